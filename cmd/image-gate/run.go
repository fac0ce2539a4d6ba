package main

import (
	"bytes"
	"context"
	"crypto"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/daemon"
	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/secretfile"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/version"
)

// keyPasswordEnv holds the password of a cosign-encrypted signing key.
const keyPasswordEnv = "IMAGEPIPE_GATE_KEY_PASSWORD"

// engine names the gate in its verdicts.
const engine = "imagepipe-gate"

// loggedError is an error run has already logged.
type loggedError struct{ error }

func run(ctx context.Context, o *options, stderr io.Writer) error {
	h, err := o.daemon.Handler(stderr)
	if err != nil {
		return err
	}
	log := slog.New(h)
	if err := serve(ctx, o, log, stderr); err != nil {
		log.Error("image-gate stopped on an error", "error", err, "version", version.Get().Version)
		return loggedError{err}
	}
	log.Info("image-gate stopped")
	return nil
}

// serve wires the gate: registry client, signer, the service with its
// workers, the poller, and the webhook, metrics and health endpoints.
func serve(ctx context.Context, o *options, log *slog.Logger, stderr io.Writer) error {
	reg, err := o.daemon.RegistryName()
	if err != nil {
		return err
	}
	signer, trust, err := loadKeys(o)
	if err != nil {
		return err
	}
	rc, err := o.daemon.RegistryClient(userAgent(), log)
	if err != nil {
		return err
	}
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := gate.NewMetrics(promReg)
	if err != nil {
		return err
	}
	build := version.Get()
	exe, err := childPath()
	if err != nil {
		return err
	}
	work, err := gate.OpenWorkDir(o.tempDir, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := work.Close(); err != nil {
			log.Warn("removing the gate's folder", "path", work.Path, "error", err)
		}
	}()
	store := o.store()
	store.Prune()
	svc := &gate.Service{
		Store:        store,
		Registry:     rc,
		RegistryName: reg,
		Signer:       signer,
		Trust:        trust,
		Workers:      o.workers,
		PerTenant:    o.perTenant,
		Reserve:      o.reserve,
		// The reserve is a lane for cheap work.
		ReserveMaxBytes: o.reserveMaxSize,
		Budget:          o.budget,
		Metrics:         metrics,
		Logger:          log,
	}
	spool, err := o.spoolPerVerification(svc.MaxRunning())
	if err != nil {
		return err
	}
	if err := o.boot.prepare(ctx, work.Path); err != nil {
		return err
	}
	if o.boot.enabled {
		log.Info("boot check on", "accelerator", o.boot.accel, "deadline", o.boot.deadline, "memoryMiB", o.boot.memoryMiB)
	}
	svc.Verifier = &gate.Verifier{Registry: rc, TempDir: work.Path, MaxVirtualSize: o.maxVirtualSize, MaxSpool: spool, Engine: engine, Version: build.Version, Logger: log, Store: store}
	svc.Isolated = &gate.Child{Path: exe, Args: o.childArgs(spool), TempDir: work.Path, MemoryLimit: o.verifyMemoryLimit,
		CPULimit: o.verifyCPULimit, Timeout: o.verifyTimeout, Stderr: stderr}
	if o.tenantKeysDir != "" {
		if st, err := os.Stat(o.tenantKeysDir); err != nil || !st.IsDir() {
			return fmt.Errorf("--tenant-keys-dir %s: not a folder (%v)", o.tenantKeysDir, err)
		}
		svc.TenantKeys = &gate.TenantKeys{Dir: o.tenantKeysDir}
	}
	if o.leaseNamespace != "" {
		leases, err := newLeases(o)
		if err != nil {
			return err
		}
		svc.Leases = leases
	}
	log.Info("image-gate starting", "version", build.Version, "commit", build.Commit, "registry", reg.RegistryStr(),
		"keyID", signer.KeyID(), "tenantKeysDir", o.tenantKeysDir, "workers", o.workers, "perTenant", o.perTenant, "maxRunning", svc.MaxRunning(), "reserveMaxSize", o.reserveMaxSize,
		"spoolPerVerification", spool, "stateDir", store.Dir, "leaseNamespace", o.leaseNamespace)

	var webhook http.Handler
	if o.daemon.WebhookListen != "" {
		token, err := secretfile.Read(o.daemon.WebhookTokenFile)
		if err != nil {
			return err
		}
		wh, err := intake.NewWebhookHandler(string(bytes.TrimSpace(token)), svc.Add, log)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle(o.daemon.WebhookPath, wh)
		webhook = mux
	}
	scrape := http.NewServeMux()
	scrape.Handle("/metrics", promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}))
	health := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	health.HandleFunc("/healthz", ok)
	health.HandleFunc("/readyz", ok)
	poll := &daemon.PollLoop{Poller: intake.NewPoller(reg, rc, gate.AllTenants{}), Interval: o.daemon.PollInterval, Resync: o.daemon.DigestResyncInterval,
		Waiting: svc.Queued, Polled: svc.Polled, Logger: log}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return svc.Run(ctx) })
	g.Go(func() error { return poll.Run(ctx) })
	for _, srv := range []*daemon.Server{
		{Name: "webhook", Addr: o.daemon.WebhookListen, Handler: webhook},
		{Name: "metrics", Addr: o.daemon.MetricsListen, Handler: scrape},
		{Name: "health", Addr: o.daemon.HealthListen, Handler: health},
	} {
		if srv.Addr != "" {
			srv.ShutdownTimeout, srv.Logger = o.daemon.ShutdownTimeout, log
			g.Go(func() error { return srv.Run(ctx) })
		}
	}
	return g.Wait()
}

