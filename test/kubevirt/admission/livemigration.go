package main

import (
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "kubevirt.io/api/core/v1"

	instancetypevm "kubevirt.io/kubevirt/pkg/instancetype/controller/vm"
	"kubevirt.io/kubevirt/pkg/network/netbinding"
	netvmispec "kubevirt.io/kubevirt/pkg/network/vmispec"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/mutating-webhook/mutators"
	vmwatch "kubevirt.io/kubevirt/pkg/virt-controller/watch/vm"
	virthandler "kubevirt.io/kubevirt/pkg/virt-handler"
)

// Where a volume's claim facts came from, in liveMigration.Claims.
const (
	// claimFromPVC: the PersistentVolumeClaim exists on the hub, as virt-controller reads it.
	claimFromPVC = "PersistentVolumeClaim"
	// claimFromTemplate: no claim exists (nothing provisions on a hub without nodes), so the
	// access modes the VM's DataVolume template asks for stand in for the claim's.
	claimFromTemplate = "DataVolumeTemplate"
)

// liveMigration is /live-migration's answer.
type liveMigration struct {
	// Condition is KubeVirt's LiveMigratable condition for the VMI the VM would start.
	Condition v1.VirtualMachineInstanceCondition `json:"condition"`
	// Claims says, per volume backed by a claim, which access modes KubeVirt was given and where
	// they came from; a volume missing here is one KubeVirt could not learn about.
	Claims []claimFacts `json:"claims"`
	// LaunchError is why virt-controller could not render the instance's launcher pod, as far as
	// its network binding plugin lookup tells (admission does not check that an interface's
	// binding plugin is registered; this lookup is where KubeVirt finds out); empty when it can.
	LaunchError string `json:"launchError,omitempty"`
}

// claimFacts are the claim details virt-controller would put into a VMI's volume status.
type claimFacts struct {
	Volume      string                              `json:"volume"`
	Claim       string                              `json:"claim"`
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes"`
	From        string                              `json:"from"`
}

// serveLiveMigration answers GET /live-migration?namespace=NS&name=VM with the LiveMigratable
// condition KubeVirt computes for the instance the stored VM NS/VM would start.
//
// The instance is made by KubeVirt's own steps, called in the order virt-controller's VM
// controller calls them when it starts a VM (SetupVMIFromVM, the instancetype controller's
// preference and instancetype application, the default network interface), then defaulted as
// virt-api's VMI mutating webhook does on create (ApplyNewVMIMutations). Its volume status gets
// what virt-controller copies from each claim; without nodes no claim is provisioned, so a
// claim that does not exist is described by the VM's DataVolume template (claimFromTemplate).
// The condition itself is virt-handler's calculateLiveMigrationCondition, run for a node whose
// host CPU model is -node-host-cpu-model; it needs nothing else of a node. The answer also says
// whether virt-controller's network binding sidecar lookup, done when it renders the launcher
// pod, fails for the instance.
func (s *server) serveLiveMigration(w http.ResponseWriter, r *http.Request) {
	ns, name := r.URL.Query().Get("namespace"), r.URL.Query().Get("name")
	if ns == "" || name == "" {
		http.Error(w, "want ?namespace=NS&name=VM", http.StatusBadRequest)
		return
	}
	vm, err := s.virtCli.VirtualMachine(ns).Get(r.Context(), name, metav1.GetOptions{})
	if err != nil {
		code := http.StatusInternalServerError
		if apierrors.IsNotFound(err) {
			code = http.StatusNotFound
		}
		http.Error(w, fmt.Sprintf("reading VM %s/%s: %v", ns, name, err), code)
		return
	}
	vmi, err := s.instanceOf(vm)
	if err != nil {
		http.Error(w, fmt.Sprintf("making the instance of VM %s/%s: %v", ns, name, err), http.StatusUnprocessableEntity)
		return
	}
	claims, err := s.addVolumeStatus(r, vm, vmi)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	out := liveMigration{Claims: claims}
	if _, err := netbinding.NetBindingPluginSidecarList(vmi, s.clusterConfig.GetConfig()); err != nil {
		out.LaunchError = err.Error()
	}
	out.Condition = *virthandler.ImagepipeLiveMigrationCondition(s.clusterConfig, s.hostCPUModel, vmi)
	s.log.Info("live-migration condition", "vm", ns+"/"+name, "status", out.Condition.Status,
		"reason", out.Condition.Reason, "message", out.Condition.Message, "launchError", out.LaunchError)
	writeJSON(w, out)
}

