package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/test/harness"
)

// What the demo imports, and where.
const (
	tenant     = "acme"
	tenantUser = "tenant-a" // the hub user bound to the tenant RBAC in namespace acme
	image      = "sample"
	tag        = "stable"
	bucket     = "demo"
	steps      = 9
	// waitTimeout bounds every wait for image-syncer. The syncer acts within a second of a
	// notification; the margin is for a loaded CI machine.
	waitTimeout = 2 * time.Minute
)

// config is what differs between `make demo` and the short test.
type config struct {
	// full selects the 256 MiB sample disk (the Go toolchain's sources and this repository);
	// otherwise it is a 32 MiB disk of this repository's sources.
	full bool
	// imagectl, syncer and gate are the binaries to run; empty means
	// bin/imagectl, bin/image-syncer and bin/image-gate of the repository.
	imagectl, syncer, gate string
	// logDir is where the components' logs are copied once they have stopped; empty: not kept.
	logDir string
}

// tour runs the demo's steps and prints them.
type tour struct {
	t   harness.T // its Context ends when the demo is interrupted
	cfg config
	out io.Writer
	tty bool

	started                         time.Time
	step                            int
	root, work                      string
	kubectl, imagectl, syncer, gate string
	mkfs, qemuImg                   string
	lastQCOW2                       string // the sample disk last uploaded, in the work directory
	imagectlEnv                     []string
	hubs                            []*hub
	reg                             *harness.Registry
	minio                           *harness.MinIO
	finished                        bool
}

// hub is one hub of the demo, with the files its commands name.
type hub struct {
	*harness.SyncerHub
	kubeconfig       string // admin, in the work directory
	tenantKubeconfig string // the tenant user, in the work directory
	syncer           *harness.Syncer
	syncerArgs       []string
	syncerSays       string
}

// runDemo runs the whole demo. Every failure, and the end of t.Context() (an interrupt), ends it
// through t.Fatalf; what it started is stopped by t's cleanups either way.
func runDemo(t harness.T, cfg config) {
	d := &tour{t: t, cfg: cfg, out: os.Stdout, tty: term.IsTerminal(int(os.Stdout.Fd())), started: time.Now()}
	d.work = t.TempDir()
	// Registered before any component starts, so it runs after every one has been stopped.
	t.Cleanup(d.finish)
	d.findTools()
	d.intro()

	d.startComponents()
	v1 := d.makeSampleDisk(1)
	d.startSyncers()
	digest1 := d.importStep(v1)
	d.showReplicated(digest1)
	d.gateRefusesCranePush(digest1)
	d.launchVM(digest1)
	d.newVersionAndDelete(digest1)

	d.heading("Stop everything")
	d.say("The demo now stops what it started, newest first: the two image-syncers, MinIO, image-gate, the registry, and both hubs (kube-apiserver, then etcd). Each gets SIGTERM, and SIGKILL if it has not exited 5 s later. The same happens on Ctrl-C.")
	d.finished = true
}

// findTools locates the binaries the demo runs; a missing one stops it with what to do.
func (d *tour) findTools() {
	d.root = harness.RepoRoot(d.t)
	d.imagectl = cmp.Or(d.cfg.imagectl, filepath.Join(d.root, "bin", "imagectl"))
	d.syncer = cmp.Or(d.cfg.syncer, filepath.Join(d.root, "bin", "image-syncer"))
	d.gate = cmp.Or(d.cfg.gate, filepath.Join(d.root, "bin", "image-gate"))
	for _, bin := range []string{d.imagectl, d.syncer, d.gate} {
		if _, err := os.Stat(bin); err != nil {
			need.Missing(d.t, "%s: run make build (make demo does)", bin)
		}
	}
	d.kubectl = harness.Binary(d.t, "kubectl")
	var err error
	d.qemuImg = need.Program(d.t, "qemu-img")
	d.mkfs, err = exec.LookPath("mkfs.ext4")
	if err != nil { // /usr/sbin is not in an ordinary user's PATH on Debian
		for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if _, statErr := os.Stat(p); statErr == nil {
				d.mkfs, err = p, nil
				break
			}
		}
	}
	if err != nil {
		need.Missing(d.t, "mkfs.ext4: run make tools (it installs e2fsprogs)")
	}
}

func (d *tour) intro() {
	mode := "short mode: a 32 MiB sample disk"
	if d.cfg.full {
		mode = "a 256 MiB sample disk"
	}
	d.bold("imagepipe demo: the whole pipeline on this machine, on 127.0.0.1 only (" + mode + ")")
	d.say("It starts a central registry, MinIO and two Kubernetes control planes (\"hubs\"); imports a disk from S3 into the registry as tenant acme; watches image-syncer replicate it onto both hubs; creates a VM from it; then pushes a new version and deletes the tag.")
	d.say("Every command shown after a $ runs for real, in " + d.work + " (removed at the end): imagectl and image-syncer from bin/, kubectl and the servers from " + harness.BinDir() + ".")
	d.say("CDI is real: each hub runs CDI's own controller and importer (v1.64.0, built from CDI's source). What cannot run here is a node: each hub has a node stand-in from the tests (test/nodestandin) that provisions volumes as sparse files on this machine and runs CDI's importer pods as local processes in private namespaces. Lines marked [node stand-in] say where it acts. KubeVirt's controllers do not run, so VMs are stored but not booted.")
}

