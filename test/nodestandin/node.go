package nodestandin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Config says which node to play.
type Config struct {
	// Name is the Node object's name; pods are bound to it.
	Name string
	// Dir holds the node's volumes, container roots and logs. It must exist.
	Dir string
	// Provisioner is the StorageClass provisioner name whose claims this node provisions.
	Provisioner string
	// Images maps a container image to the host binary that runs as its entrypoint.
	Images map[string]string
	// Client talks to the hub with the rights of a node and a provisioner (an admin will do).
	Client kubernetes.Interface
	// RestartBackoff is the wait before a failed container's first restart, doubling up to
	// eight times it; zero means one second. (kubelet's starts at 10 s and caps at 5 min.)
	RestartBackoff time.Duration
	// Log receives one line per action of the node; nil discards them.
	Log func(format string, args ...any)
}

// Node is a running node stand-in; see the package doc for what it plays.
type Node struct {
	cfg     Config
	pods    corelisters.PodLister
	claims  corelisters.PersistentVolumeClaimLister
	volumes corelisters.PersistentVolumeLister

	kick   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[types.UID]*podWorker // pods this node runs or has run
	paused  bool                     // schedule no pod; see Pause
}

// resyncInterval is how often the node looks at every object even without a change.
const resyncInterval = 2 * time.Second

// Start registers the node, starts watching the hub, and plays the node until Stop.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Name == "" || cfg.Dir == "" || cfg.Provisioner == "" || cfg.Client == nil {
		return nil, errors.New("nodestandin: Name, Dir, Provisioner and Client are required")
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	for _, d := range []string{"volumes", "pods"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := register(ctx, cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n := &Node{cfg: cfg, kick: make(chan struct{}, 1), cancel: cancel, workers: map[types.UID]*podWorker{}}
	factory := informers.NewSharedInformerFactory(cfg.Client, 0)
	n.pods = factory.Core().V1().Pods().Lister()
	n.claims = factory.Core().V1().PersistentVolumeClaims().Lister()
	n.volumes = factory.Core().V1().PersistentVolumes().Lister()
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.poke() },
		UpdateFunc: func(any, any) { n.poke() },
		DeleteFunc: func(any) { n.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		factory.Core().V1().Pods().Informer(),
		factory.Core().V1().PersistentVolumeClaims().Informer(),
		factory.Core().V1().PersistentVolumes().Informer(),
	} {
		if _, err := inf.AddEventHandler(kick); err != nil {
			cancel()
			return nil, err
		}
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			cancel()
			factory.Shutdown()
			return nil, fmt.Errorf("nodestandin: watching %v did not sync", typ)
		}
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer factory.Shutdown()
		n.loop(ctx)
	}()
	return n, nil
}

// register creates the Node object, Ready, as kubelet registers its node.
func register(ctx context.Context, cfg Config) error {
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Labels: map[string]string{
			"kubernetes.io/hostname": cfg.Name, "kubernetes.io/os": "linux",
		}},
	}
	created, err := cfg.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("registering node %s: %w", cfg.Name, err)
	}
	created.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourcePods: resource.MustParse("110")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourcePods: resource.MustParse("110")},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "node stand-in of imagepipe's tests", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: cfg.Name}},
	}
	if _, err := cfg.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reporting node %s ready: %w", cfg.Name, err)
	}
	return nil
}

// Stop kills every container the node runs, detaches their loop devices and stops watching.
// Pod objects are left as they are, as when a real node goes away.
func (n *Node) Stop() {
	n.cancel()
	n.wg.Wait()
}

// poke asks the loop for a pass without waiting for it.
func (n *Node) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// loop makes a pass over the node's objects on every change and every resyncInterval.
func (n *Node) loop(ctx context.Context) {
	tick := time.NewTicker(resyncInterval)
	defer tick.Stop()
	for {
		n.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		case <-tick.C:
		}
	}
}

// pass provisions waiting claims, reclaims released volumes, and schedules, starts and
// finishes pods. A failure is logged and tried again on the next pass.
func (n *Node) pass(ctx context.Context) {
	claims, _ := n.claims.List(everything)
	for _, c := range claims {
		if n.wantsVolume(c) {
			if err := n.provision(ctx, c); err != nil {
				n.logf("provisioning: %v", err)
			}
		}
	}
	volumes, _ := n.volumes.List(everything)
	for _, pv := range volumes {
		if n.released(pv) {
			if err := n.reclaim(ctx, pv); err != nil {
				n.logf("reclaiming %s: %v", pv.Name, err)
			}
		}
	}
	pods, _ := n.pods.List(everything)
	for _, p := range pods {
		if err := n.handlePod(ctx, p); err != nil && ctx.Err() == nil {
			n.logf("pod %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
}

// handlePod schedules an unscheduled pod, starts a worker for a pod of this node, and tells a
// worker that its pod is being deleted.
func (n *Node) handlePod(ctx context.Context, p *corev1.Pod) error {
	switch {
	case p.Spec.NodeName == "" && p.DeletionTimestamp == nil:
		if n.isPaused() {
			return nil
		}
		return n.schedule(ctx, p)
	case p.Spec.NodeName != n.cfg.Name:
		return nil
	}
	n.mu.Lock()
	w, ok := n.workers[p.UID]
	if !ok {
		w = newPodWorker(n, p)
		n.workers[p.UID] = w
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			w.run(ctx)
		}()
	}
	n.mu.Unlock()
	if p.DeletionTimestamp != nil {
		w.delete()
	}
	return nil
}

// schedule binds a pod to this node once every claim it uses is bound, the one decision a
// scheduler makes on a one-node cluster.
func (n *Node) schedule(ctx context.Context, p *corev1.Pod) error {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		c, err := n.claims.PersistentVolumeClaims(p.Namespace).Get(v.PersistentVolumeClaim.ClaimName)
		if err != nil || c.Status.Phase != corev1.ClaimBound {
			return nil // not yet: the pod stays Pending, as with WaitForFirstConsumer's opposite
		}
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: n.cfg.Name},
	}
	err := n.cfg.Client.CoreV1().Pods(p.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("binding to node %s: %w", n.cfg.Name, err)
	}
	return nil
}

// Pause makes the node take no new pod until Resume: pods stay Pending, unscheduled, as on a
// cluster whose nodes are full. Pods already running go on. Tests use it to look at the
// pipeline while an import waits.
func (n *Node) Pause() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paused = true
}

// Resume undoes Pause.
func (n *Node) Resume() {
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
	n.poke()
}

func (n *Node) isPaused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}

func (n *Node) logf(format string, args ...any) {
	if n.cfg.Log != nil {
		n.cfg.Log(format, args...)
	}
}
