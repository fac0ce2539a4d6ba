package guest

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/need"
)

// noCloudMetaData is KubeVirt's NoCloud meta-data (pkg/cloud-init,
// NoCloudMetadata), written as JSON.
type noCloudMetaData struct {
	InstanceType  string            `json:"instance-type,omitempty"`
	InstanceID    string            `json:"instance-id"`
	LocalHostname string            `json:"local-hostname,omitempty"`
	PublicSSHKeys map[string]string `json:"public-keys,omitempty"`
}

// firmwareUUID is the SMBIOS UUID KubeVirt's virt-controller gives a VM
// that names none (watch/vm/firmware.go, CalculateLegacyUUID): a version 5
// UUID of the VM's name in KubeVirt's namespace.
func firmwareUUID(vm *kubevirtv1.VirtualMachine) string {
	if fw := vm.Spec.Template.Spec.Domain.Firmware; fw != nil && fw.UUID != "" {
		return string(fw.UUID)
	}
	ns, _ := hex.DecodeString("6a1a24a140614607" + "8bf4a3963d0c5895")
	h := sha1.New()
	h.Write(ns)
	h.Write([]byte(vm.Name))
	u := h.Sum(nil)[:16]
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	x := hex.EncodeToString(u)
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

// noCloudSeed plays KubeVirt's virt-launcher for vm as the hub holds it:
// it writes the cidata ISO KubeVirt attaches as the VM's cloudInitNoCloud
// disk (pkg/cloud-init: ReadCloudInitVolumeDataSource, GenerateLocalData).
// user-data is the volume's inline user data or its userDataSecretRef's
// "userdata" (else "userData") key; meta-data is JSON with the firmware
// UUID as instance-id, the VM's name as local-hostname and, as public-keys
// "0", "1"..., the keys of every access credential propagated by NoCloud
// (each key of its Secret, in name order, as the mounted files are read);
// the ISO is made as KubeVirt makes it, xorrisofs -volid cidata -joliet
// -rock. It returns the ISO's path.
func noCloudSeed(t *testing.T, c client.Reader, vm *kubevirtv1.VirtualMachine) string {
	t.Helper()
	xorrisofs := need.Program(t, "xorrisofs")
	spec := vm.Spec.Template.Spec
	secret := func(name string) map[string][]byte {
		t.Helper()
		var s corev1.Secret
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: vm.Namespace, Name: name}, &s); err != nil {
			t.Fatalf("reading Secret %s/%s that VM %s refers to: %v", vm.Namespace, name, vm.Name, err)
		}
		return s.Data
	}
	var userData string
	var found bool
	for _, v := range spec.Volumes {
		src := v.CloudInitNoCloud
		if src == nil {
			continue
		}
		found = true
		userData = src.UserData
		if src.UserDataSecretRef != nil {
			data := secret(src.UserDataSecretRef.Name)
			ud, ok := data["userdata"]
			if !ok {
				ud, ok = data["userData"]
			}
			if !ok {
				t.Fatalf("Secret %s has no userdata key", src.UserDataSecretRef.Name)
			}
			userData = string(ud)
		}
		break
	}
	if !found {
		t.Fatalf("VM %s has no cloudInitNoCloud volume", vm.Name)
	}
	meta := noCloudMetaData{InstanceID: firmwareUUID(vm), LocalHostname: strings.Split(vm.Name, ".")[0]}
	if spec.Hostname != "" {
		meta.LocalHostname = spec.Hostname
	}
	for _, ac := range spec.AccessCredentials {
		key := ac.SSHPublicKey
		if key == nil || key.PropagationMethod.NoCloud == nil || key.Source.Secret == nil {
			continue
		}
		data := secret(key.Source.Secret.SecretName)
		for _, name := range slices.Sorted(maps.Keys(data)) {
			if len(data[name]) == 0 {
				continue
			}
			if meta.PublicSSHKeys == nil {
				meta.PublicSSHKeys = map[string]string{}
			}
			meta.PublicSSHKeys[strconv.Itoa(len(meta.PublicSSHKeys))] = string(data[name])
		}
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"user-data": []byte(userData), "meta-data": metaJSON} {
		if err := os.WriteFile(filepath.Join(data, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	iso := filepath.Join(dir, "noCloud.iso")
	if out, err := exec.Command(xorrisofs, "-output", iso, "-volid", "cidata", "-joliet", "-rock", "-partition_cyl_align", "on", data).CombinedOutput(); err != nil {
		t.Fatalf("xorrisofs: %v\n%s", err, out)
	}
	t.Logf("NoCloud seed for VM %s: meta-data %s; user-data:\n%s", vm.Name, metaJSON, userData)
	return iso
}
