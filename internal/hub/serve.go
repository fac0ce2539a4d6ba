package hub

import (
	"context"
	"fmt"
	"maps"

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
	case !equality.Semantic.DeepEqual(cur.Spec.Source, want.Spec.Source) || !labelsContain(cur.Labels, want.Labels):
		cur.Spec.Source = want.Spec.Source
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		maps.Copy(cur.Labels, want.Labels)
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

func labelsContain(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