// Step 1.
func (d *tour) startComponents() {
	d.heading("Start the central registry, MinIO and two hubs")
	d.say("A hub is etcd, kube-apiserver and kube-controller-manager with the real CRDs of CDI, KubeVirt and imagepipe's BaseImage, CDI's real controller, and one node stand-in. Each is prepared as a provider would prepare a real one: namespaces imagepipe-system and acme, image-syncer's RBAC from config/syncer/rbac.yaml bound to the user \"syncer\", the tenant RBAC from config/tenant/rbac.yaml bound to the user \"tenant-a\" in acme, and a default StorageClass shared-rwx.")
	for i := range 2 {
		name := fmt.Sprintf("hub-%d", i+1)
		start := time.Now()
		h := &hub{SyncerHub: harness.StartSyncerHub(d.t, name, harness.SyncerHubOptions{Namespaces: []string{tenant}})}
		h.BindTenant(d.t, tenantUser, tenant)
		h.kubeconfig = d.copyToWork(h.Kubeconfig, name+".kubeconfig")
		h.tenantKubeconfig = d.copyToWork(h.UserKubeconfig(d.t, tenantUser), name+"-"+tenantUser+".kubeconfig")
		d.hubs = append(d.hubs, h)
		d.printf("  %-9s %s  (etcd, kube-apiserver, kube-controller-manager, cdi-controller and a node stand-in, ready in %s; kubeconfigs %s, %s)\n", name, h.URL, since(start), filepath.Base(h.kubeconfig), filepath.Base(h.tenantKubeconfig))
		d.check()
	}
	for _, h := range d.hubs {
		h.syncer = harness.ReserveSyncer(d.t)
	}
	start := time.Now()
	d.reg = harness.StartRegistry(d.t, harness.RegistryOptions{
		Gate:        d.gate,
		NotifyURL:   d.hubs[0].syncer.WebhookURL,
		NotifyURLs:  []string{d.hubs[1].syncer.WebhookURL},
		NotifyToken: harness.SyncerWebhookToken,
	})
	d.printf("  %-9s %s  (CNCF distribution, ready in %s; notifies %s for hub-1 and %s for hub-2)\n", "registry", d.reg.Host, since(start), d.hubs[0].syncer.WebhookURL, d.hubs[1].syncer.WebhookURL)
	start = time.Now()
	d.minio = harness.StartMinIO(d.t)
	d.printf("  %-9s %s  (S3, ready in %s)\n", "minio", d.minio.Endpoint, since(start))
	d.imagectlEnv = []string{
		"AWS_ACCESS_KEY_ID=" + d.minio.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + d.minio.SecretKey,
		"IMAGEPIPE_CACHE=" + filepath.Join(d.work, "imagectl-cache"), // no state shared with your own imports
	}
	d.check()
	d.say("CDI does not know shared-rwx's provisioner, so the provider tells it what the class can do in the StorageProfile's spec, as on a real cluster; CDI's controller publishes it in the status, where image-syncer reads it: ReadWriteMany, Block. The registry serves plain HTTP, so it is also listed in CDI's insecureRegistries.")
	for _, h := range d.hubs {
		h.CDI.AllowInsecureRegistry(d.t, d.reg.Host)
	}
	d.kubectlOn(d.hubs[0], "get", "storageprofile", "-o", "custom-columns=NAME:.metadata.name,ACCESS MODES:.status.claimPropertySets[*].accessModes,VOLUME MODE:.status.claimPropertySets[*].volumeMode")
}

// gateRefusesCranePush pushes, with crane instead of imagectl, a
// containerDisk whose qcow2 names a host file as its backing file, and
// shows both hubs refusing it on the gate's signed verdict; then cosign
// checks the verdict on the good image.
func (d *tour) gateRefusesCranePush(good string) {
	d.heading("A push without imagectl is refused on both hubs")
	d.say("imagectl refuses a qcow2 that names a backing file, but anyone with push access can use crane instead. Here the tenant builds a containerDisk by hand whose disk is a qcow2 overlay of /etc/passwd: imported by CDI's qemu-img, the tenant's volume would hold the importer's /etc/passwd.")
	disk := filepath.Join(d.work, "sneaky.qcow2")
	d.run(d.qemuImg, "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", disk, "16M")
	layer := filepath.Join(d.work, "sneaky.tar")
	d.writeTar(layer, disk)
	crane := harness.Binary(d.t, "crane")
	ref := d.reg.Host + "/" + tenant + "/sneaky:1"
	d.run(crane, "append", "--insecure", "--oci-empty-base", "-f", layer, "-t", ref)
	d.run(crane, "mutate", "--insecure", "--set-platform", "linux/amd64", ref)
	d.say("image-gate reads the pushed digest in full and signs a verdict that rejects it; each syncer reads that verdict and imports nothing:")
	for _, h := range d.hubs {
		d.waitFor(h.Name+": sneaky--1 rejected", func() (bool, error) {
			var bi v1alpha1.BaseImage
			err := h.Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: "sneaky--1"}, &bi)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && bi.Status.Phase == v1alpha1.PhaseRejected, err
		})
		d.kubectlOn(h, "get", "bi", "-n", tenant, "sneaky--1", "-o", `custom-columns=NAME:.metadata.name,PHASE:.status.phase,REASON:.status.conditions[?(@.type=="Rejected")].reason,MESSAGE:.status.conditions[?(@.type=="Rejected")].message`)
	}
	d.say("The verdicts are in-toto attestations in the registry, beside the images they judge, so any tool can check them. cosign, with the provider's public key, on the image imported above:")
	_, pub := harness.ProviderKeyFiles(d.t)
	args := []string{"verify-attestation", "--key", d.copyToWork(pub, "gate.pub"), "--type", api.VerdictPredicateType,
		"--insecure-ignore-tlog=true", "--allow-http-registry=true", d.reg.Host + "/" + tenant + "/" + image + "@" + good}
	d.echo("cosign", args...)
	cmd := exec.CommandContext(d.t.Context(), harness.Binary(d.t, "cosign"), args...)
	cmd.Stderr = d.out
	out, err := cmd.Output()
	if err != nil {
		d.t.Fatalf("cosign verify-attestation: %v", err)
	}
	var env struct{ Payload []byte }
	var st struct{ Predicate json.RawMessage }
	if err := json.Unmarshal(out, &env); err != nil || json.Unmarshal(env.Payload, &st) != nil {
		d.t.Fatalf("cosign printed %q, not an attestation: %v", out, err)
	}
	var pretty bytes.Buffer
	json.Indent(&pretty, st.Predicate, "  ", "  ")
	d.say("cosign printed the attestation, whose predicate is the gate's verdict:")
	d.printf("  %s\n", pretty.String())
	d.check()
}

