// Package imageref is the one grammar of image references and the one
// tenant rule: every entry point (imagectl, the webhook intake, the gate,
// the hub, vmlaunch, the template catalog) checks names here.
//
// Parse follows the OCI distribution grammar strictly, in the form the
// caller needs (FormImage, FormTag, ...), into a Ref of plain strings.
// go-containerregistry's name package is lenient where that matters for
// tenancy: it accepts "..", "." and empty path components
// ("reg/acme/../globex/x:1", which a URL cleaner turns into globex/x),
// repeated separators, a missing registry (it assumes Docker Hub) and a
// missing tag (it assumes "latest"). Parse refuses all of them and says
// which part breaks which rule, as an *Error.
//
// A tenant is the first path component of a repository, and a DNS-1123
// label (it becomes a namespace). Tenant gives it for a path without the
// registry host, as events and verdicts carry it.
//
// Limits: a repository of at most 255 characters (as registries count
// it, without the host), a tag of at most 128, a host of at most 253 with
// labels of at most 63. Nothing here touches the network.
package imageref
