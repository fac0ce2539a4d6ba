// Package reject is imagepipe's one rejection taxonomy: the stable codes
// saying why an untrusted disk image or containerDisk was refused, and the
// error that carries one.
//
// The codes are part of imagectl's JSON output (api.Rejection's Code) and
// of a BaseImage's status, so a code never changes meaning once released;
// docs/security.md lists them. Disk codes come from the disk engine
// (internal/convert) and the source readers (internal/source); shape codes
// from the containerDisk format (internal/containerdisk). Every *Error
// matches ErrRejected, so callers tell "the input is refused" (exit 3, no
// retry) from every other failure with one errors.Is.
//
// The package imports only the standard library, so the disk engine can
// use it and stay pure.
package reject
