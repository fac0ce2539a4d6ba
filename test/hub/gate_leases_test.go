package hub

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/test/harness"
)

// TestGateLeasesShareDigestsBetweenReplicas: on a real API server, two
// gate replicas never hold one digest's Lease at once; a released Lease
// goes to the other at once, and one whose holder stopped renewing it
// (a replica that died) goes to the other once it expires.
func TestGateLeasesShareDigestsBetweenReplicas(t *testing.T) {
	t.Parallel()
	hub := harness.StartHub(t, "hub-a")
	cs, err := kubernetes.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "imagepipe-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replica := func(name string) *gate.KubeLeases {
		return &gate.KubeLeases{Client: cs.CoordinationV1(), Namespace: "imagepipe-system", Holder: name, Duration: 3 * time.Second}
	}
	a, b := replica("gate-a"), replica("gate-b")
	const digest = "registry.example.com/acme/rhel@sha256:aaaa"

	releaseA, ok, err := a.Acquire(t.Context(), digest)
	if err != nil || !ok {
		t.Fatalf("replica a: %v, %v; want the free lease", ok, err)
	}
	if _, ok, err := b.Acquire(t.Context(), digest); err != nil || ok {
		t.Fatalf("replica b took a lease a holds: %v, %v", ok, err)
	}
	// a renews while it works: the lease outlives its duration.
	time.Sleep(4 * time.Second)
	if _, ok, err := b.Acquire(t.Context(), digest); err != nil || ok {
		t.Fatalf("replica b took a lease a renews: %v, %v", ok, err)
	}
	if _, ok, err := b.Acquire(t.Context(), "registry.example.com/acme/rhel@sha256:bbbb"); err != nil || !ok {
		t.Fatalf("replica b could not take another digest's lease: %v, %v", ok, err)
	}
	releaseA()
	dying, stop := context.WithCancel(t.Context())
	if _, ok, err := b.Acquire(dying, digest); err != nil || !ok {
		t.Fatalf("replica b after a released: %v, %v", ok, err)
	}
	// b dies: it stops renewing and never releases. a gets the lease once
	// it has expired, not before.
	stop()
	if _, ok, _ := a.Acquire(t.Context(), digest); ok {
		t.Fatal("replica a took the lease of b before it expired")
	}
	harness.WaitUntil(t, "the dead replica's lease to expire", 20*time.Second, 200*time.Millisecond, func() (bool, error) {
		_, ok, err := a.Acquire(t.Context(), digest)
		return ok, err
	})
}
