package gpuscheduler

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/dra"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/workload"
)

// draGpus is what a DRA driver publishes of each node's GPUs, read from kube-scheduler's
// own DRA state (its DynamicResources plugin keeps the claims it has allocated in
// flight there): refreshed once per scheduling cycle, read by Filter and PreScore with
// one map lookup per node. A node whose Node advertises nvidia.com/gpu keeps its own
// facts (the device plugin wins, as kube-scheduler decides per node).
type draGpus struct {
	manager fwk.SharedDRAManager
	cel     *cel.Cache
	touch   func(node string) // the cluster's figures read the node again

	mu      sync.Mutex // one refresh at a time
	class   *resourceapi.DeviceClass
	matcher *dra.Class
	slices  map[*resourceapi.ResourceSlice]dra.Slice // the listers keep an unchanged slice's pointer
	problem string

	state atomic.Pointer[draNodes]
}

// draNodes is one refresh's view; a new one (with a new version) only when some
// node's facts or usage changed.
type draNodes struct {
	version uint64
	nodes   map[string]*draNode
}

type draNode struct {
	facts  *dra.Node
	used   int64
	gpus   []sharing.Gpu
	merged atomic.Pointer[[2]*facts.Node] // the Node's facts and the merge of them
}

// celCacheSize is how many compiled selectors are kept (upstream's allocator keeps 10).
const celCacheSize = 10

func newDraGpus(manager fwk.SharedDRAManager, touch func(string)) *draGpus {
	d := &draGpus{manager: manager, touch: touch, slices: map[*resourceapi.ResourceSlice]dra.Slice{},
		cel: cel.NewCache(celCacheSize, cel.Features{EnableConsumableCapacity: true})}
	d.state.Store(&draNodes{})
	return d
}

// WithDRA makes the plugin read DRA GPUs from the given manager (New: the handle's).
func (p *GPUScheduler) WithDRA(manager fwk.SharedDRAManager) *GPUScheduler {
	if manager == nil {
		return p
	}
	p.dra = newDraGpus(manager, func(node string) { p.cluster.Touch(node) })
	p.cluster = workload.NewCluster(p.nodeFacts)
	return p
}

// nodeFacts is a node's facts as the rules read them: from its Node, or from its DRA
// devices (the cluster's figures read them so).
func (p *GPUScheduler) nodeFacts(node *v1.Node) *facts.Node {
	base := facts.Nodes.Of(node)
	if n := p.draNode(base, node.Name); n != nil {
		return n.merge(base)
	}
	return base
}

// draNode is the node's DRA GPUs where they decide its facts (nil elsewhere).
func (p *GPUScheduler) draNode(base *facts.Node, name string) *draNode {
	if p.dra == nil || base.Allocatable != 0 {
		return nil
	}
	return p.dra.state.Load().nodes[name]
}

// draFit puts a DRA node's facts into its Fit: the devices of the class, the ones
// claims hold in use (not the pods' requests, which count the same GPUs again), and
// for shareable devices what claims left of them.
func (p *GPUScheduler) draFit(fit *Fit, name string) {
	if n := p.draNode(fit.Node, name); n != nil {
		fit.Node, fit.Used, fit.Gpus = n.merge(fit.Node), n.used, n.gpus
	}
}

// draVersion moves when some DRA node's facts or usage changed.
func (p *GPUScheduler) draVersion() uint64 {
	if p.dra == nil {
		return 0
	}
	return p.dra.state.Load().version
}

// merge is the Node's facts with the GPU facts the devices give, everything else
// kept (CPU and memory, zone, capacity type): gpu_facts' dataclasses.replace.
func (n *draNode) merge(base *facts.Node) *facts.Node {
	if got := n.merged.Load(); got != nil && got[0] == base {
		return got[1]
	}
	out := *base
	out.Allocatable, out.Labelled, out.Replicas, out.DRA = n.facts.Count, true, 1, true
	out.MemoryMiB, out.Product = n.facts.MemoryMiB, n.facts.Product
	out.Model = strings.TrimSuffix(out.Product, contract.SharedSuffix)
	out.ModelCode = facts.ModelCodeOf(out.Model)
	out.Health, out.Shared = nil, nil
	if len(n.facts.Unhealthy) > 0 {
		out.Health = &facts.Health{Healthy: n.facts.Healthy(), Total: n.facts.Count, Unhealthy: n.facts.Unhealthy}
	}
	if specs := n.facts.Specs(); specs != nil {
		out.Shared = &sharing.Node{Mode: "dra", Gpus: specs}
	}
	n.merged.Store(&[2]*facts.Node{base, &out})
	return &out
}

