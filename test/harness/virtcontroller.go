package harness

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// The parts of KubeVirt's virt-controller and virt-handler a hub cannot run here (there is no
// node): tests that play them store what those controllers would.

// RunningInstance is the VirtualMachineInstance virt-controller creates for vm once
// virt-handler runs it on node with address ip; migratable adds virt-handler's
// LiveMigratable condition, True, and without it the instance has no such condition (as before
// virt-handler reports). VirtualMachineInstances have no status subresource, so the status is
// stored as created. StartedInstance decides the condition by KubeVirt's rules instead.
func RunningInstance(vm *kubevirtv1.VirtualMachine, node, ip string, migratable bool) *kubevirtv1.VirtualMachineInstance {
	vmi := newInstance(vm, node, ip)
	if migratable {
		vmi.Status.Conditions = []kubevirtv1.VirtualMachineInstanceCondition{{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}}
	}
	return vmi
}

// Claims are the access modes of the PersistentVolumeClaims virt-controller finds for a VM's
// volumes, by claim name (a DataVolume's claim has the DataVolume's name). A claim missing here
// is one virt-controller did not find.
type Claims map[string][]corev1.PersistentVolumeAccessMode

// StartedInstance is the VirtualMachineInstance of vm running on node with address ip as
// KubeVirt reports it: virt-controller copies the access modes of each volume's claim, from
// claims, into the volume status (as its processPVCInfo does), and virt-handler sets the
// LiveMigratable condition from that (see LiveMigratableCondition). The status is stored as
// created (VirtualMachineInstances have no status subresource).
func StartedInstance(vm *kubevirtv1.VirtualMachine, node, ip string, claims Claims) *kubevirtv1.VirtualMachineInstance {
	vmi := newInstance(vm, node, ip)
	for _, v := range vmi.Spec.Volumes {
		claim := claimName(v)
		if claim == "" {
			continue
		}
		status := kubevirtv1.VolumeStatus{Name: v.Name, Target: v.Name}
		if modes, ok := claims[claim]; ok {
			status.PersistentVolumeClaimInfo = &kubevirtv1.PersistentVolumeClaimInfo{ClaimName: claim, AccessModes: modes}
		}
		vmi.Status.VolumeStatus = append(vmi.Status.VolumeStatus, status)
	}
	vmi.Status.Conditions = []kubevirtv1.VirtualMachineInstanceCondition{LiveMigratableCondition(vmi)}
	return vmi
}

// LiveMigratableCondition is the LiveMigratable condition virt-handler sets on vmi, by two of
// the rules of its calculateLiveMigrationCondition (KubeVirt v1.8.0, pkg/virt-handler/vm.go),
// in its order and with its reasons and messages:
//
//   - InterfaceNotLiveMigratable: the interface on the pod network uses neither masquerade nor
//     passt, nor bridge with the kubevirt.io/allow-pod-bridge-network-live-migration annotation
//     (netvmispec.VerifyVMIMigratable). A binding plugin counts as one that declares no
//     migration, as on a KubeVirt that registers none: this stand-in reads no KubeVirt
//     configuration.
//   - DisksNotLiveMigratable: a volume backed by a PersistentVolumeClaim or a DataVolume whose
//     claim is not ReadWriteMany, or whose claim virt-controller did not find
//     (checkVolumesForMigration).
//
// Otherwise the condition is True. KubeVirt's other rules (CPU model, host devices, SEV, TDX,
// Secure Execution, SCSI reservations, TSC frequency, Hyper-V passthrough, host disks, volume
// migrations) are not played; a test that needs one asks KubeVirt's own code
// (Hub.StartKubeVirtAdmission).
func LiveMigratableCondition(vmi *kubevirtv1.VirtualMachineInstance) kubevirtv1.VirtualMachineInstanceCondition {
	notMigratable := func(reason, msg string) kubevirtv1.VirtualMachineInstanceCondition {
		return kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionFalse, Reason: reason, Message: msg}
	}
	if msg := interfaceNotMigratable(vmi); msg != "" {
		return notMigratable(kubevirtv1.VirtualMachineInstanceReasonInterfaceNotMigratable, msg)
	}
	if msg := diskNotMigratable(vmi); msg != "" {
		return notMigratable(kubevirtv1.VirtualMachineInstanceReasonDisksNotMigratable, msg)
	}
	return kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}
}

