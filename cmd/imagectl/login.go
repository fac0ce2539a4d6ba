package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/imagepipe/imagepipe/internal/credstore"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type loginOptions struct {
	*globalOptions
	registryFlags
	host string
	out  outputFlags
}

func newLoginCmd(g *globalOptions) *cobra.Command {
	o := &loginOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "login REGISTRY",
		Short: "Save credentials for a registry where docker, crane and skopeo find them too",
		Long: `Checks the credentials with the registry (its /v2/ endpoint, and the token
exchange where it uses tokens) and saves them in the docker config:
$DOCKER_CONFIG/config.json, else ~/.docker/config.json, or the credential
helper that file names. imagectl, crane, skopeo and docker read them from there.

The password comes from standard input with --password-stdin, or is typed at a
prompt when standard input is a terminal; --username is asked for there too.
Wrong credentials are not saved.`,
		Example: `  imagectl login registry.example.com --username alice
  echo "$TOKEN" | imagectl login registry.example.com --username alice --password-stdin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.host = args[0]
			return runLogin(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	return cmd
}

func runLogin(cmd *cobra.Command, o *loginOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	if o.username == "" {
		if o.passwordStdin || !term.IsTerminal(int(os.Stdin.Fd())) {
			return &usageError{errors.New("login needs --username (or a terminal to ask for it)")}
		}
		fmt.Fprint(os.Stderr, "Username: ")
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return fmt.Errorf("reading the username: %w", err)
		}
		if o.username = strings.TrimSpace(line); o.username == "" {
			return errors.New("no username typed")
		}
	}
	password, err := o.password()
	if err != nil {
		return err
	}
	// The client gets the credentials as they are now, not from the
	// flags, which would read the password again.
	user := o.username
	o.username, o.passwordStdin = "", false
	o.basicUser = user
	client, err := o.registryFlags.client(o.globalOptions, registry.WithBasicAuth(user, password))
	if err != nil {
		return err
	}
	reg, err := parseRegistry(o.names(), o.host)
	if err != nil {
		return err
	}
	if err := client.CheckAccess(cmd.Context(), reg, ""); err != nil {
		return err
	}
	path, err := credstore.Save(reg.RegistryStr(), user, password)
	if err != nil {
		return err
	}
	res := api.LoginResult{Registry: reg.RegistryStr(), Username: user, ConfigFile: path, Changed: true}
	return o.out.print(cmd.OutOrStdout(), res, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "Login Succeeded: credentials for %s saved in %s\n", res.Registry, path)
		return err
	})
}

type logoutOptions struct {
	*globalOptions
	host string
	out  outputFlags
}

func newLogoutCmd(g *globalOptions) *cobra.Command {
	o := &logoutOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "logout REGISTRY",
		Short: "Remove the saved credentials for a registry",
		Long: `Removes the credentials for REGISTRY from the docker config (or its credential
helper), where imagectl login, docker login and crane auth login save them.
Logging out of a registry without saved credentials is not an error.`,
		Example: `  imagectl logout registry.example.com`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.host = args[0]
			return runLogout(cmd, o)
		},
	}
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	return cmd
}

func runLogout(cmd *cobra.Command, o *logoutOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	reg, err := parseRegistry(registry.Names{}, o.host)
	if err != nil {
		return err
	}
	had, path, err := credstore.Erase(reg.RegistryStr())
	if err != nil {
		return err
	}
	res := api.LoginResult{Registry: reg.RegistryStr(), ConfigFile: path, Changed: had}
	return o.out.print(cmd.OutOrStdout(), res, func(w io.Writer) error {
		msg := fmt.Sprintf("Removed the credentials for %s from %s\n", res.Registry, path)
		if !had {
			msg = fmt.Sprintf("Not logged in to %s: %s holds no credentials for it\n", res.Registry, path)
		}
		_, err := io.WriteString(w, msg)
		return err
	})
}

// parseRegistry parses host as login and logout take it
// (imageref.FormRegistry) and names it with names.
func parseRegistry(names registry.Names, host string) (name.Registry, error) {
	r, err := imageref.Parse(host, imageref.FormRegistry)
	if err != nil {
		return name.Registry{}, err
	}
	return names.Registry(r)
}