// refresh reads the DRA state again: the class serving nvidia.com/gpu, the slices
// that changed, and what claims hold now. Nothing to do where no class serves it.
func (d *draGpus) refresh(logger klog.Logger) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.state.Load()
	class, err := fwk.ExtendedResourceClass(d.manager, v1.ResourceName(contract.ResourceGpu))
	if err != nil {
		logger.V(4).Info("DRA: no DeviceClass for the GPU resource", "err", err)
		class = nil
	}
	if class != d.class {
		d.class, d.matcher = class, dra.NewClass(class, d.cel)
		clear(d.slices)
		if len(old.nodes) > 0 { // the last class's devices: none now, whatever follows
			d.publish(old, map[string]*draNode{})
			old = d.state.Load()
		}
	}
	if class == nil {
		if len(old.nodes) > 0 {
			d.publish(old, map[string]*draNode{})
		}
		return
	}
	nodes, changed, err := d.readSlices(old)
	if err != nil {
		logger.Error(err, "DRA: listing ResourceSlices")
		return
	}
	if d.matcher.Problem != "" && d.matcher.Problem != d.problem {
		d.problem = d.matcher.Problem
		logger.Info("DRA: a DeviceClass selector problem; its devices are not counted", "deviceClass", class.Name, "problem", d.problem)
	}
	if len(nodes) == 0 {
		if len(old.nodes) > 0 {
			d.publish(old, nodes)
		}
		return
	}
	allocated, err := d.allocated()
	if err != nil {
		logger.V(4).Info("DRA: claims' allocations not read; the last ones stand", "err", err)
		if !changed {
			return
		}
	}
	for name, n := range nodes {
		n.used, n.gpus = n.facts.Used(allocated), n.facts.Shares(allocated)
		if prev := old.nodes[name]; prev != nil && prev.facts == n.facts {
			if err != nil {
				n.used, n.gpus = prev.used, prev.gpus
			}
			if n.used == prev.used && slices.Equal(n.gpus, prev.gpus) {
				nodes[name] = prev
				continue
			}
		}
		changed = true
	}
	if changed || len(nodes) != len(old.nodes) {
		d.publish(old, nodes)
	}
}

// readSlices is each node's DRA GPUs, read again only when some slice changed
// (changed); an unchanged node keeps its facts object.
func (d *draGpus) readSlices(old *draNodes) (map[string]*draNode, bool, error) {
	list, err := d.manager.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, false, err
	}
	changed := len(list) != len(d.slices)
	kept := make(map[*resourceapi.ResourceSlice]dra.Slice, len(list))
	for _, slice := range list {
		read, ok := d.slices[slice]
		if !ok {
			read, changed = dra.ReadSlice(slice, d.matcher.Matches), true
		}
		kept[slice] = read
	}
	d.slices = kept
	if !changed {
		nodes := make(map[string]*draNode, len(old.nodes))
		for name, n := range old.nodes {
			nodes[name] = &draNode{facts: n.facts}
		}
		return nodes, false, nil
	}
	read := make([]dra.Slice, 0, len(kept))
	for _, slice := range kept {
		if len(slice.Nodes) > 0 {
			read = append(read, slice)
		}
	}
	nodes := map[string]*draNode{}
	for name, gpus := range dra.NodeGpus(read) {
		facts := dra.NodeOf(gpus)
		if prev := old.nodes[name]; prev != nil && sameNode(prev.facts, facts) {
			facts = prev.facts
		}
		nodes[name] = &draNode{facts: facts}
	}
	return nodes, true, nil
}

