package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeVirtNamespace is where StartKubeVirtAdmission creates the KubeVirt object, as the
// namespace a KubeVirt install runs in.
const KubeVirtNamespace = "kubevirt"

// KubeVirtCR is the KubeVirt object a hub's KubeVirt admission is configured by. Its namespace
// is always KubeVirtNamespace; its status is what virt-operator reports once deployed.
type KubeVirtCR struct {
	// Name is the object's name, as the install that makes it names it.
	Name string
	// Spec is the object's spec.
	Spec kubevirtv1.KubeVirtSpec
}

// OpenShiftVirtualizationCR is the KubeVirt object a default OpenShift Virtualization install
// makes: what hyperconverged-cluster-operator v1.18.1 derives from a HyperConverged object left
// at its defaults on a cluster with several workers and SSP deployed. Of its configuration, the
// parts KubeVirt's admission reads are kept: the feature gates HCO always sets and those its
// defaults turn on, the network configuration (masquerade by default, and only the l2bridge
// binding, managedTap with migration, for primary user defined networks; passt only with the
// HCO annotation deployPasstNetworkBinding=true), LiveMigrate eviction, the LiveUpdate rollout
// strategy and the disk verification limit. Placement, certificates and tuning are left out.
func OpenShiftVirtualizationCR() KubeVirtCR {
	evict := kubevirtv1.EvictionStrategyLiveMigrate
	rollout := kubevirtv1.VMRolloutStrategyLiveUpdate
	diskLimit := resource.MustParse("2G")
	return KubeVirtCR{
		Name: "kubevirt-kubevirt-hyperconverged",
		Spec: kubevirtv1.KubeVirtSpec{
			UninstallStrategy: kubevirtv1.KubeVirtUninstallStrategyBlockUninstallIfWorkloadsExist,
			Configuration: kubevirtv1.KubeVirtConfiguration{
				DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{
					FeatureGates: []string{
						// Always set by HCO.
						"CPUManager", "Snapshot", "ExpandDisks", "HostDevices", "VMExport",
						"KubevirtSeccompProfile", "LiveUpdateNADRef",
						// Set when SSP is deployed (not on KVM emulation).
						"WithHostModelCPU", "HypervStrictCheck",
						// On by HCO's defaults.
						"VideoConfig", "DecentralizedLiveMigration", "HotplugVolumes",
					},
					DiskVerification: &kubevirtv1.DiskVerification{MemoryLimit: &diskLimit},
				},
				NetworkConfiguration: &kubevirtv1.NetworkConfiguration{
					NetworkInterface: string(kubevirtv1.MasqueradeInterface),
					Binding: map[string]kubevirtv1.InterfaceBindingPlugin{
						"l2bridge": {DomainAttachmentType: kubevirtv1.ManagedTap, Migration: &kubevirtv1.InterfaceBindingMigration{}},
					},
				},
				EvictionStrategy:  &evict,
				VMRolloutStrategy: &rollout,
			},
			WorkloadUpdateStrategy: kubevirtv1.KubeVirtWorkloadUpdateStrategy{
				WorkloadUpdateMethods: []kubevirtv1.WorkloadUpdateMethod{kubevirtv1.WorkloadUpdateMethodLiveMigrate},
			},
			ProductName:      "kubevirt-hyperconverged",
			ProductComponent: "compute",
		},
	}
}

// OpenShiftVirtualizationWithPasstCR is OpenShiftVirtualizationCR after the provider set the
// HyperConverged annotation deployPasstNetworkBinding=true: HCO v1.18.1 then also registers the
// passt binding (a sidecar, with migration declared) and turns on the PasstBinding feature gate.
func OpenShiftVirtualizationWithPasstCR() KubeVirtCR {
	cr := OpenShiftVirtualizationCR()
	cfg := &cr.Spec.Configuration
	cfg.DeveloperConfiguration.FeatureGates = append(cfg.DeveloperConfiguration.FeatureGates, "PasstBinding")
	cfg.NetworkConfiguration.Binding["passt"] = kubevirtv1.InterfaceBindingPlugin{
		NetworkAttachmentDefinition: "openshift-cnv/primary-udn-kubevirt-binding",
		SidecarImage:                "registry.redhat.io/container-native-virtualization/network-passt-binding-rhel9:v4.18",
		Migration:                   &kubevirtv1.InterfaceBindingMigration{},
	}
	return cr
}

