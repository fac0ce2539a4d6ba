package registry

import (
	"bytes"
	"context"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/opencontainers/go-digest"
)

// uploadSmallBlob uploads b, whose digest is d, into repo through rt, an
// authenticated transport to base ("https://host"): a POST that opens the
// upload and a PUT that sends b and closes it, the distribution
// specification's monolithic upload, which every registry serves. It does
// not ask first whether repo has the blob: for a blob this small, asking
// costs as much as sending it again.
func uploadSmallBlob(ctx context.Context, rt http.RoundTripper, base string, repo name.Repository, d digest.Digest, b []byte) error {
	client := &http.Client{Transport: rt}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v2/"+repo.RepositoryStr()+"/blobs/uploads/", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("uploading %s: %w", d, err)
	}
	err = transport.CheckError(resp, http.StatusAccepted) // reads the body of an error
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("uploading %s: %w", d, err)
	}
	loc, err := resp.Location()
	if err != nil {
		return fmt.Errorf("uploading %s: the registry named no upload location: %w", d, err)
	}
	q := loc.Query()
	q.Set("digest", d.String())
	loc.RawQuery = q.Encode()
	req, err = http.NewRequestWithContext(ctx, http.MethodPut, loc.String(), bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err = client.Do(req); err != nil {
		return fmt.Errorf("uploading %s: %w", d, err)
	}
	err = transport.CheckError(resp, http.StatusCreated)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("uploading %s: %w", d, err)
	}
	return nil
}
