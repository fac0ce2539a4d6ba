package registry

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/imageref"
)

// nameOptions are go-containerregistry's options for parsed references.
func (c *Client) nameOptions() []name.Option {
	nopts := []name.Option{name.StrictValidation}
	if c.opts.insecure {
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
// digest. Like Repository and Registry, it carries the client's
// WithInsecure into the name, which is where go-containerregistry reads
// it: without it, plain HTTP is tried only for localhost, loopback and
// private addresses.
func (c *Client) Reference(r imageref.Ref) (name.Reference, error) {
	var (
		n   name.Reference
		err error
	)
	if r.Digest != "" {
		n, err = name.NewDigest(r.String(), c.nameOptions()...)
	} else {
		n, err = name.NewTag(r.String(), c.nameOptions()...)
	}
	if err != nil { // Parse is stricter: this is a bug, not bad input
		return nil, fmt.Errorf("converting the reference %q: %w", r, err)
	}
	return n, nil
}

// Repository returns the repository r names (REGISTRY/REPOSITORY, any
// tag or digest left out) in go-containerregistry's form, with the
// client's WithInsecure (see Reference).
func (c *Client) Repository(r imageref.Ref) (name.Repository, error) {
	s := r.Registry + "/" + r.Repository
	repo, err := name.NewRepository(s, c.nameOptions()...)
	if err != nil {
		return name.Repository{}, fmt.Errorf("converting the repository %q: %w", s, err)
	}
	return repo, nil
}

// Registry returns the registry host of r in go-containerregistry's
// form, with the client's WithInsecure (see Reference).
func (c *Client) Registry(r imageref.Ref) (name.Registry, error) {
	reg, err := name.NewRegistry(r.Registry, c.nameOptions()...)
	if err != nil {
		return name.Registry{}, fmt.Errorf("converting the registry %q: %w", r.Registry, err)
	}
	return reg, nil
}
