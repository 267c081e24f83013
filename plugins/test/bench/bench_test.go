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

// BenchmarkCycle: one pod's cycle over 500 nodes, 230 of them scored (kube-scheduler's
// adaptive share at 500 nodes).
func BenchmarkCycle(b *testing.B) {
	infos := make([]fwk.NodeInfo, 500)
	for i := range infos {
		info := framework.NewNodeInfo(gpuPod(fmt.Sprintf("p-%d", i), int64(i%4)))
		info.SetNode(node(i))
		infos[i] = info
	}
	args := config.GPUSchedulerArgs{DefaultPlacement: "binpack", Namespace: "gpu-scheduler",
		HeartbeatWindow: &metav1.Duration{Duration: 15 * time.Minute}}
	gpu := gpuscheduler.NewWith(args, gpuscheduler.NewHeartbeats(), time.Now)
	spot := &spotscheduler.SpotScheduler{}
	az := azscheduler.NewWith(contract.TopologyLevels, func() ([]fwk.NodeInfo, error) { return infos, nil })
	pod := gpuPod("new", 2)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		state := framework.NewCycleState()
		spot.PreFilter(ctx, state, pod, nil)
		gpu.PreFilter(ctx, state, pod, nil)
		for _, info := range infos {
			gpu.Filter(ctx, state, pod, info)
		}
		scored := infos[:230]
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
			plugin.ScoreExtensions().NormalizeScore(ctx, state, pod, list)
		}
	}
}
