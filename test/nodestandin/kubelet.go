package nodestandin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
)

var everything = labels.Everything()

const (
	// maxTerminationMessage is what kubelet keeps of a termination message file (4096 bytes),
	// and fallbackLogLines and fallbackLogBytes what it takes from the log instead under
	// FallbackToLogsOnError.
	maxTerminationMessage = 4096
	fallbackLogLines      = 80
	fallbackLogBytes      = 2048
	// defaultPath is the PATH of a container whose image sets the usual one.
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// nonRootUID runs a container that sets no runAsUser: the stand-in never runs one as root.
	nonRootUID = 65534
)

// podWorker runs one pod's container, restarting it as its restart policy says, and reports
// the pod's status as kubelet does.
type podWorker struct {
	n   *Node
	pod *corev1.Pod // as first seen; its spec does not change
	dir string      // the pod's directory on the node: logs, volumes, root

	deleteOnce sync.Once
	deleted    chan struct{} // closed when the pod is being deleted

	// What the next status report says.
	restarts int32
	last     *corev1.ContainerStateTerminated
	started  metav1.Time
}

func newPodWorker(n *Node, p *corev1.Pod) *podWorker {
	return &podWorker{
		n: n, pod: p.DeepCopy(), deleted: make(chan struct{}),
		dir: filepath.Join(n.cfg.Dir, "pods", p.Namespace+"_"+p.Name+"_"+string(p.UID)),
	}
}

// delete tells the worker its pod is being deleted: its container is killed, then the pod is
// removed.
func (w *podWorker) delete() { w.deleteOnce.Do(func() { close(w.deleted) }) }

// run plays kubelet for the pod until it has finished, or is deleted, or the node stops.
func (w *podWorker) run(ctx context.Context) {
	w.started = metav1.Now()
	if w.pod.Status.Phase == corev1.PodSucceeded || w.pod.Status.Phase == corev1.PodFailed {
		w.finish(ctx) // done before this node started; only its deletion is left
		return
	}
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		w.n.logf("pod %s: %v", w.name(), err)
		return
	}
	podCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.deleted:
			cancel()
		case <-podCtx.Done():
		}
	}()
	if msg := unsupported(w.pod); msg != "" {
		w.report(ctx, corev1.PodFailed, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "NodeStandInUnsupported", Message: msg}})
		w.finish(ctx)
		return
	}
	c := w.pod.Spec.Containers[0]
	entrypoint, ok := w.n.cfg.Images[c.Image]
	if !ok {
		msg := fmt.Sprintf("the node stand-in has no binary for image %q", c.Image)
		w.report(ctx, corev1.PodPending, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: msg}})
		w.finish(ctx)
		return
	}
	backoff := w.n.cfg.RestartBackoff
run:
	for {
		w.report(ctx, corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})
		term, err := w.runContainer(podCtx, c, entrypoint)
		if podCtx.Err() != nil {
			break
		}
		wait := backoff
		switch {
		case err != nil:
			// What kubelet calls CreateContainerConfigError: a missing secret key, say.
			w.report(ctx, corev1.PodPending, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: err.Error()}})
		case restart(w.pod.Spec.RestartPolicy, term.ExitCode):
			// As kubelet: the container shows terminated, then waits in back-off with its
			// termination as last state, and counts a restart when it starts again. CDI reads
			// the importer's error from the terminated state.
			w.report(ctx, corev1.PodRunning, corev1.ContainerState{Terminated: term})
			if !sleep(podCtx, backoff/2) {
				break run
			}
			w.restarts++
			w.last = term
			w.report(ctx, corev1.PodRunning, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: "CrashLoopBackOff", Message: fmt.Sprintf("back-off %s restarting failed container", backoff),
			}})
			wait = backoff / 2
		default:
			phase := corev1.PodSucceeded
			if term.ExitCode != 0 {
				phase = corev1.PodFailed
			}
			w.report(ctx, phase, corev1.ContainerState{Terminated: term})
			break run
		}
		if !sleep(podCtx, wait) {
			break
		}
		backoff = min(2*backoff, 8*w.n.cfg.RestartBackoff)
	}
	w.finish(ctx)
}