// writeTar writes a containerDisk tar holding disk as disk/disk.img, owned 107:107.
func (d *tour) writeTar(path, disk string) {
	data, err := os.ReadFile(disk)
	if err != nil {
		d.t.Fatal(err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Size: int64(len(data))})
	tw.Write(data)
	if err := tw.Close(); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// Step 2. makeSampleDisk builds version v of the sample disk and uploads it to MinIO. It
// returns the object's s3:// URL.
func (d *tour) makeSampleDisk(v int) string {
	rootfs := filepath.Join(d.work, "rootfs")
	raw := fmt.Sprintf("%s-v%d.raw", image, v)
	qcow := fmt.Sprintf("%s-v%d.qcow2", image, v)
	if v == 1 {
		d.heading("Make a sample disk and upload it to S3")
		goroot := d.fillRootfs(rootfs)
		what := "this repository's sources in usr/src/imagepipe"
		if goroot != "" {
			what = "the Go toolchain's sources (from " + goroot + ") in usr/src/go, " + what
		}
		d.say("The disk is an ext4 file system made from real files: " + what + ", an etc/os-release naming it, and an etc/cloud/cloud.cfg as cloud images carry (the gate reads it as cloud-init, which is what takes the SSH key vm create gives). It is data, not a bootable OS; nothing boots on this machine anyway (step 6).")
	} else {
		d.writeFile(filepath.Join(rootfs, "etc", "os-release"), osRelease(v))
		d.writeFile(filepath.Join(rootfs, "usr", "share", "doc", image, "CHANGES"), fmt.Sprintf("version %d: rebuilt on %s\n", v, time.Now().UTC().Format(time.RFC3339)))
		d.say(fmt.Sprintf("Version %d of the disk: the same files, with etc/os-release saying VERSION_ID=%d and a new usr/share/doc/%s/CHANGES.", v, v, image))
	}
	d.run(d.mkfs, "-q", "-L", image, "-d", "rootfs", raw, d.fsSize(rootfs))
	d.say("Compressed qcow2, as distributions publish their cloud images:")
	d.run(d.qemuImg, "convert", "-c", "-O", "qcow2", raw, qcow)
	if err := os.Remove(filepath.Join(d.work, raw)); err != nil {
		d.t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(d.work, qcow))
	if err != nil {
		d.t.Fatal(err)
	}
	url := "s3://" + bucket + "/" + qcow
	d.say(fmt.Sprintf("Uploading %s (%s) to MinIO as %s, with minio-go.", qcow, mib(fi.Size()), url))
	d.minio.PutFile(d.t, bucket, qcow, filepath.Join(d.work, qcow))
	d.lastQCOW2 = qcow
	d.check()
	if v == 1 {
		d.say("imagectl treats every disk as hostile. inspect validates it where it lies, without importing it:")
		d.imagectlRun("inspect", url, "--s3-endpoint", "http://"+d.minio.Endpoint)
	}
	return url
}

// fillRootfs copies the sample disk's files into dir: this repository's sources and, in full
// mode, the Go toolchain's. It returns the GOROOT it copied from, if any.
func (d *tour) fillRootfs(dir string) (goroot string) {
	d.writeFile(filepath.Join(dir, "etc", "os-release"), osRelease(1))
	// A cloud image carries cloud-init, which is what reads the SSH key
	// `vm create --ssh-key` gives (step 6); vm create refuses a key for a
	// guest the gate found without it.
	d.writeFile(filepath.Join(dir, "etc", "cloud", "cloud.cfg"), "datasource_list: [NoCloud, None]\n")
	for _, name := range []string{"cmd", "internal", "pkg", "config", "docs", "test", "README.md", "Makefile", "go.mod", "go.sum"} {
		if err := copyTree(d.t.Context(), filepath.Join(d.root, name), filepath.Join(dir, "usr", "src", "imagepipe", name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			d.check()
			d.t.Fatalf("copying the repository into the sample disk: %v", err)
		}
	}
	if !d.cfg.full {
		return ""
	}
	out, err := exec.CommandContext(d.t.Context(), "go", "env", "GOROOT").Output()
	if err != nil {
		d.t.Fatalf("go env GOROOT: %v", err)
	}
	goroot = strings.TrimSpace(string(out))
	if err := copyTree(d.t.Context(), filepath.Join(goroot, "src"), filepath.Join(dir, "usr", "src", "go")); err != nil {
		d.check()
		d.t.Fatalf("copying the Go sources into the sample disk: %v", err)
	}
	return goroot
}

// fsSize is the size of the sample file system for the files in dir: 256 MiB in full mode and
// 32 MiB in short mode, or more if the files need it (a newer Go's sources may).
func (d *tour) fsSize(dir string) string {
	var need int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		need += (fi.Size()+4095)/4096*4096 + 256 // data blocks and an inode
		return nil
	})
	if err != nil {
		d.t.Fatalf("measuring the sample disk's files: %v", err)
	}
	mib := int64(32)
	if d.cfg.full {
		mib = 256
	}
	// ext4's metadata (journal, inode tables, bitmaps) takes its share: leave a third free.
	return strconv.FormatInt(max(mib, need*3/2>>20+1), 10) + "M"
}

