package netsync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// The ResourceQuotas the syncer keeps so that a tenant's quota holds over
// its home and its networks' namespaces together.
//
// The provider bounds a tenant with ResourceQuotas in its home namespace
// (the tenant's total, T: for each resource, the least hard limit of the
// unscoped quotas there). Each network's namespace gets the quota
// QuotaNetworkShare, of the share its PrivateNetwork asks for
// (spec.quota, which cannot change), and the home gets QuotaHomeShare, of
// T less every network's share. The API server enforces each namespace's
// quotas atomically, so the sum holds under any concurrency.
//
// A share is granted once, before the tenant may act in the network's
// namespace (its RoleBinding comes after): the home's quota is lowered
// first, and only once the API server enforces the lower limit (the
// quota's status.hard) and the home's use is within it is the network's
// quota made. A share that does not fit is refused, and the network gets
// no access.
const (
	QuotaHomeShare    = "imagepipe-home-share"
	QuotaNetworkShare = "imagepipe-network-share"
)

// labelShareOf, on a network's share quota, is the tenant's home whose
// total it is a share of. Tenants cannot write quotas.
const labelShareOf = "imagepipe.io/quota-share-of"

// errQuotaPending: a quota's limits are not enforced yet (the quota
// controller has not copied spec.hard to status.hard); look again soon.
var errQuotaPending = errors.New("waiting for the API server to enforce the network's and its home's quotas")

// tenantTotal is the least hard limit of each resource over the home's
// unscoped quotas that are not the syncer's: what the provider gives the
// tenant.
func tenantTotal(quotas []corev1.ResourceQuota) corev1.ResourceList {
	total := corev1.ResourceList{}
	for _, q := range quotas {
		if strings.HasPrefix(q.Name, "imagepipe-") || len(q.Spec.Scopes) > 0 || q.Spec.ScopeSelector != nil {
			continue
		}
		for r, v := range q.Spec.Hard {
			if have, ok := total[r]; !ok || v.Cmp(have) < 0 {
				total[r] = v
			}
		}
	}
	return total
}

// usedIn is what the home's quotas say the home uses, by resource.
func usedIn(quotas []corev1.ResourceQuota) corev1.ResourceList {
	used := corev1.ResourceList{}
	for _, q := range quotas {
		for res, v := range q.Status.Used {
			if have, ok := used[res]; !ok || v.Cmp(have) > 0 {
				used[res] = v
			}
		}
	}
	return used
}

// shareOf is pn's share of total: what spec.quota asks of each resource
// total bounds, 0 for the others.
func shareOf(pn *v1alpha1.PrivateNetwork, total corev1.ResourceList) corev1.ResourceList {
	share := corev1.ResourceList{}
	for r := range total {
		share[r] = resource.Quantity{}
		if v, ok := pn.Spec.Quota[r]; ok {
			share[r] = v
		}
	}
	return share
}

// ensureQuota keeps the quotas of pn's namespace ns and of its home, and
// says whether the tenant may be given access to ns.
func (r *Reconciler) ensureQuota(ctx context.Context, pn *v1alpha1.PrivateNetwork, ns string) outcome {
	var home corev1.ResourceQuotaList
	if err := r.Client.List(ctx, &home, client.InNamespace(pn.Namespace)); err != nil {
		return outcome{err: err}
	}
	if len(tenantTotal(home.Items)) == 0 {
		return outcome{} // the provider bounds nothing here
	}
	// A network already granted is kept from the cache, as VMs come and
	// go; a grant reads the API server itself.
	granted, others, err := r.grants(ctx, r.Client, pn, ns)
	if err == nil && granted == nil {
		granted, others, err = r.grants(ctx, r.live(), pn, ns)
	}
	if errors.Is(err, errQuotaPending) {
		return pending()
	}
	if err != nil {
		return outcome{err: err}
	}
	live := r.live()
	if err := live.List(ctx, &home, client.InNamespace(pn.Namespace)); err != nil {
		return outcome{err: err}
	}
	total := tenantTotal(home.Items)
	if granted != nil {
		want := clamp(remaining(total, others, granted.Spec.Hard))
		var q corev1.ResourceQuota
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: pn.Namespace, Name: QuotaHomeShare}, &q); err == nil &&
			equality.Semantic.DeepEqual(q.Spec.Hard, want) && equality.Semantic.DeepEqual(q.Status.Hard, want) {
			return outcome{}
		}
		// The home's share changes: from what the API server says, never
		// from a cache that may miss a share just granted.
		if granted, others, err = r.grants(ctx, live, pn, ns); err != nil || granted == nil {
			return outcome{err: cmp.Or(err, errQuotaPending)}
		}
		return r.setHomeShare(ctx, pn.Namespace, remaining(total, others, granted.Spec.Hard))
	}
	share := shareOf(pn, total)
	try := remaining(total, others, share)
	for res, v := range try {
		if v.Sign() < 0 {
			return refused(v1alpha1.ReasonQuotaTooLarge, fmt.Errorf("the network asks for %s of %s, but the tenant's quota in %s is %s and its other networks take %s",
				quantity(share, res), res, pn.Namespace, quantity(total, res), quantity(sum(others), res)))
		}
	}
	// What the home uses already must fit what it would keep: checked
	// first, so that a share that cannot fit lowers nothing, and again
	// once the lower limit is enforced, against what came meanwhile.
	for res, used := range usedIn(home.Items) {
		if hard, ok := try[res]; ok && used.Cmp(hard) > 0 {
			return refused(v1alpha1.ReasonQuotaTooLarge, fmt.Errorf("the network asks for %s of %s, but %s already uses %s of the %s the tenant's quota leaves it",
				quantity(share, res), res, pn.Namespace, used.String(), quantity(remaining(total, others, nil), res)))
		}
	}
	if o := r.setHomeShare(ctx, pn.Namespace, try); o.err != nil || o.reason != "" {
		return o
	}
	var q corev1.ResourceQuota
	if err := live.Get(ctx, client.ObjectKey{Namespace: pn.Namespace, Name: QuotaHomeShare}, &q); err != nil {
		return outcome{err: err}
	}
	for res, hard := range try {
		if used := q.Status.Used[res]; used.Cmp(hard) > 0 {
			if back := r.setHomeShare(ctx, pn.Namespace, remaining(total, others, nil)); back.err != nil && back.reason == "" {
				return back
			}
			return refused(v1alpha1.ReasonQuotaTooLarge, fmt.Errorf("the network asks for %s of %s, but %s already uses %s of the %s the tenant's quota leaves it",
				quantity(share, res), res, pn.Namespace, used.String(), quantity(remaining(total, others, nil), res)))
		}
	}
	mine := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: QuotaNetworkShare, Namespace: ns, Labels: map[string]string{tenantnet.LabelNetwork: pn.Name, labelShareOf: pn.Namespace}},
		Spec:       corev1.ResourceQuotaSpec{Hard: share},
	}
	if err := r.Client.Create(ctx, mine); err != nil {
		return outcome{err: err}
	}
	r.logger().Info("granted a network its share of the tenant's quota", "network", pn.Namespace+"/"+pn.Name, "share", share)
	return pending()
}