// sleep waits d, or less if ctx ends first; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// finish waits until the pod is deleted, then removes it, as kubelet's final delete does once
// the container has stopped.
func (w *podWorker) finish(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-w.deleted:
	}
	zero := int64(0)
	err := w.n.cfg.Client.CoreV1().Pods(w.pod.Namespace).Delete(ctx, w.pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &w.pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.n.logf("pod %s: final delete: %v", w.name(), err)
		return
	}
	w.n.logf("pod %s: deleted", w.name())
}

// restart reports whether a container that exited with code is started again.
func restart(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default:
		return true
	}
}

// unsupported says why the stand-in cannot run a pod, or "" when it can.
func unsupported(p *corev1.Pod) string {
	switch {
	case len(p.Spec.InitContainers) > 0 || len(p.Spec.Containers) != 1:
		return "the node stand-in runs pods of exactly one container and no init containers"
	case len(p.Spec.Containers[0].Command) > 0:
		return "the node stand-in runs an image's own entrypoint only; this container sets a command"
	}
	return ""
}

// runContainer runs the container once and returns how it ended.
func (w *podWorker) runContainer(ctx context.Context, c corev1.Container, entrypoint string) (*corev1.ContainerStateTerminated, error) {
	env, err := w.env(ctx, c)
	if err != nil {
		return nil, err
	}
	sb := &sandbox{
		root: filepath.Join(w.dir, "root"), entrypoint: entrypoint, args: c.Args, env: env,
		workingDir: c.WorkingDir, terminationPath: c.TerminationMessagePath,
		terminationLog: filepath.Join(w.dir, "termination-log"),
	}
	if sb.terminationPath == "" {
		sb.terminationPath = corev1.TerminationMessagePathDefault
	}
	sb.uid, sb.gid = w.user(c)
	if sc := w.pod.Spec.SecurityContext; sc != nil {
		sb.fsGroup = sc.FSGroup
	}
	detach, err := w.volumes(ctx, c, sb)
	defer detach()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(sb.root, 0o755); err != nil {
		return nil, err
	}
	// Writable by the container's user, and empty for each run, as kubelet's is.
	if err := os.WriteFile(sb.terminationLog, nil, 0o666); err != nil {
		return nil, err
	}
	if err := os.Chmod(sb.terminationLog, 0o666); err != nil {
		return nil, err
	}
	logPath := filepath.Join(w.dir, c.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	sb.log = logFile
	fmt.Fprintf(logFile, "--- node stand-in: starting %s (restart %d)\n", c.Image, w.restarts)
	started := metav1.Now()
	code, err := sb.run(ctx)
	if err != nil {
		return nil, err
	}
	term := &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: "Completed", StartedAt: started, FinishedAt: metav1.Now(),
		ContainerID: "nodestandin://" + string(w.pod.UID),
	}
	if code != 0 {
		term.Reason = "Error"
	}
	term.Message = terminationMessage(sb.terminationLog, logPath, code, c.TerminationMessagePolicy)
	w.n.logf("pod %s: container %s exited %d", w.name(), c.Name, code)
	return term, nil
}

// terminationMessage is what kubelet reports: the file's first 4096 bytes, or under
// FallbackToLogsOnError with an empty file and a failure, the log's last lines.
func terminationMessage(file, log string, code int, policy corev1.TerminationMessagePolicy) string {
	msg, _ := os.ReadFile(file)
	if len(msg) > maxTerminationMessage {
		msg = msg[:maxTerminationMessage]
	}
	if len(msg) > 0 || code == 0 || policy != corev1.TerminationMessageFallbackToLogsOnError {
		return string(msg)
	}
	out, _ := os.ReadFile(log)
	lines := bytes.Split(bytes.TrimRight(out, "\n"), []byte("\n"))
	if len(lines) > fallbackLogLines {
		lines = lines[len(lines)-fallbackLogLines:]
	}
	tail := bytes.Join(lines, []byte("\n"))
	if len(tail) > fallbackLogBytes {
		tail = tail[len(tail)-fallbackLogBytes:]
	}
	return string(tail)
}

// user is the uid and gid the container runs as: its runAsUser and runAsGroup, else the pod's,
// else nobody; never root.
func (w *podWorker) user(c corev1.Container) (int64, int64) {
	uid, gid := int64(nonRootUID), int64(-1)
	if sc := w.pod.Spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	if uid == 0 {
		uid = nonRootUID
	}
	if gid < 0 {
		gid = uid
	}
	return uid, gid
}

