package gate

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// DefaultLeaseDuration is how long a lease of a replica that stopped
// renewing it holds: another replica takes the digest over after that.
const DefaultLeaseDuration = 30 * time.Second

// KubeLeases are Leases kept as coordination.k8s.io Leases in one
// namespace, named after the sha256 of the key, renewed every third of
// their duration and deleted on release.
type KubeLeases struct {
	Client    coordclient.LeasesGetter
	Namespace string
	// Holder names this replica (its pod name).
	Holder string
	// Duration is DefaultLeaseDuration when 0.
	Duration time.Duration
}

var _ Leases = (*KubeLeases)(nil)

func (l *KubeLeases) duration() time.Duration {
	if l.Duration > 0 {
		return l.Duration
	}
	return DefaultLeaseDuration
}

// leaseName is the Lease object of key.
func leaseName(key string) string {
	return fmt.Sprintf("imagepipe-gate-%x", sha256.Sum256([]byte(key)))[:55]
}

// Acquire takes the Lease of key when nobody holds it or its holder
// stopped renewing it; the API server's optimistic concurrency settles
// two replicas taking it at once.
func (l *KubeLeases) Acquire(ctx context.Context, key string) (func(), bool, error) {
	leases := l.Client.Leases(l.Namespace)
	name := leaseName(key)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(l.duration().Seconds())
	spec := coordinationv1.LeaseSpec{HolderIdentity: &l.Holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.Namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "imagepipe-gate"}},
			Spec:       spec,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, false, nil
		}
	case err != nil:
		return nil, false, err
	default:
		if held(cur, l.Holder, time.Now()) {
			return nil, false, nil
		}
		cur.Spec = spec
		cur, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return nil, false, nil
		}
	}
	if err != nil {
		return nil, false, err
	}
	return l.keep(ctx, cur), true, nil
}

// held reports whether another holder has a lease that has not expired.
func held(le *coordinationv1.Lease, me string, now time.Time) bool {
	s := le.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" || *s.HolderIdentity == me || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return false
	}
	return now.Before(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second))
}

// keep renews the lease until release, which deletes it.
func (l *KubeLeases) keep(ctx context.Context, le *coordinationv1.Lease) func() {
	leases := l.Client.Leases(l.Namespace)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(l.duration() / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				now := metav1.NewMicroTime(time.Now())
				le.Spec.RenewTime = &now
				if next, err := leases.Update(ctx, le, metav1.UpdateOptions{}); err == nil {
					le = next
				}
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			precond := metav1.Preconditions{UID: &le.UID, ResourceVersion: &le.ResourceVersion}
			_ = leases.Delete(cctx, le.Name, metav1.DeleteOptions{Preconditions: &precond})
		})
	}
}
