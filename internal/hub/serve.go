package hub

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// serve points the DataSource at the imported digest's PVC, marks the
// BaseImage Ready and collects imports beyond the retention.
func (r *Reconciler) serve(ctx context.Context, bi *v1alpha1.BaseImage, im cdi.Import) error {
	st := &bi.Status
	name := bi.Name // one BaseImage, one DataSource, of the same name
	im.Digest, im.Tag = st.ImportedDigest, bi.Spec.Tag
	want := im.DataSource(name, st.PVCName)
	want.Labels[cdi.LabelBaseImage] = bi.Name
	want.Labels[cdi.LabelTag] = cdi.LabelValue(bi.Spec.Tag)
	var cur cdiv1.DataSource
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want); err != nil {
			return fmt.Errorf("creating DataSource %s/%s: %w", bi.Namespace, name, err)
		}
		log.FromContext(ctx).Info("DataSource created", "datasource", client.ObjectKeyFromObject(want), "pvc", st.PVCName)
	case err != nil:
		return fmt.Errorf("reading DataSource %s/%s: %w", bi.Namespace, name, err)
	case !ownsDataSource(bi, &cur):
		return r.conflict(bi, &ConflictError{Kind: "DataSource", Namespace: bi.Namespace, Name: name, Owner: ownerOf(&cur)})
	case !equality.Semantic.DeepEqual(cur.Spec.Source, want.Spec.Source) || !labelsContain(cur.Labels, want.Labels) ||
		!sameKeys(cur.Labels, want.Labels, cdi.HintLabels) || !sameKeys(cur.Annotations, want.Annotations, cdi.GuestAnnotationKeys):
		cur.Spec.Source = want.Spec.Source
		cur.Labels = setKeys(cur.Labels, want.Labels, cdi.HintLabels)
		maps.Copy(cur.Labels, want.Labels)
		cur.Annotations = setKeys(cur.Annotations, want.Annotations, cdi.GuestAnnotationKeys)
		if err := r.Client.Update(ctx, &cur); err != nil {
			return fmt.Errorf("switching DataSource %s/%s: %w", bi.Namespace, name, err)
		}
		log.FromContext(ctx).Info("DataSource switched", "datasource", client.ObjectKeyFromObject(want), "pvc", st.PVCName, "digest", st.ImportedDigest)
	}
	st.DataSourceName = name
	if st.ImportedDigest == bi.Spec.Digest {
		st.Phase = v1alpha1.PhaseReady
		r.condition(bi, v1alpha1.ConditionProgressing, false, "Imported", "the newest digest is imported")
	}
	r.condition(bi, v1alpha1.ConditionReady, true, "Imported", fmt.Sprintf("DataSource %s serves %s", name, st.ImportedDigest))
	return r.collect(ctx, bi, im.Image, cdi.DataVolumeName(im.Image, bi.Spec.Digest))
}

// sameKeys reports whether have and want agree on keys, present or not.
func sameKeys(have, want map[string]string, keys []string) bool {
	for _, k := range keys {
		h, hok := have[k]
		w, wok := want[k]
		if h != w || hok != wok {
			return false
		}
	}
	return true
}

// setKeys makes m hold want's keys among keys, and only those: a hint or
// a fact the image no longer has is removed.
func setKeys(m, want map[string]string, keys []string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	for _, k := range keys {
		if v, ok := want[k]; ok {
			m[k] = v
		} else {
			delete(m, k)
		}
	}
	return m
}

func labelsContain(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// checkServed withdraws the volume bi's DataSource serves when no verdict
// admits its digest any longer (adm is the admission of digest, the
// newest pushed), or when that volume was imported from other bytes than
// the canonical image the verdict names, as an image-syncer made before
// the gate did. A verdict that cannot be read withdraws nothing.
func (r *Reconciler) checkServed(ctx context.Context, bi *v1alpha1.BaseImage, image, digest string, adm admission) error {
	served := bi.Status.ImportedDigest
	if served == "" {
		return nil
	}
	a := adm
	if served != digest {
		var err error
		if a, err = r.admissionOf(ctx, bi, served); err != nil {
			return err
		}
	}
	if a.image == nil {
		why := "the gate refused it: " + joinReasons(a.reasons)
		if a.missing != nil {
			why = "it has no verdict signed by a provider key (" + a.missing.Error() + ")"
		}
		return r.withdraw(ctx, bi, served, a.final(), "the DataSource no longer serves "+served+": "+why)
	}
	dvName := cdi.DataVolumeName(image, served)
	var dv cdiv1.DataVolume
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: bi.Namespace, Name: dvName}, &dv)
	switch {
	case apierrors.IsNotFound(err):
		return nil // the volume's own labels and owner were checked when it was served
	case err != nil:
		return fmt.Errorf("reading DataVolume %s/%s: %w", bi.Namespace, dvName, err)
	}
	want := cdi.Import{Registry: r.Registry.RegistryStr(), Repository: r.repoPath(bi), Digest: served, Canonical: a.image.Canonical}
	if url, err := want.URL(); err == nil && madeFor(bi, &dv) && !importsFrom(&dv, url) {
		return r.withdraw(ctx, bi, served, true, fmt.Sprintf("the DataSource no longer serves %s: its volume was imported from %s, not from the canonical image %s the gate verified", served, importURL(&dv), a.image.Canonical))
	}
	return nil
}

// checkRetained holds a retained import to the verdicts still found on
// its digest: a verdict refusing it, or verdicts signed only by keys no
// longer trusted (a provider removed a key), withdraw it. No verdict at
// all keeps it: deleting an image takes its verdicts along, and the
// retention policy exists to keep serving what was verified then.
func (r *Reconciler) checkRetained(ctx context.Context, bi *v1alpha1.BaseImage, image string) error {
	served := bi.Status.ImportedDigest
	if served == "" {
		return nil
	}
	adm, err := r.admissionOf(ctx, bi, served)
	if err != nil {
		return err
	}
	if adm.missing != nil && !adm.missing.Forged() {
		return nil
	}
	return r.checkServed(ctx, bi, image, served, adm)
}

// withdraw points bi's DataSource at nothing and records why; drop also
// forgets the import of digest, so that the retention deletes it (a
// verdict refused it), rather than keeping it for a verdict to come.
func (r *Reconciler) withdraw(ctx context.Context, bi *v1alpha1.BaseImage, digest string, drop bool, msg string) error {
	st := &bi.Status
	if n := st.DataSourceName; n != "" {
		var ds cdiv1.DataSource
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: bi.Namespace, Name: n}, &ds)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("reading DataSource %s/%s: %w", bi.Namespace, n, err)
		case ownsDataSource(bi, &ds) && ds.Spec.Source != (cdiv1.DataSourceSource{}):
			ds.Spec.Source = cdiv1.DataSourceSource{}
			if err := r.Client.Update(ctx, &ds); err != nil {
				return fmt.Errorf("withdrawing DataSource %s/%s: %w", bi.Namespace, n, err)
			}
		}
	}
	st.ImportedDigest, st.PVCName = "", ""
	if drop {
		st.Imports = slices.DeleteFunc(st.Imports, func(rec v1alpha1.ImportRecord) bool { return rec.Digest == digest })
	}
	r.condition(bi, v1alpha1.ConditionReady, false, "Withdrawn", msg)
	log.FromContext(ctx).Info("image withdrawn", "baseimage", client.ObjectKeyFromObject(bi), "digest", digest, "reason", msg)
	return nil
}