// allocated is what claims hold: kube-scheduler's claim tracker, with the
// allocations it has in flight.
func (d *draGpus) allocated() (dra.Allocated, error) {
	state, err := d.manager.ResourceClaims().GatherAllocatedState()
	if err != nil {
		return dra.Allocated{}, err
	}
	out := dra.Allocated{Held: make(map[dra.DeviceID]bool, len(state.AllocatedDevices)+len(state.AllocatedSharedDeviceIDs)),
		Consumed: map[dra.DeviceID]int64{}}
	for id := range state.AllocatedDevices {
		out.Held[dra.DeviceID{Driver: id.Driver.String(), Pool: id.Pool.String(), Device: id.Device.String()}] = true
	}
	for id := range state.AllocatedSharedDeviceIDs {
		out.Held[dra.DeviceID{Driver: id.Driver.String(), Pool: id.Pool.String(), Device: id.Device.String()}] = true
	}
	for id, consumed := range state.AggregatedCapacity {
		memory := map[resourceapi.QualifiedName]resource.Quantity{}
		for name, q := range consumed {
			if q != nil {
				memory[name] = *q
			}
		}
		if mib := dra.MemoryMiB(memory); mib > 0 {
			out.Consumed[dra.DeviceID{Driver: id.Driver.String(), Pool: id.Pool.String(), Device: id.Device.String()}] = mib
		}
	}
	return out, nil
}

// publish stores a new view, and has the cluster's figures read the nodes whose
// facts changed.
func (d *draGpus) publish(old *draNodes, nodes map[string]*draNode) {
	d.state.Store(&draNodes{version: old.version + 1, nodes: nodes})
	for name, n := range nodes {
		if prev := old.nodes[name]; prev == nil || prev.facts != n.facts {
			d.touch(name)
		}
	}
	for name := range old.nodes {
		if nodes[name] == nil {
			d.touch(name)
		}
	}
}

// claimUnits is, for a pod that asks no gpu-memory shares of its own and has
// ResourceClaims, what they ask of a shareable device (View.pod_shares): the scores
// take it as those shares, beside any whole GPUs it asks, its Filter having checked
// the whole GPUs only (kube-scheduler allocates the claims).
func (p *GPUScheduler) claimUnits(pod *v1.Pod, read *facts.Pod) []int64 {
	if p.dra == nil || len(read.Shares) > 0 || len(pod.Spec.ResourceClaims) == 0 {
		return nil
	}
	var units []int64
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			continue
		}
		claim, err := p.dra.manager.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil {
			continue
		}
		units = append(units, dra.ClaimUnits(claim)...)
	}
	return units
}

func sameNode(a, b *dra.Node) bool {
	if a == nil || b == nil || len(a.Gpus) != len(b.Gpus) || a.Product != b.Product || a.MemoryMiB != b.MemoryMiB {
		return false
	}
	for i := range a.Gpus {
		x, y := a.Gpus[i], b.Gpus[i]
		if x.ID != y.ID || x.Product != y.Product || x.MemoryMiB != y.MemoryMiB || x.Shareable != y.Shareable ||
			!slices.Equal(x.Taints, y.Taints) {
			return false
		}
	}
	return true
}

// claimState is the cycle's state with the pod's claims as its shares (claimUnits);
// the state itself where they ask nothing.
func (p *GPUScheduler) claimState(s *state, pod *v1.Pod) *state {
	units := p.claimUnits(pod, s.pod)
	if len(units) == 0 {
		return s
	}
	read := *s.pod
	read.Shares = units
	out := *s
	out.pod, out.claimed = &read, true
	return &out
}

// claimFreed queues the pod when a claim that held devices holds none now (its
// allocation removed, or the claim deleted).
func claimFreed(_ klog.Logger, _ *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	before, ok := oldObj.(*resourceapi.ResourceClaim)
	if !ok || before == nil || before.Status.Allocation == nil {
		return fwk.QueueSkip, nil
	}
	if after, ok := newObj.(*resourceapi.ResourceClaim); ok && after != nil && after.Status.Allocation != nil {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
}
