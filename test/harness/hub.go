package harness

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/imagepipe/imagepipe/internal/need"
)

// HubUsers are the non-admin users every hub knows, each with its own bearer token and no
// permissions beyond what Kubernetes grants every authenticated user (discovery, self reviews).
// Tests bind them with RBAC to check that a component works with least privilege. The token file
// is read once at start, so these are the only users a hub has besides its admin.
var HubUsers = []string{"syncer", "tenant-a", "tenant-b"}

// hubCRDDirs are the folders under CRDDir that StartHub installs on every hub.
var hubCRDDirs = []string{"cdi", "kubevirt", "instancetype"}

// Hub is a running Kubernetes control plane without nodes — etcd and kube-apiserver, both built
// by buildtools.sh — with the CDI, KubeVirt and instancetype CRDs installed from their real
// schemas. No controller runs: objects are stored, validated by their schemas and authorized by
// RBAC, and nothing acts on them (a DataVolume stays without status unless a test plays CDI).
type Hub struct {
	// Name tells hubs apart in logs and is the name of the cluster, user and context in the
	// kubeconfig files.
	Name string
	// URL is the apiserver's address, https://127.0.0.1:PORT.
	URL string
	// Kubeconfig is the path of a kubeconfig file for the admin (group system:masters), with
	// the hub's CA embedded, for tools and the syncer.
	Kubeconfig string
	// RestConfig is the admin's client configuration, verifying the apiserver's certificate
	// against the hub's CA. Its rate limit (QPS 50, burst 100) is above client-go's default.
	RestConfig *rest.Config

	dir   string
	caPEM []byte
	// frontProxyCA signs the client certificate the API server presents to
	// aggregated API servers, which trust it for the X-Remote-User headers.
	frontProxyCA []byte
	tokens       map[string]string // user -> bearer token, admin included

	etcd, apiserver            *proc
	apiserverBin, apiserverLog string
	apiserverArgs              []string
}

// CRDDir is where buildtools.sh writes the generated CRDs: $IMAGEPIPE_CACHE/crds, else
// $HOME/.cache/imagepipe/crds.
func CRDDir() string {
	if cache := os.Getenv("IMAGEPIPE_CACHE"); cache != "" {
		return filepath.Join(cache, "crds")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "imagepipe", "crds")
}

// StartHub starts etcd and kube-apiserver on free ports of 127.0.0.1 with their data, certificates
// and logs in t.TempDir(), waits until the apiserver's /readyz answers 200, installs the CDI,
// KubeVirt and instancetype CRDs and the CRDs in extraCRDs (files, or folders whose .yaml, .yml and
// .json files are read; documents that are not CRDs are skipped), waits until every one is
// Established, and stops both processes when the test ends. It skips the test when etcd,
// kube-apiserver or the generated CRDs are missing.
//
// The apiserver authenticates bearer tokens from a static file (the admin in system:masters and
// the HubUsers) and authorizes with RBAC only; service accounts get a key pair made for this hub.
// Every hub has its own CA and tokens, so a token of one hub is refused by another.
func StartHub(t T, name string, extraCRDs ...string) *Hub {
	t.Helper()
	etcdBin := Binary(t, "etcd")
	apiserverBin := Binary(t, "kube-apiserver")
	for _, d := range hubCRDDirs {
		if _, err := os.Stat(filepath.Join(CRDDir(), d)); err != nil {
			need.Missing(t, "the %s CRDs are not generated in %s: run make tools", d, CRDDir())
		}
	}

	h := &Hub{Name: name, dir: t.TempDir(), tokens: map[string]string{}}
	etcdLog := filepath.Join(h.dir, "etcd.log")
	h.apiserverLog = filepath.Join(h.dir, "kube-apiserver.log")
	t.Cleanup(func() {
		// The apiserver first: it would retry a vanished etcd until its own timeout.
		for _, p := range []struct {
			name string
			proc *proc
		}{{"kube-apiserver", h.apiserver}, {"etcd", h.etcd}} {
			if p.proc != nil {
				if err := p.proc.stop(); err != nil {
					t.Errorf("stopping hub %s %s: %v", name, p.name, err)
				}
			}
		}
		logOnFailure(t, "hub "+name+" etcd", etcdLog)
		logOnFailure(t, "hub "+name+" kube-apiserver", h.apiserverLog)
	})

	sec := h.writeSecrets(t)
	etcdURL := h.startEtcd(t, etcdBin, etcdLog)
	h.startAPIServer(t, apiserverBin, etcdURL, sec)
	var err error
	if h.Kubeconfig, err = h.writeKubeconfig("admin"); err != nil {
		t.Fatalf("writing hub %s kubeconfig: %v", name, err)
	}
	h.installHubCRDs(t, extraCRDs)
	return h
}