// VanillaKubeVirtCR is the KubeVirt object of KubeVirt's own release manifest (kubevirt-cr.yaml):
// no feature gates and no network binding plugin registered.
func VanillaKubeVirtCR() KubeVirtCR {
	return KubeVirtCR{
		Name: "kubevirt",
		Spec: kubevirtv1.KubeVirtSpec{
			ImagePullPolicy: corev1.PullIfNotPresent,
			Configuration: kubevirtv1.KubeVirtConfiguration{
				DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{FeatureGates: []string{}},
			},
		},
	}
}

// KubeVirtAdmission is KubeVirt's own VirtualMachine admission code (kubevirt-admission, built by
// test/kubevirt/build-admission.sh) serving as the mutating and validating webhook of a hub.
type KubeVirtAdmission struct {
	// URL is the server's address, https://127.0.0.1:PORT.
	URL string
	// CR is the KubeVirt object as created on the hub.
	CR *kubevirtv1.KubeVirt
	// Config is the configuration the server reported ready with, as KubeVirt read it.
	Config KubeVirtAdmissionConfig

	hub    *Hub
	client *http.Client
}

// KubeVirtAdmissionConfig is what kubevirt-admission's /readyz reports: the KubeVirt object it is
// configured by and the parts of KubeVirt's resulting configuration tests check.
type KubeVirtAdmissionConfig struct {
	KubeVirt            string   `json:"kubevirt"`
	ResourceVersion     string   `json:"resourceVersion"`
	FeatureGates        []string `json:"featureGates"`
	NetworkBindings     []string `json:"networkBindings"`
	CommonInstancetypes string   `json:"commonInstancetypes"`
}

// kubeVirtWebhookName names the hub's webhook configurations and their one webhook each.
const kubeVirtWebhookName = "virtualmachines.kubevirt-admission.imagepipe.test"

