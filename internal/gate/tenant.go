package gate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/secretfile"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// TenantKeys is the tenants' signature policy, one file per tenant in Dir:
// TENANT.pub holds that tenant's PEM public keys (cosign's .pub files,
// one or more). A tenant with such a file has its images verified only
// when one of those keys signed the pushed digest (`imagectl sign`,
// `cosign sign --key`); a tenant without one has no policy. The file is
// read for each verification, so a changed ConfigMap takes effect without
// a restart. A key in one tenant's file never counts for another tenant.
type TenantKeys struct {
	Dir string
}

// checker returns the checker of tenant's keys, or nil when tenant has no
// policy. A policy file that cannot be read is an error, never "no
// policy": an unreadable file must not let unsigned images through.
func (k *TenantKeys) checker(tenant string) (verdict.Checker, error) {
	if k == nil || k.Dir == "" {
		return nil, nil
	}
	if err := imageref.CheckTenant(tenant); err != nil {
		return nil, fmt.Errorf("the tenant name %q cannot name a key file: %w", tenant, err)
	}
	path := filepath.Join(k.Dir, tenant+".pub")
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	data, err := secretfile.Read(path)
	if err != nil {
		return nil, fmt.Errorf("reading tenant %s's keys: %w", tenant, err)
	}
	keys, err := attest.ParsePublicKeys(data)
	if err != nil {
		return nil, fmt.Errorf("tenant %s's keys %s: %w", tenant, path, err)
	}
	return trust.NewVerifier(keys)
}

// signatureCheck applies tenant's policy to subject: the ID of the
// tenant's key that signed it ("" when the tenant has no policy), or the
// rejection saying why the image is not verified. referrer, when set, is
// checked besides the referrers the registry lists.
func (s *Service) signatureCheck(ctx context.Context, subject name.Digest, referrer string) (keyID string, refusal *api.Rejection, err error) {
	tenant, err := imageref.Tenant(subject.RepositoryStr())
	if err != nil {
		return "", nil, err
	}
	policy, err := s.TenantKeys.checker(tenant)
	if err != nil || policy == nil {
		return "", nil, err
	}
	keyID, err = verdict.FindSignature(ctx, s.Registry, policy, subject, referrer)
	var ns *verdict.NotSignedError
	switch {
	case errors.As(err, &ns) && len(ns.Refused) == 0:
		return "", &api.Rejection{Code: string(reject.Unsigned), Message: fmt.Sprintf("tenant %s requires images signed by one of its keys, and no signature is attached to %s", tenant, subject.DigestStr())}, nil
	case errors.As(err, &ns):
		return "", &api.Rejection{Code: string(reject.UntrustedSignature), Message: fmt.Sprintf("tenant %s requires images signed by one of its keys; the signatures attached are not: %s", tenant, strings.Join(ns.Refused, "; "))}, nil
	case err != nil:
		return "", nil, fmt.Errorf("looking for the signatures on %s: %w", subject, err)
	}
	return keyID, nil, nil
}

// maxAwaiting bounds the subjects kept for Recheck. Beyond it, a subject
// is looked at again when its signature's push is announced, or after a
// restart (the first poll takes in every tag).
const maxAwaiting = 10000

// awaitingSet is the subjects refused for want of a signature.
type awaitingSet struct {
	mu  sync.Mutex
	set map[string]name.Digest
}

func (a *awaitingSet) add(d name.Digest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.set == nil {
		a.set = map[string]name.Digest{}
	}
	if len(a.set) < maxAwaiting {
		a.set[d.String()] = d
	}
}

func (a *awaitingSet) remove(d name.Digest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.set, d.String())
}

func (a *awaitingSet) list() []name.Digest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Collect(maps.Values(a.set))
}
