package hub

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestVMMigrateFollowsKubeVirtsVerdict: a tenant's VM that vm create
// recorded as live-migratable (a ReadWriteMany root disk) gets a data
// volume on the provider's local, ReadWriteOnce storage, and once it runs
// KubeVirt reports its instance LiveMigratable=False
// (DisksNotLiveMigratable). vm migrate then refuses it, saying KubeVirt's
// reason, and creates no VirtualMachineInstanceMigration; vm get shows
// KubeVirt's verdict over the recorded one. A VM KubeVirt reports
// migratable gets its migration.
func TestVMMigrateFollowsKubeVirtsVerdict(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-migrate")
	fs := corev1.PersistentVolumeFilesystem
	for _, o := range []client.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: "example.com/local"},
		&cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Spec: cdiv1.StorageProfileSpec{ClaimPropertySets: []cdiv1.ClaimPropertySet{
			{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs},
		}}},
	} {
		if err := h.c.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	tenant := func(args ...string) []string { return append(args, h.tenant...) }
	web := h.createVM(t, "acme", "web", false)
	db := h.createVM(t, "acme", "db", false)
	testenv.RunImagectlOK(t, tenant("volume", "create", "scratch", "--size", "1Gi", "--storage-class", "local")...)
	testenv.RunImagectlOK(t, tenant("vm", "attach-volume", "db", "scratch")...)
	vc := virtController{t, h.c}
	notShared := "PVC scratch is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
	dbi := vc.startInstance(db, "node-1", "10.0.0.7")
	if c := dbi.Status.Conditions; len(c) != 1 || c[0].Type != kubevirtv1.VirtualMachineInstanceIsMigratable || c[0].Status != corev1.ConditionFalse ||
		c[0].Reason != kubevirtv1.VirtualMachineInstanceReasonDisksNotMigratable || !strings.Contains(c[0].Message, notShared) {
		t.Fatalf("the stand-in reports db's instance with conditions %+v; want LiveMigratable=False (DisksNotLiveMigratable) naming scratch", c)
	}
	webi := vc.startInstance(web, "node-1", "10.0.0.8")
	if c := webi.Status.Conditions; len(c) != 1 || c[0].Type != kubevirtv1.VirtualMachineInstanceIsMigratable || c[0].Status != corev1.ConditionTrue {
		t.Fatalf("the stand-in reports web's instance with conditions %+v; want LiveMigratable=True", c)
	}

	migrations := func() []kubevirtv1.VirtualMachineInstanceMigration {
		t.Helper()
		var list kubevirtv1.VirtualMachineInstanceMigrationList
		if err := h.c.List(t.Context(), &list, client.InNamespace("acme")); err != nil {
			t.Fatalf("listing migrations: %v", err)
		}
		return list.Items
	}

	r := testenv.RunImagectl(t, tenant("vm", "migrate", "db")...)
	if r.Code != 1 || r.Stdout != "" || !strings.Contains(r.Stderr, "KubeVirt says VM db cannot live-migrate (DisksNotLiveMigratable)") || !strings.Contains(r.Stderr, notShared) {
		t.Errorf("vm migrate db: exit %d, stdout %q, stderr %q; want exit 1 and KubeVirt's reason, %q", r.Code, r.Stdout, r.Stderr, notShared)
	}
	if m := migrations(); len(m) != 0 {
		t.Errorf("after vm migrate db, acme holds migrations %v; want none", migrationNames(m))
	}
	var got api.VMSummary
	decodeStrict(t, "vm get db -o json", testenv.RunImagectlOK(t, tenant("vm", "get", "db", "-o", "json")...).Stdout, &got)
	if got.LiveMigratable == nil || *got.LiveMigratable || len(got.Reasons) != 1 || !strings.Contains(got.Reasons[0], notShared) {
		verdict := "null"
		if got.LiveMigratable != nil {
			verdict = fmt.Sprint(*got.LiveMigratable)
		}
		t.Errorf("vm get db -o json: liveMigratable %s, reasons %q; want KubeVirt's false with its reason", verdict, got.Reasons)
	}

	var res api.VMResult
	decodeStrict(t, "vm migrate web -o json", testenv.RunImagectlOK(t, tenant("vm", "migrate", "web", "-o", "json")...).Stdout, &res)
	m := migrations()
	if len(m) != 1 || res.Migration == "" || m[0].Name != res.Migration || m[0].Spec.VMIName != "web" {
		t.Errorf("vm migrate web -o json: migration %q; acme holds %v; want one migration of web, the one printed", res.Migration, migrationNames(m))
	}
}

// migrationNames lists the migrations as NAME(VMI).
func migrationNames(ms []kubevirtv1.VirtualMachineInstanceMigration) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name+"("+m.Spec.VMIName+")")
	}
	return out
}