// grants reads, with reader, the share quota of pn's namespace ns (nil
// before it is granted) and those of the tenant's other networks.
func (r *Reconciler) grants(ctx context.Context, reader client.Reader, pn *v1alpha1.PrivateNetwork, ns string) (*corev1.ResourceQuota, []corev1.ResourceList, error) {
	var list corev1.ResourceQuotaList
	if err := reader.List(ctx, &list, client.MatchingLabels{labelShareOf: pn.Namespace}); err != nil {
		return nil, nil, err
	}
	var mine *corev1.ResourceQuota
	var others []corev1.ResourceList
	for i, q := range list.Items {
		switch {
		case q.Name != QuotaNetworkShare:
		case q.Namespace == ns:
			mine = &list.Items[i]
		default:
			others = append(others, q.Spec.Hard)
		}
	}
	if mine != nil && !equality.Semantic.DeepEqual(mine.Status.Hard, mine.Spec.Hard) {
		return nil, nil, errQuotaPending
	}
	return mine, others, nil
}

// setHomeShare makes the home's share quota hard, and is pending until
// the API server enforces it. A hard equal to the tenant's total needs no
// quota of the syncer's.
func (r *Reconciler) setHomeShare(ctx context.Context, home string, hard corev1.ResourceList) outcome {
	hard = clamp(hard)
	var q corev1.ResourceQuota
	err := r.live().Get(ctx, client.ObjectKey{Namespace: home, Name: QuotaHomeShare}, &q)
	switch {
	case apierrors.IsNotFound(err):
		q = corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: QuotaHomeShare, Namespace: home}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}
		if err := r.Client.Create(ctx, &q); err != nil {
			return outcome{err: err}
		}
		return pending()
	case err != nil:
		return outcome{err: err}
	case !equality.Semantic.DeepEqual(q.Spec.Hard, hard):
		q.Spec.Hard = hard
		if err := r.Client.Update(ctx, &q); err != nil {
			return outcome{err: err}
		}
		return pending()
	case !equality.Semantic.DeepEqual(q.Status.Hard, hard):
		return pending()
	}
	return outcome{}
}

// releaseShare gives a deleted network's share back to its home, once its
// namespace (and so its quota) is gone.
func (r *Reconciler) releaseShare(ctx context.Context, pn *v1alpha1.PrivateNetwork) error {
	var home corev1.ResourceQuotaList
	if err := r.live().List(ctx, &home, client.InNamespace(pn.Namespace)); err != nil {
		return err
	}
	total := tenantTotal(home.Items)
	if len(total) == 0 {
		return nil
	}
	_, others, err := r.grants(ctx, r.live(), pn, "")
	if err != nil {
		return err
	}
	o := r.setHomeShare(ctx, pn.Namespace, remaining(total, others, nil))
	if o.reason == v1alpha1.ReasonQuotaPending {
		return nil // raising a limit is safe before it is enforced
	}
	return o.err
}

// clamp makes negative limits 0: the provider lowered the total under
// the shares, and the home may then start nothing more.
func clamp(l corev1.ResourceList) corev1.ResourceList {
	for res, v := range l {
		if v.Sign() < 0 {
			l[res] = resource.Quantity{}
		}
	}
	return l
}

func pending() outcome {
	return outcome{reason: v1alpha1.ReasonQuotaPending, err: errQuotaPending}
}

// remaining is total less the shares and extra, by resource (negative
// when they take more than total).
func remaining(total corev1.ResourceList, shares []corev1.ResourceList, extra corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	taken := sum(append(slices.Clone(shares), extra))
	for res, v := range total {
		v = v.DeepCopy()
		if t, ok := taken[res]; ok {
			v.Sub(t)
		}
		out[res] = v
	}
	return out
}

func sum(lists []corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, l := range lists {
		for res, v := range l {
			t := out[res]
			t.Add(v)
			out[res] = t
		}
	}
	return out
}

func quantity(l corev1.ResourceList, res corev1.ResourceName) string {
	v := l[res]
	return v.String()
}
