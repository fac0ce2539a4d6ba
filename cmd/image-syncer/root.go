package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/daemon"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/netsync"
	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// options are the daemon's settings, from flags and the config file.
type options struct {
	daemon               daemon.Flags
	kubeconfig           string
	gateKeys             string
	tenantCredentialsDir string
	namespaceTemplate    string
	tenantRole           string
	tenants              []string
	denyTenants          []string
	storageClass         string
	architecture         string
	preferenceTable      string
	pullMethod           string
	unknownGuests        string
	requireBoot          bool
	keep                 int32
	maxImagesPerTenant   int
	bounds               netsync.Bounds
	loadBalancerNodePort bool
	onDelete             string
	maxAttempts          int32
	retryDelay           time.Duration
	workers              int
	kubeQPS              float32
	kubeBurst            int
	leaderElect          bool
	leaderElectionNS     string
}

func newRootCmd() *cobra.Command { return newRootCmdWith(&options{}) }

// newRootCmdWith builds the command around o, which its flags fill.
func newRootCmdWith(o *options) *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "image-syncer --registry HOST[:PORT] [flags]",
		Short: "Replicate tenant images from the registry onto this hub as CDI DataVolumes and DataSources",
		Long: `image-syncer runs on each hub cluster. It learns of tenant images in the
central registry from webhooks and from polling, and imports each one the
gate (image-gate) verified, as a BaseImage with a CDI DataVolume pinned to
the gate's canonical image and a DataSource. An image without a verdict
signed by one of the provider's keys (--gate-keys) is never imported.

Its own registry credential (--docker-config) lists the catalog and tags
and revalidates images, and is never copied into tenant namespaces; the
registry's CA bundle (--registry-ca-file) is, for CDI.

Every flag can also be set in a YAML file given with --config, whose keys
are the flag names (poll-interval: 5m); the command line wins.

Where the syncer looks, in order; the first source that is set wins, and
the first log line says which, and which build runs:

    hub kubeconfig:          ` + kubeconfigOrder() + `
    leader lease namespace:  --leader-election-namespace, $` + podNamespaceEnv + `,
                             the pod's service account namespace, ` + defaultLeaderElectionNamespace,
		Version:       version.Get().String(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
					return err
				}
			}
			if err := o.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML file setting any of these flags by name")
	o.daemon.Register(f)
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the hub (default: the first of "+strings.Join(kubeconfigSourceNames()[1:], ", then ")+")")
	f.StringVar(&o.gateKeys, "gate-keys", "", "PEM file of the provider's public keys, one or more (rotation): only images with a verdict signed by one of them are imported (required)")
	f.StringVar(&o.tenantCredentialsDir, "tenant-credentials-dir", "", "folder with one docker config.json per tenant, named after the tenant, each able to read only TENANT/*; copied into that tenant's namespace as CDI's pull secret (pull method pod)")
	f.StringVar(&o.namespaceTemplate, "namespace-template", hub.DefaultNamespaceTemplate, "hub namespace of a tenant, a Go template with .Tenant")
	f.StringSliceVar(&o.tenants, "tenants", nil, "tenants this hub serves (default: all)")
	f.StringVar(&o.tenantRole, "tenant-cluster-role", "imagepipe-tenant", "ClusterRole a private network's namespace binds to whoever it is bound to in the network's own namespace (config/tenant); empty: private networks and load balancers are not provisioned")
	f.StringSliceVar(&o.denyTenants, "deny-tenants", nil, "tenants this hub never serves")
	f.StringVar(&o.storageClass, "storage-class", "", "StorageClass of imports (default: the cluster's default class)")
	f.StringVar(&o.pullMethod, "pull-method", "pod", "CDI registry pull method: pod or node")
	f.BoolVar(&o.requireBoot, "require-boot", false, "import only images the gate booted (image-gate --boot-check) and saw signal that they booted; others are refused on this hub as not-booted")
	f.StringVar(&o.unknownGuests, "unknown-guests", "import", "images whose operating system the gate could not tell: import them, or hold them back (refused on this hub as unknown-guest)")
	f.StringVar(&o.architecture, "architecture", "", "the hub's CPU architecture: the canonical image for it is imported, and images verified for none are refused (default: what most nodes report, else amd64)")
	f.StringVar(&o.preferenceTable, "preference-table", "", "NAMESPACE/NAME of a ConfigMap whose key preferences replaces the built-in table of VirtualMachineClusterPreferences given to images by the OS the gate found (docs/syncer.md); read at start (a missing or malformed one stops the syncer) and every minute (a broken edit keeps the last good table, logged)")
	f.Int32Var(&o.keep, "keep", hub.DefaultKeep, "successful imports kept per image tag (1-10)")
	f.IntVar(&o.maxImagesPerTenant, "max-images-per-tenant", hub.DefaultMaxImagesPerTenant, "BaseImages one tenant may have on this hub; a tag pushed beyond it is not synced (logged). 0: no bound")
	f.IntVar(&o.bounds.Networks, "max-networks-per-tenant", netsync.DefaultMaxNetworks, "private networks (each a namespace) one tenant may have on this hub; a newer one gets no namespace. 0: no bound")
	f.IntVar(&o.bounds.LoadBalancers, "max-load-balancers-per-tenant", netsync.DefaultMaxLoadBalancers, "load balancers (each an external address) one tenant may have on this hub, over all its namespaces; a newer one gets no Service. 0: no bound")
	f.IntVar(&o.bounds.ExposedPorts, "max-exposed-ports-per-tenant", netsync.DefaultMaxExposedPorts, "ports one tenant may expose on this hub, summed over its load balancers. 0: no bound")
	f.BoolVar(&o.loadBalancerNodePort, "load-balancer-node-ports", false, "let the hub allocate a NodePort for each exposed port (allocateLoadBalancerNodePorts), for load-balancer implementations that forward to nodes; NodePorts are one range for the whole hub")
	f.StringVar(&o.onDelete, "on-delete", string(v1alpha1.DeletionRetain), "when a tag leaves the registry: retain (keep the current import) or delete")
	f.Int32Var(&o.maxAttempts, "max-attempts", hub.DefaultMaxAttempts, "failed imports of one digest before retries stop")
	f.DurationVar(&o.retryDelay, "retry-delay", hub.DefaultRetryDelay, "wait after a failed import, doubling after each further one (at most 10m)")
	f.IntVar(&o.workers, "workers", 4, "concurrent reconciles and event handlers")
	f.Float32Var(&o.kubeQPS, "kube-qps", defaultKubeQPS, "requests per second to the hub's API server, on average; a first sync of N images makes about 2N writes")
	f.IntVar(&o.kubeBurst, "kube-burst", defaultKubeBurst, "requests to the hub's API server allowed at once above --kube-qps")
	f.BoolVar(&o.leaderElect, "leader-elect", true, "run one active replica at a time (webhooks are accepted by all)")
	f.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "namespace of the leader lease (default: $"+podNamespaceEnv+", then the pod's service account namespace, then "+defaultLeaderElectionNamespace+")")
	return cmd
}

