package gpuscheduler

import (
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
)

// Heartbeats are the agents' Lease renewals by node (extender/policies/heartbeat.py).
// A node with no Lease is not agent-managed and is trusted as it is; a Lease not
// renewed yet holds nothing against its node.
// Filter reads a node's heartbeat on every node it filters (600 a pod at 5,000 nodes)
// without a lock: the map of nodes is replaced when a Lease comes or goes, never
// written, and a renewal stores into its node's cell.
type Heartbeats struct {
	mu     sync.Mutex // writers, and the guard
	beats  atomic.Pointer[map[string]*beat]
	synced func() bool
	// The guard's last answer and when it was worked out: at most once a second, not
	// once a pod (it reads every Lease: 5,000 at 5,000 nodes).
	guardAt  time.Time
	guardWhy string
	// presence counts Leases that came or went (not renewals): what a node's Fit
	// remembers of its agent holds until it moves.
	presence atomic.Uint64
}

// NewHeartbeats is an empty set (tests fill it with Set).
func NewHeartbeats() *Heartbeats {
	h := &Heartbeats{synced: func() bool { return true }}
	h.beats.Store(&map[string]*beat{})
	return h
}

// beat is a node's last renewal, in Unix nanoseconds (notRenewed: none yet).
type beat struct{ nanos atomic.Int64 }

const notRenewed = math.MinInt64

func (b *beat) store(renewed time.Time) {
	switch {
	case renewed.IsZero():
		b.nanos.Store(notRenewed)
	case renewed.After(lastNano):
		b.nanos.Store(lastNano.UnixNano()) // a renewTime past 2262: far in the future still
	case renewed.Before(firstNano):
		b.nanos.Store(firstNano.UnixNano())
	default:
		b.nanos.Store(renewed.UnixNano())
	}
}

// The times UnixNano holds (1678 to 2262); a Lease's renewTime is anyone's to write.
var (
	firstNano = time.Unix(0, math.MinInt64+1)
	lastNano  = time.Unix(0, math.MaxInt64)
)

func (b *beat) load() time.Time {
	if n := b.nanos.Load(); n != notRenewed {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// WatchLeases keeps the set from a Lease informer of its own: one namespace, one label
// selector. A Lease named in EventsToRegister would make kube-scheduler watch every
// node's kube-node-lease renewals, cluster-wide.
func (h *Heartbeats) WatchLeases(client kubernetes.Interface, namespace string, stop <-chan struct{}) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = contract.LeaseSelector }))
	informer := factory.Coordination().V1().Leases().Informer()
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { h.put(obj) },
		UpdateFunc: func(_, obj any) { h.put(obj) },
		DeleteFunc: func(obj any) {
			if lease, ok := facts.Deleted[*coordinationv1.Lease](obj); ok {
				h.forget(lease.Name)
			}
		},
	})
	h.synced = informer.HasSynced
	factory.Start(stop)
}

func (h *Heartbeats) put(obj any) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok || lease.Labels[contract.LeaseLabel] != contract.LeaseLabelValue {
		return
	}
	var renewed time.Time
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	}
	h.Set(lease.Name, renewed)
}

// Set records a node's last renewal (zero: a Lease not renewed yet).
func (h *Heartbeats) Set(node string, renewed time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cell, ok := (*h.beats.Load())[node]; ok {
		cell.store(renewed) // the guard sees it within its second: renewals come 500 a second at 5,000 nodes
		return
	}
	h.guardAt = time.Time{} // an agent more: worked out again on the next pod
	cell := &beat{}
	cell.store(renewed)
	next := maps.Clone(*h.beats.Load())
	next[node] = cell
	h.beats.Store(&next)
	h.presence.Add(1)
}

// forget drops a node's Lease.
func (h *Heartbeats) forget(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.guardAt = time.Time{}
	next := maps.Clone(*h.beats.Load())
	delete(next, node)
	h.beats.Store(&next)
	h.presence.Add(1)
}

// Presence moves when a Lease comes or goes (not when one is renewed).
func (h *Heartbeats) Presence() uint64 { return h.presence.Load() }

// Of is the node's last renewal and whether it has a Lease (is agent-managed).
func (h *Heartbeats) Of(node string) (time.Time, bool) {
	if cell, ok := (*h.beats.Load())[node]; ok {
		return cell.load(), true
	}
	return time.Time{}, false
}

// Guard says why heartbeats must not filter now ("" when they may): the Leases are
// not listed yet, or more than half the agents look silent at once (and at least
// contract.HeartbeatGuardMinSilent): agents do not fail together, a partition does.
// Worked out at most once a second.
func (h *Heartbeats) Guard(oldest time.Time) string {
	if !h.synced() {
		return "stale-view"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.guardAt.IsZero() && oldest.Sub(h.guardAt).Abs() < time.Second {
		return h.guardWhy
	}
	silent, agents := 0, 0 // a Lease not renewed yet counts as neither
	for _, cell := range *h.beats.Load() {
		if renewed := cell.load(); !renewed.IsZero() {
			agents++
			if renewed.Before(oldest) {
				silent++
			}
		}
	}
	h.guardAt, h.guardWhy = oldest, ""
	if silent >= contract.HeartbeatGuardMinSilent && float64(silent) > 0.5*float64(agents) {
		h.guardWhy = "many-silent"
	}
	return h.guardWhy
}

// Silent: the node's agent holds a Lease last renewed before oldest.
func (h *Heartbeats) Silent(node string, oldest time.Time) bool {
	renewed, ok := h.Of(node)
	return silent(renewed, ok, oldest)
}

// silent: a heartbeat known (ok) and renewed before oldest.
func silent(renewed time.Time, ok bool, oldest time.Time) bool {
	return ok && !renewed.IsZero() && renewed.Before(oldest)
}

// SilentWords: the refusal in the extender's words.
func SilentWords(renewed, now time.Time, window time.Duration) string {
	age := int64(now.Sub(renewed).Seconds())
	return fmt.Sprintf("gpu-scheduler agent on this node is silent: its heartbeat Lease %s was "+
		"last renewed %ds ago (window %ds)", contract.LeaseSelector, age, int64(window.Seconds()))
}
