// This file is not built where it lies: test/kubevirt/build-admission.sh copies it into the
// pkg/virt-handler folder of the KubeVirt tree it builds kubevirt-admission in, because
// virt-handler computes a VMI's LiveMigratable condition in an unexported method.

package virthandler

import (
	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/log"

	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
)

// ImagepipeLiveMigrationCondition returns the LiveMigratable condition virt-handler's
// calculateLiveMigrationCondition computes for vmi on a node whose host CPU model is
// hostCPUModel ("" for a node without host-model support). The method reads only the cluster
// configuration, that CPU model and a logger of its controller, so a controller holding just
// those runs it without a node, libvirt or launcher.
func ImagepipeLiveMigrationCondition(clusterConfig *virtconfig.ClusterConfig, hostCPUModel string, vmi *v1.VirtualMachineInstance) *v1.VirtualMachineInstanceCondition {
	c := &VirtualMachineController{
		BaseController: &BaseController{
			logger:        log.Log.With("controller", "imagepipe-live-migration"),
			clusterConfig: clusterConfig,
		},
		hostCpuModel: hostCPUModel,
	}
	cond, _ := c.calculateLiveMigrationCondition(vmi)
	return cond
}
