package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// maxConfigFile bounds the config file read.
const maxConfigFile = 1 << 20

// applyConfigFile sets the flags named in a YAML file, whose keys are the
// flag names ("poll-interval: 5m"). Flags given on the command line win.
// An unknown key is an error, so that a typo is not silently ignored.
func applyConfigFile(flags *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the config file: %w", err)
	}
	if len(data) > maxConfigFile {
		return fmt.Errorf("the config file %s is larger than %d bytes", path, maxConfigFile)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return fmt.Errorf("parsing the config file %s: %w", path, err)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		f := flags.Lookup(key)
		if f == nil || key == "config" {
			return fmt.Errorf("the config file %s has an unknown key %q", path, key)
		}
		if f.Changed {
			continue
		}
		var s string
		switch v := values[key].(type) {
		case []any:
			parts := make([]string, len(v))
			for i, p := range v {
				parts[i] = fmt.Sprint(p)
			}
			s = strings.Join(parts, ",")
		case nil:
			continue
		default:
			s = fmt.Sprint(v)
		}
		if err := flags.Set(key, s); err != nil {
			return fmt.Errorf("the config file %s: %s: %w", path, key, err)
		}
	}
	return nil
}
