package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/hub"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/netsync"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/secretfile"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// loggedError is an error run has already logged, in the log format, so
// that main exits without printing it again.
type loggedError struct{ error }

// run sets up logging to stderr and runs the syncer until ctx ends. An
// error is logged as the last line, with the version, and returned as a
// loggedError.
func run(ctx context.Context, o *options, stderr io.Writer) error {
	log, err := o.setUpLogging(stderr)
	if err != nil {
		return err
	}
	if err := serve(ctx, o, log); err != nil {
		log.Error("image-syncer stopped on an error", "error", err, "version", version.Get().Version)
		return loggedError{err}
	}
	log.Info("image-syncer stopped")
	return nil
}

// serve wires the syncer: registry client, hub manager, intake workers and
// webhook on every replica, poller and reconciler on the leader only. Its
// first log line says which build runs, which kubeconfig it read and where
// the leader lease lives and why.
func serve(ctx context.Context, o *options, log *slog.Logger) error {
	reg, err := o.daemon.RegistryName()
	if err != nil {
		return err
	}
	queue := intake.NewQueue()
	metrics, err := hub.NewMetrics(ctrlmetrics.Registry, queue.Len)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	cfg, kubeconfig, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.kubeQPS, o.kubeBurst
	build := version.Get()
	start := []any{
		"version", build.Version, "commit", build.Commit, "modified", build.Modified, "goVersion", build.GoVersion, "platform", build.Platform,
		"registry", reg.RegistryStr(), "hub", cfg.Host, "kubeconfig", kubeconfig, "leaderElection", o.leaderElect,
	}
	if o.leaderElect {
		ns, from, err := leaderElectionNamespace(o.leaderElectionNS, os.Getenv(podNamespaceEnv), serviceAccountNamespaceFile)
		if err != nil {
			return err
		}
		o.leaderElectionNS = ns
		start = append(start, "leaderElectionNamespace", ns, "leaderElectionNamespaceFrom", from)
	}
	log.Info("image-syncer starting", start...)
	if o.architecture == "" {
		o.architecture = hubArchitecture(ctx, cfg, log)
	}
	rc, err := o.daemon.RegistryClient("image-syncer/"+build.Version, log, registry.WithArchitecture(o.architecture),
		registry.WithRequestObserver(func(method, _ string, status int) {
			metrics.RegistryRequests.WithLabelValues(method, strconv.Itoa(status)).Inc()
		}))
	if err != nil {
		return err
	}
	var ca []byte // copied into the tenants' namespaces for CDI
	if o.daemon.RegistryCAFile != "" {
		if ca, err = secretfile.Read(o.daemon.RegistryCAFile); err != nil {
			return err
		}
	}
	tenancy, err := newTenancy(o)
	if err != nil {
		return err
	}
	mgr, err := newManager(cfg, o)
	if err != nil {
		return err
	}
	trust, err := loadGateKeys(o.gateKeys)
	if err != nil {
		return err
	}
	rec, err := newReconciler(o, mgr, reg, hub.NewGateVerdicts(rc, trust), ca, metrics)
	if err != nil {
		return err
	}
	if rec.Preferences, err = loadPreferences(ctx, o, mgr, log); err != nil {
		return err
	}
	if err := rec.SetupWithManager(mgr, o.workers); err != nil {
		return fmt.Errorf("setting up the reconciler: %w", err)
	}
	if o.tenantRole != "" {
		nets := &netsync.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), TenantRole: o.tenantRole, Bounds: o.bounds, Logger: log}
		if err := nets.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up private networks: %w", err)
		}
		lbs := &netsync.LoadBalancers{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Bounds: o.bounds, NodePorts: o.loadBalancerNodePort, Logger: log}
		if err := lbs.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up load balancers: %w", err)
		}
	}
	applier := &hub.Applier{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Registry: reg, Resolver: rc, Manifests: rc, Tenancy: tenancy, Wake: rec.Wake, Logger: log,
		MaxImagesPerTenant: o.maxImagesPerTenant}
	poll := hub.NewPollLoop(intake.NewPoller(reg, rc, tenancy), queue, metrics, o.daemon.PollInterval, o.daemon.DigestResyncInterval, log)
	poll.Backlog = rec.Backlog
	runnables := []manager.Runnable{hub.NewWorkers(queue, applier, metrics, o.workers, log), poll}
	if o.daemon.WebhookListen != "" {
		server, err := newWebhookServer(o, queue, metrics, log)
		if err != nil {
			return err
		}
		runnables = append(runnables, server)
	}
	for _, r := range runnables {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running: %w", err)
	}
	return nil
}

// hubArchitecture is the CPU architecture most of the hub's nodes report
// (their kubernetes.io/arch label), or amd64 when no node can be read.
func hubArchitecture(ctx context.Context, cfg *rest.Config, log *slog.Logger) string {
	cs, err := kubernetes.NewForConfig(cfg)
	if err == nil {
		var nodes *corev1.NodeList
		if nodes, err = cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
			count := map[string]int{}
			for _, n := range nodes.Items {
				if a := n.Labels[corev1.LabelArchStable]; a != "" {
					count[a]++
				}
			}
			if len(count) > 0 {
				arch := slices.MaxFunc(slices.Sorted(maps.Keys(count)), func(a, b string) int { return count[a] - count[b] })
				log.Info("hub architecture from its nodes", "architecture", arch, "nodes", len(nodes.Items))
				return arch
			}
		}
	}
	log.Info("hub architecture not found on its nodes; using amd64 (set --architecture)", "error", err)
	return "amd64"
}