// hubSecrets are the files the apiserver authenticates with.
type hubSecrets struct {
	certs        certFiles
	saKey, saPub string // the service-account signing key pair
	tokenFile    string
	// The aggregation layer: the CA aggregated servers trust for the
	// requests the API server proxies, and the API server's client
	// certificate it signs.
	frontProxyCA, proxyCert, proxyKey string
}

// writeSecrets makes the hub's CA, serving certificate, service-account
// keys and token file.
func (h *Hub) writeSecrets(t T) hubSecrets {
	t.Helper()
	pki := filepath.Join(h.dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	var sec hubSecrets
	var err error
	if sec.certs, err = writeCerts(pki); err != nil {
		t.Fatalf("making hub %s certificates: %v", h.Name, err)
	}
	if h.caPEM, err = os.ReadFile(sec.certs.CA); err != nil {
		t.Fatal(err)
	}
	if sec.saKey, sec.saPub, err = writeServiceAccountKeys(pki); err != nil {
		t.Fatalf("making hub %s service-account keys: %v", h.Name, err)
	}
	if sec.tokenFile, err = h.writeTokens(); err != nil {
		t.Fatalf("writing hub %s tokens: %v", h.Name, err)
	}
	if err := h.writeFrontProxy(pki, &sec); err != nil {
		t.Fatalf("making hub %s front-proxy certificates: %v", h.Name, err)
	}
	return sec
}

// frontProxyClient is the name in the API server's front-proxy client
// certificate, the only one aggregated servers accept.
const frontProxyClient = "front-proxy-client"

func (h *Hub) writeFrontProxy(pki string, sec *hubSecrets) error {
	ca, err := newTestCA("imagepipe test front-proxy CA")
	if err != nil {
		return err
	}
	cert, key, err := ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: frontProxyClient}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return err
	}
	sec.frontProxyCA, sec.proxyCert, sec.proxyKey = filepath.Join(pki, "front-proxy-ca.pem"), filepath.Join(pki, "proxy-client.pem"), filepath.Join(pki, "proxy-client-key.pem")
	for path, data := range map[string][]byte{sec.frontProxyCA: ca.certPEM, sec.proxyCert: cert, sec.proxyKey: key} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
	}
	h.frontProxyCA = ca.certPEM
	return nil
}

// startEtcd starts the hub's etcd on free ports, trying again when
// another process took a port first, and returns its client URL.
func (h *Hub) startEtcd(t T, bin, logFile string) string {
	t.Helper()
	var etcdURL string
	var err error
	for range startAttempts {
		etcdURL = "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		if h.etcd, err = startEtcd(bin, h.dir, logFile, etcdURL, freePort(t)); !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting hub %s etcd: %v", h.Name, err)
	}
	return etcdURL
}

// startAPIServer starts kube-apiserver on a free port with token
// authentication and RBAC, and waits until /readyz answers 200.
func (h *Hub) startAPIServer(t T, bin, etcdURL string, sec hubSecrets) {
	t.Helper()
	h.RestConfig = &rest.Config{
		BearerToken:     h.tokens["admin"],
		TLSClientConfig: rest.TLSClientConfig{CAData: h.caPEM},
		QPS:             50,
		Burst:           100,
	}
	var err error
	for range startAttempts {
		port := freePort(t)
		h.URL = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		h.RestConfig.Host = h.URL
		args := []string{
			"--etcd-servers", etcdURL,
			"--secure-port", strconv.Itoa(port),
			"--bind-address", "127.0.0.1",
			"--cert-dir", filepath.Join(h.dir, "apiserver-certs"),
			"--tls-cert-file", sec.certs.Cert,
			"--tls-private-key-file", sec.certs.Key,
			"--token-auth-file", sec.tokenFile,
			"--authorization-mode", "RBAC",
			"--service-account-issuer", "https://kubernetes.default.svc",
			"--service-account-key-file", sec.saPub,
			"--service-account-signing-key-file", sec.saKey,
			"--service-cluster-ip-range", "10.0.0.0/24",
			"--disable-admission-plugins", "ServiceAccount",
			// No nodes and a loopback address: there are no endpoints to publish for the
			// kubernetes service, and trying logs an error every few seconds.
			"--endpoint-reconciler-type", "none",
			// The aggregation layer, for APIServices such as KubeVirt's subresources.
			"--requestheader-client-ca-file", sec.frontProxyCA,
			"--requestheader-allowed-names", frontProxyClient,
			"--requestheader-username-headers", "X-Remote-User",
			"--requestheader-group-headers", "X-Remote-Group",
			"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
			"--proxy-client-cert-file", sec.proxyCert,
			"--proxy-client-key-file", sec.proxyKey,
		}
		if h.apiserver, err = startProc(h.apiserverLog, nil, bin, args...); err != nil {
			break
		}
		h.apiserverBin, h.apiserverArgs = bin, args
		if err = h.waitReadyz(h.apiserver); !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting hub %s kube-apiserver: %v", h.Name, err)
	}
}