// env resolves the container's environment: values, and keys of secrets and config maps.
func (w *podWorker) env(ctx context.Context, c corev1.Container) ([]string, error) {
	out := []string{defaultPath, "HOSTNAME=" + w.pod.Name}
	for _, e := range c.Env {
		v := e.Value
		if src := e.ValueFrom; src != nil {
			var err error
			switch {
			case src.SecretKeyRef != nil:
				v, err = w.secretKey(ctx, src.SecretKeyRef.Name, src.SecretKeyRef.Key, src.SecretKeyRef.Optional)
			case src.ConfigMapKeyRef != nil:
				v, err = w.configMapKey(ctx, src.ConfigMapKeyRef.Name, src.ConfigMapKeyRef.Key, src.ConfigMapKeyRef.Optional)
			case src.FieldRef != nil:
				v, err = w.field(src.FieldRef.FieldPath)
			default:
				err = fmt.Errorf("environment variable %s: the node stand-in reads values, secret and config map keys and pod fields only", e.Name)
			}
			if err != nil {
				return nil, err
			}
		}
		out = append(out, e.Name+"="+v)
	}
	return out, nil
}

func (w *podWorker) secretKey(ctx context.Context, name, key string, optional *bool) (string, error) {
	s, err := w.n.cfg.Client.CoreV1().Secrets(w.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		if v, ok := s.Data[key]; ok {
			return string(v), nil
		}
		err = fmt.Errorf("couldn't find key %s in Secret %s/%s", key, w.pod.Namespace, name)
	}
	if optional != nil && *optional {
		return "", nil
	}
	return "", err
}

func (w *podWorker) configMapKey(ctx context.Context, name, key string, optional *bool) (string, error) {
	cm, err := w.n.cfg.Client.CoreV1().ConfigMaps(w.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		if v, ok := cm.Data[key]; ok {
			return v, nil
		}
		err = fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", key, w.pod.Namespace, name)
	}
	if optional != nil && *optional {
		return "", nil
	}
	return "", err
}

func (w *podWorker) field(path string) (string, error) {
	switch path {
	case "metadata.name":
		return w.pod.Name, nil
	case "metadata.namespace":
		return w.pod.Namespace, nil
	case "metadata.uid":
		return string(w.pod.UID), nil
	case "spec.nodeName":
		return w.n.cfg.Name, nil
	case "status.podIP", "status.hostIP":
		return "127.0.0.1", nil
	}
	return "", fmt.Errorf("the node stand-in does not expose field %s", path)
}

// volumes maps the container's volume mounts and devices into sb, attaching claims to loop
// devices; the returned function detaches them and must be called even on error.
func (w *podWorker) volumes(ctx context.Context, c corev1.Container, sb *sandbox) (func(), error) {
	var loops []string
	detach := func() {
		for _, dev := range loops {
			if err := detachLoop(dev); err != nil {
				w.n.logf("pod %s: %v", w.name(), err)
			}
		}
	}
	byName := map[string]corev1.Volume{}
	for _, v := range w.pod.Spec.Volumes {
		byName[v.Name] = v
	}
	claimDevice := func(v corev1.Volume, want corev1.PersistentVolumeMode) (string, error) {
		file, mode, err := w.n.claimFile(ctx, w.pod.Namespace, v.PersistentVolumeClaim.ClaimName)
		if err != nil {
			return "", err
		}
		if mode != want {
			return "", fmt.Errorf("volume %s: claim %s is %s, used as %s", v.Name, v.PersistentVolumeClaim.ClaimName, mode, want)
		}
		dev, err := loopDevice(ctx, file)
		if err != nil {
			return "", err
		}
		loops = append(loops, dev)
		return dev, nil
	}
	for _, m := range c.VolumeMounts {
		v, ok := byName[m.Name]
		if !ok {
			return detach, fmt.Errorf("volume mount %s names no volume", m.Name)
		}
		switch {
		case v.PersistentVolumeClaim != nil:
			dev, err := claimDevice(v, corev1.PersistentVolumeFilesystem)
			if err != nil {
				return detach, err
			}
			sb.mounts = append(sb.mounts, mount{kind: ext4Mount, host: dev, container: m.MountPath, readOnly: m.ReadOnly})
		case v.EmptyDir != nil:
			dir := filepath.Join(w.dir, "volumes", v.Name)
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return detach, err
			}
			if err := os.Chmod(dir, 0o777); err != nil {
				return detach, err
			}
			sb.mounts = append(sb.mounts, mount{kind: bindMount, host: dir, container: m.MountPath, readOnly: m.ReadOnly})
		case v.ConfigMap != nil || v.Secret != nil:
			dir, err := w.writeKeys(ctx, v)
			if err != nil {
				return detach, err
			}
			sb.mounts = append(sb.mounts, mount{kind: bindMount, host: dir, container: m.MountPath, readOnly: true})
		default:
			return detach, fmt.Errorf("volume %s: the node stand-in mounts claims, emptyDirs, config maps and secrets only", v.Name)
		}
	}
	for _, d := range c.VolumeDevices {
		v, ok := byName[d.Name]
		if !ok || v.PersistentVolumeClaim == nil {
			return detach, fmt.Errorf("volume device %s names no claim", d.Name)
		}
		dev, err := claimDevice(v, corev1.PersistentVolumeBlock)
		if err != nil {
			return detach, err
		}
		sb.mounts = append(sb.mounts, mount{kind: blockDevice, host: dev, container: d.DevicePath})
	}
	return detach, nil
}

