package gpuscheduler

import (
	"context"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// infoFacts finds a node's facts by its NodeInfo without a lock (Filter runs on 16
// goroutines at once, and the facts cache's read lock was the plugins' costliest
// line there): valid while the NodeInfo holds the same Node object. A preemption
// what-if's clones come and go; past maxInfoFacts entries the map starts over.
type infoFacts struct {
	m      sync.Map // fwk.NodeInfo -> *nodeFacts
	stored atomic.Int64
}

type nodeFacts struct {
	node  *v1.Node
	facts *facts.Node
}

const maxInfoFacts = 1 << 16

// factsOf is the node's facts, read through the facts cache on a miss.
func (p *GPUScheduler) factsOf(info fwk.NodeInfo, node *v1.Node) *facts.Node {
	if got, ok := p.byInfo.m.Load(info); ok {
		if e := got.(*nodeFacts); e.node == node {
			return e.facts
		}
	}
	read := p.nodes.Of(node)
	if p.byInfo.stored.Add(1) > maxInfoFacts {
		p.byInfo.m.Clear()
		p.byInfo.stored.Store(0)
	}
	p.byInfo.m.Store(info, &nodeFacts{node, read})
	return read
}

// fitCache keeps, per node of kube-scheduler's snapshot, what PreScore reads of it:
// its Fit and the CPU and memory of its GPU pods, until its NodeInfo changes or an
// agent's Lease comes or goes. kube-scheduler's batching calls PreScore again over the
// same 500 nodes for each alike pod, with one node changed; reading them all again
// cost a tenth of its CPU at 5,000 nodes.
type fitCache struct {
	mu      sync.Mutex
	entries map[fwk.NodeInfo]*cachedFit
}

type cachedFit struct {
	generation int64
	presence   uint64
	fit        Fit
	used       [2]int64
}

func newFitCache() *fitCache { return &fitCache{entries: map[fwk.NodeInfo]*cachedFit{}} }

// read hands each node with a Node (name, info, its Fit, its GPU pods' CPU and
// memory) to each, in the given order.
func (c *fitCache) read(p *GPUScheduler, nodes []fwk.NodeInfo, each func(string, fwk.NodeInfo, Fit, [2]int64)) {
	presence := p.heartbeats.Presence()
	c.mu.Lock()
	defer c.mu.Unlock()
	// NodeInfos gone from the snapshot (nodes deleted) are dropped all at once, past
	// twice the nodes the cluster holds
	if len(c.entries) > 2*max(p.cluster.Size(), len(nodes))+1024 {
		clear(c.entries)
	}
	for _, info := range nodes {
		node := info.Node()
		if node == nil {
			continue
		}
		generation := info.GetGeneration()
		e := c.entries[info]
		if e == nil || e.generation != generation || e.presence != presence {
			e = &cachedFit{generation: generation, presence: presence, fit: p.fit(info), used: p.cluster.Used(info)}
			c.entries[info] = e
		}
		each(node.Name, info, e.fit, e.used)
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