// installHubCRDs installs the CDI, KubeVirt and instancetype CRDs and the
// test's own, and waits until each is Established.
func (h *Hub) installHubCRDs(t T, extraCRDs []string) {
	t.Helper()
	paths := make([]string, 0, len(hubCRDDirs)+len(extraCRDs))
	for _, d := range hubCRDDirs {
		paths = append(paths, filepath.Join(CRDDir(), d))
	}
	crds, err := readCRDs(append(paths, extraCRDs...))
	if err != nil {
		t.Fatalf("reading CRDs for hub %s: %v", h.Name, err)
	}
	if err := h.installCRDs(t.Context(), crds); err != nil {
		t.Fatalf("installing CRDs on hub %s: %v", h.Name, err)
	}
}

// RestartAPIServer stops the hub's kube-apiserver (SIGTERM), keeps it stopped for down, starts
// it again on the same port with the same etcd, and waits until /readyz answers 200. Clients see
// the hub vanish and come back, as during an apiserver upgrade; everything stored in etcd
// survives.
func (h *Hub) RestartAPIServer(t T, down time.Duration) {
	t.Helper()
	if err := h.apiserver.stop(); err != nil {
		t.Fatalf("stopping hub %s kube-apiserver: %v", h.Name, err)
	}
	time.Sleep(down) // the outage itself, not a wait for something to happen
	var err error
	if h.apiserver, err = startProc(h.apiserverLog, nil, h.apiserverBin, h.apiserverArgs...); err != nil {
		t.Fatalf("restarting hub %s kube-apiserver: %v", h.Name, err)
	}
	if err := h.waitReadyz(h.apiserver); err != nil {
		t.Fatalf("restarting hub %s kube-apiserver: %v", h.Name, err)
	}
}

// LogPaths are the files holding the stdout and stderr of the hub's etcd and kube-apiserver,
// in that order.
func (h *Hub) LogPaths() []string {
	return []string{filepath.Join(h.dir, "etcd.log"), filepath.Join(h.dir, "kube-apiserver.log")}
}

// UserKubeconfig returns the path of a kubeconfig file for user, one of HubUsers, authenticating
// with that user's own token. The user starts with no permissions; bind it with RBAC.
func (h *Hub) UserKubeconfig(t T, user string) string {
	t.Helper()
	if user == "admin" || h.tokens[user] == "" {
		t.Fatalf("hub %s has no user %q; its users are %v (and the admin, in Kubeconfig)", h.Name, user, HubUsers)
	}
	path, err := h.writeKubeconfig(user)
	if err != nil {
		t.Fatalf("writing hub %s kubeconfig for %s: %v", h.Name, user, err)
	}
	return path
}

// writeTokens makes a random token for the admin and each of HubUsers and writes the apiserver's
// token file: token,user,uid[,"groups"].
func (h *Hub) writeTokens() (string, error) {
	var b strings.Builder
	h.tokens["admin"] = randomHex(16)
	fmt.Fprintf(&b, "%s,admin,admin,system:masters\n", h.tokens["admin"])
	for _, user := range HubUsers {
		h.tokens[user] = randomHex(16)
		fmt.Fprintf(&b, "%s,%s,%s\n", h.tokens[user], user, user)
	}
	path := filepath.Join(h.dir, "tokens.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// writeKubeconfig writes DIR/USER.kubeconfig for the hub with the CA embedded, so the file still
// works when copied elsewhere.
func (h *Hub) writeKubeconfig(user string) (string, error) {
	config := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{
			h.Name: {Server: h.URL, CertificateAuthorityData: h.caPEM},
		},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{
			user: {Token: h.tokens[user]},
		},
		Contexts: map[string]*clientcmdapi.Context{
			h.Name: {Cluster: h.Name, AuthInfo: user},
		},
		CurrentContext: h.Name,
	}
	path := filepath.Join(h.dir, user+".kubeconfig")
	if err := clientcmd.WriteToFile(config, path); err != nil {
		return "", err
	}
	return path, nil
}

// waitReadyz waits until the apiserver answers GET /readyz with 200 to the admin.
func (h *Hub) waitReadyz(p *proc) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.caPEM)
	probe := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true,
	}}
	auth := http.Header{"Authorization": {"Bearer " + h.tokens["admin"]}}
	return waitReady(p, httpAnswers(probe, h.URL+"/readyz", auth, http.StatusOK))
}