func (o *options) validate() error {
	errs := []error{o.daemon.Validate()}
	if o.gateKeys == "" {
		errs = append(errs, errors.New("--gate-keys is required: the syncer imports only what the gate verified"))
	}
	switch cdiv1.RegistryPullMethod(o.pullMethod) {
	case cdiv1.RegistryPullPod:
	case cdiv1.RegistryPullNode:
		if o.tenantCredentialsDir != "" {
			errs = append(errs, errors.New("--tenant-credentials-dir needs --pull-method pod: with node, the node's runtime pulls with the cluster's credentials and no Secret is used"))
		}
	default:
		errs = append(errs, fmt.Errorf("--pull-method %q: want pod or node", o.pullMethod))
	}
	if o.unknownGuests != "import" && o.unknownGuests != "hold" {
		errs = append(errs, fmt.Errorf("--unknown-guests %q: want import or hold", o.unknownGuests))
	}
	if _, err := hub.NewTenancy(o.namespaceTemplate, o.tenants, o.denyTenants); err != nil {
		errs = append(errs, fmt.Errorf("--namespace-template: %w", err))
	}
	if o.maxImagesPerTenant < 0 {
		errs = append(errs, fmt.Errorf("--max-images-per-tenant %d: want 0 (no bound) or more", o.maxImagesPerTenant))
	}
	for flag, n := range map[string]int{"--max-networks-per-tenant": o.bounds.Networks, "--max-load-balancers-per-tenant": o.bounds.LoadBalancers, "--max-exposed-ports-per-tenant": o.bounds.ExposedPorts} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s %d: want 0 (no bound) or more", flag, n))
		}
	}
	if o.preferenceTable != "" {
		if _, err := preferenceTableKey(o.preferenceTable); err != nil {
			errs = append(errs, err)
		}
	}
	if o.keep < 1 || o.keep > 10 {
		errs = append(errs, fmt.Errorf("--keep %d: want 1 to 10", o.keep))
	}
	switch v1alpha1.DeletionPolicy(o.onDelete) {
	case v1alpha1.DeletionRetain, v1alpha1.DeletionDelete:
	default:
		errs = append(errs, fmt.Errorf("--on-delete %q: want retain or delete", o.onDelete))
	}
	if o.maxAttempts < 1 {
		errs = append(errs, fmt.Errorf("--max-attempts %d: want at least 1", o.maxAttempts))
	}
	if o.retryDelay < time.Second || o.retryDelay > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--retry-delay %s: want 1s to 10m", o.retryDelay))
	}
	if o.workers < 1 {
		errs = append(errs, fmt.Errorf("--workers %d: want at least 1", o.workers))
	}
	if o.kubeQPS < 1 || o.kubeBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-qps %v and --kube-burst %d: want at least 1 each", o.kubeQPS, o.kubeBurst))
	}
	return errors.Join(errs...)
}
