// Command kubevirt-admission serves KubeVirt's own admission code for VirtualMachines as an
// admission webhook of a test hub's kube-apiserver, so that imagepipe's tests see what a real
// cluster's virt-api decides about the VMs imagectl renders.
//
// It is not virt-api: it links kubevirt.io/kubevirt at the version test/kubevirt/build-admission.sh
// names and calls, for each AdmissionReview, the very functions virt-api registers for
// VirtualMachines — the mutating webhook's ServeVMs (VMsMutator, with the instancetype mutator)
// and the validating webhook's ServeVMs (VMsAdmitter, with the instancetype admitter) — with a
// ClusterConfig that KubeVirt's own code builds from the KubeVirt object it watches on the hub,
// as virt-api does. Only the plumbing around them is ours: flags, TLS, the informers' start,
// readiness, and logging.
//
// Endpoints (HTTPS, admission.k8s.io/v1 AdmissionReview):
//
//	/mutate-virtualmachines    KubeVirt's VM mutating webhook
//	/validate-virtualmachines  KubeVirt's VM validating webhook
//	/live-migration            KubeVirt's live-migration condition for a stored VM (livemigration.go)
//	/readyz                    200 with the configuration in use once a KubeVirt object is seen
//
// With -deploy-common-instancetypes it also creates the common cluster instancetypes and
// preferences bundled with KubeVirt, as virt-operator does unless the KubeVirt object's
// spec.configuration.commonInstancetypesDeployment.enabled is false, so that VMs naming u1.medium
// or rhel.9 find them.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"

	"kubevirt.io/kubevirt/pkg/controller"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	mutatingwebhook "kubevirt.io/kubevirt/pkg/virt-api/webhooks/mutating-webhook"
	validatingwebhook "kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

// options are the command's flags.
type options struct {
	kubeconfig   string
	listen       string
	certFile     string
	keyFile      string
	namespace    string
	deployCommon bool
	hostCPUModel string
}

func main() {
	var opts options
	flag.StringVar(&opts.kubeconfig, "kubeconfig", "", "kubeconfig of the hub whose KubeVirt object configures admission (required)")
	flag.StringVar(&opts.listen, "listen", "127.0.0.1:8443", "address to serve HTTPS on")
	flag.StringVar(&opts.certFile, "tls-cert", "", "PEM certificate to serve with (required)")
	flag.StringVar(&opts.keyFile, "tls-key", "", "PEM private key of -tls-cert (required)")
	flag.StringVar(&opts.namespace, "namespace", "kubevirt", "namespace of the KubeVirt object, as virt-api's own namespace")
	flag.BoolVar(&opts.deployCommon, "deploy-common-instancetypes", false, "create KubeVirt's bundled cluster instancetypes and preferences, as virt-operator does")
	flag.StringVar(&opts.hostCPUModel, "node-host-cpu-model", "Skylake-Client-IBRS",
		"the host CPU model virt-handler would report for the node a VMI runs on; empty plays a node without host-model support")
	flag.Parse()
	if opts.kubeconfig == "" || opts.certFile == "" || opts.keyFile == "" {
		fmt.Fprintln(os.Stderr, "kubevirt-admission: -kubeconfig, -tls-cert and -tls-key are required")
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, opts); err != nil {
		logger.Error("kubevirt-admission stopped", "error", err)
		os.Exit(1)
	}
}

// server holds what every request needs: the hub's client and KubeVirt's cluster configuration.
type server struct {
	log           *slog.Logger
	virtCli       kubecli.KubevirtClient
	clusterConfig *virtconfig.ClusterConfig
	informers     *webhooks.Informers
	// serviceAccounts are KubeVirt's own service accounts, which virt-api lets change more.
	serviceAccounts map[string]struct{}
	hostCPUModel    string
	// common is the state of the common instancetypes: "not asked", "pending", "deployed",
	// "disabled" or "failed: ...".
	common atomic.Pointer[string]
}

// setCommon records the state of the common instancetypes' deployment.
func (s *server) setCommon(state string) { s.common.Store(&state) }

