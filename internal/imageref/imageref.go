package imageref

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// maxNameLength bounds a repository path, as registries bound the names
// they store (distribution's NameTotalLengthMax, applied by its server to
// the repository): every entry point reads the same names, whichever host
// a client reached them through.
const maxNameLength = 255

var (
	// pathComponentPattern is one repository path component.
	pathComponentPattern = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	// tagPattern is a tag: at most 128 characters.
	tagPattern = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
	// digestPattern is the only digest form imagepipe reads and writes.
	digestPattern = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	// hostLabelPattern is one label of a registry host name (lower case).
	hostLabelPattern = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)
	// tenantPattern is a DNS-1123 label.
	tenantPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// Error reports a reference outside the grammar: which part and
// which rule.
type Error struct {
	// Input is the reference as given.
	Input string
	// Part names the offending part: "reference", "registry host",
	// "repository", "tenant", "tag" or "digest".
	Part string
	// Rule is a sentence saying what is wrong and what is allowed.
	Rule string
}

func (e *Error) Error() string {
	return fmt.Sprintf("invalid image reference %q: %s", e.Input, e.Rule)
}

// AsError returns the *Error in err's chain, or nil.
func AsError(err error) *Error {
	var re *Error
	if errors.As(err, &re) {
		return re
	}
	return nil
}

// Form says which parts a reference must have.
type Form int

const (
	// FormImage names an image: REGISTRY/TENANT/NAME with a tag or a
	// digest, not both (export, inspect, delete, sign, and both sides of
	// copy).
	FormImage Form = iota
	// FormTag names a tag to write: REGISTRY/TENANT/NAME:TAG (import); a
	// digest is refused.
	FormTag
	// FormRepository names a repository without tag or digest, whose
	// first path component need not be a tenant (the template catalog;
	// Tenant checks one).
	FormRepository
	// FormTenant is REGISTRY/TENANT (list); a trailing "/" is dropped.
	FormTenant
	// FormRegistry is a registry host, HOST[:PORT], as login and logout
	// take it: a URL's scheme and a trailing slash are dropped, as docker
	// login drops them; a path is refused. The Ref has only a Registry.
	FormRegistry
)

// Ref is a parsed reference: plain strings, checked against the grammar
// and the form they were parsed in. Parsing its String in the same form
// gives it back unchanged (but for what FormTenant and FormRegistry drop).
// registry.Client turns it into go-containerregistry's names.
type Ref struct {
	Registry   string // host[:port], lower case
	Repository string // path components joined by '/'; "" in FormRegistry
	Tag        string // "" when absent
	Digest     string // "" when absent
}

// String returns the reference as REGISTRY/REPOSITORY[:TAG][@DIGEST], or
// REGISTRY alone for a Ref of FormRegistry.
func (r Ref) String() string {
	if r.Repository == "" {
		return r.Registry
	}
	s := r.Registry + "/" + r.Repository
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// tenantOf is the first path component of a repository.
func tenantOf(repository string) string {
	t, _, _ := strings.Cut(repository, "/")
	return t
}

// refFault is a broken rule of the reference grammar: which part breaks
// which rule. parseRef turns it into a *Error naming the input.
type refFault struct{ part, rule string }

func fault(part, format string, args ...any) *refFault {
	return &refFault{part: part, rule: fmt.Sprintf(format, args...)}
}

// Parse parses s in the given form, following the OCI distribution
// grammar strictly: the registry host is required, no path component is
// "..", ".", empty or upper case, and, in FormImage and FormTag, the first
// one is the tenant and exactly one of tag and digest is given. A
// reference outside the grammar or the form is a *Error. Parse
// never touches the network.
func Parse(s string, form Form) (Ref, error) {
	switch form {
	case FormRegistry:
		return parseRegistry(s)
	case FormTenant:
		s = strings.TrimSuffix(s, "/")
	}
	return parseRef(s, form)
}

// parseRef parses s in the given form (not FormRegistry) as it is.
func parseRef(s string, form Form) (Ref, error) {
	r, f := parseRefParts(s)
	if f == nil {
		f = checkForm(r, form)
	}
	if f != nil {
		return Ref{}, &Error{Input: s, Part: f.part, Rule: f.rule}
	}
	return r, nil
}

// parseRegistry parses a registry host in FormRegistry.
func parseRegistry(s string) (Ref, error) {
	host := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(s, "https://"), "http://"), "/")
	if strings.Contains(host, "/") {
		return Ref{}, &Error{Input: s, Part: "registry host", Rule: "it names a repository; give only the registry host, e.g. registry.example.com"}
	}
	if why := checkHost(host); why != "" {
		return Ref{}, &Error{Input: s, Part: "registry host", Rule: "the registry host " + why}
	}
	return Ref{Registry: host}, nil
}