// newTenancy compiles the tenancy flags; the syncer's own namespace is
// never a tenant's.
func newTenancy(o *options) (*hub.Tenancy, error) {
	tenancy, err := hub.NewTenancy(o.namespaceTemplate, o.tenants, o.denyTenants)
	if err != nil {
		return nil, err
	}
	for _, ns := range []string{o.leaderElectionNS, os.Getenv(podNamespaceEnv)} {
		if ns != "" {
			tenancy.Reserve(ns)
		}
	}
	return tenancy, nil
}

// The leader lease outlives an API server restart: a hub's apiserver is
// often away for tens of seconds (an upgrade, a busy etcd), and a leader
// that cannot renew within renewDeadline exits, to be restarted and to
// sync everything again. The price is failover after a leader's pod dies:
// up to leaseDuration. A leader stopped with SIGTERM releases the lease at
// once.
const (
	leaseDuration = 60 * time.Second
	renewDeadline = 40 * time.Second
)

// newManager builds the controller manager of the hub, with its health
// and readiness checks.
func newManager(cfg *rest.Config, o *options) (manager.Manager, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	lease, renew := leaseDuration, renewDeadline
	metricsAddr := o.daemon.MetricsListen
	if metricsAddr == "" {
		metricsAddr = "0" // controller-runtime's off; its "" is :8080
	}
	loadBalancerObjects, err := labels.Parse(netsync.LabelLoadBalancer) // the label exists
	if err != nil {
		return nil, err
	}
	launchers, err := labels.Parse(netsync.LabelVirtLauncher)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "image-syncer.imagepipe.io",
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &renew,
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        o.daemon.HealthListen,
		GracefulShutdownTimeout:       &o.daemon.ShutdownTimeout,
		// Only the Services and EndpointSlices of load balancers are
		// cached, and of pods only KubeVirt's virt-launchers, whose
		// addresses a load balancer may send traffic to.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Service{}:            {Label: loadBalancerObjects},
			&discoveryv1.EndpointSlice{}: {Label: loadBalancerObjects},
			&corev1.Pod{}:                {Label: launchers},
		}},
		Client: client.Options{Cache: &client.CacheOptions{
			// Read directly: the syncer may only get these, not list or watch them.
			DisableFor: []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}, &corev1.PersistentVolumeClaim{}},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the controller manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("the hub cache is not synced yet")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// newReconciler builds the BaseImage reconciler from the import flags:
// storage, pull method, tenants' credentials, CA, retention and retries.
func newReconciler(o *options, mgr manager.Manager, reg name.Registry, verdicts hub.Verdicts, ca []byte, metrics *hub.Metrics) (*hub.Reconciler, error) {
	rec := &hub.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Registry: reg, Verdicts: verdicts,
		StorageClass: o.storageClass, PullMethod: cdiv1.RegistryPullMethod(o.pullMethod), Architecture: o.architecture, HoldUnknownGuests: o.unknownGuests == "hold", RequireBoot: o.requireBoot,
		Keep: o.keep, OnDelete: v1alpha1.DeletionPolicy(o.onDelete),
		CA: ca, MaxAttempts: o.maxAttempts, RetryDelay: o.retryDelay, Metrics: metrics,
		Recorder: mgr.GetEventRecorderFor("image-syncer"),
	}
	if o.tenantCredentialsDir != "" {
		if _, err := os.Stat(o.tenantCredentialsDir); err != nil {
			return nil, fmt.Errorf("--tenant-credentials-dir: %w", err)
		}
		rec.TenantCredentials = hub.CredentialDir{Dir: o.tenantCredentialsDir, Registry: reg.RegistryStr()}
	}
	return rec, nil
}

// preferenceTableKey parses --preference-table NAMESPACE/NAME.
func preferenceTableKey(s string) (client.ObjectKey, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return client.ObjectKey{}, fmt.Errorf("--preference-table %q: want NAMESPACE/NAME of a ConfigMap", s)
	}
	return client.ObjectKey{Namespace: ns, Name: name}, nil
}

// loadPreferences reads the provider's preference table, when one is
// named; nil means the built-in table.
func loadPreferences(ctx context.Context, o *options, mgr manager.Manager, log *slog.Logger) (*hub.Preferences, error) {
	if o.preferenceTable == "" {
		return nil, nil
	}
	key, err := preferenceTableKey(o.preferenceTable)
	if err != nil {
		return nil, err
	}
	p := &hub.Preferences{Reader: mgr.GetAPIReader(), Key: key, Logger: log}
	if err := p.Load(ctx); err != nil {
		return nil, err
	}
	log.Info("preference table read", "configmap", key.String())
	return p, nil
}

// newWebhookServer builds the webhook endpoint, which hands the events it
// accepts to queue.
func newWebhookServer(o *options, queue *intake.Queue, metrics *hub.Metrics, log *slog.Logger) (*hub.WebhookServer, error) {
	token, err := secretfile.Read(o.daemon.WebhookTokenFile)
	if err != nil {
		return nil, err
	}
	h, err := intake.NewWebhookHandler(string(bytes.TrimSpace(token)), queue.Add, log)
	if err != nil {
		return nil, err
	}
	h.Metrics = metrics
	mux := http.NewServeMux()
	mux.Handle(o.daemon.WebhookPath, h)
	return hub.NewWebhookServer(o.daemon.WebhookListen, mux, o.daemon.ShutdownTimeout, log), nil
}

// loadGateKeys reads the provider's public keys the gate's verdicts must
// be signed with.
func loadGateKeys(path string) (*trust.Verifier, error) {
	data, err := secretfile.Read(path)
	if err != nil {
		return nil, fmt.Errorf("--gate-keys: %w", err)
	}
	keys, err := attest.ParsePublicKeys(data)
	if err != nil {
		return nil, fmt.Errorf("--gate-keys %s: %w", path, err)
	}
	return trust.NewVerifier(keys)
}
