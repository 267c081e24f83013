package gpuscheduler

import (
	"context"
	"sync"
	"unsafe"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/workload"
)

// fitCache keeps, per node of kube-scheduler's snapshot, what the scores read of it:
// its Fit, the CPU and memory of its GPU pods, and the view the scores take of both,
// until its NodeInfo changes or an agent's Lease comes or goes. Score runs on 16
// goroutines at once, so the entries are split over shards, each under its own lock.
// (Filter reads the node's facts itself: going through this cache cost it more, in
// the locks and the checks, than Score saved in finding the entries warm.)
// Entries are kept by Node object, a pointer (hashing the NodeInfo interface cost
// twice as much): NodeInfo generations come from one counter for the process and a
// clone keeps its original's, so an entry whose generation matches was read from the
// same pods and the same Node; but kube-scheduler 1.36+ assumes a pod group's members
// into the cycle's snapshot and puts the generation back (Snapshot.AssumePod,
// ForgetPod), so the number of pods, and the GPUs and GPU memory they request, are
// compared too.
type fitCache struct {
	shards [fitShards]fitShard
}

const fitShards = 16

type fitShard struct {
	mu      sync.Mutex
	entries map[*v1.Node]*cachedFit
	_       [40]byte // a shard to a cache line: the locks of two shards are not one line
}

// cachedFit is one node as read at one generation: never written once made.
type cachedFit struct {
	view       view // first: what NormalizeScore reads, in the entry's first lines
	generation int64
	pods       int
	asked      [2]int64 // the GPUs and GPU memory its pods request (see fitCache)
	presence   uint64
	dra        uint64 // the DRA view's version (dra.go)
	fit        Fit
	used       [2]int64
}

// view is what the scores read of a node's Fit and its GPU pods' CPU and memory,
// worked out once per entry: the score of a pod asking whole GPUs, or none, reads no
// more than this (one asking shares reads the Fit's GPUs too).
type view struct {
	name string // the node's
	free int64  // Fit.Free
	// gpuNode: the node has GPUs, or says it does (a CPU pod prefers the others).
	gpuNode bool
	// state: the fragmentation measure's reading of the node (free GPUs, the CPU
	// and memory its GPU pods leave, its model).
	state workload.State
	// memory: its GPU memory where it shares its GPUs (the shares' median), else -1.
	memory int64
}

// viewOf is a node's view, from its Fit and the CPU and memory its GPU pods request.
func viewOf(fit *Fit, used [2]int64) view {
	n := fit.Node
	v := view{name: n.Name, free: fit.Free(), gpuNode: n.Allocatable > 0 || n.Labelled, memory: -1,
		state: workload.State{Free: fit.Free(), CPUMilli: workload.Unlimited, RAMMiB: workload.Unlimited,
			Model: n.Model, ModelCode: n.ModelCode}}
	if n.CPUMilli >= 0 {
		v.state.CPUMilli = n.CPUMilli - used[0]
	}
	if n.RAMMiB >= 0 {
		v.state.RAMMiB = n.RAMMiB - used[1]
	}
	if n.Shared != nil {
		v.memory = max(n.MemoryMiB, 0)
	}
	return v
}

func newFitCache() *fitCache {
	c := &fitCache{}
	for i := range c.shards {
		c.shards[i].entries = map[*v1.Node]*cachedFit{}
	}
	return c
}

// entry is the node's entry, read again where its NodeInfo changed (nil: no Node).
func (c *fitCache) entry(p *GPUScheduler, info fwk.NodeInfo) *cachedFit {
	node := info.Node()
	if node == nil {
		return nil
	}
	presence, draVersion := p.heartbeats.Presence(), p.draVersion()
	generation, pods := info.GetGeneration(), len(info.GetPods())
	requested := info.GetRequested().GetScalarResources()
	asked := [2]int64{requested[contract.ResourceGpu], requested[contract.ResourceGpuMemory]}
	shard := &c.shards[(uintptr(unsafe.Pointer(node))>>7)%fitShards]
	shard.mu.Lock()
	defer shard.mu.Unlock()
	e := shard.entries[node]
	if e == nil || e.generation != generation || e.pods != pods || e.asked != asked || e.presence != presence || e.dra != draVersion {
		// Node objects gone from the snapshot (nodes changed or deleted) are dropped
		// all at once, past twice a shard's part of the nodes the cluster holds
		if len(shard.entries) > (2*p.cluster.Size()+1024)/fitShards {
			clear(shard.entries)
		}
		e = &cachedFit{generation: generation, pods: pods, asked: asked, presence: presence, dra: draVersion,
			fit: p.fit(info), used: p.cluster.Used(info)}
		e.view = viewOf(&e.fit, e.used)
		shard.entries[node] = e
	}
	return e
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