// parseRefParts splits s into registry, repository, tag and digest and
// checks each against the grammar, whatever the form.
func parseRefParts(s string) (Ref, *refFault) {
	if f := checkText(s); f != nil {
		return Ref{}, f
	}
	var r Ref
	rest, digest, f := cutDigest(s)
	if f != nil {
		return Ref{}, f
	}
	r.Digest = digest
	host, path, ok := strings.Cut(rest, "/")
	if !ok || !looksLikeHost(host) {
		return Ref{}, fault("registry host", "it names no registry host: write REGISTRY/TENANT/NAME:TAG, e.g. registry.example.com/acme/rhel:10 (a host has a '.' or a ':PORT', or is localhost; imagectl never assumes Docker Hub)")
	}
	if err := checkHost(host); err != "" {
		return Ref{}, fault("registry host", "registry host %q %s", host, err)
	}
	r.Registry = host
	if path, r.Tag, f = cutTag(path); f != nil {
		return Ref{}, f
	}
	if f := checkRepositoryPath(path); f != nil {
		return Ref{}, f
	}
	r.Repository = path
	if n := len(r.Repository); n > maxNameLength {
		return Ref{}, fault("repository", "the repository is %d characters long; the limit is %d", n, maxNameLength)
	}
	return r, nil
}

// checkText checks what any reference must be: printable ASCII without
// spaces, and no URL.
func checkText(s string) *refFault {
	if s == "" {
		return fault("reference", "it is empty")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return fault("reference", "it contains %q at byte %d; references are printable ASCII without spaces", rune(c), i)
		}
	}
	if strings.Contains(s, "://") {
		return fault("reference", "it has a URL scheme; write REGISTRY/TENANT/NAME:TAG without one")
	}
	return nil
}

// cutDigest splits off and checks the "@sha256:..." digest, if any.
func cutDigest(s string) (rest, digest string, f *refFault) {
	at := strings.IndexByte(s, '@')
	if at < 0 {
		return s, "", nil
	}
	rest, digest = s[:at], s[at+1:]
	if strings.HasPrefix(digest, "sha512:") || strings.HasPrefix(digest, "sha384:") {
		return "", "", fault("digest", "digest %q uses another algorithm; imagepipe reads only sha256 digests", digest)
	}
	if !digestPattern.MatchString(digest) {
		return "", "", fault("digest", "digest %q is not \"sha256:\" followed by 64 lower-case hexadecimal digits", digest)
	}
	return rest, digest, nil
}

// cutTag splits off and checks the ":TAG" after the repository path, if any.
func cutTag(path string) (repo, tag string, f *refFault) {
	colon := strings.LastIndexByte(path, ':')
	if colon <= strings.LastIndexByte(path, '/') {
		return path, "", nil
	}
	repo, tag = path[:colon], path[colon+1:]
	if f := checkTag(tag); f != nil {
		return "", "", f
	}
	return repo, tag, nil
}

// checkTag checks a tag against the grammar.
func checkTag(tag string) *refFault {
	switch {
	case tag == "":
		return fault("tag", "the tag after ':' is empty")
	case len(tag) > 128:
		return fault("tag", "the tag is %d characters long; the limit is 128", len(tag))
	case !tagPattern.MatchString(tag):
		return fault("tag", "tag %q is not letters, digits, '_', '.' and '-' starting with a letter, digit or '_'", tag)
	}
	return nil
}