// instanceOf makes the VMI virt-controller would create for vm, defaulted as virt-api would.
func (s *server) instanceOf(vm *v1.VirtualMachine) (*v1.VirtualMachineInstance, error) {
	instancetypes := instancetypevm.New(nil, nil, nil, nil, nil, s.virtCli, s.clusterConfig, nil)
	vmi := vmwatch.SetupVMIFromVM(vm)
	if err := instancetypes.ApplyAutoAttachPreferences(vm, vmi); err != nil {
		return nil, fmt.Errorf("applying the preference's device defaults: %w", err)
	}
	vmwatch.AutoAttachInputDevice(vmi)
	if err := netvmispec.SetDefaultNetworkInterface(s.clusterConfig, &vmi.Spec); err != nil {
		return nil, fmt.Errorf("setting the default network interface: %w", err)
	}
	if err := instancetypes.ApplyToVMI(vm, vmi); err != nil {
		return nil, fmt.Errorf("applying the instancetype: %w", err)
	}
	if err := mutators.ApplyNewVMIMutations(vmi, s.clusterConfig); err != nil {
		return nil, fmt.Errorf("applying virt-api's VMI defaults: %w", err)
	}
	return vmi, nil
}

// addVolumeStatus fills vmi's volume status with the claim facts virt-controller would copy:
// from the claim when it exists, else from vm's DataVolume template of that name.
func (s *server) addVolumeStatus(r *http.Request, vm *v1.VirtualMachine, vmi *v1.VirtualMachineInstance) ([]claimFacts, error) {
	claims := []claimFacts{}
	for _, vol := range vmi.Spec.Volumes {
		var claim string
		switch {
		case vol.PersistentVolumeClaim != nil:
			claim = vol.PersistentVolumeClaim.ClaimName
		case vol.DataVolume != nil:
			claim = vol.DataVolume.Name
		default:
			continue
		}
		facts := claimFacts{Volume: vol.Name, Claim: claim}
		pvc, err := s.virtCli.CoreV1().PersistentVolumeClaims(vmi.Namespace).Get(r.Context(), claim, metav1.GetOptions{})
		switch {
		case err == nil:
			facts.AccessModes, facts.From = pvc.Spec.AccessModes, claimFromPVC
		case apierrors.IsNotFound(err):
			facts.AccessModes, facts.From = templateAccessModes(vm, claim), claimFromTemplate
		default:
			return nil, fmt.Errorf("reading claim %s/%s: %w", vmi.Namespace, claim, err)
		}
		if facts.AccessModes == nil {
			continue // KubeVirt then says it cannot tell whether the claim is shared
		}
		vmi.Status.VolumeStatus = append(vmi.Status.VolumeStatus, v1.VolumeStatus{
			Name: vol.Name,
			PersistentVolumeClaimInfo: &v1.PersistentVolumeClaimInfo{
				ClaimName:   claim,
				AccessModes: facts.AccessModes,
			},
		})
		claims = append(claims, facts)
	}
	return claims, nil
}

// templateAccessModes returns the access modes vm's DataVolume template named claim asks for, or
// nil when there is no such template or it leaves them to the StorageProfile.
func templateAccessModes(vm *v1.VirtualMachine, claim string) []corev1.PersistentVolumeAccessMode {
	for _, t := range vm.Spec.DataVolumeTemplates {
		if t.Name != claim {
			continue
		}
		switch {
		case t.Spec.Storage != nil && len(t.Spec.Storage.AccessModes) > 0:
			return t.Spec.Storage.AccessModes
		case t.Spec.PVC != nil && len(t.Spec.PVC.AccessModes) > 0:
			return t.Spec.PVC.AccessModes
		}
	}
	return nil
}
