package main

import (
	"encoding/json"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/gate"
)

// inspectOneCmd is the command a verification runs, as a process of its
// own, to read the guest of the disk it verified (gate.Inspector): the
// disk is its file 3; it bounds its own memory and CPU time first, then
// prints the guest report as JSON.
func inspectOneCmd() *cobra.Command {
	var size, maxVirtualSize, memory int64
	var cpu time.Duration
	var format string
	cmd := &cobra.Command{
		Use:    "inspect-one",
		Short:  "Read the guest of a verified disk given as file 3 and print the report (run by each verification)",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := gate.LimitInspection(memory, cpu); err != nil {
				return err
			}
			rep, err := gate.InspectOne(cmd.Context(), os.NewFile(3, "disk"), size, maxVirtualSize, format)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
		},
	}
	f := cmd.Flags()
	f.Int64Var(&size, "disk-size", 0, "the disk's size in bytes")
	f.Int64Var(&maxVirtualSize, "max-virtual-size", 0, "the virtual size the disk was verified under")
	f.StringVar(&format, "format", "", "the format the disk was verified as (empty: detected)")
	f.Int64Var(&memory, "memory-limit", gate.DefaultInspectMemory, "data the process may hold, in bytes")
	f.DurationVar(&cpu, "cpu-limit", gate.DefaultInspectCPU, "CPU time the process may use")
	return cmd
}
