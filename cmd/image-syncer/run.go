package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// maxSecretFile bounds the token and docker config files read.
const maxSecretFile = 64 << 10

// run wires the syncer: registry client, hub manager, intake workers and
// webhook on every replica, poller and reconciler on the leader only.
func run(ctx context.Context, o *options) error {
	log := o.logger()
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))

	reg, err := name.NewRegistry(o.registry)
	if err != nil {
		return fmt.Errorf("--registry %q: %w", o.registry, err)
	}
	intake := cdi.NewIntake()
	metrics, err := cdi.NewMetrics(ctrlmetrics.Registry, intake.Len)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}

	ropts := []registry.Option{
		registry.WithLogger(log), registry.WithCacheDir(""), registry.WithInsecure(o.registryInsecure),
		registry.WithRequestObserver(func(method, _ string, status int) {
			metrics.RegistryRequests.WithLabelValues(method, strconv.Itoa(status)).Inc()
		}),
	}
	if o.dockerConfig != "" {
		// The syncer's own credential: never copied into a namespace.
		user, pass, err := registryCredentials(o.dockerConfig, reg.RegistryStr())
		if err != nil {
			return err
		}
		ropts = append(ropts, registry.WithBasicAuth(user, pass))
	}
	var tenantCredentials cdi.TenantCredentials
	if o.tenantCredentialsDir != "" {
		if _, err := os.Stat(o.tenantCredentialsDir); err != nil {
			return fmt.Errorf("--tenant-credentials-dir: %w", err)
		}
		tenantCredentials = cdi.CredentialDir{Dir: o.tenantCredentialsDir, Registry: reg.RegistryStr()}
	}
	var ca []byte
	if o.registryCAFile != "" {
		if ca, err = readBounded(o.registryCAFile); err != nil {
			return err
		}
		ropts = append(ropts, registry.WithCAFile(o.registryCAFile))
	}
	rc, err := registry.New(ropts...)
	if err != nil {
		return err
	}
	tenancy, err := cdi.NewTenancy(o.namespaceTemplate, o.tenants, o.denyTenants)
	if err != nil {
		return err
	}
	// The syncer's own namespace is never a tenant's.
	for _, ns := range []string{o.leaderElectionNS, os.Getenv("POD_NAMESPACE")} {
		if ns != "" {
			tenancy.Reserve(ns)
		}
	}

	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "image-syncer.imagepipe.io",
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: o.metricsListen},
		HealthProbeBindAddress:        o.healthListen,
		GracefulShutdownTimeout:       &o.shutdownTimeout,
		Client: client.Options{Cache: &client.CacheOptions{
			// Read directly: the syncer may only get these, not list or watch them.
			DisableFor: []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}, &corev1.PersistentVolumeClaim{}},
		}},
	})
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}

	applier := &cdi.Applier{Client: mgr.GetClient(), Registry: reg, Resolver: rc, Tenancy: tenancy, Logger: log}
	rec := &cdi.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Registry: reg, Checker: rc,
		StorageClass: o.storageClass, PullMethod: cdiv1.RegistryPullMethod(o.pullMethod),
		TenantCredentials: tenantCredentials, CA: ca, Keep: o.keep, OnDelete: v1alpha1.DeletionPolicy(o.onDelete),
		MaxAttempts: o.maxAttempts, RetryDelay: o.retryDelay, Metrics: metrics, Logger: log,
	}
	if err := rec.SetupWithManager(mgr, o.workers); err != nil {
		return fmt.Errorf("setting up the reconciler: %w", err)
	}
	if err := mgr.Add(everyReplica(func(ctx context.Context) error {
		return runWorkers(ctx, intake, applier, metrics, o.workers, log)
	})); err != nil {
		return err
	}
	poller := cdi.NewPoller(reg, rc, tenancy)
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { // leader only
		pollLoop(ctx, poller, intake, metrics, o.pollInterval, o.digestResyncInterval, log)
		return nil
	})); err != nil {
		return err
	}
	if o.webhookListen != "" {
		token, err := readBounded(o.webhookTokenFile)
		if err != nil {
			return err
		}
		h, err := cdi.NewWebhookHandler(string(bytes.TrimSpace(token)), intake.Add, log)
		if err != nil {
			return err
		}
		h.Metrics = metrics
		mux := http.NewServeMux()
		mux.Handle(o.webhookPath, h)
		if err := mgr.Add(everyReplica(func(ctx context.Context) error {
			return serveHTTP(ctx, o.webhookListen, mux, o.shutdownTimeout, log)
		})); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("the hub cache is not synced yet")
		}
		return nil
	}); err != nil {
		return err
	}
	log.Info("image-syncer starting", "registry", reg.RegistryStr(), "hub", cfg.Host, "leaderElection", o.leaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running: %w", err)
	}
	log.Info("image-syncer stopped")
	return nil
}

// runWorkers hands queued events to the applier until ctx ends.
func runWorkers(ctx context.Context, intake *cdi.Intake, a *cdi.Applier, m *cdi.Metrics, workers int, log *slog.Logger) error {
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				e, finish, ok := intake.Next(ctx)
				if !ok {
					return
				}
				err := a.Apply(ctx, e)
				m.Applied(e, err)
				if err != nil && ctx.Err() == nil {
					log.Warn("event not applied; retrying with backoff", "repository", e.Repository, "tag", e.Tag, "source", e.Source, "error", err)
				}
				finish(err)
			}
		}()
	}
	for range workers {
		<-done
	}
	return nil
}

// pollLoop polls the registry every interval, re-resolving every known
// tag's digest every resync; the first pass is a full one. A failed poll
// is logged and changes nothing.
func pollLoop(ctx context.Context, p *cdi.Poller, intake *cdi.Intake, m *cdi.Metrics, interval, resync time.Duration, log *slog.Logger) {
	var lastFull time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		full := lastFull.IsZero() || time.Since(lastFull) >= resync
		start := time.Now()
		poll := p.Poll
		if full {
			poll = p.PollDigests
		}
		events, err := poll(ctx)
		if full && err == nil {
			lastFull = start
		}
		m.Polled(full, err)
		if err != nil && ctx.Err() == nil {
			log.Warn("polling the registry failed; nothing is changed until it answers", "error", err)
		}
		if len(events) > 0 {
			m.Received("poll", len(events))
			intake.Add(events)
		}
		log.Debug("poll done", "full", full, "events", len(events), "duration", time.Since(start))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serveHTTP serves handler on addr until ctx ends, then shuts down
// gracefully within timeout.
func serveHTTP(ctx context.Context, addr string, handler http.Handler, timeout time.Duration, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Serve(ln) }()
	log.Info("webhook listening", "address", ln.Addr().String())
	select {
	case err := <-stopped:
		return fmt.Errorf("serving the webhook: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return srv.Shutdown(sctx)
}

// everyReplica is a runnable that runs on every replica, not only the leader.
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }

// restConfig loads the hub's client configuration from path, or in-cluster
// and $KUBECONFIG when path is empty.
func restConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = ctrl.GetConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading the hub's kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = "image-syncer"
	return cfg, nil
}

// registryCredentials reads the registry's username and password from a
// docker config file, without running credential helpers.
func registryCredentials(path, host string) (user, pass string, err error) {
	return cdi.DockerCredentials(path, host)
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxSecretFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxSecretFile)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return data, nil
}
