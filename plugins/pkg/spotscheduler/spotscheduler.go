// Package spotscheduler is the SpotScheduler framework plugin: the extender's spot rule
// (extender/policies/spot.py). A pod says prefer, avoid, require or forbid in
// gpu-scheduler.io/spot; a GPU pod that says nothing avoids spot capacity. A node is
// spot when any cloud's spot label carries its spot value (EKS, Karpenter, GKE, AKS).
package spotscheduler

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/explain"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/score"
)

// Name is the plugin's name in a scheduler profile.
const Name = "SpotScheduler"

const stateKey fwk.StateKey = Name

// SpotScheduler filters on require/forbid and scores on prefer/avoid.
type SpotScheduler struct {
	facts.Signer
	// kinds: the cluster's spot nodes counted (nil: each list of nodes is read)
	kinds *Kinds
}

var (
	_ fwk.PreFilterPlugin = &SpotScheduler{}
	_ fwk.FilterPlugin    = &SpotScheduler{}
	_ fwk.PreScorePlugin  = &SpotScheduler{}
	_ fwk.ScorePlugin     = &SpotScheduler{}
)

// New builds the plugin (it has no args); it counts spot nodes from kube-scheduler's
// Node informer.
func New(_ context.Context, _ runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	p := &SpotScheduler{}
	if handle != nil && handle.SharedInformerFactory() != nil {
		p.kinds = NewKinds()
		if err := p.kinds.Watch(handle.SharedInformerFactory().Core().V1().Nodes().Informer()); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// NewWith builds the plugin over a count of the cluster's spot nodes (tests).
func NewWith(kinds *Kinds) *SpotScheduler { return &SpotScheduler{kinds: kinds} }

// Name is the plugin's name.
func (p *SpotScheduler) Name() string { return Name }

type preference string

func (s preference) Clone() fwk.StateData { return s }

// Preference is the pod's spot preference as the extender reads it ("" where its
// annotation is unreadable: GPUScheduler refuses that pod with the reason).
func Preference(pod *v1.Pod) string {
	return facts.PodOf(pod).Spot
}

// Refuse is the spot rule: 0, or the code for the node under require/forbid.
func Refuse(rule string, node *facts.Node) int {
	spot := node.CapacityType == "spot"
	switch {
	case rule == "require" && !spot:
		return contract.SpotNotSpot
	case rule == "forbid" && spot:
		return contract.SpotIsSpot
	}
	return 0
}

// Words puts a refusal into the extender's words.
func Words(code int) string {
	pairs := make([]string, 0, len(contract.SpotLabels))
	for _, pair := range contract.SpotLabels {
		pairs = append(pairs, pair[0]+"="+pair[1])
	}
	if code == contract.SpotNotSpot {
		return fmt.Sprintf("node is not spot capacity (none of %s) and the pod has %s=require",
			strings.Join(pairs, ", "), contract.AnnSpot)
	}
	return fmt.Sprintf("node is spot capacity and the pod has %s=forbid", contract.AnnSpot)
}

// Raw is the spot score: 1 for the capacity the pod prefers, 0 for the other.
func Raw(rule string, node *facts.Node) int64 {
	spot := node.CapacityType == "spot"
	if spot == (rule == "prefer") {
		return 1
	}
	return 0
}

// PreFilter skips pods that do not require or forbid spot.
func (p *SpotScheduler) PreFilter(_ context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	rule := Preference(pod)
	if rule != "require" && rule != "forbid" {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	cs.Write(stateKey, preference(rule))
	return nil, nil
}

// PreFilterExtensions: none (the rule reads the node alone).
func (p *SpotScheduler) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter refuses spot or on-demand capacity, unresolvably (no eviction changes a node's kind).
func (p *SpotScheduler) Filter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, info fwk.NodeInfo) *fwk.Status {
	rule, err := ruleOf(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if code := Refuse(rule, facts.Nodes.Of(info.Node())); code != 0 {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, Words(code))
	}
	return nil
}

func ruleOf(cs fwk.CycleState) (string, error) {
	data, err := cs.Read(stateKey)
	if err != nil {
		return "", fmt.Errorf("%s: %w", Name, err)
	}
	rule, _ := data.(preference)
	return string(rule), nil
}

// PreScore skips pods that neither prefer nor avoid spot, and nodes that are all of
// one kind: every node would score the same (the extender gives each the top score,
// which changes no ranking).
func (p *SpotScheduler) PreScore(_ context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	rule := Preference(pod)
	if rule != "prefer" && rule != "avoid" || p.kinds.OneKind() || Alike(nodes) {
		return fwk.NewStatus(fwk.Skip)
	}
	cs.Write(stateKey, preference(rule))
	return nil
}

// Alike: the nodes are all spot, or all on-demand.
func Alike(nodes []fwk.NodeInfo) bool {
	if len(nodes) == 0 {
		return true
	}
	spot := facts.Nodes.Of(nodes[0].Node()).CapacityType == "spot"
	for _, info := range nodes[1:] {
		if (facts.Nodes.Of(info.Node()).CapacityType == "spot") != spot {
			return false
		}
	}
	return true
}

// Score is 1 for the capacity the pod prefers (normalised over the nodes).
func (p *SpotScheduler) Score(_ context.Context, cs fwk.CycleState, _ *v1.Pod, info fwk.NodeInfo) (int64, *fwk.Status) {
	rule, err := ruleOf(cs)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	return Raw(rule, facts.Nodes.Of(info.Node())), nil
}

// ScoreExtensions normalises.
func (p *SpotScheduler) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore: min-max onto 0..MaxNodeScore, all alike: MaxNodeScore.
func (p *SpotScheduler) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	score.NormaliseList(scores)
	explain.Keep(cs, "spot", scores) // for GPUScheduler's GPUPlacement Event
	return nil
}
