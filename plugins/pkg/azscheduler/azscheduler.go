// Package azscheduler is the AZScheduler framework plugin: the extender's group score
// (extender/policies/group.py). Pods that share gpu-scheduler.io/group (a training
// job's workers) are drawn to the tightest topology domain (NVLink clique, GKE
// sub-block and block, AWS network layers, zone) where pods of their group already
// run. Soft: it never filters.
package azscheduler

import (
	"context"
	"fmt"
	"math"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/explain"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/score"
)

// Name is the plugin's name in a scheduler profile.
const Name = "AZScheduler"

const stateKey fwk.StateKey = Name

// Scale turns the group score's fractions into the integers Score returns.
const Scale = 1_000_000

// AZScheduler scores nodes by where the pod's placement group already runs.
type AZScheduler struct {
	facts.Signer
	levels []string
	nodes  func() ([]fwk.NodeInfo, error)
}

var (
	_ fwk.PreScorePlugin = &AZScheduler{}
	_ fwk.ScorePlugin    = &AZScheduler{}
)

// New builds the plugin over the scheduler's snapshot of every node.
func New(_ context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	args, err := config.DecodeAZScheduler(obj)
	if err != nil {
		return nil, err
	}
	return NewWith(args.GroupLevels, func() ([]fwk.NodeInfo, error) {
		return handle.SnapshotSharedLister().NodeInfos().List()
	}), nil
}

// NewWith builds the plugin over given levels and nodes (tests, the conformance suite).
func NewWith(levels []string, nodes func() ([]fwk.NodeInfo, error)) *AZScheduler {
	return &AZScheduler{levels: levels, nodes: nodes}
}

// Name is the plugin's name.
func (p *AZScheduler) Name() string { return Name }

// Group is where a group's placed pods are: per level (tightest first), domain -> pods.
type Group struct {
	levels  []string
	index   map[string]int
	domains []map[string]int
	members int
}

func (g *Group) Clone() fwk.StateData { return g }

// Placed reads where the group (namespace, name) runs, over every node's pods; nil
// when it runs nowhere labelled with one of the levels.
func Placed(levels []string, nodes []fwk.NodeInfo, namespace, name string) *Group {
	g := &Group{levels: levels, index: map[string]int{}, domains: make([]map[string]int, len(levels))}
	for i, level := range levels {
		g.index[level] = i
		g.domains[i] = map[string]int{}
	}
	labelled := false
	for _, info := range nodes {
		node := info.Node()
		if node == nil {
			continue
		}
		count := 0
		for _, pod := range info.GetPods() {
			p := pod.GetPod()
			if p.Namespace == namespace && p.Annotations[contract.AnnGroup] == name {
				count++
			}
		}
		if count == 0 {
			continue
		}
		g.members += count
		for i, level := range levels {
			if value := node.Labels[level]; value != "" {
				g.domains[i][value] += count
				labelled = true
			}
		}
	}
	if !labelled {
		return nil
	}
	return g
}

// Raw is levels - i + count/(members+1): i the tightest level whose domain the node
// shares with the group, count the group's pods there; 0 where it shares none.
func (g *Group) Raw(labels map[string]string) float64 {
	for i, level := range g.levels {
		value := labels[level]
		if value == "" {
			continue
		}
		if count := g.domains[i][value]; count > 0 {
			return float64(len(g.levels)-i) + float64(count)/float64(g.members+1)
		}
	}
	return 0
}

// PreScore finds the pod's group; a pod of no group, or of a group placed nowhere yet,
// skips the score.
func (p *AZScheduler) PreScore(_ context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	name := pod.Annotations[contract.AnnGroup]
	if name == "" {
		return fwk.NewStatus(fwk.Skip)
	}
	nodes, err := p.nodes()
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("%s: listing nodes: %w", Name, err))
	}
	group := Placed(p.levels, nodes, pod.Namespace, name)
	if group == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	cs.Write(stateKey, group)
	return nil
}

// Score is the group score, scaled to an integer.
func (p *AZScheduler) Score(_ context.Context, cs fwk.CycleState, _ *v1.Pod, info fwk.NodeInfo) (int64, *fwk.Status) {
	data, err := cs.Read(stateKey)
	if err != nil {
		return 0, fwk.AsStatus(fmt.Errorf("%s: %w", Name, err))
	}
	group, _ := data.(*Group)
	return int64(math.Round(group.Raw(info.Node().Labels) * Scale)), nil
}

// ScoreExtensions normalises.
func (p *AZScheduler) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore: min-max onto 0..MaxNodeScore.
func (p *AZScheduler) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	score.NormaliseList(scores)
	explain.Keep(cs, "group", scores) // for GPUScheduler's GPUPlacement Event
	return nil
}
