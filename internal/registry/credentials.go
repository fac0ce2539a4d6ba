package registry

import (
	"bytes"
	"fmt"
	"io"
	"os"

	dockerconfig "github.com/docker/cli/cli/config"
)

// maxCredentialFile bounds a docker config file read for a credential.
const maxCredentialFile = 64 << 10

// DockerCredentials reads the username and password for host from a docker
// config file of at most maxCredentialFile bytes, without running
// credential helpers.
func DockerCredentials(path, host string) (user, pass string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCredentialFile+1))
	if err != nil {
		return "", "", fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxCredentialFile {
		return "", "", fmt.Errorf("%s is larger than %d bytes", path, maxCredentialFile)
	}
	cf, err := dockerconfig.LoadFromReader(bytes.NewReader(data))
	if err != nil {
		return "", "", fmt.Errorf("parsing the docker config %s: %w", path, err)
	}
	for _, key := range []string{host, "https://" + host, "http://" + host} {
		if ac, ok := cf.GetAuthConfigs()[key]; ok && ac.Username != "" {
			return ac.Username, ac.Password, nil
		}
	}
	return "", "", fmt.Errorf("the docker config %s has no username and password for %s", path, host)
}
