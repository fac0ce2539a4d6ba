package source

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// ChecksumError reports that the original bytes of an image do not have the
// digest given in Options.Checksum. Nothing opened is kept.
type ChecksumError struct {
	// Want is the expected digest, "sha256:<hex>".
	Want string
	// Got is the digest of the bytes actually read, "sha256:<hex>".
	Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("checksum mismatch: expected %s, got %s", e.Want, e.Got)
}

// parseChecksum validates a "sha256:<hex>" checksum and returns it with the
// hex digits in lower case, the form Image.Digest uses. "" stays "".
func parseChecksum(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	algo, hexDigest, ok := strings.Cut(s, ":")
	if !ok || algo != "sha256" || len(hexDigest) != 64 {
		return "", fmt.Errorf("checksum %q is not of the form sha256:<64 hex digits>", s)
	}
	if _, err := hex.DecodeString(hexDigest); err != nil {
		return "", fmt.Errorf("checksum %q is not of the form sha256:<64 hex digits>", s)
	}
	return "sha256:" + strings.ToLower(hexDigest), nil
}

// tooLarge rejects a source whose announced size is already over the cap,
// before any of it is read.
func tooLarge(size, limit int64) error {
	return &reject.Error{
		Reason: reject.VirtualSize,
		Detail: fmt.Sprintf("the image is %d bytes, over the limit of %d bytes", size, limit),
	}
}