func osRelease(v int) string {
	return fmt.Sprintf("NAME=\"imagepipe demo disk\"\nID=imagepipe-demo\nVERSION_ID=%d\nPRETTY_NAME=\"imagepipe demo disk %d (data only, not bootable)\"\n", v, v)
}

// Step 3.
func (d *tour) startSyncers() {
	d.heading("Run one image-syncer per hub")
	d.say("Each hub runs its own image-syncer. It learns of pushes from the registry's notifications (and polls once a minute in case one is lost), and acts on its hub only as the user \"syncer\", with exactly the rules of config/syncer/rbac.yaml. The two hubs have different policies:")
	d.hubs[0].syncerArgs = []string{"--poll-interval", "1m"}
	d.hubs[0].syncerSays = "keeps the 2 newest imports of a tag (the default), and retains them when the tag is deleted (--on-delete retain, the default)"
	d.hubs[1].syncerArgs = []string{"--poll-interval", "1m", "--keep", "1", "--on-delete", "delete"}
	d.hubs[1].syncerSays = "keeps only the newest import, and deletes everything of a tag deleted from the registry"
	for _, h := range d.hubs {
		h.syncer.Start(d.t, d.syncer, h.SyncerHub, d.reg.Host, h.syncerArgs...)
		d.say(h.Name + ": " + h.syncerSays + ".")
		d.echo("image-syncer", shortenPaths(h.syncer.Args)...)
		d.printf("  ready (log: %s)\n", d.logName("syncer-"+h.Name+".log", h.syncer.LogPath))
		d.check()
	}
	d.say("(Paths are shortened to their base names; the full command line is at the top of each syncer's log.)")
}

// Step 4. importStep imports the sample disk and returns the image's digest.
func (d *tour) importStep(src string) string {
	d.heading("Import the disk as tenant acme")
	d.say("The tenant imports straight from S3. imagectl validates the disk, converts it, and streams it to the registry as a KubeVirt containerDisk, in one pass; the credentials come from the usual AWS_* variables. The first path component of the reference is the tenant.")
	return d.importImage(src)
}

// importImage runs imagectl import of src into the demo's tag and returns the digest it printed.
func (d *tour) importImage(src string) string {
	var stdout bytes.Buffer
	d.runWith(&stdout, d.imagectl, d.imagectlEnv, "import", src, d.ref(), "--s3-endpoint", "http://"+d.minio.Endpoint)
	m := regexp.MustCompile(`@(sha256:[0-9a-f]{64})\s*$`).FindStringSubmatch(stdout.String())
	if m == nil {
		d.t.Fatalf("imagectl import printed %q, not REF@DIGEST", stdout.String())
	}
	return m[1]
}

