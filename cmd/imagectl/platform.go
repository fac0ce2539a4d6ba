package main

import (
	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/registry"
)

// platformFlag is --platform os/arch[/variant], crane's spelling, checked
// as it is parsed (registry.ParsePlatform: linux only, a known
// architecture and variant). It is nil until given.
type platformFlag struct{ p **registry.Platform }

func (f platformFlag) String() string {
	if *f.p == nil {
		return ""
	}
	return (*f.p).String()
}

func (f platformFlag) Set(s string) error {
	p, err := registry.ParsePlatform(s)
	if err != nil {
		return err
	}
	*f.p = &p
	return nil
}

func (platformFlag) Type() string { return "os/arch[/variant]" }

// addPlatformFlag adds --platform with usage; *p stays nil unless it is
// given.
func addPlatformFlag(cmd *cobra.Command, p **registry.Platform, usage string) {
	cmd.Flags().Var(platformFlag{p}, "platform", usage)
}

// platformOption is the client option for a --platform, if one was given.
func platformOption(p *registry.Platform) []registry.Option {
	if p == nil {
		return nil
	}
	return []registry.Option{registry.WithPlatform(*p)}
}