// StartKubeVirtAdmission creates cr on the hub (with the namespace KubeVirtNamespace and the
// status virt-operator reports), starts kubevirt-admission on a free port of 127.0.0.1 with a
// certificate of its own CA, waits until it has read cr and deployed KubeVirt's common cluster
// instancetypes and preferences (as virt-operator does by default), registers it for
// kubevirt.io/v1 virtualmachines as a mutating and a validating webhook with failurePolicy Fail,
// and waits until a probe VM is mutated and a broken one refused through the apiserver. When the
// test ends the webhooks are removed and the server stopped; its log is printed if the test
// failed. It skips the test when kubevirt-admission is not built. One per hub.
func (h *Hub) StartKubeVirtAdmission(t T, cr KubeVirtCR) *KubeVirtAdmission {
	t.Helper()
	bin := Binary(t, "kubevirt-admission")
	start := time.Now()
	c, err := client.New(h.RestConfig, client.Options{Scheme: NewScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	a := &KubeVirtAdmission{hub: h, CR: h.createKubeVirtCR(t, c, cr)}

	dir := filepath.Join(h.dir, "kubevirt-admission")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	certs, err := writeCerts(dir)
	if err != nil {
		t.Fatalf("making kubevirt-admission's certificates: %v", err)
	}
	caPEM, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	a.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true,
	}}

	logPath := filepath.Join(dir, "kubevirt-admission.log")
	var p *proc
	t.Cleanup(func() {
		if p != nil {
			if err := p.stop(); err != nil {
				t.Errorf("stopping hub %s kubevirt-admission: %v", h.Name, err)
			}
		}
		logOnFailure(t, "hub "+h.Name+" kubevirt-admission", logPath)
	})
	for range startAttempts {
		a.URL = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
		p, err = startProc(logPath, nil, bin,
			"-kubeconfig", h.Kubeconfig, "-listen", strings.TrimPrefix(a.URL, "https://"),
			"-tls-cert", certs.Cert, "-tls-key", certs.Key,
			"-namespace", KubeVirtNamespace, "-deploy-common-instancetypes")
		if err != nil {
			break
		}
		if err = waitReady(p, httpAnswers(a.client, a.URL+"/readyz", nil, http.StatusOK)); !errors.Is(err, errExited) {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting hub %s kubevirt-admission: %v", h.Name, err)
	}
	if err := a.get(a.URL+"/readyz", &a.Config); err != nil {
		t.Fatalf("hub %s kubevirt-admission: %v", h.Name, err)
	}
	if a.Config.CommonInstancetypes != "deployed" {
		t.Fatalf("hub %s kubevirt-admission: common instancetypes %s", h.Name, a.Config.CommonInstancetypes)
	}
	ready := time.Since(start)
	a.registerWebhooks(t, c, caPEM)
	a.waitProbe(t, c)
	t.Logf("hub %s: KubeVirt admission configured by %s (feature gates %v, network bindings %v), ready in %s, in the apiserver's path %s later",
		h.Name, a.Config.KubeVirt, a.Config.FeatureGates, a.Config.NetworkBindings,
		ready.Round(time.Millisecond), (time.Since(start) - ready).Round(time.Millisecond))
	return a
}

// createKubeVirtCR creates the namespace KubeVirtNamespace and the KubeVirt object cr with the
// phase Deployed, which KubeVirt's configuration code requires before it reads an object.
func (h *Hub) createKubeVirtCR(t T, c client.Client, cr KubeVirtCR) *kubevirtv1.KubeVirt {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KubeVirtNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("hub %s: creating namespace %s: %v", h.Name, KubeVirtNamespace, err)
	}
	kv := &kubevirtv1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Name: cr.Name, Namespace: KubeVirtNamespace},
		Spec:       *cr.Spec.DeepCopy(),
		Status:     kubevirtv1.KubeVirtStatus{Phase: kubevirtv1.KubeVirtPhaseDeployed},
	}
	if err := c.Create(ctx, kv); err != nil {
		t.Fatalf("hub %s: creating KubeVirt %s: %v", h.Name, cr.Name, err)
	}
	if kv.Status.Phase == "" { // a CRD with a status subresource drops the status on create
		kv.Status.Phase = kubevirtv1.KubeVirtPhaseDeployed
		if err := c.Status().Update(ctx, kv); err != nil {
			t.Fatalf("hub %s: setting the phase of KubeVirt %s: %v", h.Name, cr.Name, err)
		}
	}
	return kv
}

// registerWebhooks registers the server for kubevirt.io/v1 virtualmachines on CREATE and UPDATE,
// as virt-api registers itself, and removes the registrations when the test ends.
func (a *KubeVirtAdmission) registerWebhooks(t T, c client.Client, caPEM []byte) {
	t.Helper()
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{kubevirtv1.GroupVersion.Group}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"},
		},
	}}
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	clientConfig := func(path string) admissionregistrationv1.WebhookClientConfig {
		u := a.URL + path
		return admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: caPEM}
	}
	objs := []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: kubeVirtWebhookName},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name: "mutate." + kubeVirtWebhookName, ClientConfig: clientConfig("/mutate-virtualmachines"), Rules: rules,
				FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
			}},
		},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: kubeVirtWebhookName},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: "validate." + kubeVirtWebhookName, ClientConfig: clientConfig("/validate-virtualmachines"), Rules: rules,
				FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
			}},
		},
	}
	for _, obj := range objs {
		if err := c.Create(t.Context(), obj); err != nil {
			t.Fatalf("hub %s: registering %T: %v", a.hub.Name, obj, err)
		}
	}
	// Removed before the server stops (cleanups run last first), so that a later cleanup
	// touching VMs is not refused by a webhook that no longer answers.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, obj := range objs {
			if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("hub %s: removing %T: %v", a.hub.Name, obj, err)
			}
		}
	})
}

