package credstore

import (
	"bytes"
	"fmt"
	"io"
	"os"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/types"
)

// maxCredentialFile bounds a docker config file read for a credential.
const maxCredentialFile = 64 << 10

// Read reads the username and password for host from a docker
// config file of at most maxCredentialFile bytes, without running
// credential helpers.
func Read(path, host string) (user, pass string, err error) {
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

// Save stores user and password for host where docker, crane,
// skopeo and internal/registry's default keychain read them: the docker config
// ($DOCKER_CONFIG/config.json, else ~/.docker/config.json), or the
// credential helper it names. It returns the config file's path.
func Save(host, user, password string) (string, error) {
	cf, err := dockerconfig.Load(dockerconfig.Dir())
	if err != nil {
		return "", fmt.Errorf("reading the docker config: %w", err)
	}
	store := cf.GetCredentialsStore(host)
	if err := store.Store(types.AuthConfig{ServerAddress: host, Username: user, Password: password}); err != nil {
		return "", fmt.Errorf("storing the credentials for %s: %w", host, err)
	}
	if err := cf.Save(); err != nil {
		return "", fmt.Errorf("writing %s: %w", cf.Filename, err)
	}
	return cf.Filename, nil
}

// Erase removes the credentials for host from the docker
// config (or its credential helper). It reports whether there were any,
// and the config file's path.
func Erase(host string) (bool, string, error) {
	cf, err := dockerconfig.Load(dockerconfig.Dir())
	if err != nil {
		return false, "", fmt.Errorf("reading the docker config: %w", err)
	}
	store := cf.GetCredentialsStore(host)
	had, err := store.Get(host)
	if err != nil {
		return false, cf.Filename, fmt.Errorf("reading the credentials for %s: %w", host, err)
	}
	if had.Username == "" && had.Password == "" && had.IdentityToken == "" {
		return false, cf.Filename, nil
	}
	if err := store.Erase(host); err != nil {
		return false, cf.Filename, fmt.Errorf("removing the credentials for %s: %w", host, err)
	}
	if err := cf.Save(); err != nil {
		return false, cf.Filename, fmt.Errorf("writing %s: %w", cf.Filename, err)
	}
	return true, cf.Filename, nil
}