// interfaceNotMigratable is KubeVirt's message when the interface on the pod network keeps the
// instance from migrating, or "".
func interfaceNotMigratable(vmi *kubevirtv1.VirtualMachineInstance) string {
	ifaces := vmi.Spec.Domain.Devices.Interfaces
	if len(ifaces) == 0 {
		return ""
	}
	var pod string
	for _, n := range vmi.Spec.Networks {
		if n.Pod != nil {
			pod = n.Name
			break
		}
	}
	if pod == "" {
		return ""
	}
	for _, iface := range ifaces {
		if iface.Name != pod {
			continue
		}
		_, bridgeAllowed := vmi.Annotations[kubevirtv1.AllowPodBridgeNetworkLiveMigrationAnnotation]
		if iface.Masquerade != nil || iface.PasstBinding != nil || (iface.Bridge != nil && bridgeAllowed) {
			return ""
		}
		return "cannot migrate VMI which does not use masquerade or a migratable plugin to connect to the pod network"
	}
	return fmt.Sprintf("no primary interface found for network %s", pod)
}

// diskNotMigratable is KubeVirt's message for the first volume whose claim keeps the instance
// from migrating, or "".
func diskNotMigratable(vmi *kubevirtv1.VirtualMachineInstance) string {
	status := map[string]kubevirtv1.VolumeStatus{}
	for _, s := range vmi.Status.VolumeStatus {
		status[s.Name] = s
	}
	for _, v := range vmi.Spec.Volumes {
		claim := claimName(v)
		if claim == "" {
			continue
		}
		s, ok := status[v.Name]
		if !ok || s.PersistentVolumeClaimInfo == nil {
			return fmt.Sprintf("cannot migrate VMI: Unable to determine if PVC %v is shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)", claim)
		}
		shared := false
		for _, m := range s.PersistentVolumeClaimInfo.AccessModes {
			shared = shared || m == corev1.ReadWriteMany
		}
		if !shared {
			return fmt.Sprintf("cannot migrate VMI: PVC %v is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)", claim)
		}
	}
	return ""
}

// claimName is the claim behind volume v, or "" when no claim backs it.
func claimName(v kubevirtv1.Volume) string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.DataVolume != nil:
		return v.DataVolume.Name
	}
	return ""
}

// newInstance is the running instance of vm on node with address ip, without conditions.
func newInstance(vm *kubevirtv1.VirtualMachine, node, ip string) *kubevirtv1.VirtualMachineInstance {
	meta := vm.Spec.Template.ObjectMeta
	return &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name, Labels: meta.Labels, Annotations: meta.Annotations},
		Spec:       vm.Spec.Template.Spec,
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			Phase: kubevirtv1.Running, NodeName: node,
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: ip}},
		},
	}
}

// RunningVMStatus is the status virt-controller reports of a running VM.
func RunningVMStatus() kubevirtv1.VirtualMachineStatus {
	return kubevirtv1.VirtualMachineStatus{
		PrintableStatus: kubevirtv1.VirtualMachineStatusRunning, Ready: true, Created: true,
		Conditions: []kubevirtv1.VirtualMachineCondition{{Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
}

// LauncherPod is the virt-launcher pod virt-controller creates for vmi (which must be stored,
// to have its UID), with the labels KubeVirt gives it: kubevirt.io=virt-launcher,
// kubevirt.io/created-by (the instance's UID) and kubevirt.io/domain (its name). Its spec
// names node, which no node stand-in plays, so nothing runs it; store it, then set its status
// with LauncherPodStatus, as kubelet reports a running pod's addresses.
func LauncherPod(vmi *kubevirtv1.VirtualMachineInstance, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: vmi.Namespace, Name: "virt-launcher-" + vmi.Name,
			Labels: map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(vmi.UID), "kubevirt.io/domain": vmi.Name},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher"}}},
	}
}

// LauncherPodStatus is the status kubelet reports of a running pod with address ip.
func LauncherPodStatus(ip string) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
}