// spoolPerVerification is the data one of running verifications at once
// may spool: an equal share of --max-spool, or of nine tenths of the temp
// folder's free space, so that together they never fill it.
func (o *options) spoolPerVerification(running int) (int64, error) {
	total := o.maxSpool
	if total == 0 {
		dir := o.tempDir
		if dir == "" {
			dir = os.TempDir()
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return 0, fmt.Errorf("reading the free space of %s for --max-spool: %w", dir, err)
		}
		total = int64(st.Bavail) * st.Bsize / 10 * 9
	}
	return max(total/int64(running), 1), nil
}

// loadKeys reads the signing key and the key ring of verdicts that count
// as given (the signing key's own by default).
func loadKeys(o *options) (*attest.Signer, *trust.Verifier, error) {
	data, err := secretfile.Read(o.signingKey)
	if err != nil {
		return nil, nil, fmt.Errorf("--signing-key: %w", err)
	}
	var password []byte
	if p, ok := os.LookupEnv(keyPasswordEnv); ok {
		password = []byte(p)
	}
	signer, err := attest.LoadSigner(data, password)
	if err != nil {
		return nil, nil, fmt.Errorf("--signing-key %s: %w", o.signingKey, err)
	}
	keys := []crypto.PublicKey{signer.Public()}
	if o.trustedKeys != "" {
		data, err := secretfile.Read(o.trustedKeys)
		if err != nil {
			return nil, nil, fmt.Errorf("--trusted-keys: %w", err)
		}
		ring, err := attest.ParsePublicKeys(data)
		if err != nil {
			return nil, nil, fmt.Errorf("--trusted-keys %s: %w", o.trustedKeys, err)
		}
		keys = ring
	}
	if !slices.ContainsFunc(keys, func(k crypto.PublicKey) bool {
		id, err := attest.KeyID(k)
		return err == nil && id == signer.KeyID()
	}) {
		return nil, nil, fmt.Errorf("--trusted-keys %s does not hold the signing key's public key: the gate would not recognise its own verdicts", o.trustedKeys)
	}
	verifier, err := trust.NewVerifier(keys)
	return signer, verifier, err
}

// userAgent is the gate's User-Agent, in the registry's logs.
func userAgent() string { return "imagepipe-gate/" + version.Get().Version }

// newLeases builds the Kubernetes Leases replicas share work through,
// held under the pod's name.
func newLeases(o *options) (*gate.KubeLeases, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig of the leases: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	holder, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	return &gate.KubeLeases{Client: cs.CoordinationV1(), Namespace: o.leaseNamespace, Holder: holder + "-" + fmt.Sprint(os.Getpid())}, nil
}
