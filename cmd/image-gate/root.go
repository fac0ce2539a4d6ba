package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/daemon"
	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/internal/version"
)

// options are the gate's settings, from flags.
type options struct {
	daemon            daemon.Flags
	signingKey        string
	trustedKeys       string
	tenantKeysDir     string
	workers           int
	perTenant         int
	reserve           int
	reserveMaxSize    int64
	verifyCPULimit    time.Duration
	verifyTimeout     time.Duration
	maxSpool          int64
	budget            gate.Budget
	tempDir           string
	stateDir          string
	maxVirtualSize    int64
	verifyMemoryLimit int64
	kubeconfig        string
	leaseNamespace    string
	boot              bootFlags
}

// DefaultVerifyMemoryLimit is --verify-memory-limit's default: about
// twice the resident memory of a verification of the bench's 4 GiB disk,
// the Go runtime and the binary's pages included.
const DefaultVerifyMemoryLimit = 128 << 20

func newRootCmd() *cobra.Command { return newRootCmdWith(&options{}) }

func newRootCmdWith(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image-gate --registry HOST[:PORT] --signing-key FILE [flags]",
		Short: "Verify every image tenants push, publish its canonical form and sign the verdict",
		Long: `image-gate runs beside the central registry. It learns of pushed images
from registry webhooks and from polling, reads each pushed digest in full
(manifest, config, every byte of the layer, every table and cluster of the
disk), writes the canonical containerDisk into the same repository by
digest, and attaches a verdict signed with --signing-key as an OCI 1.1
referrer. Hubs import only images with an accepted verdict signed by one of
the provider's keys, and only the canonical image it names.

Each digest is verified once: a digest with a verdict signed by one of
--trusted-keys is not verified again (a restart redoes nothing), and with
--lease-namespace replicas share the work through Kubernetes Leases, one
replica per digest at a time.

With --tenant-keys-dir, a tenant that has a key file there must sign what
it pushes: an unsigned image, or one signed by no key of that tenant, is
refused (unsigned, untrusted-signature) without being read, and looked at
again when a signature is pushed for it.

Its own registry credential (--docker-config) must read every tenant
repository and push canonical images and verdicts into it.`,
		Version:       version.Get().String(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.AddCommand(verifyOneCmd(o))
	cmd.AddCommand(inspectOneCmd())
	f := cmd.PersistentFlags()
	o.daemon.Register(f)
	f.StringVar(&o.signingKey, "signing-key", "", "PEM private key verdicts are signed with: PKCS#8 or EC, ECDSA P-256/P-384 or Ed25519, or a cosign key with its password in $"+keyPasswordEnv+" (required)")
	f.StringVar(&o.trustedKeys, "trusted-keys", "", "PEM public keys whose verdicts count as given (add the old key while rotating); default: the signing key's")
	f.StringVar(&o.tenantKeysDir, "tenant-keys-dir", "", "folder of the tenants' signature policy: TENANT.pub holds the PEM public keys one of which must have signed each image TENANT pushes (cosign sign --key, imagectl sign); tenants without a file need no signature. Read for each image, so edits apply at once")
	f.IntVar(&o.workers, "workers", gate.DefaultWorkers, "verifications at once")
	f.IntVar(&o.perTenant, "per-tenant", gate.DefaultPerTenant, "verifications of one tenant at once")
	f.IntVar(&o.reserve, "reserve", 0, "verifications beyond --workers that may run for tenants with none running, so that a tenant's image does not wait for others' long verifications (default: half of --workers)")
	f.Int64Var(&o.reserveMaxSize, "reserve-max-size", gate.DefaultReserveMaxBytes, "what an image verified in a --reserve slot may declare, in bytes (its layer, disk/disk.img in the tar, a qcow2's virtual size): one declaring more stops at once and waits for a --workers slot, so that a tenant with none running waits at most for the reserve verifications ahead of it")
	f.DurationVar(&o.verifyCPULimit, "verify-cpu-limit", time.Hour, "CPU time one verification may use; past it the image is refused (verification-limit). 0: no limit")
	f.DurationVar(&o.verifyTimeout, "verify-timeout", 3*time.Hour, "time one verification may take; past it three times in a row the image is refused (verification-limit). 0: no limit")
	f.Int64Var(&o.maxSpool, "max-spool", 0, "bytes of disk data all verifications at once may spool in --temp-dir, shared equally between them; past its share an image is refused (verification-limit) (default: 90% of --temp-dir's free space at start)")
	f.DurationVar(&o.budget.Window, "tenant-budget-window", gate.DefaultBudgetWindow, "window of the tenants' budgets: past a budget within it, a tenant's next verification waits")
	f.DurationVar(&o.budget.CPU, "tenant-budget-cpu", gate.DefaultBudgetCPU, "CPU time one tenant's verifications may use per --tenant-budget-window (0: no bound)")
	f.Int64Var(&o.budget.Decompressed, "tenant-budget-decompressed", gate.DefaultBudgetDecompressed, "bytes one tenant's verifications may decompress per --tenant-budget-window (0: no bound)")
	f.Int64Var(&o.budget.Spooled, "tenant-budget-spooled", gate.DefaultBudgetSpooled, "bytes one tenant's verifications may spool per --tenant-budget-window (0: no bound)")
	f.StringVar(&o.stateDir, "state-dir", "", "folder of the gate's own record of the layers it read and the verdicts it gave, so that no layer is read twice and a verdict hidden in the registry is published again, not computed again; keep it on a volume that outlives restarts (default: gate-store in --temp-dir)")
	f.StringVar(&o.tempDir, "temp-dir", "", "folder where the gate makes its own, image-gate-*, for the disks being verified (sparse files; at most one disk's size per verification, none for imagectl's qcow2 disks; default: $TMPDIR); at start it removes the folders of gates that are gone, never a running gate's")
	f.Int64Var(&o.maxVirtualSize, "max-virtual-size", gate.DefaultMaxVirtualSize, "largest guest disk accepted, in bytes")
	f.Int64Var(&o.verifyMemoryLimit, "verify-memory-limit", DefaultVerifyMemoryLimit, "resident memory one verification may use, in bytes: each runs in a process of its own, stopped past this limit without stopping the others (0: no limit)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster holding the leases (default: in-cluster)")
	f.StringVar(&o.leaseNamespace, "lease-namespace", "", "namespace of the per-digest Leases replicas share work through; empty runs without (one replica)")
	o.boot.register(f)
	return cmd
}

// store is the gate's Store, in --state-dir.
func (o *options) store() *gate.Store {
	dir := o.stateDir
	if dir == "" {
		base := o.tempDir
		if base == "" {
			base = os.TempDir()
		}
		dir = filepath.Join(base, "gate-store")
	}
	return &gate.Store{Dir: dir}
}

func (o *options) validate() error {
	errs := []error{o.daemon.Validate()}
	if o.signingKey == "" {
		errs = append(errs, errors.New("--signing-key is required: verdicts are signed"))
	}
	if o.reserve < 0 || o.maxSpool < 0 || o.verifyCPULimit < 0 || o.verifyTimeout < 0 {
		errs = append(errs, errors.New("--reserve, --max-spool, --verify-cpu-limit and --verify-timeout: want 0 or more"))
	}
	if o.budget.Window < time.Minute {
		errs = append(errs, fmt.Errorf("--tenant-budget-window %s: want at least a minute", o.budget.Window))
	}
	if o.workers < 1 || o.perTenant < 1 {
		errs = append(errs, fmt.Errorf("--workers %d and --per-tenant %d: want at least 1", o.workers, o.perTenant))
	}
	if o.verifyMemoryLimit != 0 && o.verifyMemoryLimit < 32<<20 {
		errs = append(errs, fmt.Errorf("--verify-memory-limit %d: want 0 (no limit) or at least 32 MiB", o.verifyMemoryLimit))
	}
	if o.reserveMaxSize < 1<<20 {
		errs = append(errs, fmt.Errorf("--reserve-max-size %d: want at least 1 MiB", o.reserveMaxSize))
	}
	if o.maxVirtualSize < 1<<20 {
		errs = append(errs, fmt.Errorf("--max-virtual-size %d: want at least 1 MiB", o.maxVirtualSize))
	}
	errs = append(errs, o.boot.validate())
	return errors.Join(errs...)
}
