package gpuscheduler

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/explain"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// placed runs a cycle's PreFilter and PreScore over nodes of these sizes (GPUs, all
// free), keeps a spot list as SpotScheduler would, binds the pod to chosen and
// returns the Events written.
func placed(t *testing.T, p *GPUScheduler, gpus string, sizes map[string]int64, chosen string) []*v1.Event {
	t.Helper()
	var written []*v1.Event
	nodes := map[string]*v1.Node{}
	infos := []fwk.NodeInfo{}
	list := fwk.NodeScoreList{}
	for _, name := range []string{"roomy", "tight"} {
		node := gpuNode(nil, nil)
		node.Name = name
		node.Status.Allocatable[v1.ResourceName(contract.ResourceGpu)] = *resource.NewQuantity(sizes[name], resource.DecimalSI)
		nodes[name] = node
		info := framework.NewNodeInfo()
		info.SetNode(node)
		infos = append(infos, info)
		list = append(list, fwk.NodeScore{Name: name, Score: 100})
	}
	p.placements = &Placements{
		Writer: explain.NewWriter(func(_ context.Context, ev *v1.Event) error {
			written = append(written, ev)
			return nil
		}, 10, 50, 10, "test"),
		Weights: func() map[string]int64 { return map[string]int64{"spot": 5, "group": 15} },
		Node:    func(name string) *v1.Node { return nodes[name] },
	}
	ctx, state, pd := context.Background(), framework.NewCycleState(), pod(gpus, "")
	pd.UID = types.UID("uid-1")
	if _, status := p.PreFilter(ctx, state, pd, infos); !status.IsSuccess() && !status.IsSkip() {
		t.Fatalf("PreFilter: %v", status)
	}
	if _, _, status := p.ScoreAll(ctx, state, pd, infos); !status.IsSuccess() {
		t.Fatalf("scores: %v", status)
	}
	explain.Keep(state, "spot", list)
	p.PostBind(ctx, state, pd, chosen)
	p.placements.Writer.Drain(ctx)
	return written
}

func TestAPlacedGPUPodGetsTheExtendersEvent(t *testing.T) {
	written := placed(t, plugin(t), "2", map[string]int64{"roomy": 8, "tight": 2}, "tight")
	if len(written) != 1 {
		t.Fatalf("events: %d", len(written))
	}
	ev := written[0]
	if ev.Reason != "GPUPlacement" || ev.Name != explain.EventName("p", "uid-1") ||
		ev.Source.Component != "gpu-scheduler-plugins" || ev.InvolvedObject.Name != "p" {
		t.Fatalf("event %+v", ev)
	}
	for _, words := range []string{"2 GPUs on tight: gpu-scheduler score", "rank 1 of 2 candidates",
		"gpu 10, spot 10", "weights gpu 5, spot 5", "Runner-up roomy"} {
		if !strings.Contains(ev.Message, words) {
			t.Errorf("message %q lacks %q", ev.Message, words)
		}
	}
}

func TestAPodWithoutGPUsGetsNoEvent(t *testing.T) {
	if written := placed(t, plugin(t), "", map[string]int64{"roomy": 8, "tight": 2}, "tight"); len(written) != 0 {
		t.Fatalf("events: %v", written)
	}
}

type profile struct{}

func (profile) ListPlugins() *schedconfig.Plugins {
	return &schedconfig.Plugins{Score: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{
		{Name: "SpotScheduler", Weight: 3}, {Name: "NodeResourcesFit", Weight: 1}}}}
}

func TestTheProfileWeightsAreReadFromTheFramework(t *testing.T) {
	if got := Weights(nil); got["spot"] != contract.WeightSpot || got["group"] != contract.WeightGroup {
		t.Fatalf("without a framework: %v", got)
	}
	if got := Weights(profile{}); got["spot"] != 3 || got["group"] != contract.WeightGroup || len(got) != 2 {
		t.Fatalf("from the profile: %v", got)
	}
}
