package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/registry"
)

// Kinds of registry failure, matched with errors.Is on what explain
// returns; describe turns them into reason codes.
var (
	// errUnauthorized: the registry wants credentials, or refused the
	// ones given.
	errUnauthorized = errors.New("unauthorized")
	// errDenied: the credentials are valid but may not do this.
	errDenied = errors.New("denied")
	// errNotFound: no such repository, tag, manifest or blob.
	errNotFound = errors.New("not found")
	// errUnreachable: no connection to the registry.
	errUnreachable = errors.New("unreachable")
)

// failure is a registry error explained in one sentence for people: the
// host, what went wrong and what to do. It keeps the original error for
// errors.Is and errors.As, but not its text, which is the registry's raw
// body (Go map dumps, upload URLs of hundreds of characters).
type failure struct {
	kind error
	msg  string
	err  error
}

func (f *failure) Error() string { return f.msg }

// Unwrap gives the kind (errUnauthorized, ...) and the original error.
func (f *failure) Unwrap() []error { return []error{f.kind, f.err} }

// explain turns a registry error that err carries into one that says, in a
// sentence for people, the host, what went wrong and what to do: missing
// or wrong credentials, access denied, something not found, a registry
// unreachable. It matches its kind with errors.Is (errUnauthorized,
// errDenied, errNotFound, errUnreachable) and keeps err for errors.As.
// Other errors, and nil, are returned as they are. user names the user
// the command sent to a host ("" for none, see registryFlags.user);
// resumable says that the command keeps its work, so running it again
// continues it.
func explain(user func(host string) string, err error, resumable bool) error {
	var done *failure
	if err == nil || errors.As(err, &done) {
		return err
	}
	again := "then run the same command again"
	if resumable {
		again = "then run the same command again to resume"
	}
	var plain *registry.PlainHTTPError
	if errors.As(err, &plain) { // before the HTTPS attempt's own error, which says less
		return &failure{errUnreachable, plain.Error(), err}
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		host := ""
		if terr.Request != nil {
			host = terr.Request.URL.Host
		}
		switch {
		case terr.StatusCode == http.StatusUnauthorized:
			user := user(host)
			if user == "" {
				return &failure{errUnauthorized, fmt.Sprintf("registry %s wants credentials: run imagectl login %s, or pass --username and --password-stdin", host, host), err}
			}
			return &failure{errUnauthorized, fmt.Sprintf("wrong credentials for %s: the registry refused user %q; run imagectl login %s again", host, user, host), err}
		case terr.StatusCode == http.StatusForbidden || hasCode(terr, transport.DeniedErrorCode):
			verb := "pull"
			if terr.Request != nil {
				switch terr.Request.Method {
				case http.MethodPost, http.MethodPut, http.MethodPatch:
					verb = "push to"
				case http.MethodDelete:
					verb = "delete"
				}
			}
			who := "an anonymous user (no credentials for " + host + ")"
			if user := user(host); user != "" {
				who = fmt.Sprintf("user %q", user)
			}
			msg := fmt.Sprintf("access denied: %s may not %s %s", who, verb, what(terr))
			if said := registryMessage(terr); said != "" {
				msg += " (the registry says: " + said + ")"
			}
			return &failure{errDenied, msg, err}
		case terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return &failure{errNotFound, fmt.Sprintf("%s not found", what(terr)), err}
		}
		return err
	}
	if unreachable(err) {
		host, cause := dialTarget(err)
		if host == "" {
			return &failure{errUnreachable, fmt.Sprintf("the registry is unreachable (%s); %s", cause, again), err}
		}
		return &failure{errUnreachable, fmt.Sprintf("registry %s unreachable (%s); %s", host, cause, again), err}
	}
	// A connection that broke: the URL, an upload's with its state token,
	// says nothing to a person.
	var uerr *url.Error
	if errors.As(err, &uerr) && !errors.Is(err, context.Canceled) {
		host := uerr.URL
		if u, perr := url.Parse(uerr.URL); perr == nil {
			host = u.Host
		}
		if registry.AnsweredInPlainHTTP(uerr.Err) { // not transient: trying again changes nothing
			return &failure{errUnreachable, fmt.Sprintf("registry %s speaks plain HTTP, not HTTPS: credentials and images would cross the network unencrypted (--insecure allows it)", host), err}
		}
		cause := uerr.Err.Error()
		if i := strings.LastIndex(cause, ": "); i >= 0 {
			cause = cause[i+2:]
		}
		return &failure{errUnreachable, fmt.Sprintf("registry %s unreachable (%s); %s", host, cause, again), err}
	}
	return err
}

// hasCode reports whether the registry's error response carries one of
// codes.
func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// what names the object a failed request was about, from its URL path:
// HOST/REPO:TAG or HOST/REPO@DIGEST for a manifest, "blob DIGEST of
// HOST/REPO" for a blob, HOST/REPO for anything else under /v2/REPO/.
func what(terr *transport.Error) string {
	if terr.Request == nil {
		return "the object"
	}
	host, path := terr.Request.URL.Host, strings.TrimPrefix(terr.Request.URL.Path, "/v2/")
	for _, sep := range []string{"/manifests/", "/blobs/", "/tags/", "/referrers/"} {
		repo, ref, ok := strings.Cut(path, sep)
		if !ok {
			continue
		}
		switch {
		case sep == "/manifests/" && strings.Contains(ref, ":"):
			return host + "/" + repo + "@" + ref
		case sep == "/manifests/":
			return host + "/" + repo + ":" + ref
		case sep == "/blobs/" && !strings.HasPrefix(ref, "uploads"):
			return "blob " + ref + " of " + host + "/" + repo
		}
		return host + "/" + repo
	}
	return host
}

// dialTarget is the address a failed connection was for and the cause in
// a few words ("connection refused", "no such host").
func dialTarget(err error) (addr, cause string) {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr.Name, "no such host"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		if opErr.Addr != nil {
			addr = opErr.Addr.String()
		}
		cause = opErr.Err.Error()
		var sys *net.OpError
		if errors.As(opErr.Err, &sys) {
			cause = sys.Err.Error()
		}
		if i := strings.LastIndex(cause, ": "); i >= 0 {
			cause = cause[i+2:]
		}
		return addr, cause
	}
	return "", "no answer in time"
}

// registryMessage is the message of the registry's first error, when it
// says more than the distribution specification's stock sentences; at most
// 200 bytes of it, printable.
func registryMessage(terr *transport.Error) string {
	if len(terr.Errors) == 0 {
		return ""
	}
	msg := strings.TrimSpace(terr.Errors[0].Message)
	switch strings.ToLower(msg) {
	case "", "requested access to the resource is denied", "access denied", "denied":
		return ""
	}
	msg = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, msg)
	if len(msg) > 200 {
		msg = strings.ToValidUTF8(msg[:200], "") + "…"
	}
	return msg
}

// unreachable reports whether err means that no HTTP conversation took
// place: no route, refused, name not found, timed out.
func unreachable(err error) bool {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	return errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &opErr) && opErr.Op == "dial")
}