// Step 5.
func (d *tour) showReplicated(digest string) {
	d.heading("The BaseImage appears on both hubs")
	dv := cdi.DataVolumeName(image, digest)
	d.say("The registry notified image-gate and both syncers. The gate read the pushed image in full (it trusts neither the notification nor the client that pushed), found it canonical (imagectl built it) and attached a verdict signed with the provider's key. Each syncer checked that signature, then made a BaseImage and a DataVolume that imports the verified image pinned by digest, never by tag, onto ReadWriteMany Block storage, so that VMs can live-migrate.")
	for _, h := range d.hubs {
		d.waitImporting(h, digest)
	}
	for _, h := range d.hubs {
		d.kubectlOn(h, "get", "bi", "-A")
		d.kubectlOn(h, "get", "dv", "-A", "-o", dvColumns)
	}
	d.say(fmt.Sprintf("CDI's controller now makes the PVC %s and a scratch PVC, and starts an importer pod that pulls docker://%s/%s/%s@%s into the volume. image-syncer waits for CDI to say the DataVolume Succeeded before it points the DataSource at the new volume.", dv, d.reg.Host, tenant, image, digest))
	d.standIn("The node stand-in provisions the two claims as sparse files and runs the importer pod's container, CDI's real cdi-importer, as a local process.")
	for _, h := range d.hubs {
		d.waitImported(h, dv)
	}
	d.kubectlOn(d.hubs[0], "get", "pvc", "-n", tenant)
	d.compareImported(d.hubs[0], dv)
	for _, h := range d.hubs {
		d.waitReady(h, digest)
		d.wantDataSource(h, dv)
	}
	d.say("Both BaseImages are Ready, and the DataSource \"" + cdi.BaseImageName(tenant+"/"+image, tag) + "\" (named like the BaseImage), which VMs clone from, serves the import:")
	for _, h := range d.hubs {
		d.kubectlOn(h, "get", "bi", "-A")
		d.kubectlOn(h, "get", "datasource", "-n", tenant, "-o", dsColumns)
	}
}

// Step 6.
func (d *tour) launchVM(digest string) {
	d.heading("Publish a VM template and create a VM on hub-1")
	d.say("The provider publishes templates to a catalog in the same registry, as OCI artifacts:")
	d.writeFile(filepath.Join(d.work, "templates", "small_vm.yaml"), smallVMTemplate)
	d.run("cat", "templates/small_vm.yaml")
	d.imagectlRun("template", "publish", "templates/", "--catalog", d.reg.Host)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		d.t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		d.t.Fatal(err)
	}
	d.writeFile(filepath.Join(d.work, "demo_ed25519.pub"), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))+" demo@imagepipe\n")
	h := d.hubs[0]
	kube := []string{"--kubeconfig", filepath.Base(h.tenantKubeconfig), "-n", tenant}
	d.say("The tenant, as the user tenant-a with only config/tenant's rules, creates a VM from the synced image and the template (demo_ed25519.pub is a throwaway key made for the demo):")
	d.imagectlRun(append([]string{"vm", "create", "web", "--image", tenant + "/" + image + ":" + tag, "--template", "small_vm", "--set", "vm_cpu_cores=4", "--ssh-key", "demo_ed25519.pub", "--catalog", d.reg.Host}, kube...)...)
	var vm kubevirtv1.VirtualMachine
	if err := h.Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: "web"}, &vm); err != nil {
		d.fatalf("hub-1: VirtualMachine acme/web: %v", err)
	}
	if dvt := vm.Spec.DataVolumeTemplates; len(dvt) == 0 || dvt[0].Spec.SourceRef == nil || dvt[0].Spec.SourceRef.Name != cdi.BaseImageName(tenant+"/"+image, tag) ||
		dvt[0].Spec.Storage == nil || !slices.Contains(dvt[0].Spec.Storage.AccessModes, corev1.ReadWriteMany) || vm.Annotations["imagepipe.io/image-digest"] != digest {
		d.fatalf("hub-1: VirtualMachine acme/web does not clone DataSource %s onto ReadWriteMany storage at %s: %+v", cdi.BaseImageName(tenant+"/"+image, tag), digest, vm.Spec.DataVolumeTemplates)
	}
	d.imagectlRun(append([]string{"vm", "get", "web"}, kube...)...)
	d.say("The VirtualMachine as stored on hub-1; its root disk is a clone of the DataSource, ReadWriteMany:")
	d.kubectlOn(h, "get", "virtualmachine", "web", "-n", tenant, "-o", vmColumns)
	d.note("[no KubeVirt here]", "KubeVirt's controllers do not run here, so the VirtualMachine stays as stored (checked against KubeVirt's real CRD schema) and nothing boots. On a real cluster virt-controller would now create web's root-disk DataVolume, CDI would clone the DataSource's volume into it, and the VM would start.")
}

