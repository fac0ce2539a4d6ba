package vmlaunch

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
)

// DefaultWaitInterval is how often WaitReady reads the VM by default.
const DefaultWaitInterval = time.Second

// WaitOptions say how WaitReady follows a VM. The zero value reads it
// every DefaultWaitInterval and reports nothing on the way.
type WaitOptions struct {
	// Interval is the time between two reads of the VM and its instance.
	Interval time.Duration
	// Progress, when set, is called with KubeVirt's printable status of
	// the VM each time it changes.
	Progress func(status string)
}

// VMState is a VM as KubeVirt last reported it, with its running
// instance (nil when it has none).
type VMState struct {
	VM       *kubevirtv1.VirtualMachine
	Instance *kubevirtv1.VirtualMachineInstance
}

// WaitGoal says what WaitReady waits for on vm: Ready (or a running
// instance) for a VM set to run, Stopped (its disks provisioned, ready
// to start) for a VM created stopped.
func WaitGoal(vm *kubevirtv1.VirtualMachine) string {
	if halted(vm) {
		return "Stopped (its disks provisioned, ready to start)"
	}
	return "Ready (or its instance Running)"
}

func halted(vm *kubevirtv1.VirtualMachine) bool {
	return vm.Spec.RunStrategy != nil && *vm.Spec.RunStrategy == kubevirtv1.RunStrategyHalted
}

// reached reports whether s is what WaitGoal describes.
func (s *VMState) reached() bool {
	vm := s.VM
	if halted(vm) {
		return vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusStopped
	}
	if vm.Status.Ready {
		return true
	}
	if c := vmCondition(vm, kubevirtv1.VirtualMachineReady); c != nil && c.Status == corev1.ConditionTrue {
		return true
	}
	return s.Instance != nil && s.Instance.Status.Phase == kubevirtv1.Running
}

func vmCondition(vm *kubevirtv1.VirtualMachine, t kubevirtv1.VirtualMachineConditionType) *kubevirtv1.VirtualMachineCondition {
	for i := range vm.Status.Conditions {
		if vm.Status.Conditions[i].Type == t {
			return &vm.Status.Conditions[i]
		}
	}
	return nil
}

// WaitError is WaitReady's answer when ctx ends before the VM gets where
// WaitGoal says: what it waited for, why it stopped, and what KubeVirt
// last reported of the VM.
type WaitError struct {
	Namespace, Name string
	// Goal is WaitGoal of the VM.
	Goal string
	// Cause is why waiting stopped: ctx's cause (a timeout, an interrupt).
	Cause error
	// Status is the VM's last printable status; empty when KubeVirt
	// reported none, as when its controller does not run.
	Status string
	// Conditions are the VM's last conditions that say why it is not
	// there: Ready, and Failure, PodScheduled and DataVolumesReady when
	// they report a problem.
	Conditions []kubevirtv1.VirtualMachineCondition
	// InstancePhase is the phase of the VM's instance, if it has one.
	InstancePhase string
	// LastErr is the last error reading the VM, when reads failed.
	LastErr error
}

func (e *WaitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "waiting for VM %s/%s to be %s: %v; ", e.Namespace, e.Name, e.Goal, e.Cause)
	if e.Status == "" {
		b.WriteString("KubeVirt reported no status for it (is KubeVirt's virt-controller running on the cluster?)")
	} else {
		fmt.Fprintf(&b, "KubeVirt last reported status %s", e.Status)
	}
	for _, c := range e.Conditions {
		fmt.Fprintf(&b, ", condition %s=%s", c.Type, c.Status)
		if detail := strings.TrimSpace(strings.Trim(c.Reason+": "+c.Message, ": ")); detail != "" {
			fmt.Fprintf(&b, " (%s)", detail)
		}
	}
	if e.InstancePhase != "" {
		fmt.Fprintf(&b, ", instance phase %s", e.InstancePhase)
	}
	if e.LastErr != nil {
		fmt.Fprintf(&b, "; the last read failed: %v", e.LastErr)
	}
	return b.String()
}

// Unwrap returns why waiting stopped, so that errors.Is and errors.As see
// a timeout or an interrupt.
func (e *WaitError) Unwrap() error { return e.Cause }

// WaitReady follows VM ns/name until it is where WaitGoal says, and
// returns it then. When ctx ends first it returns a *WaitError wrapping
// ctx's cause; a VM deleted or being deleted meanwhile, or reads the user
// may not make, end it at once. Other read errors are retried until ctx ends.
func WaitReady(ctx context.Context, c cdi.Reader, ns, name string, opts WaitOptions) (*VMState, error) {
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultWaitInterval
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	werr := &WaitError{Namespace: ns, Name: name, Goal: "ready"}
	for {
		s, err := readState(ctx, c, ns, name)
		switch {
		case err == nil && s.VM.DeletionTimestamp != nil:
			return nil, fmt.Errorf("VM %s/%s is being deleted", ns, name)
		case err == nil:
			werr.LastErr = nil
			werr.note(s, opts.Progress)
			if s.reached() {
				return s, nil
			}
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("VM %s/%s was deleted while waiting for it", ns, name)
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return nil, fmt.Errorf("reading VM %s/%s: %w", ns, name, err)
		case ctx.Err() == nil:
			werr.LastErr = err
		}
		select {
		case <-ctx.Done():
			werr.Cause = context.Cause(ctx)
			return nil, werr
		case <-tick.C:
		}
	}
}

// telling are the VM conditions that say why a VM is not ready, in the
// order a WaitError lists them, each when it has the status given (any
// when empty). KubeVirt copies the instance's conditions to the VM.
var telling = []struct {
	typ    kubevirtv1.VirtualMachineConditionType
	status corev1.ConditionStatus
}{
	{kubevirtv1.VirtualMachineReady, ""},
	{kubevirtv1.VirtualMachineFailure, corev1.ConditionTrue},
	{kubevirtv1.VirtualMachineConditionType(corev1.PodScheduled), corev1.ConditionFalse},
	{kubevirtv1.VirtualMachineConditionType(kubevirtv1.VirtualMachineInstanceDataVolumesReady), corev1.ConditionFalse},
}

// note records s as the last state seen, and reports a new status.
func (e *WaitError) note(s *VMState, progress func(string)) {
	e.Goal = WaitGoal(s.VM)
	status := string(s.VM.Status.PrintableStatus)
	if status != e.Status && status != "" && progress != nil {
		progress(status)
	}
	e.Status = status
	e.Conditions = nil
	for _, w := range telling {
		if c := vmCondition(s.VM, w.typ); c != nil && (w.status == "" || c.Status == w.status) {
			e.Conditions = append(e.Conditions, *c)
		}
	}
	e.InstancePhase = ""
	if s.Instance != nil {
		e.InstancePhase = string(s.Instance.Status.Phase)
	}
}

// readState reads the VM and its instance.
func readState(ctx context.Context, c cdi.Reader, ns, name string) (*VMState, error) {
	var vm kubevirtv1.VirtualMachine
	if err := c.Get(ctx, ns, name, &vm); err != nil {
		return nil, err
	}
	s := &VMState{VM: &vm}
	var vmi kubevirtv1.VirtualMachineInstance
	err := c.Get(ctx, ns, name, &vmi)
	switch {
	case err == nil:
		s.Instance = &vmi
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading the instance of VM %s/%s: %w", ns, name, err)
	}
	return s, nil
}
