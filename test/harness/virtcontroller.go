package harness

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// The parts of KubeVirt's virt-controller and virt-handler a hub cannot run here (there is no
// node): tests that play them store what those controllers would.

// RunningInstance is the VirtualMachineInstance virt-controller creates for vm once
// virt-handler runs it on node with address ip; migratable adds virt-handler's
// LiveMigratable condition. VirtualMachineInstances have no status subresource, so the status
// is stored as created.
func RunningInstance(vm *kubevirtv1.VirtualMachine, node, ip string, migratable bool) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name, Labels: vm.Spec.Template.ObjectMeta.Labels},
		Spec:       vm.Spec.Template.Spec,
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			Phase: kubevirtv1.Running, NodeName: node,
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: ip}},
		},
	}
	if migratable {
		vmi.Status.Conditions = []kubevirtv1.VirtualMachineInstanceCondition{{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue}}
	}
	return vmi
}

// RunningVMStatus is the status virt-controller reports of a running VM.
func RunningVMStatus() kubevirtv1.VirtualMachineStatus {
	return kubevirtv1.VirtualMachineStatus{
		PrintableStatus: kubevirtv1.VirtualMachineStatusRunning, Ready: true, Created: true,
		Conditions: []kubevirtv1.VirtualMachineCondition{{Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionTrue}},
	}
}
