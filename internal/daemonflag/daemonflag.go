// Package daemonflag reads the flags image-syncer and image-gate share: the
// registry they serve (--registry, --registry-insecure) and the log level
// (--log-level). Errors name the flag and what it takes.
package daemonflag

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Registry is --registry with --registry-insecure in it, where
// go-containerregistry reads it; every name on the registry derives from
// it (registry.NameOptions).
func Registry(host string, insecure bool) (name.Registry, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(host, opts...)
	if err != nil {
		return name.Registry{}, fmt.Errorf("--registry %q: %w", host, err)
	}
	return reg, nil
}

// Level is --log-level: debug, info, warn or error, in any case.
func Level(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
