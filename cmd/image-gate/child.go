package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// verifyOneCmd is the command the gate runs as a child process for each
// verification (gate.Child): it gets ready, reads one task (a subject and
// its manifest, gate.ReadTask; the subject alone when run by hand) from
// its standard input, verifies it (exiting gate.ExitLarge at once when
// the image declares more than the task's limit),
// publishes its canonical image and prints the verdict as JSON. It signs
// nothing and reads no signing key; the parent signs. Standard input
// ending without a subject ends it quietly.
func verifyOneCmd(o *options) *cobra.Command {
	var tempDir string
	var maxSpool int64
	cmd := &cobra.Command{
		Use:    "verify-one",
		Short:  "Verify one pushed digest, read from standard input, and print the verdict (run by image-gate for each verification)",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reg, err := o.daemon.RegistryName()
			if err != nil {
				return err
			}
			gate.LimitSelf(o.verifyMemoryLimit)
			h, err := o.daemon.Handler(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			task, ok, err := gate.ReadTask(cmd.InOrStdin(), registry.NameOptions(reg)...)
			if err != nil || !ok {
				return err // !ok: stopped before it was given a subject
			}
			subject, manifest := task.Subject, task.Manifest
			ctx := gate.WithMaxDeclared(cmd.Context(), task.MaxDeclared)
			log := slog.New(h).With("subject", subject.String())
			rc, err := o.daemon.RegistryClient(userAgent(), log)
			if err != nil {
				return err
			}
			exe, err := childPath()
			if err != nil {
				return err
			}
			v := &gate.Verifier{Registry: rc, TempDir: tempDir, MaxVirtualSize: o.maxVirtualSize, MaxSpool: maxSpool, Engine: engine, Version: version.Get().Version, Logger: log, Store: o.store(),
				Inspector: &gate.Inspector{Path: exe, Args: []string{"inspect-one"}}}
			if v.BootCheck, err = o.boot.check(tempDir); err != nil {
				return err
			}
			var verdict *api.Verdict
			if manifest == nil {
				verdict, err = v.Verify(ctx, subject)
			} else {
				verdict, err = v.VerifyManifest(ctx, subject, manifest)
			}
			if errors.Is(err, gate.ErrLarge) {
				// Not a failure: the parent runs it again in a worker slot.
				log.Info("the image declares more than a reserve slot takes", "error", err)
				os.Exit(gate.ExitLarge)
			}
			if err != nil {
				return err
			}
			// The verdict, then what it cost, for the tenant's budget.
			enc := json.NewEncoder(cmd.OutOrStdout())
			if err := enc.Encode(verdict); err != nil {
				return err
			}
			return enc.Encode(v.Spent())
		},
	}
	f := cmd.Flags()
	f.StringVar(&tempDir, "verify-temp-dir", "", "folder for the disk being verified")
	f.Int64Var(&maxSpool, "verify-max-spool", 0, "data this verification may spool, in bytes (0: no bound)")
	return cmd
}

// childArgs are the arguments of verify-one that carry the parent's
// settings, with maxSpool the data one verification may spool (gate.Child
// adds the folder).
func (o *options) childArgs(maxSpool int64) []string {
	args := []string{"verify-one",
		"--verify-max-spool", strconv.FormatInt(maxSpool, 10),
		"--registry", o.daemon.Registry,
		"--max-virtual-size", strconv.FormatInt(o.maxVirtualSize, 10),
		"--state-dir", o.store().Dir,
		"--verify-memory-limit", strconv.FormatInt(o.verifyMemoryLimit, 10),
		"--log-format", o.daemon.LogFormat, "--log-level", o.daemon.LogLevel,
	}
	if o.daemon.RegistryCAFile != "" {
		args = append(args, "--registry-ca-file", o.daemon.RegistryCAFile)
	}
	if o.daemon.RegistryInsecure {
		args = append(args, "--registry-insecure")
	}
	if o.daemon.DockerConfig != "" {
		args = append(args, "--docker-config", o.daemon.DockerConfig)
	}
	return append(args, o.boot.args()...)
}

// childPath is the gate's own executable, run for each verification.
func childPath() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", errors.New("finding the gate's own executable for its verifications: " + err.Error())
	}
	return exe, nil
}
