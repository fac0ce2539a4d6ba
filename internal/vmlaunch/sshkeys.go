package vmlaunch

import (
	"fmt"
	"strings"
)

// MaxSSHKeyFile bounds one file of SSH public keys, in bytes.
const MaxSSHKeyFile = 64 << 10

// ParseSSHKeys reads the public keys of an authorized_keys-style file: one
// key per line, blank lines and '#' comments skipped. A line that is not a
// public key is refused, naming its start, so that a private key given by
// mistake never reaches a Secret.
func ParseSSHKeys(data []byte) ([]string, error) {
	var keys []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "ssh-") && !strings.HasPrefix(line, "ecdsa-") && !strings.HasPrefix(line, "sk-") {
			return nil, fmt.Errorf("%q is not an SSH public key (is it the private key?)", line[:min(len(line), 20)])
		}
		keys = append(keys, line)
	}
	return keys, nil
}
