// Command imagebuild builds imagepipe's container images, image-syncer, image-gate and
// imagectl, and pushes them as multi-platform OCI indexes, without a
// container runtime; `make images` and `make release-config` run it.
//
// For each binary and platform (linux/amd64, linux/arm64) it cross-compiles
// the binary (CGO_ENABLED=0, -trimpath, no ISA-L, the version and commit
// stamped into internal/version) and builds an image of two layers it
// writes itself:
//
//   - a base layer: /etc/passwd and /etc/group with root and the user
//     nonroot (65532), /home/nonroot, /tmp (1777), and the CA bundle
//     /etc/ssl/certs/ca-certificates.crt, made from the Mozilla roots of
//     the Go module golang.org/x/crypto/x509roots/fallback at the version
//     go.mod pins;
//   - a binary layer: /usr/local/bin/NAME, mode 0755, owned by root.
//
// The image runs as 65532:65532 with the binary as its entrypoint. Every
// timestamp is SOURCE_DATE_EPOCH (default: the commit time of HEAD), so
// the same source and Go toolchain give the same digests. Each platform
// image gets an SPDX JSON SBOM made from the binary's build information,
// pushed as an OCI referrer of the image.
//
// It prints one line per image, REGISTRY/PATH/NAME:TAG@sha256:..., and with
// -kustomization pins the image-syncer index by digest in a kustomization's
// images: entry, as `kustomize edit set image NAME=REPO@DIGEST` would.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	results, err := buildAndPush(ctx, log, o)
	if err != nil {
		return err
	}
	for _, r := range results {
		fmt.Printf("%s@%s\n", r.tag, r.digest)
	}
	if o.kustomization == "" {
		return nil
	}
	for _, r := range results {
		if r.binary == pinnedBinary {
			if err := pinImage(o.kustomization, o.kustomizeName, r.tag.Context().Name(), r.digest); err != nil {
				return err
			}
			log.Info("pinned", "kustomization", o.kustomization, "image", o.kustomizeName, "to", r.tag.Context().Name()+"@"+r.digest)
		}
	}
	return nil
}

// pinnedBinary is the image a kustomization of config/ deploys.
const pinnedBinary = "image-syncer"

// options are the command line of imagebuild.
type options struct {
	registry        string // HOST[:PORT]/PATH the images go under
	tag             string
	version         string
	revision        string
	source          string
	sourceDateEpoch int64
	insecure        bool
	sbom            bool
	kustomization   string // file whose images: entry gets the image-syncer digest
	kustomizeName   string // the image name the manifests use, which the entry replaces
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("imagebuild", flag.ContinueOnError)
	fs.StringVar(&o.registry, "registry", "", "where the images go, HOST[:PORT]/PATH (required): PATH/image-syncer, PATH/image-gate and PATH/imagectl")
	fs.StringVar(&o.tag, "tag", "", "the tag to push (default: the version)")
	fs.StringVar(&o.version, "version", "", "the version stamped into the binaries and labels (default: git describe --always --dirty)")
	fs.StringVar(&o.revision, "revision", "", "the commit stamped into the binaries and labels (default: git rev-parse HEAD)")
	fs.StringVar(&o.source, "source", "https://github.com/imagepipe/imagepipe", "the org.opencontainers.image.source label")
	fs.Int64Var(&o.sourceDateEpoch, "source-date-epoch", -1, "every timestamp in the images, in seconds since 1970 (default: $SOURCE_DATE_EPOCH, else the commit time of HEAD, else 0)")
	fs.BoolVar(&o.insecure, "insecure", false, "allow a registry on plain HTTP or with a certificate that is not trusted (127.0.0.1 and localhost may use plain HTTP without it)")
	fs.BoolVar(&o.sbom, "sbom", true, "push an SPDX JSON SBOM of each image as its referrer")
	fs.StringVar(&o.kustomization, "kustomization", "", "after pushing, pin the image-syncer index by digest in this kustomization.yaml")
	fs.StringVar(&o.kustomizeName, "kustomize-name", "ghcr.io/imagepipe/image-syncer", "the image name config/syncer's Deployment uses, which -kustomization's entry replaces")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.registry = strings.TrimSuffix(o.registry, "/")
	if o.registry == "" {
		return o, errors.New("-registry HOST[:PORT]/PATH is required (make images IMG_REGISTRY=...)")
	}
	if o.version == "" {
		o.version = gitOutput("describe", "--always", "--dirty")
		if o.version == "" {
			o.version = "dev"
		}
	}
	if o.tag == "" {
		o.tag = o.version
	}
	if o.revision == "" {
		o.revision = gitOutput("rev-parse", "HEAD")
	}
	if o.sourceDateEpoch < 0 {
		epoch, err := sourceDateEpoch()
		if err != nil {
			return o, err
		}
		o.sourceDateEpoch = epoch
	}
	return o, nil
}
