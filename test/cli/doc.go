// Package cli tests imagectl as a user runs it: exit codes, output formats,
// and that a failed conversion leaves nothing behind.
package cli
