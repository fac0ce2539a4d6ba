package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/internal/version"
)

// registryFlags are the registry connection flags of every command that
// talks to a registry.
type registryFlags struct {
	username      string
	passwordStdin bool
	chunkSize     int
	// tls are --ca-file and --insecure, shared with the source flags of
	// the same command.
	tls *tlsFlags
	// built is the client made from the flags: a command that built none
	// has no registry errors to explain.
	built *registry.Client
	// basicUser is the user name the client sends with WithBasicAuth: the
	// --username of the client's flags, or the user login checks.
	basicUser string
}

// addRegistryFlags adds the connection flags to cmd, and makes the
// registry errors its RunE returns say in a sentence what is wrong and
// what to do (explain).
func addRegistryFlags(cmd *cobra.Command, f *registryFlags) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			err := run(c, args)
			if f.built == nil {
				return err
			}
			return explain(f.user, err, errors.Is(err, registry.ErrResumable))
		}
	}
	cmd.Flags().StringVar(&f.username, "username", "", "registry username (default: ~/.docker/config.json and credential helpers)")
	cmd.Flags().BoolVar(&f.passwordStdin, "password-stdin", false, "read the registry password from standard input")
	f.tls = addTLSFlags(cmd, tlsForRegistry)
}

// tlsFlags are --ca-file and --insecure. A command has one of each, which
// applies to every TLS connection it makes: to registries and to https://
// and S3 sources alike.
type tlsFlags struct {
	caFile   string
	insecure bool
	// users says which flag groups share the flags, for their help.
	users tlsUsers
}

// tlsUsers are the flag groups that use the TLS flags of a command.
type tlsUsers int

const (
	tlsForRegistry tlsUsers = 1 << iota
	tlsForSource
)

// caFileValue is the value of --ca-file, through which a second flag
// group of the same command finds the tlsFlags the first one added.
type caFileValue struct{ f *tlsFlags }

func (v caFileValue) String() string     { return v.f.caFile }
func (v caFileValue) Set(s string) error { v.f.caFile = s; return nil }
func (v caFileValue) Type() string       { return "string" }

// addTLSFlags adds --ca-file and --insecure to cmd for the flag group
// user, or, when another group of cmd added them already, returns that
// group's and words their help for both.
func addTLSFlags(cmd *cobra.Command, user tlsUsers) *tlsFlags {
	var f *tlsFlags
	if fl := cmd.Flags().Lookup("ca-file"); fl != nil {
		f = fl.Value.(caFileValue).f
	} else {
		f = &tlsFlags{}
		cmd.Flags().Var(caFileValue{f}, "ca-file", "")
		cmd.Flags().BoolVar(&f.insecure, "insecure", false, "")
	}
	f.users |= user
	caFile, insecure := cmd.Flags().Lookup("ca-file"), cmd.Flags().Lookup("insecure")
	switch f.users {
	case tlsForRegistry:
		caFile.Usage = "PEM file of extra CA certificates to trust"
		insecure.Usage = "allow plain HTTP and skip TLS verification (127.0.0.1 and localhost never need it for HTTP)"
	case tlsForSource:
		caFile.Usage = "PEM file of extra CA certificates to trust for https:// and S3 sources"
		insecure.Usage = "skip TLS verification of https:// and S3 sources"
	default:
		caFile.Usage = "PEM file of extra CA certificates to trust, for the registry and for https:// and S3 sources"
		insecure.Usage = "skip TLS verification of the registry and of https:// and S3 sources, and allow plain HTTP to the registry (127.0.0.1 and localhost never need it for HTTP)"
	}
	return f
}

// addChunkFlag adds --chunk-size to commands that upload layers.
func addChunkFlag(cmd *cobra.Command, f *registryFlags) {
	cmd.Flags().IntVar(&f.chunkSize, "chunk-size", registry.DefaultChunkSize, "bytes per upload request; at most this much is sent again after a broken connection")
}

// client builds a registry client from the flags, with the command's own
// options (e.g. --platform's) after them.
func (f *registryFlags) client(g *globalOptions, extra ...registry.Option) (*registry.Client, error) {
	opts := []registry.Option{
		registry.WithLogger(g.logger()),
		registry.WithInsecure(f.tls.insecure),
		registry.WithUserAgent("imagectl/" + version.Version),
	}
	if f.tls.caFile != "" {
		opts = append(opts, registry.WithCAFile(f.tls.caFile))
	}
	if f.chunkSize != 0 {
		opts = append(opts, registry.WithChunkSize(f.chunkSize))
	}
	if f.passwordStdin && f.username == "" {
		return nil, &usageError{errors.New("--password-stdin needs --username")}
	}
	if f.username != "" {
		password, err := f.password()
		if err != nil {
			return nil, err
		}
		opts = append(opts, registry.WithBasicAuth(f.username, password))
		f.basicUser = f.username
	}
	client, err := registry.New(append(opts, extra...)...)
	f.built = client
	return client, err
}

