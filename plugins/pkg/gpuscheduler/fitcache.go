package gpuscheduler

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// fitCache keeps, per node of kube-scheduler's snapshot, what PreScore reads of it:
// its Fit and the CPU and memory of its GPU pods, until its NodeInfo changes or an
// agent's Lease comes or goes. kube-scheduler's batching calls PreScore again over the
// same 500 nodes for each alike pod, with one node changed; reading them all again
// cost a tenth of its CPU at 5,000 nodes. Entries are kept by Node object, a pointer
// (hashing the NodeInfo interface cost twice as much): NodeInfo generations come from
// one counter for the process and a clone keeps its original's, so an entry whose
// generation matches was read from the same pods and the same Node; but kube-scheduler
// 1.36+ assumes a pod group's members into the cycle's snapshot and puts the
// generation back (Snapshot.AssumePod, ForgetPod), so the number of pods is compared
// too.
type fitCache struct {
	mu      sync.Mutex
	entries map[*v1.Node]*cachedFit
}

type cachedFit struct {
	generation int64
	pods       int
	presence   uint64
	dra        uint64 // the DRA view's version (dra.go)
	fit        Fit
	used       [2]int64
}

func newFitCache() *fitCache { return &fitCache{entries: map[*v1.Node]*cachedFit{}} }

// read hands each node with a Node (name, info, its Fit, its GPU pods' CPU and
// memory) to each, in the given order.
// The Fit handed over is the cache's: read, never written.
func (c *fitCache) read(p *GPUScheduler, nodes []fwk.NodeInfo, each func(string, fwk.NodeInfo, *Fit, [2]int64)) {
	presence, draVersion := p.heartbeats.Presence(), p.draVersion()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Node objects gone from the snapshot (nodes changed or deleted) are dropped all
	// at once, past twice the nodes the cluster holds
	if len(c.entries) > 2*max(p.cluster.Size(), len(nodes))+1024 {
		clear(c.entries)
	}
	for _, info := range nodes {
		node := info.Node()
		if node == nil {
			continue
		}
		generation, pods := info.GetGeneration(), len(info.GetPods())
		e := c.entries[node]
		if e == nil || e.generation != generation || e.pods != pods || e.presence != presence || e.dra != draVersion {
			e = &cachedFit{generation: generation, pods: pods, presence: presence, dra: draVersion,
				fit: p.fit(info), used: p.cluster.Used(info)}
			c.entries[node] = e
		}
		each(node.Name, info, &e.fit, e.used)
	}
}

var (
	_ fwk.ReservePlugin = &GPUScheduler{}
)

// Reserve: the node the pod is placed on is read again at the next PreScore (the
// cluster's figures count the pod from then, as the extender's assume step does).
func (p *GPUScheduler) Reserve(_ context.Context, _ fwk.CycleState, _ *v1.Pod, node string) *fwk.Status {
	p.cluster.Touch(node)
	return nil
}

// Unreserve: the node the pod was taken back from is read again too.
func (p *GPUScheduler) Unreserve(_ context.Context, _ fwk.CycleState, _ *v1.Pod, node string) {
	p.cluster.Touch(node)
}