// Step 7.
func (d *tour) newVersionAndDelete(digest1 string) {
	d.heading("Push a new version, then delete the tag")
	src := d.makeSampleDisk(2)
	d.say("The tenant imports it to the same tag:")
	for _, h := range d.hubs {
		h.CDI.Node.Pause()
	}
	digest2 := d.importImage(src)
	dv1, dv2 := cdi.DataVolumeName(image, digest1), cdi.DataVolumeName(image, digest2)
	for _, h := range d.hubs {
		d.waitImporting(h, digest2)
	}
	d.say("Each syncer started a second import, alongside the first. Until it succeeds, the DataSource keeps serving the old volume, so VMs created meanwhile are not disturbed:")
	d.kubectlOn(d.hubs[0], "get", "dv", "-A", "-o", dvColumns)
	d.kubectlOn(d.hubs[0], "get", "datasource", "-n", tenant, "-o", dsColumns)
	for _, h := range d.hubs {
		d.wantDataSource(h, dv1)
	}
	d.standIn("So that the old volume can be seen still serving, the demo had both nodes hold new pods until now; it lets them run CDI's importer for the new version.")
	for _, h := range d.hubs {
		h.CDI.Node.Resume()
	}
	for _, h := range d.hubs {
		d.waitImported(h, dv2)
	}
	for _, h := range d.hubs {
		d.waitReady(h, digest2)
		d.wantDataSource(h, dv2)
	}
	d.waitFor("hub-2 to collect the first import (--keep 1)", func() (bool, error) {
		dvs, err := d.dataVolumes(d.hubs[1])
		return len(dvs) == 1 && dvs[0] == dv2, err
	})
	if dvs, err := d.dataVolumes(d.hubs[0]); err != nil || !slices.Equal(dvs, []string{dv1, dv2}) && !slices.Equal(dvs, []string{dv2, dv1}) {
		d.fatalf("hub-1 keeps DataVolumes %v (%v), want %s and %s (--keep 2)", dvs, err, dv1, dv2)
	}
	d.say("The DataSource switched to the new volume on both hubs. Retention differs: hub-1 keeps both imports, so rolling back is one DataSource edit; hub-2 keeps one and deleted the first DataVolume and its PVC.")
	for _, h := range d.hubs {
		d.kubectlOn(h, "get", "datasource", "-n", tenant, "-o", dsColumns)
		d.kubectlOn(h, "get", "dv", "-A", "-o", dvColumns)
	}

	d.say("Now the tenant deletes the tag from the registry:")
	d.imagectlRun("delete", d.ref())
	biName := cdi.BaseImageName(tenant+"/"+image, tag)
	d.waitFor("hub-1 to mark the BaseImage Deleted", func() (bool, error) {
		var bi v1alpha1.BaseImage
		err := d.hubs[0].Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: biName}, &bi)
		return err == nil && bi.Status.Phase == v1alpha1.PhaseDeleted, err
	})
	d.wantDataSource(d.hubs[0], dv2)
	d.waitFor("hub-2 to delete the BaseImage, the DataSource and the DataVolumes", func() (bool, error) {
		biErr := d.hubs[1].Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: biName}, &v1alpha1.BaseImage{})
		dsErr := d.hubs[1].Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: biName}, &cdiv1.DataSource{})
		dvs, err := d.dataVolumes(d.hubs[1])
		return apierrors.IsNotFound(biErr) && apierrors.IsNotFound(dsErr) && len(dvs) == 0, err
	})
	d.say("hub-1 (--on-delete retain) keeps the DataSource and its volumes, so VMs can still be created from the image there; its BaseImage says Deleted:")
	d.kubectlOn(d.hubs[0], "get", "bi", "-A")
	d.kubectlOn(d.hubs[0], "get", "datasource", "-n", tenant, "-o", dsColumns)
	d.say("hub-2 (--on-delete delete) removed the BaseImage, the DataSource and the imported volumes:")
	d.kubectlOn(d.hubs[1], "get", "bi,datasource,dv", "-n", tenant)
}

// kubectl columns that show what matters here.
const (
	dvColumns       = "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,SOURCE URL:.spec.source.registry.url,ACCESS:.spec.storage.accessModes[*],MODE:.spec.storage.volumeMode,PHASE:.status.phase"
	dsColumns       = "custom-columns=NAME:.metadata.name,CLONES FROM PVC:.spec.source.pvc.name,DIGEST:.metadata.labels.imagepipe\\.io/digest"
	vmColumns       = "custom-columns=NAME:.metadata.name,RUN STRATEGY:.spec.runStrategy,CORES:.spec.template.spec.domain.cpu.cores,MEMORY:.spec.template.spec.domain.memory.guest,ROOT DISK FROM:.spec.dataVolumeTemplates[0].spec.sourceRef.name,ACCESS:.spec.dataVolumeTemplates[0].spec.storage.accessModes[*],EVICTION:.spec.template.spec.evictionStrategy"
	smallVMTemplate = `id: small_vm
title: Small VM
description: A VM whose root disk is a clone of the image; CPU, memory and disk size are parameters
parameters:
  - {name: vm_cpu_cores, type: integer, min: 1, max: 8, default: {value: 2}}
  - {name: vm_memory, type: quantity, min: 512Mi, default: {value: 2Gi}}
  - {name: vm_disk_size, type: quantity, default: {value: 10Gi}}
`
)

// ref is the demo image's reference in the registry.
func (d *tour) ref() string { return d.reg.Host + "/" + tenant + "/" + image + ":" + tag }

// waitImporting waits until h's syncer imports digest: the BaseImage observes it and its
// DataVolume, pinned to the digest on ReadWriteMany storage, exists.
func (d *tour) waitImporting(h *hub, digest string) {
	dv := cdi.DataVolumeName(image, digest)
	d.waitFor(h.Name+": DataVolume "+dv, func() (bool, error) {
		var bi v1alpha1.BaseImage
		err := h.Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: cdi.BaseImageName(tenant+"/"+image, tag)}, &bi)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil || bi.Status.ObservedDigest != digest {
			return false, err
		}
		var got cdiv1.DataVolume
		if err := h.Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: dv}, &got); apierrors.IsNotFound(err) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		want := "docker://" + d.reg.Host + "/" + tenant + "/" + image + "@" + digest
		if url := got.Spec.Source.Registry.URL; url == nil || *url != want {
			return false, fmt.Errorf("DataVolume %s imports %v, want %s", dv, url, want)
		}
		if got.Spec.Storage == nil || !slices.Contains(got.Spec.Storage.AccessModes, corev1.ReadWriteMany) {
			return false, fmt.Errorf("DataVolume %s is not ReadWriteMany: %+v", dv, got.Spec.Storage)
		}
		return true, nil
	})
}

