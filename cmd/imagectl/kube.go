package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// kubeFlags select the hub and namespace of the vm and volume commands,
// as kubectl's flags do.
type kubeFlags struct {
	kubeconfig string
	context    string
	namespace  string
	// requestTimeout, when set, bounds each request to the hub (shell
	// completion sets it); commands are bounded by their context only.
	requestTimeout time.Duration
}

func addKubeFlags(cmd *cobra.Command, f *kubeFlags) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the hub (default: $KUBECONFIG, then ~/.kube/config)")
	cmd.Flags().StringVar(&f.context, "context", "", "kubeconfig context (default: the current one)")
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", "", "namespace (default: the context's namespace)")
}

// client connects to the hub and returns the namespace to work in.
func (f *kubeFlags) client() (*kube.Client, string, error) { return f.connect(false) }

// connect connects to the hub. With allNamespaces (kubectl's -A) the
// namespace returned is empty, meaning every namespace, and -n and the
// context's namespace are ignored, as kubectl ignores them.
func (f *kubeFlags) connect(allNamespaces bool) (*kube.Client, string, error) {
	cfg, ns, err := f.restConfig(allNamespaces)
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kubevirtv1.AddToScheme, cdiv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, "", err
		}
	}
	c, err := kube.New(cfg, scheme)
	if err != nil {
		return nil, "", err
	}
	return c, ns, nil
}

// restConfig reads the kubeconfig: the hub's connection and the namespace
// to work in, as connect takes them.
func (f *kubeFlags) restConfig(allNamespaces bool) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if f.kubeconfig != "" {
		rules.ExplicitPath = f.kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "imagectl/" + version.Version
	cfg.Timeout = f.requestTimeout
	ns := f.namespace
	if allNamespaces {
		ns = ""
	} else if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", fmt.Errorf("reading the context's namespace: %w", err)
		}
	}
	if ns == "" && !allNamespaces {
		return nil, "", errors.New("name the namespace with -n")
	}
	return cfg, ns, nil
}

// completionTimeout bounds the requests of one shell completion, so that
// an unreachable hub or registry never hangs the user's shell.
const completionTimeout = 5 * time.Second

// hubLister lists the candidates of one argument from the hub: kc and ns
// are what the kube flags select, args the arguments already typed.
type hubLister func(ctx context.Context, kc *kube.Client, ns string, args []string) ([]string, error)

// completeArgs completes positional arguments from the hub, the i-th with
// listers[i]; arguments past the listers get nothing. A failure to list
// completes nothing (and tells cobra's debug output why) rather than
// offering file names.
func completeArgs(f *kubeFlags, listers ...hubLister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) >= len(listers) || listers[len(args)] == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return completeFromHub(cmd, f, args, toComplete, listers[len(args)])
	}
}

// completeFlagFromHub completes a flag's value from the hub.
func completeFlagFromHub(f *kubeFlags, list hubLister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return completeFromHub(cmd, f, args, toComplete, list)
	}
}

func completeFromHub(cmd *cobra.Command, f *kubeFlags, args []string, toComplete string, list hubLister) ([]cobra.Completion, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
	defer cancel()
	f.requestTimeout = completionTimeout
	kc, ns, err := f.client()
	if err == nil {
		var names []string
		if names, err = list(ctx, kc, ns, args); err == nil {
			return withPrefix(names, toComplete), cobra.ShellCompDirectiveNoFileComp
		}
	}
	cobra.CompErrorln(err.Error())
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// withPrefix keeps the names that start with what the user typed.
func withPrefix(names []string, prefix string) []cobra.Completion {
	var out []cobra.Completion
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// The hub listers of imagectl's arguments.
var (
	listVMs hubLister = func(ctx context.Context, kc *kube.Client, ns string, _ []string) ([]string, error) {
		return vmlaunch.VMNames(ctx, kc, ns)
	}
	listVolumes hubLister = func(ctx context.Context, kc *kube.Client, ns string, _ []string) ([]string, error) {
		vols, err := vmlaunch.Volumes(ctx, kc, ns)
		names := make([]string, 0, len(vols))
		for _, v := range vols {
			names = append(names, v.Name)
		}
		return names, err
	}
	// listAttachedVolumes lists the volumes attached to the VM named by
	// the first argument.
	listAttachedVolumes hubLister = func(ctx context.Context, kc *kube.Client, ns string, args []string) ([]string, error) {
		return vmlaunch.AttachedVolumes(ctx, kc, ns, args[0])
	}
	listImages hubLister = func(ctx context.Context, kc *kube.Client, ns string, _ []string) ([]string, error) {
		return vmlaunch.ImageRefs(ctx, kc, ns)
	}
)
