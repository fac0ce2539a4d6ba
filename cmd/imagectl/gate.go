package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// maxKeyFile bounds a key file read.
const maxKeyFile = 64 << 10

// gateChecker checks bundles against the public keys in keysFile, as
// --gate-keys names them.
func gateChecker(keysFile string) (*attest.KeyChecker, error) {
	data, err := os.ReadFile(keysFile)
	if err != nil {
		return nil, fmt.Errorf("--gate-keys: %w", err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("--gate-keys %s is larger than %d bytes", keysFile, maxKeyFile)
	}
	keys, err := attest.ParsePublicKeys(data)
	if err != nil {
		return nil, fmt.Errorf("--gate-keys %s: %w", keysFile, err)
	}
	// A check with the standard library, for the tenant's eyes: what hubs
	// import is decided by the syncer's own check (internal/trust).
	return attest.NewKeyChecker(keys)
}

// gateReport finds the gate's verdict on the digest ref names, trusting
// the public keys in keysFile.
func gateReport(ctx context.Context, client *registry.Client, ref name.Reference, keysFile string) (*api.GateReport, error) {
	checker, err := gateChecker(keysFile)
	if err != nil {
		return nil, err
	}
	d, ok := ref.(name.Digest)
	if !ok {
		raw, err := client.FetchManifest(ctx, ref)
		if err != nil {
			return nil, err
		}
		d = ref.Context().Digest(raw.Digest)
	}
	report := &api.GateReport{Subject: d.DigestStr()}
	v, err := verdict.Find(ctx, client, checker, d)
	var nv *verdict.NoVerdictError
	switch {
	case errors.As(err, &nv):
		report.Refused = nv.Refused
	case err != nil:
		return nil, err
	default:
		report.Verdict = v
	}
	return report, nil
}

// gateRows adds the gate's verdict to inspect's table.
func gateRows(row func(string, any), g *api.GateReport) {
	if g == nil {
		return
	}
	v := g.Verdict
	if v == nil {
		msg := "no verdict signed by the given keys yet: no hub imports the image until there is one"
		if len(g.Refused) > 0 {
			msg = "no trusted verdict (" + strings.Join(g.Refused, "; ") + "): no hub imports the image"
		}
		row("gate", msg)
		return
	}
	row("gate", fmt.Sprintf("%s by %s %s at %s", v.Verdict, v.Engine, v.EngineVersion, v.VerifiedAt))
	for _, r := range v.Reasons {
		row("gate reason", r.Code+": "+r.Message)
	}
	if v.SignedBy != "" {
		row("signed by", "the tenant's key "+v.SignedBy+", as the tenant's policy requires")
	}
	for _, im := range v.Images {
		row("hubs import", fmt.Sprintf("%s: %s (%s, %s)", im.Platform, im.Canonical, im.Format, humanBytes(im.VirtualSize)))
		if im.Guest != nil {
			guestRows(row, im.Guest)
		}
	}
}

// gateSBOM finds the guest's SBOM the gate attached to image (a manifest
// digest), signed by one of the keys in keysFile and about image itself,
// and returns its CycloneDX JSON. At most attest.MaxSBOMBundleSize bytes
// of each attestation are downloaded.
func gateSBOM(ctx context.Context, client *registry.Client, image name.Digest, keysFile string) ([]byte, error) {
	checker, err := gateChecker(keysFile)
	if err != nil {
		return nil, err
	}
	pred, err := verdict.FindStatement(ctx, client, checker, image, attest.CycloneDXPredicateType)
	if err != nil {
		if errors.Is(err, verdict.ErrNoStatement) {
			return nil, &hintedError{err: err, hint: "the gate attaches an SBOM when it accepts an image whose guest's packages it read (a disk it verified in its spool); imagectl inspect --gate-keys shows what its verdict says of the guest"}
		}
		return nil, err
	}
	var bom struct {
		BOMFormat string `json:"bomFormat"`
	}
	if err := json.Unmarshal(pred, &bom); err != nil || bom.BOMFormat != "CycloneDX" {
		return nil, fmt.Errorf("the SBOM attested for %s is not a CycloneDX document (%v)", image, err)
	}
	return pred, nil
}
