// Package gpuscheduler is the GPUScheduler framework plugin: the extender's gpu and
// heartbeat rules inside kube-scheduler, counted from NodeInfo alone (the node, its
// labels and the agent's annotation, and the pods kube-scheduler puts there: bound,
// assumed, nominated, or a preemption what-if's), so kube-scheduler's own assume
// step, nominations and DefaultPreemption work unchanged.
package gpuscheduler

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/workload"
)

// Name is the plugin's name in a scheduler profile.
const Name = "GPUScheduler"

const stateKey fwk.StateKey = Name

// GPUScheduler filters and scores nodes for GPU pods.
type GPUScheduler struct {
	facts.Signer
	args       config.GPUSchedulerArgs
	nodes      *facts.Cache
	heartbeats *Heartbeats
	now        func() time.Time
	placements *Placements // GPUPlacement Events (placement.go); nil: none
	// snapshot lists every node of the cycle's snapshot (the cluster's figures).
	snapshot *workload.Nodes
	cluster  *workload.Cluster
	frag     *workload.Fragmentation // the last mix's measure
	usages   *Usages
	fits     *fitCache
	ring     *ring // Score's tickets (ring.go)
	scratch  scratch
	dra      *draGpus // GPUs from a DRA driver (dra.go); nil: not read
}

var (
	_ fwk.PreFilterPlugin   = &GPUScheduler{}
	_ fwk.FilterPlugin      = &GPUScheduler{}
	_ fwk.PreScorePlugin    = &GPUScheduler{}
	_ fwk.ScorePlugin       = &GPUScheduler{}
	_ fwk.EnqueueExtensions = &GPUScheduler{}
)

// New builds the plugin; its Lease informer starts with it (stopped with ctx).
func New(ctx context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	args, err := config.DecodeGPUScheduler(obj)
	if err != nil {
		return nil, err
	}
	p := NewWith(args, NewHeartbeats(), time.Now)
	if handle != nil {
		p.snapshot = &workload.Nodes{
			List: func() ([]fwk.NodeInfo, error) { return handle.SnapshotSharedLister().NodeInfos().List() },
			Get:  func(name string) (fwk.NodeInfo, error) { return handle.SnapshotSharedLister().NodeInfos().Get(name) },
		}
		p.WithDRA(handle.SharedDRAManager())
		if factory := handle.SharedInformerFactory(); factory != nil {
			if err := facts.Nodes.ForgetDeleted(factory.Core().V1().Nodes().Informer()); err != nil {
				return nil, err
			}
		}
	}
	if args.HeartbeatWindow.Duration > 0 && handle != nil && handle.ClientSet() != nil {
		p.heartbeats.WatchLeases(handle.ClientSet(), args.Namespace, ctx.Done())
	}
	p.placements = NewPlacements(ctx, handle)
	return p, nil
}

// NewWith builds the plugin over given heartbeats and clock (tests, the conformance suite).
func NewWith(args config.GPUSchedulerArgs, heartbeats *Heartbeats, now func() time.Time) *GPUScheduler {
	if args.Weights == nil {
		args.Weights = config.DefaultWeights
	}
	return &GPUScheduler{args: args, nodes: facts.Nodes, heartbeats: heartbeats, now: now,
		cluster: workload.NewCluster(facts.Nodes.Of), usages: NewUsages(), fits: newFitCache(), ring: newRing()}
}

// OverNodes makes the plugin read the cluster's figures from the given list of every
// node (tests, the conformance suite; New reads kube-scheduler's snapshot).
func (p *GPUScheduler) OverNodes(all func() ([]fwk.NodeInfo, error)) *GPUScheduler {
	p.snapshot = &workload.Nodes{List: all, Get: func(name string) (fwk.NodeInfo, error) {
		nodes, err := all()
		for _, info := range nodes {
			if node := info.Node(); node != nil && node.Name == name {
				return info, nil
			}
		}
		return nil, err
	}}
	return p
}

// Name is the plugin's name.
func (p *GPUScheduler) Name() string { return Name }

// state is what PreFilter reads of the pod, once per cycle.
type state struct {
	pod    *facts.Pod
	spread bool // the pod's placement, or the configured default
	// oldest: renewals before it are silent; zero: heartbeats do not filter now.
	oldest time.Time
	now    time.Time
	// claimed: the pod's shares are what its ResourceClaims ask (claimState).
	claimed bool
}

func (s *state) Clone() fwk.StateData { return s }

// PreFilter reads the pod; a pod without GPUs skips the rules.
func (p *GPUScheduler) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	s := p.read(pod)
	if s.pod.Error != "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			"pod cannot be placed as asked: "+s.pod.Error)
	}
	cs.Write(stateKey, s)
	if !s.pod.WantsGpus() {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	p.dra.refresh(klog.FromContext(ctx))
	if window := p.args.HeartbeatWindow.Duration; window > 0 {
		oldest := s.now.Add(-window)
		if why := p.heartbeats.Guard(oldest); why == "" {
			s.oldest = oldest
		} else {
			klog.FromContext(ctx).V(2).Info("heartbeat guard: not filtering on heartbeats", "why", why)
		}
	}
	return nil, nil
}

// PreFilterExtensions: the rule reads NodeInfo's pods, which the framework already
// adds and removes for nominated pods and preemption's what-ifs.
func (p *GPUScheduler) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter applies the gpu rule, then the heartbeat rule; as in the extender, the first
// refusal stands unless a later one is unresolvable.
func (p *GPUScheduler) Filter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, info fwk.NodeInfo) *fwk.Status {
	s, err := read(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	node := info.Node()
	if node == nil {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node not found")
	}
	fit := p.fit(info)
	if code := RefuseAny(s.pod, fit); code != 0 && Unresolvable(code) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, Words(s.pod, fit, code))
	} else if !s.oldest.IsZero() && silent(fit.Renewed, fit.Managed, s.oldest) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			SilentWords(fit.Renewed, s.now, p.args.HeartbeatWindow.Duration))
	} else if code != 0 {
		return fwk.NewStatus(fwk.Unschedulable, Words(s.pod, fit, code))
	}
	return nil
}

// fit reads a node as the rule needs it.
func (p *GPUScheduler) fit(info fwk.NodeInfo) Fit {
	node := info.Node()
	renewed, managed := p.heartbeats.Of(node.Name)
	used := info.GetRequested().GetScalarResources()[v1.ResourceName(contract.ResourceGpu)]
	fit := Fit{Node: p.nodes.Of(node), Managed: managed, Renewed: renewed, Used: used}
	if fit.Node.Shared != nil {
		fit.Gpus = p.usages.Of(fit.Node.Shared, info)
	}
	p.draFit(&fit, node.Name)
	return fit
}

// read is the cycle's state of a pod.
func (p *GPUScheduler) read(pod *v1.Pod) *state {
	read := facts.PodOf(pod)
	return &state{pod: read, spread: read.Spread(p.args.DefaultPlacement), now: p.now()}
}

func read(cs fwk.CycleState) (*state, error) {
	data, err := cs.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("%s: reading the cycle's state: %w", Name, err)
	}
	s, ok := data.(*state)
	if !ok {
		return nil, fmt.Errorf("%s: the cycle's state is %T", Name, data)
	}
	return s, nil
}