// waitImported waits until CDI on h reports DataVolume dv Succeeded, and shows its status.
func (d *tour) waitImported(h *hub, dv string) {
	start := time.Now()
	h.CDI.WaitImported(d.t, tenant, dv, 5*time.Minute)
	d.printf("  %s: CDI imported %s in %s\n", h.Name, dv, since(start))
}

// compareImported copies the disk CDI imported on h out of the node stand-in's volume and has
// qemu-img compare it with the disk the tenant uploaded.
func (d *tour) compareImported(h *hub, dv string) {
	got := filepath.Join(d.work, h.Name+"-"+dv+".raw")
	h.CDI.CopyImportedDisk(d.t, tenant, dv, got)
	d.say("The volume on " + h.Name + " holds exactly the disk that was uploaded to S3 (copied out of the node stand-in's volume):")
	d.run(d.qemuImg, "compare", filepath.Base(got), d.lastQCOW2)
	os.Remove(got)
}

// waitReady waits until h's BaseImage is Ready at digest.
func (d *tour) waitReady(h *hub, digest string) {
	d.waitFor(h.Name+": BaseImage Ready at "+digest, func() (bool, error) {
		var bi v1alpha1.BaseImage
		err := h.Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: cdi.BaseImageName(tenant+"/"+image, tag)}, &bi)
		return err == nil && bi.Status.Phase == v1alpha1.PhaseReady && bi.Status.ImportedDigest == digest, err
	})
}

// wantDataSource waits until h's DataSource clones from pvc.
func (d *tour) wantDataSource(h *hub, pvc string) {
	name := cdi.BaseImageName(tenant+"/"+image, tag)
	d.waitFor(h.Name+": DataSource "+name+" → "+pvc, func() (bool, error) {
		var ds cdiv1.DataSource
		err := h.Client.Get(d.t.Context(), client.ObjectKey{Namespace: tenant, Name: name}, &ds)
		return err == nil && ds.Spec.Source.PVC != nil && ds.Spec.Source.PVC.Name == pvc, err
	})
}

