package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/internal/version"
)

// registryFlags are the registry connection flags of every command that
// talks to a registry.
type registryFlags struct {
	username      string
	passwordStdin bool
	caFile        string
	insecure      bool
	chunkSize     int
	// built is the client made from the flags, kept to explain the
	// command's registry errors.
	built *registry.Client
}

// addRegistryFlags adds the connection flags to cmd, and makes the
// registry errors its RunE returns say in a sentence what is wrong and
// what to do (registry.Client.Explain).
func addRegistryFlags(cmd *cobra.Command, f *registryFlags) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			err := run(c, args)
			if f.built == nil {
				return err
			}
			return f.built.Explain(err, errors.Is(err, registry.ErrResumable))
		}
	}
	cmd.Flags().StringVar(&f.username, "username", "", "registry username (default: ~/.docker/config.json and credential helpers)")
	cmd.Flags().BoolVar(&f.passwordStdin, "password-stdin", false, "read the registry password from standard input")
	cmd.Flags().StringVar(&f.caFile, "ca-file", "", "PEM file of extra CA certificates to trust")
	cmd.Flags().BoolVar(&f.insecure, "insecure", false, "allow plain HTTP and skip TLS verification (127.0.0.1 and localhost never need it for HTTP)")
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
		registry.WithInsecure(f.insecure),
		registry.WithUserAgent("imagectl/" + version.Version),
	}
	if f.caFile != "" {
		opts = append(opts, registry.WithCAFile(f.caFile))
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
	}
	client, err := registry.New(append(opts, extra...)...)
	f.built = client
	return client, err
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
}

func addSourceFlags(cmd *cobra.Command, f *sourceFlags) {
	cmd.Flags().StringVar(&f.checksum, "checksum", "", "expected sha256 of the source as given (sha256:HEX); the import fails on a mismatch")
	cmd.Flags().StringVar(&f.s3Endpoint, "s3-endpoint", "", "S3 endpoint host:port or URL (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL)")
	cmd.Flags().StringVar(&f.s3Region, "s3-region", "", "S3 region (default: AWS_REGION)")
	cmd.Flags().BoolVar(&f.s3Insecure, "s3-insecure", false, "use plain HTTP for an S3 endpoint given without a scheme")
	cmd.Flags().StringVar(&f.tempDir, "temp-dir", "", "where downloaded or decompressed sources are spooled (default: $TMPDIR); at least 64 MiB are always left free")
	f.maxSpool = source.DefaultMaxSpool
	cmd.Flags().Var(sizeFlag{&f.maxSpool}, "max-spool", "most temporary space one downloaded or decompressed source may take in --temp-dir (e.g. 200GiB); a local uncompressed file is never copied")
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
		Logger:   g.logger(),
		Progress: progress,
	}
}
