package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/homedir"
)

// kubeconfigSource is one place the hub's client configuration can come
// from. restConfig tries kubeconfigSources in order and uses the first
// that applies; --help states the same order, built from the same list.
type kubeconfigSource struct {
	// name says the source in --help and in the first log line.
	name string
	// load returns the configuration, or ok false when the source does not
	// apply (nothing given). A source that applies but cannot be loaded is
	// an error: the next one is not tried, so that a broken configuration
	// is never silently replaced by another cluster's.
	load func(flagValue string) (cfg *rest.Config, ok bool, err error)
}

var kubeconfigSources = []kubeconfigSource{
	{"--kubeconfig", func(path string) (*rest.Config, bool, error) {
		if path == "" {
			return nil, false, nil
		}
		cfg, err := loadKubeconfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: path})
		return cfg, true, err
	}},
	// A list of files like kubectl's, merged the same way; an empty
	// variable counts as unset, as it does for kubectl.
	{"$KUBECONFIG", func(string) (*rest.Config, bool, error) {
		paths := filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar))
		if len(paths) == 0 {
			return nil, false, nil
		}
		cfg, err := loadKubeconfig(&clientcmd.ClientConfigLoadingRules{Precedence: paths})
		return cfg, true, err
	}},
	// In a pod: KUBERNETES_SERVICE_HOST and _PORT are set, and the service
	// account's token is mounted.
	{"in-cluster", func(string) (*rest.Config, bool, error) {
		if os.Getenv("KUBERNETES_SERVICE_HOST") == "" || os.Getenv("KUBERNETES_SERVICE_PORT") == "" {
			return nil, false, nil
		}
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, true, fmt.Errorf("in a pod (KUBERNETES_SERVICE_HOST is set) without a usable service account token: %w", err)
		}
		return cfg, true, nil
	}},
	{"~/.kube/config", func(string) (*rest.Config, bool, error) {
		home := homedir.HomeDir()
		if home == "" {
			return nil, false, nil
		}
		path := filepath.Join(home, clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
		cfg, err := loadKubeconfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: path})
		return cfg, true, err
	}},
}

// kubeconfigSourceNames names kubeconfigSources in order, for --help.
func kubeconfigSourceNames() []string {
	names := make([]string, len(kubeconfigSources))
	for i, s := range kubeconfigSources {
		names[i] = s.name
	}
	return names
}

// kubeconfigOrder is the order of kubeconfigSources in words, for --help.
func kubeconfigOrder() string { return strings.Join(kubeconfigSourceNames(), ", ") }

// loadKubeconfig loads the current context of the kubeconfig files rules
// name. Unlike clientcmd's deferred loading, an empty result is an error
// rather than a silent fall-back to the in-cluster configuration.
func loadKubeconfig(rules *clientcmd.ClientConfigLoadingRules) (*rest.Config, error) {
	raw, err := rules.Load()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		// clientcmd's own message suggests KUBERNETES_MASTER, which is not read here.
		return nil, fmt.Errorf("%s: missing or empty", strings.Join(rules.GetLoadingPrecedence(), string(filepath.ListSeparator)))
	}
	return cfg, err
}

// The client's default rate limit. The API server guards itself with API
// Priority and Fairness; this limit only keeps one syncer from taking more
// than its share. A first sync writes each BaseImage about twice (create,
// status), so 5,000 images need 20 s of the limit at 500 per second; on a
// 2-core hub the API server's CPU, not the limit, then sets the pace
// (59 s measured, against 66 s at 200 per second).
const (
	defaultKubeQPS   = 500
	defaultKubeBurst = 1000
)

// restConfig loads the hub's client configuration from the first source
// of kubeconfigSources that applies, and says which.
func restConfig(flagValue string) (_ *rest.Config, source string, _ error) {
	for _, s := range kubeconfigSources {
		cfg, ok, err := s.load(flagValue)
		if !ok {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("loading the hub's kubeconfig (%s): %w", s.name, err)
		}
		cfg.UserAgent = "image-syncer"
		return cfg, s.name, nil
	}
	return nil, "", errors.New("no kubeconfig for the hub: give --kubeconfig, set $KUBECONFIG, run in a pod, or write ~/.kube/config")
}

// Where the leader election namespace comes from, in order, when
// --leader-election-namespace is not given.
const (
	// podNamespaceEnv is set by config/syncer/deployment.yaml from the
	// downward API.
	podNamespaceEnv = "POD_NAMESPACE"
	// serviceAccountNamespaceFile is the namespace of the pod's service
	// account, mounted in every pod that mounts its token.
	serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
	// defaultLeaderElectionNamespace is config/syncer's namespace.
	defaultLeaderElectionNamespace = "imagepipe-system"
)

// leaderElectionNamespace returns the namespace of the leader lease and
// where it came from: flagValue (--leader-election-namespace), else
// podNamespace ($POD_NAMESPACE), else the content of nsFile (the service
// account's namespace), else imagepipe-system. A value that is not a
// namespace name is an error naming its source, not skipped.
func leaderElectionNamespace(flagValue, podNamespace, nsFile string) (ns, source string, err error) {
	check := func(ns, source string) (string, string, error) {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return "", "", fmt.Errorf("the leader election namespace %q from %s is not a namespace name: %s", ns, source, strings.Join(errs, "; "))
		}
		return ns, source, nil
	}
	if flagValue != "" {
		return check(flagValue, "--leader-election-namespace")
	}
	if podNamespace != "" {
		return check(podNamespace, "$"+podNamespaceEnv)
	}
	f, err := os.Open(nsFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", "", fmt.Errorf("reading the service account's namespace: %w", err)
	default:
		defer f.Close()
		// A namespace name is at most 63 bytes; more is not one.
		data, err := io.ReadAll(io.LimitReader(f, 256))
		if err != nil {
			return "", "", fmt.Errorf("reading the service account's namespace: %w", err)
		}
		if ns := strings.TrimSpace(string(data)); ns != "" {
			return check(ns, nsFile)
		}
	}
	return defaultLeaderElectionNamespace, "default", nil
}