// waitProbe waits until the apiserver sends VMs through both webhooks: a dry-run create of a
// valid VM comes back with the firmware UUID KubeVirt's mutator sets, and one whose disk names no
// volume is refused by KubeVirt's admitter. The apiserver may take a moment to see the new
// webhook configurations.
func (a *KubeVirtAdmission) waitProbe(t T, c client.Client) {
	t.Helper()
	WaitUntil(t, "hub "+a.hub.Name+" to send VMs through kubevirt-admission", readyTimeout, 100*time.Millisecond, func() (bool, error) {
		vm := probeVM("probe")
		if err := c.Create(t.Context(), vm, client.DryRunAll); err != nil {
			return false, fmt.Errorf("a valid probe VM was refused: %w", err)
		}
		if fw := vm.Spec.Template.Spec.Domain.Firmware; fw == nil || fw.UUID == "" {
			return false, nil // not mutated yet
		}
		broken := probeVM("probe-broken")
		broken.Spec.Template.Spec.Volumes = nil
		err := c.Create(t.Context(), broken, client.DryRunAll)
		if err == nil {
			return false, nil // not validated yet
		}
		if !strings.Contains(err.Error(), kubeVirtWebhookName) {
			return false, fmt.Errorf("a broken probe VM was refused, but not by kubevirt-admission: %w", err)
		}
		return true, nil
	})
}

// probeVM is a minimal VM with one container disk, in KubeVirtNamespace.
func probeVM(name string) *kubevirtv1.VirtualMachine {
	halted := kubevirtv1.RunStrategyHalted
	memory := resource.MustParse("128Mi")
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: KubeVirtNamespace},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Memory:  &kubevirtv1.Memory{Guest: &memory},
					Devices: kubevirtv1.Devices{Disks: []kubevirtv1.Disk{{Name: "root"}}},
				},
				Volumes: []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{
					ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora:latest"},
				}}},
			}},
		},
	}
}

// KubeVirtLiveMigration is KubeVirt's live-migration verdict on a stored VM, from
// kubevirt-admission's /live-migration.
type KubeVirtLiveMigration struct {
	// Condition is the LiveMigratable condition virt-handler computes for the VM's instance.
	Condition kubevirtv1.VirtualMachineInstanceCondition `json:"condition"`
	// Claims are the claim facts KubeVirt was given, per volume.
	Claims []struct {
		Volume      string                              `json:"volume"`
		Claim       string                              `json:"claim"`
		AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes"`
		// From is "PersistentVolumeClaim" when the claim exists, else "DataVolumeTemplate".
		From string `json:"from"`
	} `json:"claims"`
	// LaunchError is why virt-controller could not render the instance's launcher pod, as its
	// network binding plugin lookup says (KubeVirt's admission does not check that a binding
	// plugin is registered; this lookup does); empty when it finds every plugin.
	LaunchError string `json:"launchError"`
}

// LiveMigratable reports KubeVirt's verdict as a bool.
func (m KubeVirtLiveMigration) LiveMigratable() bool {
	return m.Condition.Status == corev1.ConditionTrue
}

// LiveMigration asks KubeVirt's own code whether the stored VM ns/name would live-migrate once
// running: the instance virt-controller would start for it, given the claims' access modes (from
// the claims, or the VM's DataVolume templates where no claim exists), and virt-handler's
// LiveMigratable condition for it on a node that supports host-model CPUs; and whether
// virt-controller would find the network binding plugins to launch it.
func (a *KubeVirtAdmission) LiveMigration(t T, ns, name string) KubeVirtLiveMigration {
	t.Helper()
	var out KubeVirtLiveMigration
	q := url.Values{"namespace": {ns}, "name": {name}}
	if err := a.get(a.URL+"/live-migration?"+q.Encode(), &out); err != nil {
		t.Fatalf("asking KubeVirt whether VM %s/%s live-migrates: %v", ns, name, err)
	}
	return out
}

// get decodes the JSON answer to a GET of u into v.
func (a *KubeVirtAdmission) get(u string, v any) error {
	resp, err := a.client.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, v)
}
