package hub

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// PreferenceTableKey is the key of a provider's preference table in its
// ConfigMap (image-syncer --preference-table NAMESPACE/NAME).
const PreferenceTableKey = "preferences"

// Bounds of a preference table.
const (
	MaxPreferenceTableBytes = 64 << 10
	MaxPreferenceLines      = 1000
)

// BuiltinPreferences is the table image-syncer uses unless a provider
// names its own: common-instancetypes' preferences
// (github.com/kubevirt/common-instancetypes) for the operating systems
// the gate finds, in the format ParsePreferenceTable reads. An OS it does
// not list gets no hint: a wrong hint is worse than none.
const BuiltinPreferences = `# os-release ID [VERSION_ID] [ARCH] = preference
alpine = alpine
cirros = cirros
debian = debian
ubuntu = ubuntu
sles = sles
fedora = fedora
fedora arm64 = fedora.arm64
centos 9 = centos.stream9
centos 10 = centos.stream10
rhel 7 = rhel.7
rhel 8 = rhel.8
rhel 9 = rhel.9
rhel 9 arm64 = rhel.9.arm64
rhel 10 = rhel.10
rhel 10 arm64 = rhel.10.arm64
opensuse-leap = opensuse.leap
opensuse-tumbleweed = opensuse.tumbleweed
ol = oraclelinux
# Windows: the gate's VERSION_ID is the registry's major.minor.build;
# build 26100 is both Windows 11 24H2 and Server 2025, so it has no row.
windows 10.0.14393 = windows.2k16
windows 10.0.17763 = windows.2k19
windows 10.0.20348 = windows.2k22
windows 10.0.19044 = windows.10
windows 10.0.19045 = windows.10
windows 10.0.22621 = windows.11
windows 10.0.22631 = windows.11
`

// builtin is BuiltinPreferences, parsed once.
var builtin = func() *PreferenceTable {
	t, err := ParsePreferenceTable(BuiltinPreferences)
	if err != nil {
		panic(err)
	}
	return t
}()

// PreferenceTable maps an operating system (os-release's ID and
// VERSION_ID) on a hub of an architecture to the VirtualMachineCluster-
// Preference VMs of its images are given.
type PreferenceTable struct {
	rows []preferenceRow
}

type preferenceRow struct {
	id, version, arch, preference string
}

var (
	osIDPattern      = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	osVersionPattern = regexp.MustCompile(`^[0-9][0-9A-Za-z._~-]{0,62}$`)
	archNames        = map[string]bool{"amd64": true, "arm64": true, "s390x": true, "ppc64le": true, "riscv64": true}
)