// checkRepositoryPath checks each path component of a repository name.
func checkRepositoryPath(path string) *refFault {
	if path == "" {
		return fault("repository", "it names no repository after the registry host")
	}
	for _, c := range strings.Split(path, "/") {
		switch {
		case c == "":
			return fault("repository", "the repository %q has an empty path component (a '/' at the start or end, or two in a row)", path)
		case c == "." || c == "..":
			return fault("repository", "path component %q of the repository is a relative path step, not a name", c)
		case strings.ToLower(c) != c:
			return fault("repository", "path component %q of the repository has upper-case letters; repository names are lower case", c)
		case !pathComponentPattern.MatchString(c):
			return fault("repository", "path component %q of the repository breaks the OCI name grammar: lower-case letters and digits, separated inside a component by one '.', one or two '_', or one or more '-'", c)
		}
	}
	return nil
}

// checkForm checks that a parsed reference has the parts form asks for.
func checkForm(r Ref, form Form) *refFault {
	switch form {
	case FormTenant:
		if strings.Contains(r.Repository, "/") || r.Tag != "" || r.Digest != "" {
			return fault("tenant", "it names a repository, not a tenant: write REGISTRY/TENANT")
		}
		if !isTenant(r.Repository) {
			return fault("tenant", "%s", tenantRule(r.Repository))
		}
		return nil
	case FormRepository:
		if r.Tag != "" || r.Digest != "" {
			return fault("repository", "it names a tag or a digest; write REGISTRY/REPOSITORY")
		}
		return nil
	}
	if rule := checkTenant(r.Repository); rule != "" {
		return fault("tenant", "%s", rule)
	}
	if r.Tag != "" && r.Digest != "" {
		return fault("reference", "it has both a tag and a digest; give one of them")
	}
	if r.Tag == "" {
		switch {
		case form == FormTag && r.Digest != "":
			return fault("digest", "it names a digest, and this command writes a tag: write REGISTRY/TENANT/NAME:TAG")
		case form == FormTag:
			return fault("tag", "it has no tag, and this command writes one: add :TAG (imagectl never assumes :latest)")
		case r.Digest == "":
			return fault("tag", "it has neither a tag nor a digest: add :TAG or @sha256:... (imagectl never assumes :latest)")
		}
	}
	return nil
}

// checkTenant checks that a repository path starts with a tenant; it
// returns "" or the broken rule.
func checkTenant(path string) string {
	tenant, rest, ok := strings.Cut(path, "/")
	if !ok || rest == "" {
		return fmt.Sprintf("repository %q has no tenant: write REGISTRY/TENANT/NAME", path)
	}
	if !isTenant(tenant) {
		return tenantRule(tenant)
	}
	return ""
}

// isTenant reports whether s is a tenant: a DNS-1123 label, as
// Kubernetes names namespaces, since a tenant becomes one, and not of a
// private network's namespace form. (The pattern is written here, not
// taken from Kubernetes' validation package, so that the registry client
// links no Kubernetes code.)
func isTenant(s string) bool {
	return tenantPattern.MatchString(s) && !IsNetworkNamespace(s)
}

func tenantRule(tenant string) string {
	if IsNetworkNamespace(tenant) {
		return fmt.Sprintf("tenant %q (the first path component) has the form of a private network's namespace (HOME%sNAME), which no tenant may have", tenant, NetworkInfix)
	}
	return fmt.Sprintf("tenant %q (the first path component) is not a valid name: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63", tenant)
}

// NetworkInfix joins a tenant's home and a network's name in the name of
// the network's namespace, HOME-net-NAME.
const NetworkInfix = "-net-"

// IsNetworkNamespace reports whether ns has the form of a private
// network's namespace, HOME-net-NAME. No tenant may have it, whether or
// not such a network exists: otherwise a registry tenant of that name
// would have its images synced into another tenant's network, or hold a
// name a network of another tenant will need.
func IsNetworkNamespace(ns string) bool { return strings.Contains(ns, NetworkInfix) }

// looksLikeHost tells a registry host from a first path component, as
// docker does: a host has a '.' or a ':' (a port, or an IPv6 literal),
// or is localhost.
func looksLikeHost(s string) bool {
	return s == "localhost" || strings.ContainsAny(s, ".:[")
}