// TestVirtHandlerStandInAgreesWithKubeVirt: the LiveMigratable condition
// the tests' stand-in for virt-handler reports (harness.StartedInstance)
// is the one KubeVirt v1.8.0's own code computes for the same VM and
// claims (kubevirt-admission's /live-migration), for the rules the
// stand-in plays: a ReadWriteMany root disk with masquerade is
// migratable; a ReadWriteOnce root disk, or an attached ReadWriteOnce
// claim, is not (DisksNotLiveMigratable); a bridge on the pod network is
// not (InterfaceNotLiveMigratable) unless the VM allows it by annotation.
func TestVirtHandlerStandInAgreesWithKubeVirt(t *testing.T) {
	t.Parallel()
	hub := harness.StartHub(t, "hub-standin")
	adm := hub.StartKubeVirtAdmission(t, harness.VanillaKubeVirtCR())
	kc, err := kube.New(hub.RestConfig, harness.NewScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	ns := "acme"
	if err := kc.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	scratch := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "scratch", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: rwo,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
	if err := kc.Create(t.Context(), scratch); err != nil {
		t.Fatal(err)
	}
	bridge := func(vm *kubevirtv1.VirtualMachine) {
		iface := &vm.Spec.Template.Spec.Domain.Devices.Interfaces[0]
		iface.Masquerade, iface.Bridge = nil, &kubevirtv1.InterfaceBridge{}
	}
	for _, tc := range []struct {
		name   string
		access corev1.PersistentVolumeAccessMode
		change func(vm *kubevirtv1.VirtualMachine)
		want   string // the reason, "" for True
	}{
		{"rwx-masquerade", corev1.ReadWriteMany, nil, ""},
		{"rwo-root", corev1.ReadWriteOnce, nil, kubevirtv1.VirtualMachineInstanceReasonDisksNotMigratable},
		{"rwo-claim-attached", corev1.ReadWriteMany, func(vm *kubevirtv1.VirtualMachine) {
			spec := &vm.Spec.Template.Spec
			spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: "scratch"})
			spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: "scratch", VolumeSource: kubevirtv1.VolumeSource{
				PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "scratch"}}}})
		}, kubevirtv1.VirtualMachineInstanceReasonDisksNotMigratable},
		{"pod-bridge", corev1.ReadWriteMany, bridge, kubevirtv1.VirtualMachineInstanceReasonInterfaceNotMigratable},
		{"pod-bridge-allowed", corev1.ReadWriteMany, func(vm *kubevirtv1.VirtualMachine) {
			bridge(vm)
			vm.Spec.Template.ObjectMeta.Annotations = map[string]string{kubevirtv1.AllowPodBridgeNetworkLiveMigrationAnnotation: ""}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, values := simpleTemplate(t)
			r, err := vmlaunch.Render(vmlaunch.Request{
				Name: tc.name, Namespace: ns, Template: tmpl, Values: values,
				Image: vmlaunch.Image{Tenant: ns, Name: "rhel", Tag: "9", Namespace: ns, DataSource: "rhel--9",
					Digest: "sha256:" + strings.Repeat("ef", 32), VirtualSize: 1 << 30},
				Storage: cdi.Storage{StorageClass: "shared", AccessMode: tc.access, VolumeMode: corev1.PersistentVolumeBlock},
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.change != nil {
				tc.change(r.VM)
			}
			if err := vmlaunch.Create(t.Context(), kc, r); err != nil {
				t.Fatalf("KubeVirt refused the VM: %v", err)
			}
			lm := adm.LiveMigration(t, ns, tc.name)
			claims := harness.Claims{}
			for _, c := range lm.Claims {
				claims[c.Claim] = c.AccessModes
			}
			got := harness.StartedInstance(r.VM, "node-1", "10.0.0.7", claims).Status.Conditions
			kv := lm.Condition
			if len(got) != 1 || got[0].Type != kv.Type || got[0].Status != kv.Status || got[0].Reason != kv.Reason || got[0].Message != kv.Message {
				t.Errorf("the stand-in reports %+v; KubeVirt reports %s=%s (%s: %s) given claims %+v", got, kv.Type, kv.Status, kv.Reason, kv.Message, lm.Claims)
			}
			if want := map[bool]corev1.ConditionStatus{true: corev1.ConditionTrue, false: corev1.ConditionFalse}[tc.want == ""]; kv.Status != want || kv.Reason != tc.want {
				t.Errorf("KubeVirt reports %s (%s: %s); this case means %s %q", kv.Status, kv.Reason, kv.Message, want, tc.want)
			}
		})
	}
}
