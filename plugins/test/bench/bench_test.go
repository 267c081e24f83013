// Package bench measures what the plugins cost kube-scheduler per pod, without the
// framework around them: PreFilter, Filter on every node, PreScore, Score and
// NormalizeScore on the nodes kube-scheduler scores, as one cycle does.
//
//	cd tools/k8s && go test -run - -bench . -benchmem \
//	    github.com/gpu-scheduler/gpu-scheduler/plugins/test/bench
package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/azscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/gpuscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/spotscheduler"
)

func node(i int) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n-%05d", i), ResourceVersion: "1", Labels: map[string]string{
			contract.LabelGpuPresent: "true", contract.LabelGpuCount: "8",
			contract.LabelGpuProduct: "NVIDIA-H100-80GB-HBM3", contract.LabelGpuMemory: "81559",
			contract.LabelZone: fmt.Sprintf("zone-%d", i%3),
		}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceName(contract.ResourceGpu): resource.MustParse("8"),
			v1.ResourceCPU:                        resource.MustParse("192"),
		}},
	}
}

func gpuPod(name string, gpus int64) *v1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q, v1.ResourceCPU: resource.MustParse("1")},
			Limits:   v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q},
		}}}},
	}
}

// BenchmarkCycle: one pod's cycle over 500 and 5,000 nodes, of which kube-scheduler's
// adaptive share scores 230 and 500; one node changes between cycles (the pod the
// last cycle assumed), as in a run that places pod after pod. scores=gpu: GPUScheduler
// with its gpu score alone (what scarcity and fragmentation cost is the difference).
func BenchmarkCycle(b *testing.B) {
	for _, size := range []struct{ nodes, scored int }{{500, 230}, {5000, 500}} {
		for _, weights := range []map[string]int64{nil, {"gpu": 5}} {
			name := fmt.Sprintf("nodes=%d/scores=all", size.nodes)
			if weights != nil {
				name = fmt.Sprintf("nodes=%d/scores=gpu", size.nodes)
			}
			b.Run(name, func(b *testing.B) { cycle(b, size.nodes, size.scored, weights) })
		}
	}
}

func cycle(b *testing.B, nodes, scored int, weights map[string]int64) {
	infos := make([]fwk.NodeInfo, nodes)
	for i := range infos {
		info := framework.NewNodeInfo(gpuPod(fmt.Sprintf("p-%d", i), int64(i%4)))
		info.SetNode(node(i))
		infos[i] = info
	}
	list := func() ([]fwk.NodeInfo, error) { return infos, nil }
	args := config.GPUSchedulerArgs{DefaultPlacement: "binpack", Namespace: "gpu-scheduler",
		HeartbeatWindow: &metav1.Duration{Duration: 15 * time.Minute}, Weights: weights}
	gpu := gpuscheduler.NewWith(args, gpuscheduler.NewHeartbeats(), time.Now).OverNodes(list)
	spot := &spotscheduler.SpotScheduler{}
	az := azscheduler.NewWith(contract.TopologyLevels, list)
	pod := gpuPod("new", 2)
	ctx := context.Background()
	b.ReportAllocs()
	turn := 0
	for b.Loop() {
		turn++
		changed := infos[turn%nodes].(*framework.NodeInfo)
		changed.SetNode(changed.Node()) // a new generation, as an assumed pod gives it
		gpu.Reserve(ctx, nil, pod, changed.Node().Name)
		state := framework.NewCycleState()
		spot.PreFilter(ctx, state, pod, nil)
		gpu.PreFilter(ctx, state, pod, nil)
		for _, info := range infos {
			gpu.Filter(ctx, state, pod, info)
		}
		scored := infos[:scored]
		for _, plugin := range []interface {
			PreScore(context.Context, fwk.CycleState, *v1.Pod, []fwk.NodeInfo) *fwk.Status
			Score(context.Context, fwk.CycleState, *v1.Pod, fwk.NodeInfo) (int64, *fwk.Status)
			ScoreExtensions() fwk.ScoreExtensions
		}{gpu, spot, az} {
			if plugin.PreScore(ctx, state, pod, scored).IsSkip() {
				continue
			}
			list := make(fwk.NodeScoreList, len(scored))
			for i, info := range scored {
				list[i].Name = info.Node().Name
				list[i].Score, _ = plugin.Score(ctx, state, pod, info)
			}
			if ext := plugin.ScoreExtensions(); ext != nil {
				ext.NormalizeScore(ctx, state, pod, list)
			}
		}
	}
}