// checkHost validates host[:port]; it returns "" or the broken rule as
// the end of a sentence.
func checkHost(s string) string {
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "has an unclosed '['"
		}
		host, port = s[1:end], s[end+1:]
		if ip := net.ParseIP(host); ip == nil || !strings.Contains(host, ":") || strings.Contains(host, "%") {
			return "is not an IPv6 address in brackets"
		}
		if strings.ToLower(host) != host {
			return "has upper-case letters; write the host in lower case so that one registry has one name"
		}
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return "has characters after ']' that are not a ':PORT'"
			}
			port = port[1:]
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, port = s[:i], s[i+1:]
		if port == "" {
			return "has an empty port after ':'"
		}
	}
	if port != "" || strings.HasSuffix(s, ":") {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return fmt.Sprintf("has port %q; a port is a number from 1 to 65535 without leading zeros", port)
		}
	}
	if strings.HasPrefix(s, "[") {
		return ""
	}
	if len(host) > 253 {
		return "is longer than 253 characters"
	}
	if strings.ToLower(host) != host {
		return "has upper-case letters; write the host in lower case so that one registry has one name"
	}
	for _, label := range strings.Split(host, ".") {
		if !hostLabelPattern.MatchString(label) {
			return fmt.Sprintf("has the label %q; a host is labels of letters, digits and '-' (not at either end, at most 63) joined by single dots", label)
		}
	}
	return ""
}

// Tenant returns the tenant of a repository path ("TENANT/NAME..."
// without the registry host): its first component, when the path is in
// the grammar and the first component is a tenant (a DNS-1123 label, as
// the namespace it becomes). Anything else is a *Error: events, verdicts
// and hubs never attribute a repository outside the rule to a tenant.
func Tenant(repository string) (string, error) {
	if f := checkRepository(repository); f != nil {
		return "", &Error{Input: repository, Part: f.part, Rule: f.rule}
	}
	if rule := checkTenant(repository); rule != "" {
		return "", &Error{Input: repository, Part: "tenant", Rule: rule}
	}
	return tenantOf(repository), nil
}

// Tenant returns the tenant of r's repository (see Tenant), with an
// *Error that names all of r.
func (r Ref) Tenant() (string, error) {
	t, err := Tenant(r.Repository)
	if e := AsError(err); e != nil {
		e.Input = r.String()
	}
	return t, err
}

// CheckTenant checks that s is a tenant name.
func CheckTenant(s string) error {
	if !isTenant(s) {
		return &Error{Input: s, Part: "tenant", Rule: tenantRule(s)}
	}
	return nil
}

// CheckRepository checks a repository path without the registry host
// (as registries name it in events): components in the grammar, at most
// maxNameLength characters. It does not ask for a tenant.
func CheckRepository(repository string) error {
	if f := checkRepository(repository); f != nil {
		return &Error{Input: repository, Part: f.part, Rule: f.rule}
	}
	return nil
}

// CheckTag checks a tag: at most 128 letters, digits, '_', '.' and '-',
// not starting with '.' or '-'.
func CheckTag(tag string) error {
	if f := checkTag(tag); f != nil {
		return &Error{Input: tag, Part: f.part, Rule: f.rule}
	}
	return nil
}

// CheckDigest checks a digest: "sha256:" and 64 lower-case hexadecimal
// digits, the only form imagepipe reads and writes.
func CheckDigest(digest string) error {
	if _, _, f := cutDigest("x@" + digest); f != nil {
		return &Error{Input: digest, Part: f.part, Rule: f.rule}
	}
	return nil
}

// ParseTenantImage splits "TENANT/NAME[:TAG]", an image named on its
// hub without the registry host, into the tenant, the repository path and
// the tag ("" when absent).
func ParseTenantImage(s string) (tenant, repository, tag string, err error) {
	repository, tag, f := cutTag(s)
	if f == nil {
		f = checkRepository(repository)
	}
	if f != nil {
		return "", "", "", &Error{Input: s, Part: f.part, Rule: f.rule}
	}
	if rule := checkTenant(repository); rule != "" {
		return "", "", "", &Error{Input: s, Part: "tenant", Rule: rule}
	}
	return tenantOf(repository), repository, tag, nil
}

// checkRepository checks a repository path alone.
func checkRepository(repository string) *refFault {
	if f := checkText(repository); f != nil {
		return f
	}
	if f := checkRepositoryPath(repository); f != nil {
		return f
	}
	if len(repository) > maxNameLength {
		return fault("repository", "the repository is %d characters long; the limit is %d", len(repository), maxNameLength)
	}
	return nil
}
