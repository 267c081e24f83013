package spotscheduler

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
)

// Kinds counts the cluster's spot nodes from kube-scheduler's own Node informer (no
// watch of its own), so PreScore knows at once that every node is of one kind: where
// the cluster has no spot node, or nothing else, no list of nodes can mix them, and
// reading 500 nodes' facts a pod (a fortieth of kube-scheduler's CPU at 5,000 nodes,
// again for each pod kube-scheduler batches) is skipped.
type Kinds struct {
	mu     sync.Mutex
	spot   map[string]bool // node name -> spot
	spots  int
	synced func() bool
}

// NewKinds counts nothing yet; Watch feeds it.
func NewKinds() *Kinds { return &Kinds{spot: map[string]bool{}} }

// Watch counts the nodes an informer delivers (kube-scheduler's, shared).
func (k *Kinds) Watch(informer cache.SharedIndexInformer) error {
	registration, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.put(obj) },
		UpdateFunc: func(_, obj any) { k.put(obj) },
		DeleteFunc: func(obj any) {
			if node, ok := facts.Deleted[*v1.Node](obj); ok {
				k.set(node.Name, false, true)
			}
		},
	})
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.synced = registration.HasSynced
	k.mu.Unlock()
	return nil
}

func (k *Kinds) put(obj any) {
	if node, ok := obj.(*v1.Node); ok {
		k.set(node.Name, facts.CapacityType(node.Labels) == "spot", false)
	}
}

func (k *Kinds) set(name string, spot, gone bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.spot[name] {
		k.spots--
	}
	if gone {
		delete(k.spot, name)
		return
	}
	k.spot[name] = spot
	if spot {
		k.spots++
	}
}

// OneKind: every node of the cluster is on-demand, or every one is spot (false until
// the informer has delivered every node, and on a nil Kinds).
func (k *Kinds) OneKind() bool {
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.synced != nil && k.synced() && (k.spots == 0 || k.spots == len(k.spot))
}