// writeKeys writes a config map's or secret's keys as files, as kubelet projects them.
func (w *podWorker) writeKeys(ctx context.Context, v corev1.Volume) (string, error) {
	dir := filepath.Join(w.dir, "volumes", v.Name)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	files := map[string][]byte{}
	if cmv := v.ConfigMap; cmv != nil {
		cm, err := w.n.cfg.Client.CoreV1().ConfigMaps(w.pod.Namespace).Get(ctx, cmv.Name, metav1.GetOptions{})
		if err != nil && !(apierrors.IsNotFound(err) && cmv.Optional != nil && *cmv.Optional) {
			return "", fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if cm != nil {
			for k, val := range cm.Data {
				files[k] = []byte(val)
			}
			for k, val := range cm.BinaryData {
				files[k] = val
			}
		}
	} else {
		sv := v.Secret
		s, err := w.n.cfg.Client.CoreV1().Secrets(w.pod.Namespace).Get(ctx, sv.SecretName, metav1.GetOptions{})
		if err != nil && !(apierrors.IsNotFound(err) && sv.Optional != nil && *sv.Optional) {
			return "", fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if s != nil {
			files = s.Data
		}
	}
	for k, val := range files {
		if k == "" || strings.ContainsAny(k, "/\x00") || k == "." || k == ".." {
			return "", fmt.Errorf("volume %s: key %q cannot be a file name", v.Name, k)
		}
		if err := os.WriteFile(filepath.Join(dir, k), val, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// report writes the pod's status: phase, conditions and the container's state, with the
// restart count and last termination so far.
func (w *podWorker) report(ctx context.Context, phase corev1.PodPhase, state corev1.ContainerState) {
	c := w.pod.Spec.Containers[0]
	running := state.Running != nil
	cs := corev1.ContainerStatus{
		Name: c.Name, Image: c.Image, ImageID: c.Image, State: state, Ready: running, Started: &running,
		RestartCount: w.restarts, ContainerID: "nodestandin://" + string(w.pod.UID),
	}
	if w.last != nil {
		cs.LastTerminationState = corev1.ContainerState{Terminated: w.last}
	}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now()}
	}
	status := corev1.PodStatus{
		Phase: phase, HostIP: "127.0.0.1", PodIP: "127.0.0.1", StartTime: &w.started,
		PodIPs:            []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions:        []corev1.PodCondition{cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true), cond(corev1.ContainersReady, running), cond(corev1.PodReady, running)},
		ContainerStatuses: []corev1.ContainerStatus{cs},
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := w.n.cfg.Client.CoreV1().Pods(w.pod.Namespace).Get(ctx, w.pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != w.pod.UID {
			return apierrors.NewNotFound(corev1.Resource("pods"), w.pod.Name)
		}
		cur.Status = status
		_, err = w.n.cfg.Client.CoreV1().Pods(w.pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && !errors.Is(err, context.Canceled) {
		w.n.logf("pod %s: reporting %s: %v", w.name(), phase, err)
	}
}

func (w *podWorker) name() string { return w.pod.Namespace + "/" + w.pod.Name }