func run(ctx context.Context, logger *slog.Logger, opts options) error {
	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", opts.kubeconfig, err)
	}
	// client-go's default of 5 requests a second would make deploying the 119 common
	// instancetypes and preferences take over 20 s.
	restConfig.QPS, restConfig.Burst = 100, 200
	virtCli, err := kubecli.GetKubevirtClientFromRESTConfig(restConfig)
	if err != nil {
		return fmt.Errorf("making KubeVirt's client: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(opts.certFile, opts.keyFile)
	if err != nil {
		return fmt.Errorf("loading the serving certificate: %w", err)
	}

	// The informers virt-api starts for its VM webhooks, from KubeVirt's own factory.
	factory := controller.NewKubeInformerFactory(virtCli.RestClient(), virtCli, nil, opts.namespace)
	kubeVirtInformer := factory.KubeVirt()
	crdInformer := factory.CRD()
	namespaceInformer := factory.Namespace()
	stopCh := make(chan struct{})
	defer close(stopCh)
	factory.Start(stopCh)
	if !cache.WaitForCacheSync(ctx.Done(), kubeVirtInformer.HasSynced, crdInformer.HasSynced, namespaceInformer.HasSynced) {
		return errors.New("the informers did not sync")
	}
	clusterConfig, err := virtconfig.NewClusterConfig(crdInformer, kubeVirtInformer, opts.namespace)
	if err != nil {
		return fmt.Errorf("building KubeVirt's cluster configuration: %w", err)
	}
	var dataSourceInformer cache.SharedIndexInformer
	if clusterConfig.HasDataSourceAPI() {
		dataSourceInformer = factory.DataSource()
	} else {
		dataSourceInformer = factory.DummyDataSource()
	}
	factory.Start(stopCh)
	if !cache.WaitForCacheSync(ctx.Done(), dataSourceInformer.HasSynced) {
		return errors.New("the DataSource informer did not sync")
	}

	s := &server{
		log:             logger,
		virtCli:         virtCli,
		clusterConfig:   clusterConfig,
		informers:       &webhooks.Informers{DataSourceInformer: dataSourceInformer, NamespaceInformer: namespaceInformer},
		serviceAccounts: webhooks.KubeVirtServiceAccounts(opts.namespace),
		hostCPUModel:    opts.hostCPUModel,
	}
	s.setCommon("not asked")
	if opts.deployCommon {
		s.setCommon("pending")
		go s.deployCommonInstancetypes(ctx)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/mutate-virtualmachines", func(w http.ResponseWriter, r *http.Request) {
		mutatingwebhook.ServeVMs(w, r, s.clusterConfig, s.virtCli)
	})
	mux.HandleFunc("/validate-virtualmachines", func(w http.ResponseWriter, r *http.Request) {
		validatingwebhook.ServeVMs(w, r, s.clusterConfig, s.virtCli, s.informers, s.serviceAccounts)
	})
	mux.HandleFunc("/live-migration", s.serveLiveMigration)
	mux.HandleFunc("/readyz", s.serveReadyz)
	srv := &http.Server{
		Addr:              opts.listen,
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServeTLS("", "") }()
	logger.Info("serving", "address", opts.listen, "namespace", opts.namespace)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// readiness is /readyz's answer: which KubeVirt object configures admission, and the parts of
// its configuration tests check.
type readiness struct {
	KubeVirt        string   `json:"kubevirt"`
	ResourceVersion string   `json:"resourceVersion"`
	FeatureGates    []string `json:"featureGates"`
	NetworkBindings []string `json:"networkBindings"`
	// CommonInstancetypes is the state of -deploy-common-instancetypes.
	CommonInstancetypes string `json:"commonInstancetypes"`
}

// serveReadyz answers 200 once KubeVirt's ClusterConfig found a KubeVirt object with a phase (it
// ignores one without, as virt-api does) and the common instancetypes asked for are deployed,
// else 503: before that, admission would run on KubeVirt's built-in defaults rather than on the
// hub's configuration.
func (s *server) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	kv := s.clusterConfig.GetConfigFromKubeVirtCR()
	if kv == nil {
		http.Error(w, "no KubeVirt object with a status.phase yet", http.StatusServiceUnavailable)
		return
	}
	common := *s.common.Load()
	if common == "pending" {
		http.Error(w, "deploying the common instancetypes", http.StatusServiceUnavailable)
		return
	}
	config := s.clusterConfig.GetConfig()
	out := readiness{
		KubeVirt: kv.Namespace + "/" + kv.Name, ResourceVersion: kv.ResourceVersion,
		FeatureGates: []string{}, NetworkBindings: []string{}, CommonInstancetypes: common,
	}
	if dev := config.DeveloperConfiguration; dev != nil {
		out.FeatureGates = append(out.FeatureGates, dev.FeatureGates...)
	}
	for name := range s.clusterConfig.GetNetworkBindings() {
		out.NetworkBindings = append(out.NetworkBindings, name)
	}
	slices.Sort(out.NetworkBindings)
	writeJSON(w, out)
}

// deployCommonInstancetypes creates the cluster instancetypes and preferences bundled with
// KubeVirt once a KubeVirt object is seen, unless it disables their deployment as virt-operator
// reads it. Objects that exist are left alone.
func (s *server) deployCommonInstancetypes(ctx context.Context) {
	var kv *v1.KubeVirt
	for kv == nil {
		if kv = s.clusterConfig.GetConfigFromKubeVirtCR(); kv != nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	if d := kv.Spec.Configuration.CommonInstancetypesDeployment; d != nil && d.Enabled != nil && !*d.Enabled {
		s.log.Info("common instancetypes not deployed: the KubeVirt object disables them")
		s.setCommon("disabled")
		return
	}
	if err := s.createCommonInstancetypes(ctx); err != nil {
		s.log.Error("deploying the common instancetypes", "error", err)
		s.setCommon("failed: " + err.Error())
		return
	}
	s.setCommon("deployed")
}

// createCommonInstancetypes creates the bundled cluster instancetypes and preferences that do not
// exist yet.
func (s *server) createCommonInstancetypes(ctx context.Context) error {
	instancetypes, err := components.NewClusterInstancetypes()
	if err != nil {
		return fmt.Errorf("decoding the bundled instancetypes: %w", err)
	}
	preferences, err := components.NewClusterPreferences()
	if err != nil {
		return fmt.Errorf("decoding the bundled preferences: %w", err)
	}
	for _, it := range instancetypes {
		_, err := s.virtCli.VirtualMachineClusterInstancetype().Create(ctx, it, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating cluster instancetype %s: %w", it.Name, err)
		}
	}
	for _, p := range preferences {
		_, err := s.virtCli.VirtualMachineClusterPreference().Create(ctx, p, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating cluster preference %s: %w", p.Name, err)
		}
	}
	s.log.Info("common instancetypes deployed", "instancetypes", len(instancetypes), "preferences", len(preferences))
	return nil
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		// The client went away; there is no one left to tell.
		return
	}
}
