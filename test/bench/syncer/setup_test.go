//go:build linux

package syncer

// The hubs and syncers come from test/harness (StartSyncerHub, Syncer); this file adds the
// bench's measurements (/metrics scrapes, RSS) and its import helper.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

const (
	webhookToken = harness.SyncerWebhookToken
	tenantNS     = "acme"
)

// hub is a hub prepared for the syncer (harness.StartSyncerHub): the BaseImage CRD, the syncer's
// RBAC from config/syncer bound to the hub user "syncer", the tenant namespace acme, a default
// StorageClass whose StorageProfile offers ReadWriteMany Block, and CDI's controller, with the
// node stand-in paused: importer pods stay Pending.
type hub struct {
	*harness.SyncerHub
	http *http.Client // admin, for the apiserver's own /metrics
}

func startHub(t *testing.T, name string) *hub {
	t.Helper()
	h := &hub{SyncerHub: harness.StartSyncerHub(t, name, harness.SyncerHubOptions{Namespaces: []string{tenantNS}})}
	// The node takes no pod: CDI's importers would run on worker nodes,
	// not on the two cores the bench measures the syncer and the API
	// server on, and a created DataVolume is where the measured path ends.
	h.CDI.Node.Pause()
	var err error
	if h.http, err = rest.HTTPClientFor(h.RestConfig); err != nil {
		t.Fatal(err)
	}
	return h
}

// apiserverMetrics scrapes the hub's kube-apiserver /metrics as the admin.
func (h *hub) apiserverMetrics(t *testing.T) metrics {
	t.Helper()
	m, err := scrape(t.Context(), h.http, h.URL+"/metrics")
	if err != nil {
		t.Fatalf("hub %s: scraping the apiserver: %v", h.Name, err)
	}
	return m
}

// syncer is one image-syncer process (harness.Syncer) with the bench's measurements.
type syncer struct {
	*harness.Syncer
}

// reserveSyncer picks the syncer's ports, so that the registry can be told the webhook URL
// before the syncer starts.
func reserveSyncer(t *testing.T) *syncer { return &syncer{harness.ReserveSyncer(t)} }

// start runs the syncer under test against h as the RBAC-bound user "syncer", waits for
// /readyz, and stops it with SIGTERM when the test ends.
func (s *syncer) start(t *testing.T, h *hub, registryHost string, args ...string) {
	t.Helper()
	s.Start(t, testenv.ImageSyncer, h.SyncerHub, registryHost, args...)
}

// metrics scrapes the syncer's /metrics.
func (s *syncer) metrics(t *testing.T) metrics {
	t.Helper()
	m, err := scrape(t.Context(), http.DefaultClient, s.MetricsURL)
	if err != nil {
		t.Fatalf("scraping the syncer: %v", err)
	}
	return m
}

// memory reads the syncer's peak and current resident set size, in KiB, from /proc.
func (s *syncer) memory(t *testing.T) (peakKiB, nowKiB int64) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Pid()))
	if err != nil {
		t.Fatalf("reading the syncer's memory: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			peakKiB = v
		case "VmRSS:":
			nowKiB = v
		}
	}
	return peakKiB, nowKiB
}

// sample is one Prometheus sample.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is one scrape, in the Prometheus text format.
type metrics []sample

// sum adds the samples of name whose labels include every pair of match.
func (m metrics) sum(name string, match ...string) float64 {
	return m.sumIf(name, func(l map[string]string) bool {
		for i := 0; i+1 < len(match); i += 2 {
			if l[match[i]] != match[i+1] {
				return false
			}
		}
		return true
	})
}

// sumIf adds the samples of name whose labels keep says yes to.
func (m metrics) sumIf(name string, keep func(map[string]string) bool) float64 {
	var total float64
	for _, s := range m {
		if s.name == name && keep(s.labels) {
			total += s.value
		}
	}
	return total
}

func scrape(ctx context.Context, c *http.Client, url string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format: `name{k="v",...} value [timestamp]` lines,
// comments skipped.
func parseMetrics(r io.Reader) (metrics, error) {
	var out metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i < 0 {
			return nil, fmt.Errorf("metric line %q", line)
		} else {
			s.name, rest = line[:i], line[i:]
		}
		if rest[0] == '{' {
			var err error
			if rest, err = parseLabels(rest[1:], s.labels); err != nil {
				return nil, fmt.Errorf("metric line %q: %w", line, err)
			}
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metric line %q has no value", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels reads `k="v",...}` into labels and returns what follows the closing brace.
func parseLabels(s string, labels map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, ", ")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", fmt.Errorf("malformed labels at %q", s)
		}
		key := strings.TrimSpace(s[:eq])
		var v strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[i])
				}
				continue
			}
			v.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", fmt.Errorf("unterminated label value at %q", s)
		}
		labels[key] = v.String()
		s = s[i+1:]
	}
}

// rawDisk writes a 1 MiB raw disk whose content, and so whose image digest, depends on seed.
func rawDisk(t *testing.T, path, seed string) {
	t.Helper()
	data := bytes.Repeat([]byte(seed), (1<<20)/len(seed)+1)[:1<<20]
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// importImage runs imagectl import with a fresh IMAGEPIPE_CACHE and returns its result.
func importImage(t *testing.T, disk, ref string) api.ImportResult {
	t.Helper()
	cache, err := os.MkdirTemp("", "imagectl-cache-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(cache)
	r := testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: []string{"import", "--quiet", "-o", "json", disk, ref},
		Env:  []string{"IMAGEPIPE_CACHE=" + cache},
	})
	if r.Code != 0 {
		t.Fatalf("imagectl import %s %s: exit %d\n%s", disk, ref, r.Code, r.Stderr)
	}
	var res api.ImportResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("import output %q: %v", r.Stdout, err)
	}
	return res
}
