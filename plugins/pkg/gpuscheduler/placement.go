package gpuscheduler

import (
	"context"
	"os"
	"sync"

	v1 "k8s.io/api/core/v1"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/azscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/explain"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/spotscheduler"
)

var _ fwk.PostBindPlugin = &GPUScheduler{}

// Placements writes the GPUPlacement Event of the GPU pods this profile binds.
type Placements struct {
	Writer  *explain.Writer
	Weights func() map[string]int64    // SpotScheduler's and AZScheduler's in the profile, as spot and group
	Node    func(name string) *v1.Node // nil where unknown
}

// NewPlacements starts the Event writer (stopped with ctx) over the handle's client,
// the profile's weights and the node informer; nil without a client (tests).
func NewPlacements(ctx context.Context, handle fwk.Handle) *Placements {
	if handle == nil || handle.ClientSet() == nil || handle.SharedInformerFactory() == nil {
		return nil
	}
	host, _ := os.Hostname()
	writer := explain.ClientWriter(handle.ClientSet(), host)
	go writer.Run(ctx)
	nodes := handle.SharedInformerFactory().Core().V1().Nodes().Lister()
	return &Placements{
		Writer:  writer,
		Weights: sync.OnceValue(func() map[string]int64 { return Weights(handle) }),
		Node: func(name string) *v1.Node {
			node, err := nodes.Get(name)
			if err != nil {
				return nil
			}
			return node
		},
	}
}

// Weights are the profile's weights of SpotScheduler and AZScheduler, by the
// extender's policy names, spot and group (the framework's ListPlugins); the
// extender's defaults where the handle does not say.
func Weights(handle any) map[string]int64 {
	out := map[string]int64{"spot": contract.WeightSpot, "group": contract.WeightGroup}
	lister, ok := handle.(interface{ ListPlugins() *schedconfig.Plugins })
	if !ok {
		return out
	}
	plugins := lister.ListPlugins()
	if plugins == nil {
		return out
	}
	for _, p := range plugins.Score.Enabled {
		switch p.Name {
		case spotscheduler.Name:
			out["spot"] = int64(p.Weight)
		case azscheduler.Name:
			out["group"] = int64(p.Weight)
		}
	}
	return out
}

// PostBind queues the pod's GPUPlacement Event: a GPU pod, where the rate leaves room.
func (p *GPUScheduler) PostBind(_ context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) {
	if p.placements == nil {
		return
	}
	s, err := read(cs)
	if err != nil || !s.pod.WantsGpus() || pod.UID == "" || !p.placements.Writer.Admit() {
		return
	}
	d := p.Decision(cs, pod, s.pod.Gpus, nodeName)
	p.placements.Writer.Queue(d, nodeName)
}

// Decision is what the cycle decided for pod, from the scores the plugins kept.
func (p *GPUScheduler) Decision(cs fwk.CycleState, pod *v1.Pod, gpus int64, chosen string) *explain.Decision {
	hooks := explain.Hooks{Health: func(name string) *[2]int64 {
		node := p.placements.Node(name)
		if node == nil {
			return nil
		}
		_, managed := p.heartbeats.Of(name)
		facts := p.nodes.Of(node)
		if len(facts.Unhealthy(managed)) == 0 {
			return nil
		}
		return &[2]int64{facts.Usable(managed), facts.Allocatable}
	}}
	if group := azscheduler.Placement(cs); group != nil {
		hooks.Note = func(name string) string {
			if node := p.placements.Node(name); node != nil {
				return group.Describe(node.Labels)
			}
			return ""
		}
	}
	who := explain.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Gpus: gpus}
	names, parts, weights := p.scored(cs)
	return explain.Decide(who, chosen, names, parts, weights, explain.Top, hooks)
}

// scored is the cycle's candidates, every policy's 0..10 parts of their scores and
// the policies' weights: GPUScheduler's own parts and weights, and the lists
// SpotScheduler and AZScheduler kept. No candidates: kube-scheduler did not score.
func (p *GPUScheduler) scored(cs fwk.CycleState) ([]string, map[string][]float64, map[string]int64) {
	own := ScoresOf(cs)
	if own == nil {
		return nil, nil, nil
	}
	parts := make(map[string][]float64, len(own.Parts)+2)
	weights := make(map[string]int64, len(p.args.Weights)+2)
	for policy, part := range own.Parts {
		parts[policy], weights[policy] = part, p.args.Weights[policy]
	}
	profile := p.placements.Weights()
	for policy, list := range explain.Kept(cs) {
		parts[policy], weights[policy] = explain.Parts(own.Nodes, list), profile[policy]
	}
	return own.Nodes, parts, weights
}