// user is the user name the built client sends to host, "" for none: the
// one a registry's refusal names. Without basic auth, the client resolves
// its credentials from authn.DefaultKeychain (~/.docker/config.json and
// credential helpers), and so does user.
func (f *registryFlags) user(host string) string {
	if f.basicUser != "" {
		return f.basicUser
	}
	reg, err := name.NewRegistry(host, name.StrictValidation)
	if err != nil {
		return ""
	}
	auth, err := authn.DefaultKeychain.Resolve(reg)
	if err != nil || auth == authn.Anonymous {
		return ""
	}
	cfg, err := auth.Authorization()
	if err != nil {
		return ""
	}
	return cfg.Username
}

// names turns parsed references into go-containerregistry's names with
// --insecure in them.
func (f *registryFlags) names() registry.Names {
	return registry.Names{Insecure: f.tls.insecure}
}

// parseImage parses s as an image reference (imageref.FormImage) and
// names it with --insecure in the name.
func (f *registryFlags) parseImage(s string) (name.Reference, error) {
	r, err := imageref.Parse(s, imageref.FormImage)
	if err != nil {
		return nil, err
	}
	return f.names().Reference(r)
}

// password reads the password for --username: the first line of standard
// input with --password-stdin, else typed at a prompt when standard input
// is a terminal. Anything else is an error, not an empty password.
func (f *registryFlags) password() (string, error) {
	if f.passwordStdin {
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return "", fmt.Errorf("reading the password from standard input: %w", err)
		}
		return strings.TrimRight(line, "\r\n"), nil
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return "", &usageError{fmt.Errorf("--username %s needs a password: pass it on standard input with --password-stdin, or log in once with imagectl login", f.username)}
	}
	fmt.Fprintf(os.Stderr, "Password for %s: ", f.username)
	b, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return "", fmt.Errorf("reading the password: %w", err)
	}
	if len(b) == 0 {
		return "", errors.New("no password typed")
	}
	return string(b), nil
}

// sourceFlags locate and check a source image (local, http(s), s3, stdin).
type sourceFlags struct {
	checksum   string
	s3Endpoint string
	s3Region   string
	s3Insecure bool
	tempDir    string
	maxSpool   int64
	// tls are --ca-file and --insecure, shared with the registry flags of
	// the same command.
	tls *tlsFlags
}

func addSourceFlags(cmd *cobra.Command, f *sourceFlags) {
	cmd.Flags().StringVar(&f.checksum, "checksum", "", "expected sha256 of the source as given (sha256:HEX); the import fails on a mismatch")
	cmd.Flags().StringVar(&f.s3Endpoint, "s3-endpoint", "", "S3 endpoint host:port or URL (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL)")
	cmd.Flags().StringVar(&f.s3Region, "s3-region", "", "S3 region (default: AWS_REGION)")
	cmd.Flags().BoolVar(&f.s3Insecure, "s3-insecure", false, "use plain HTTP for an --s3-endpoint given without a scheme (http:// and https:// endpoints say it themselves)")
	cmd.Flags().StringVar(&f.tempDir, "temp-dir", "", "where downloaded or decompressed sources are spooled (default: $TMPDIR); at least 64 MiB are always left free")
	f.maxSpool = source.DefaultMaxSpool
	cmd.Flags().Var(sizeFlag{&f.maxSpool}, "max-spool", "most temporary space one downloaded or decompressed source may take in --temp-dir (e.g. 200GiB); a local uncompressed file is never copied")
	f.tls = addTLSFlags(cmd, tlsForSource)
}

func (f *sourceFlags) options(g *globalOptions, maxVirtual int64, progress func(done, total int64)) source.Options {
	return source.Options{
		Checksum: f.checksum,
		TempDir:  f.tempDir,
		MaxSize:  convert.SpoolLimit(maxVirtual),
		MaxSpool: cmp.Or(f.maxSpool, -1), // --max-spool 0: never spool
		S3: source.S3Options{
			Endpoint: f.s3Endpoint,
			Region:   f.s3Region,
			Insecure: f.s3Insecure,
		},
		CAFile:             f.tls.caFile,
		InsecureSkipVerify: f.tls.insecure,
		Logger:             g.logger(),
		Progress:           progress,
	}
}
