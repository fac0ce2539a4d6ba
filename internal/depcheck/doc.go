// Package depcheck keeps the package graph drawn in docs/architecture.md:
// its test lists every package of the module with `go list` and fails when
// a package imports, directly or through another package, something its
// rule forbids, or when a package has no doc comment saying its job or one
// longer than a screen (25 lines).
//
// The rules are data (rules_test.go) so that a new rule is one line; they
// follow go-containerregistry's internal/depcheck habit of asserting the
// absence of dependencies rather than listing the allowed ones.
package depcheck
