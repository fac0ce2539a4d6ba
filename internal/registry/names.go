package registry

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/imageref"
)

// Names turns references parsed by internal/imageref into
// go-containerregistry's names, with StrictValidation. Insecure (a
// command's --insecure, the Client's WithInsecure) is carried into each
// name, which is where go-containerregistry reads it: without it, plain
// HTTP is tried only for localhost, loopback and private addresses.
type Names struct {
	Insecure bool
}

// options are go-containerregistry's options for names n makes.
func (n Names) options() []name.Option {
	nopts := []name.Option{name.StrictValidation}
	if n.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	return nopts
}

// NameOptions are the go-containerregistry options that parse a name on
// reg with reg's scheme. go-containerregistry keeps "insecure" (plain
// HTTP allowed) in each name rather than in the client, so a name parsed
// without it would be reached over HTTPS only.
func NameOptions(reg name.Registry) []name.Option {
	if reg.Scheme() == "http" {
		return []name.Option{name.Insecure}
	}
	return nil
}

// Reference returns r, an image reference (FormImage or FormTag), in
// go-containerregistry's form: a name.Tag, or a name.Digest when r has a
// digest.
func (n Names) Reference(r imageref.Ref) (name.Reference, error) {
	var (
		ref name.Reference
		err error
	)
	if r.Digest != "" {
		ref, err = name.NewDigest(r.String(), n.options()...)
	} else {
		ref, err = name.NewTag(r.String(), n.options()...)
	}
	if err != nil { // Parse is stricter: this is a bug, not bad input
		return nil, fmt.Errorf("converting the reference %q: %w", r, err)
	}
	return ref, nil
}

// Repository returns the repository r names (REGISTRY/REPOSITORY, any
// tag or digest left out) in go-containerregistry's form.
func (n Names) Repository(r imageref.Ref) (name.Repository, error) {
	s := r.Registry + "/" + r.Repository
	repo, err := name.NewRepository(s, n.options()...)
	if err != nil {
		return name.Repository{}, fmt.Errorf("converting the repository %q: %w", s, err)
	}
	return repo, nil
}

// Registry returns the registry host of r in go-containerregistry's form.
func (n Names) Registry(r imageref.Ref) (name.Registry, error) {
	reg, err := name.NewRegistry(r.Registry, n.options()...)
	if err != nil {
		return name.Registry{}, fmt.Errorf("converting the registry %q: %w", r.Registry, err)
	}
	return reg, nil
}
