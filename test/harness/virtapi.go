package harness

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConsoleBanner is what the played serial port prints when a console connects.
const ConsoleBanner = "\r\nimagepipe test guest ttyS0\r\n\r\nlogin: "

// VirtAPIConsole plays the part of a hub that cannot run here behind KubeVirt's console
// subresource: virt-api, reached through the API server's aggregation layer, and the serial
// port of a running VM. What leads there is real: the APIService v1.subresources.kubevirt.io,
// the API server's front-proxy client certificate (which this end requires), and RBAC on
// virtualmachineinstances/console. The serial port echoes what it receives, as a terminal in
// cooked mode does, after ConsoleBanner.
type VirtAPIConsole struct {
	mu       sync.Mutex
	sessions []ConsoleSession
	hub      client.Client
}

// ConsoleSession is one console connection the far end served.
type ConsoleSession struct {
	// User is the X-Remote-User the API server vouched for.
	User           string
	Namespace, VMI string
	// Subprotocol is the websocket subprotocol agreed.
	Subprotocol string
}

// virtAPIService names the Service the APIService points at; the far end's serving
// certificate is for its cluster name, which the aggregator checks.
const virtAPIService = "virt-api"

// StartVirtAPIConsole starts the far end and registers it with the hub's aggregation layer,
// waiting until the API server reports the APIService Available. It stops when the test ends.
func (h *Hub) StartVirtAPIConsole(t T) *VirtAPIConsole {
	t.Helper()
	c, err := client.New(h.RestConfig, client.Options{Scheme: NewScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	v := &VirtAPIConsole{hub: c}
	ca, err := newTestCA("imagepipe test virt-api CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: virtAPIService},
		DNSNames:    []string{virtAPIService + "." + KubeVirtNamespace + ".svc"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	proxies := x509.NewCertPool()
	proxies.AppendCertsFromPEM(h.frontProxyCA)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           v,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: proxies, MinVersion: tls.VersionTLS12},
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KubeVirtNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// An ExternalName Service: the aggregator dials its name and the APIService's port,
	// here the far end on the loopback address, and checks the serving certificate
	// against virt-api.kubevirt.svc.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: virtAPIService, Namespace: KubeVirtNamespace},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1"},
	}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatalf("creating the virt-api Service: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1.subresources.kubevirt.io"},
		"spec": map[string]any{
			"group": "subresources.kubevirt.io", "version": "v1",
			"service":              map[string]any{"namespace": KubeVirtNamespace, "name": virtAPIService, "port": int64(port)},
			"caBundle":             ca.certPEM,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
		},
	}}
	if err := c.Create(ctx, apiService); err != nil {
		t.Fatalf("registering the virt-api APIService: %v", err)
	}
	WaitUntil(t, "the APIService v1.subresources.kubevirt.io Available", time.Minute, 200*time.Millisecond, func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(apiService), apiService); err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(apiService.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			if m["type"] == "Available" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	return v
}

// writeStatus answers with err as a Kubernetes Status, as virt-api does.
func writeStatus(w http.ResponseWriter, err error) {
	status := apierrors.NewInternalError(err).ErrStatus
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		status = se.ErrStatus
	}
	status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(status.Code))
	_ = json.NewEncoder(w).Encode(status)
}

// Sessions returns the console sessions served so far.
func (v *VirtAPIConsole) Sessions() []ConsoleSession {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]ConsoleSession(nil), v.sessions...)
}

var consoleUpgrader = websocket.Upgrader{Subprotocols: []string{"plain.kubevirt.io"}, HandshakeTimeout: 10 * time.Second}

func (v *VirtAPIConsole) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != frontProxyClient {
		http.Error(w, "only the API server's front proxy may call", http.StatusForbidden)
		return
	}
	const prefix = "/apis/subresources.kubevirt.io/v1"
	switch {
	case r.URL.Path == prefix:
		// Discovery, which the aggregator's availability check also reads.
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: "subresources.kubevirt.io/v1",
			APIResources: []metav1.APIResource{{Name: "virtualmachineinstances/console", Namespaced: true, Kind: "VirtualMachineInstance", Verbs: []string{"get"}}},
		})
		return
	case strings.HasPrefix(r.URL.Path, prefix+"/namespaces/") && strings.HasSuffix(r.URL.Path, "/console"):
	default:
		http.NotFound(w, r)
		return
	}
	// /namespaces/NS/virtualmachineinstances/NAME/console
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, prefix+"/"), "/")
	if len(parts) != 5 || parts[2] != "virtualmachineinstances" {
		http.NotFound(w, r)
		return
	}
	ns, name := parts[1], parts[3]
	// virt-api answers for running instances only.
	var vmi kubevirtv1.VirtualMachineInstance
	if err := v.hub.Get(r.Context(), client.ObjectKey{Namespace: ns, Name: name}, &vmi); err != nil {
		writeStatus(w, err)
		return
	}
	if vmi.Status.Phase != kubevirtv1.Running {
		writeStatus(w, apierrors.NewBadRequest("Unable to connect to VM because phase is "+strconv.Quote(string(vmi.Status.Phase))+" instead of Running"))
		return
	}
	conn, err := consoleUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	v.mu.Lock()
	v.sessions = append(v.sessions, ConsoleSession{User: r.Header.Get("X-Remote-User"), Namespace: ns, VMI: name, Subprotocol: conn.Subprotocol()})
	v.mu.Unlock()
	if err := conn.WriteMessage(websocket.BinaryMessage, []byte(ConsoleBanner)); err != nil {
		return
	}
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			return
		}
		if err := conn.WriteMessage(websocket.BinaryMessage, data); err != nil {
			return
		}
	}
}
