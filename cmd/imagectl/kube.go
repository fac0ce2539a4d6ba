package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// kubeFlags select the hub and namespace of the vm and volume commands,
// as kubectl's flags do.
type kubeFlags struct {
	kubeconfig string
	context    string
	namespace  string
}

func addKubeFlags(cmd *cobra.Command, f *kubeFlags) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the hub (default: $KUBECONFIG, then ~/.kube/config)")
	cmd.Flags().StringVar(&f.context, "context", "", "kubeconfig context (default: the current one)")
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", "", "namespace (default: the context's namespace)")
}

// client connects to the hub and returns the namespace to work in.
func (f *kubeFlags) client() (*kube.Client, string, error) {
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
	ns := f.namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", fmt.Errorf("reading the context's namespace: %w", err)
		}
	}
	if ns == "" {
		return nil, "", errors.New("name the namespace with -n")
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