// installCRDs creates crds and waits until each is Established with its names accepted.
func (h *Hub) installCRDs(ctx context.Context, crds []*apiextensionsv1.CustomResourceDefinition) error {
	client, err := apiextensions.NewForConfig(h.RestConfig)
	if err != nil {
		return err
	}
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		if _, err := api.Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating %s: %w", crd.Name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, crd := range crds {
		for {
			got, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("waiting for %s: %w", crd.Name, err)
			}
			// Established is set before discovery serves the kinds, and
			// clients find kinds through discovery ("no matches for kind").
			if crdCondition(got, apiextensionsv1.Established) && crdCondition(got, apiextensionsv1.NamesAccepted) && discovered(client, got) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s to be established and discovered: %w (conditions %+v)", crd.Name, ctx.Err(), got.Status.Conditions)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// discovered reports whether the apiserver's discovery lists crd's kind
// in every version it serves.
func discovered(client apiextensions.Interface, crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		list, err := client.Discovery().ServerResourcesForGroupVersion(crd.Spec.Group + "/" + v.Name)
		if err != nil {
			return false
		}
		found := false
		for _, r := range list.APIResources {
			found = found || r.Name == crd.Spec.Names.Plural
		}
		if !found {
			return false
		}
	}
	return true
}

// crdCondition reports whether the CRD's condition of type c is True.
func crdCondition(crd *apiextensionsv1.CustomResourceDefinition, c apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	for _, cond := range crd.Status.Conditions {
		if cond.Type == c {
			return cond.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// readCRDs reads the CRDs in paths, each a file or a folder of .yaml, .yml and .json files (not
// recursive), in order. Multi-document YAML is allowed; documents of other kinds are skipped, but a
// file named explicitly must hold at least one CRD.
func readCRDs(paths []string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, path := range paths {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			found, err := readCRDFile(path)
			if err != nil {
				return nil, err
			}
			if len(found) == 0 {
				return nil, fmt.Errorf("%s holds no CustomResourceDefinition", path)
			}
			crds = append(crds, found...)
			continue
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() || !slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(e.Name())) {
				continue
			}
			found, err := readCRDFile(filepath.Join(path, e.Name()))
			if err != nil {
				return nil, err
			}
			crds = append(crds, found...)
		}
	}
	return crds, nil
}

// readCRDFile decodes every CustomResourceDefinition in one YAML or JSON file.
func readCRDFile(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := dec.Decode(crd); errors.Is(err, io.EOF) {
			return crds, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		if crd.APIVersion != apiextensionsv1.SchemeGroupVersion.String() || crd.Kind != "CustomResourceDefinition" {
			continue // an empty document, a kustomization, or another kind of object
		}
		crds = append(crds, crd)
	}
}

// startEtcd runs a single-member etcd serving clients on clientURL and peers on peerPort, and
// waits until /health reports a leader. fsync is off: the data lives only as long as the test.
func startEtcd(bin, dir, logPath, clientURL string, peerPort int) (*proc, error) {
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))
	// A failed attempt may have initialised the data with other peer URLs.
	if err := os.RemoveAll(filepath.Join(dir, "etcd")); err != nil {
		return nil, err
	}
	p, err := startProc(logPath, nil, bin,
		"--name", "hub",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "hub="+peerURL,
		"--unsafe-no-fsync",
	)
	if err != nil {
		return nil, err
	}
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	err = waitReady(p, httpAnswers(probe, clientURL+"/health", nil, http.StatusOK))
	if err != nil {
		_ = p.stop()
		return nil, err
	}
	return p, nil
}

// writeServiceAccountKeys writes an ECDSA P-256 key pair for signing and verifying service-account
// tokens (sa.key, SEC 1; sa.pub, PKIX) into dir.
func writeServiceAccountKeys(dir string) (keyPath, pubPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	keyPath, pubPath = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, nil
}