// dataVolumes lists the names of the image's DataVolumes on h that are not being deleted, sorted.
func (d *tour) dataVolumes(h *hub) ([]string, error) {
	var list cdiv1.DataVolumeList
	if err := h.Client.List(d.t.Context(), &list, client.InNamespace(tenant), client.MatchingLabels{cdi.LabelImage: image}); err != nil {
		return nil, err
	}
	var names []string
	for _, dv := range list.Items {
		if dv.DeletionTimestamp.IsZero() {
			names = append(names, dv.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// waitFor polls cond every 100 ms until it holds; an error, waitTimeout or an interrupt ends
// the demo.
func (d *tour) waitFor(what string, cond func() (bool, error)) {
	deadline := time.Now().Add(waitTimeout)
	for {
		d.check()
		ok, err := cond()
		if err != nil && d.t.Context().Err() == nil {
			d.fatalf("waiting for %s: %v", what, err)
		}
		if ok && err == nil {
			return
		}
		if time.Now().After(deadline) {
			d.fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		select {
		case <-d.t.Context().Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// check ends the demo if it was interrupted.
func (d *tour) check() {
	if d.t.Context().Err() != nil {
		d.t.Fatalf("%v", context.Cause(d.t.Context()))
	}
}

func (d *tour) fatalf(format string, args ...any) {
	d.check()
	d.t.Fatalf(format, args...)
}

// kubectlOn runs kubectl against h as its admin.
func (d *tour) kubectlOn(h *hub, args ...string) {
	d.runWith(nil, d.kubectl, []string{"KUBECACHEDIR=" + filepath.Join(d.work, "kube-cache")}, append([]string{"--kubeconfig", filepath.Base(h.kubeconfig)}, args...)...)
}

// imagectlRun runs imagectl with the demo's environment.
func (d *tour) imagectlRun(args ...string) { d.runWith(nil, d.imagectl, d.imagectlEnv, args...) }

// run runs a command in the work directory, showing it and its output.
func (d *tour) run(bin string, args ...string) { d.runWith(nil, bin, nil, args...) }

// runWith shows and runs bin with args in the work directory, with env added to the demo's
// environment. Its stderr is the demo's own, so imagectl draws its progress bars when that is a
// terminal; its stdout is also copied to stdout if not nil. A failure ends the demo.
func (d *tour) runWith(stdout io.Writer, bin string, env []string, args ...string) {
	d.check()
	d.echo(filepath.Base(bin), args...)
	cmd := exec.CommandContext(d.t.Context(), bin, args...)
	cmd.Dir = d.work
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = d.out
	if stdout != nil {
		cmd.Stdout = io.MultiWriter(d.out, stdout)
	}
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && !ee.Exited() {
		// A Ctrl-C on the terminal reaches the command as well as the demo; give the demo's
		// own handler a moment to record the interrupt, so that it is reported as one.
		select {
		case <-d.t.Context().Done():
		case <-time.After(time.Second):
		}
	}
	d.check()
	if err != nil {
		d.t.Fatalf("%s: %v", filepath.Base(bin), err)
	}
	fmt.Fprintln(d.out)
}

// echo prints a command line as a shell would take it.
func (d *tour) echo(name string, args ...string) {
	words := []string{name}
	for _, a := range args {
		words = append(words, shellQuote(a))
	}
	line := "$ " + strings.Join(words, " ")
	if d.tty {
		line = "\033[1;36m" + line + "\033[0m"
	}
	fmt.Fprintln(d.out, line)
}

func (d *tour) heading(title string) {
	d.step++
	elapsed := time.Since(d.started).Round(time.Second)
	d.printf("\n")
	d.bold(fmt.Sprintf("==> %d/%d  %s   [%d:%02d]", d.step, steps, title, int(elapsed.Minutes()), int(elapsed.Seconds())%60))
}

func (d *tour) bold(s string) {
	if d.tty {
		s = "\033[1m" + s + "\033[0m"
	}
	fmt.Fprintln(d.out, s)
}

// standIn prints what the node stand-in does in a node's place.
func (d *tour) standIn(text string) { d.note("[node stand-in]", text) }

// note prints a paragraph that starts with a highlighted label.
func (d *tour) note(label, text string) {
	text = wrap(label+" "+text, 0) // wrapped before the escape codes, which take no columns
	if d.tty {
		text = "\033[1;33m" + label + "\033[0m" + strings.TrimPrefix(text, label)
	}
	fmt.Fprintln(d.out, text)
	fmt.Fprintln(d.out)
}

// say prints a paragraph, wrapped.
func (d *tour) say(text string) { fmt.Fprintln(d.out, wrap(text, 0)) }

func (d *tour) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

func (d *tour) writeFile(path, content string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// copyToWork copies a file into the work directory as name and returns its path.
func (d *tour) copyToWork(src, name string) string {
	data, err := os.ReadFile(src)
	if err != nil {
		d.t.Fatal(err)
	}
	dst := filepath.Join(d.work, name)
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		d.t.Fatal(err)
	}
	return dst
}

// logName is how a log is named in messages: its place in the kept log directory, else its path.
func (d *tour) logName(kept, path string) string {
	if d.cfg.logDir != "" {
		return filepath.Join(d.cfg.logDir, kept)
	}
	return path
}

// finish runs once every component has been stopped: it checks that no process the demo
// started is left, and keeps the logs.
func (d *tour) finish() {
	left := childProcesses()
	switch {
	case len(left) > 0:
		d.t.Errorf("processes left behind: %s", strings.Join(left, "; "))
	case d.step == 0: // it ended before it started anything
	case d.finished:
		d.say("Everything the demo started has exited; no process is left behind.")
	default:
		d.printf("\n")
		d.say("Everything the demo had started has been stopped; no process is left behind.")
	}
	if d.cfg.logDir != "" {
		d.keepLogs()
	}
	if d.finished && !d.t.Failed() {
		d.bold(fmt.Sprintf("Done in %s.", since(d.started)))
	}
}

// keepLogs copies the components' logs into cfg.logDir.
func (d *tour) keepLogs() {
	files := map[string]string{}
	if d.reg != nil {
		files["registry.log"] = d.reg.LogPath()
	}
	if d.minio != nil {
		files["minio.log"] = d.minio.LogPath()
	}
	for _, h := range d.hubs {
		for _, p := range h.LogPaths() {
			files[filepath.Join(h.Name, filepath.Base(p))] = p
		}
		if h.syncer != nil && h.syncer.LogPath != "" {
			files["syncer-"+h.Name+".log"] = h.syncer.LogPath
		}
	}
	var kept []string
	for name, src := range files {
		if err := copyFile(src, filepath.Join(d.cfg.logDir, name)); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				d.t.Errorf("keeping %s: %v", name, err)
			}
			continue
		}
		kept = append(kept, name)
	}
	slices.Sort(kept)
	if len(kept) > 0 {
		d.say("Logs are kept in " + d.cfg.logDir + "/: " + strings.Join(kept, ", ") + ".")
	}
}

// childProcesses lists this process's children that still exist, as "PID (COMMAND)".
func childProcesses() []string {
	me := strconv.Itoa(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	var left []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(stat)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) > 1 && f[1] == me {
			left = append(left, e.Name()+" "+s[strings.IndexByte(s, '('):end+1])
		}
	}
	return left
}

// copyTree copies the directories and regular files under src to dst; symbolic links and
// special files are left out. It stops early when ctx ends.
func copyTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case e.IsDir():
			return os.MkdirAll(target, 0o755)
		case e.Type().IsRegular():
			return copyFile(path, target)
		}
		return nil
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// shortenPaths replaces every absolute path in args by its base name, for display.
func shortenPaths(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if filepath.IsAbs(a) {
			a = filepath.Base(a)
		}
		out[i] = a
	}
	return out
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9@%_+=:,./-]+$`)

// shellQuote quotes a word for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// wrap breaks text into lines of at most 100 columns, indented by indent spaces.
func wrap(text string, indent int) string {
	const width = 100
	var b strings.Builder
	col := 0
	for i, word := range strings.Fields(text) {
		switch {
		case i == 0:
			b.WriteString(strings.Repeat(" ", indent))
			col = indent
		case col+1+len(word) > width:
			b.WriteString("\n" + strings.Repeat(" ", indent))
			col = indent
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	return b.String()
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }
