package cdi

import (
	"crypto/sha256"
	"encoding/base32"
	"regexp"
	"strings"
)

// Kubernetes names of what the syncer makes. One function owns each name,
// and every name is a DNS-1123 label of at most 63 characters, injective
// over what it is derived from within one tenant's namespace:
//
//   - ImageName(repository): the path after the tenant when it is
//     "simple" (lower-case letters and digits in runs joined by single
//     dashes) and at most 30 characters, e.g. "rhel"; otherwise a cleaned
//     prefix, "--" and a hash of the path, e.g. "team-rhel--" + 16
//     characters. Simple names hold no "--", hashed ones exactly one.
//   - BaseImageName(repository, tag), also the name of the tag's
//     DataSource: "PATH--TAG" when both are simple and fit, e.g.
//     "rhel--9"; otherwise "PATH--TAG--HASH" with both parts cleaned and
//     shortened and HASH covering the exact path and tag, e.g.
//     "rhel--v1-0--" + 16 characters for "v1.0". Simple names hold one
//     "--", hashed ones two, so "foo-bar:latest" ("foo-bar--latest") and
//     "foo:bar-latest" ("foo--bar-latest") differ, and "v1.0", "v1-0" and
//     "v1_0" get three names.
//   - DataVolumeName(image, digest), also the PVC's: the image name, "--"
//     and the first 32 hex digits of the digest (at least 30 where the
//     image name is long), e.g. "rhel--" + 32 hex digits.
//
// A hash is 16 base32 characters of SHA-256 (80 bits). Names are still
// never trusted alone: before the syncer updates or deletes an object it
// compares the exact repository, tag or digest recorded on it
// (AnnotationRepository, AnnotationTag, AnnotationDigest) with its own.

// Limits of the names.
const (
	maxNameLength      = 63 // a DNS-1123 label, the bound CDI puts on DataVolumes
	maxSimpleImageName = 30 // leaves room for a digest in DataVolumeName
	maxDigestHex       = 32 // 128 bits of the digest in DataVolumeName
	nameHashLength     = 16 // base32 characters: 80 bits
)

// simplePart is a name part used as it is.
var simplePart = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

var nameEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// nameHash is a hash of parts, kind first, each part delimited so that no
// two lists of parts hash alike.
func nameHash(kind string, parts ...string) string {
	h := sha256.New()
	h.Write([]byte(kind))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return strings.ToLower(nameEncoding.EncodeToString(h.Sum(nil)))[:nameHashLength]
}

// cleanPart makes s a simple part of at most n characters: lower case,
// other characters as single dashes, none at either end; "x" when nothing
// is left.
func cleanPart(s string, n int) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			continue
		}
		dash = true
	}
	out := b.String()
	if len(out) > n {
		out = strings.TrimRight(out[:n], "-")
	}
	if out == "" {
		return "x"
	}
	return out
}

// repoPath is repository without its tenant: "acme/team/rhel" → "team/rhel".
func repoPath(repository string) string {
	_, rest, _ := strings.Cut(repository, "/")
	return rest
}

// ImageName is the Kubernetes name of repository ("TENANT/PATH"): the
// value of LabelImage and the start of its DataVolumes' names. See the
// naming rules above.
func ImageName(repository string) string {
	rest := repoPath(repository)
	if len(rest) <= maxSimpleImageName && simplePart.MatchString(rest) {
		return rest
	}
	return cleanPart(rest, maxSimpleImageName-nameHashLength-2) + "--" + nameHash("image", rest)
}

// BaseImageName names the BaseImage, and the DataSource, of
// repository:tag; repository is "TENANT/PATH". See the naming rules above.
func BaseImageName(repository, tag string) string {
	rest := repoPath(repository)
	if len(rest)+2+len(tag) <= maxNameLength && simplePart.MatchString(rest) && simplePart.MatchString(tag) {
		return rest + "--" + tag
	}
	const room = maxNameLength - nameHashLength - 4 // two "--"
	image := cleanPart(rest, 24)
	return image + "--" + cleanPart(tag, room-len(image)) + "--" + nameHash("baseimage", rest, tag)
}

// DataVolumeName names the DataVolume, and the PVC, importing digest of
// the image named image (an ImageName).
func DataVolumeName(image, digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	return image + "--" + hex[:min(len(hex), maxDigestHex, maxNameLength-len(image)-2)]
}

// Names of what the syncer copies into tenant namespaces when the
// registry needs credentials or a private CA.
const (
	PullSecretName  = "imagepipe-registry-pull"
	CAConfigMapName = "imagepipe-registry-ca"
)

// Labels that tie what the syncer makes to its BaseImage.
const (
	// LabelBaseImage names the BaseImage that created a DataVolume or
	// owns a DataSource.
	LabelBaseImage = "imagepipe.io/baseimage"
	// LabelTag records the tag on a BaseImage and its DataSource, as
	// LabelValue shortens it.
	LabelTag = "imagepipe.io/tag"
)

// LabelValue makes a tag fit a label value (63 characters, no leading dot
// or dash); the full tag stays in the spec.
func LabelValue(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	for len(s) > 0 && (s[len(s)-1] == '.' || s[len(s)-1] == '-' || s[len(s)-1] == '_') {
		s = s[:len(s)-1]
	}
	for len(s) > 0 && (s[0] == '.' || s[0] == '-' || s[0] == '_') {
		s = s[1:]
	}
	return s
}