// ParsePreferenceTable reads a table: one rule a line,
// "ID [VERSION] [ARCH] = PREFERENCE", where ID is os-release's ID, VERSION
// a VERSION_ID or its leading components ("9" matches "9" and "9.4", not
// "90"), ARCH a Go architecture name (amd64, arm64, s390x, ppc64le,
// riscv64), and PREFERENCE a VirtualMachineClusterPreference's name that is
// also a label value (at most 63 characters). Blank lines and lines
// starting with '#' are comments. It refuses, naming the line, anything
// else, a rule given twice, and tables over MaxPreferenceTableBytes or
// MaxPreferenceLines.
func ParsePreferenceTable(text string) (*PreferenceTable, error) {
	if len(text) > MaxPreferenceTableBytes {
		return nil, fmt.Errorf("the table is %d bytes, over the limit of %d", len(text), MaxPreferenceTableBytes)
	}
	t := &PreferenceTable{}
	seen := map[preferenceRow]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), MaxPreferenceTableBytes+1)
	n := 0
	for sc.Scan() {
		n++
		if n > MaxPreferenceLines {
			return nil, fmt.Errorf("the table has more than %d lines", MaxPreferenceLines)
		}
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r, err := parsePreferenceRow(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		key := r
		key.preference = ""
		if seen[key] {
			return nil, fmt.Errorf("line %d: %q repeats an earlier rule for the same ID, VERSION and ARCH", n, line)
		}
		seen[key] = true
		t.rows = append(t.rows, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the table: %w", err)
	}
	return t, nil
}

func parsePreferenceRow(line string) (preferenceRow, error) {
	var r preferenceRow
	lhs, rhs, ok := strings.Cut(line, "=")
	if !ok {
		return r, fmt.Errorf("%q: want ID [VERSION] [ARCH] = PREFERENCE", line)
	}
	r.preference = strings.TrimSpace(rhs)
	if errs := validation.IsValidLabelValue(r.preference); r.preference == "" || len(errs) > 0 || len(validation.IsDNS1123Subdomain(r.preference)) > 0 {
		return r, fmt.Errorf("preference %q: want the name of a VirtualMachineClusterPreference that is also a label value (lower-case letters, digits, '.' and '-', at most 63 characters)", r.preference)
	}
	fields := strings.Fields(lhs)
	if len(fields) == 0 || len(fields) > 3 {
		return r, fmt.Errorf("%q: want ID [VERSION] [ARCH] before '='", strings.TrimSpace(lhs))
	}
	r.id = fields[0]
	if !osIDPattern.MatchString(r.id) {
		return r, fmt.Errorf("ID %q: want os-release's ID (lower-case letters, digits, '.', '_' and '-')", r.id)
	}
	for _, f := range fields[1:] {
		switch {
		case archNames[f] && r.arch == "":
			r.arch = f
		case osVersionPattern.MatchString(f) && r.version == "" && r.arch == "":
			r.version = f
		default:
			return r, fmt.Errorf("%q: want ID [VERSION] [ARCH], VERSION starting with a digit and ARCH one of amd64, arm64, s390x, ppc64le, riscv64", strings.TrimSpace(lhs))
		}
	}
	return r, nil
}

// For is the preference for the guest on a hub of architecture arch
// (amd64 when empty), or "" when no rule matches. Of the rules matching
// the guest's ID, the one with the longest matching VERSION wins, and of
// those, the one naming arch over the one naming none.
func (t *PreferenceTable) For(g *api.GuestReport, arch string) string {
	if t == nil || g == nil || g.OS == nil {
		return ""
	}
	if arch == "" {
		arch = "amd64"
	}
	best, score := "", -1
	for _, r := range t.rows {
		if r.id != g.OS.ID || (r.arch != "" && r.arch != arch) {
			continue
		}
		if r.version != "" && g.OS.VersionID != r.version && !strings.HasPrefix(g.OS.VersionID, r.version+".") {
			continue
		}
		s := 2 * len(r.version)
		if r.arch != "" {
			s++
		}
		if s > score {
			best, score = r.preference, s
		}
	}
	return best
}

// Preferences gives the preference table in force: a provider's, read from
// a ConfigMap, or the built-in one. A nil *Preferences is the built-in
// table.
type Preferences struct {
	// Reader reads the ConfigMap; the manager's API reader, so that only
	// that one object is ever read (no cache of every ConfigMap).
	Reader client.Reader
	// Key names the ConfigMap.
	Key client.ObjectKey
	// Every is how often the ConfigMap is read again; 0 means a minute.
	Every  time.Duration
	Logger *slog.Logger

	mu      sync.Mutex
	table   *PreferenceTable
	version string // the resourceVersion table was read from
	readAt  time.Time
	failed  string // the last failure logged, to log each once
}

// ErrPreferenceTable is Load's error for a ConfigMap that is not a table.
var ErrPreferenceTable = errors.New("the preference table is not valid")

// Load reads the provider's table; image-syncer does at start, and refuses
// to start when the ConfigMap is missing, unreadable or malformed.
func (p *Preferences) Load(ctx context.Context) error {
	var cm corev1.ConfigMap
	if err := p.Reader.Get(ctx, p.Key, &cm); err != nil {
		return fmt.Errorf("reading the preference table ConfigMap %s: %w", p.Key, err)
	}
	t, err := tableOf(&cm)
	if err != nil {
		return fmt.Errorf("%w: ConfigMap %s: %w", ErrPreferenceTable, p.Key, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.table, p.version, p.readAt, p.failed = t, cm.ResourceVersion, time.Now(), ""
	return nil
}

// tableOf reads the one key of a preference table ConfigMap.
func tableOf(cm *corev1.ConfigMap) (*PreferenceTable, error) {
	text, ok := cm.Data[PreferenceTableKey]
	if !ok || len(cm.Data) != 1 || len(cm.BinaryData) != 0 {
		return nil, fmt.Errorf("want exactly one key, %s", PreferenceTableKey)
	}
	return ParsePreferenceTable(text)
}

// Table is the table in force. Once Every has passed since the last read
// it reads the ConfigMap again; while the ConfigMap is unreadable, missing
// or malformed, the last good table stays in force and the failure is
// logged as an error (once per failure), so that a broken edit never
// silently becomes the built-in table or no table.
func (p *Preferences) Table(ctx context.Context) *PreferenceTable {
	if p == nil || p.Reader == nil {
		return builtin
	}
	p.mu.Lock()
	stale := time.Since(p.readAt) >= p.every()
	if stale {
		p.readAt = time.Now() // one reader reads it again, the others use what is in force
	}
	p.mu.Unlock()
	if stale {
		if err := p.Load(ctx); err != nil {
			p.mu.Lock()
			if err.Error() != p.failed {
				p.failed = err.Error()
				p.logger().Error("preference table not read; the last good one stays in force", "configmap", p.Key.String(), "inForce", p.version, "error", err)
			}
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.table // nil, which gives no hints, until a table was read
}

func (p *Preferences) every() time.Duration {
	if p.Every <= 0 {
		return time.Minute
	}
	return p.Every
}

func (p *Preferences) logger() *slog.Logger {
	if p.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Logger
}
