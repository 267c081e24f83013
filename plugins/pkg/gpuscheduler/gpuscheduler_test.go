package gpuscheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

func gpuNode(labels map[string]string, annotations map[string]string) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels, Annotations: annotations},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceName(contract.ResourceGpu): resource.MustParse("8")}},
	}
}

func pod(gpus string, memory string) *v1.Pod {
	requests := v1.ResourceList{}
	if gpus != "" {
		requests[v1.ResourceName(contract.ResourceGpu)] = resource.MustParse(gpus)
	}
	if memory != "" {
		requests[v1.ResourceName(contract.ResourceGpuMemory)] = resource.MustParse(memory)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c",
			Resources: v1.ResourceRequirements{Requests: requests}}}},
	}
}

func plugin(t *testing.T) *GPUScheduler {
	t.Helper()
	args, err := config.DecodeGPUScheduler(nil)
	if err != nil {
		t.Fatal(err)
	}
	return NewWith(args, NewHeartbeats(), time.Now)
}

// A share goes where the fit rule finds a GPU with room: the GPUs the pods on the node
// (bound, assumed, or left in a preemption's what-if) leave free, by NodeInfo alone.
func TestASharePlacedByTheFitRuleOverNodeInfo(t *testing.T) {
	p := plugin(t)
	labels := map[string]string{contract.LabelGpuSharing: "mps", contract.LabelGpuCount: "2",
		contract.LabelGpuMemory: "40960", contract.LabelGpuPresent: "true"}
	sharingNode := gpuNode(labels, nil)
	sharingNode.Status.Allocatable[v1.ResourceName(contract.ResourceGpu)] = resource.MustParse("2")
	held := pod("", "30")
	held.UID, held.Name = "uid-held", "held"
	whole := pod("1", "")
	whole.UID, whole.Name = "uid-whole", "whole"
	info := framework.NewNodeInfo(held, whole)
	info.SetNode(sharingNode)
	state := framework.NewCycleState()
	asking := pod("", "20")
	if _, status := p.PreFilter(context.Background(), state, asking, nil); !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	status := p.Filter(context.Background(), state, asking, info)
	want := "no single GPU has 20 GiB free: the largest free piece is 10 GiB on gpu-0 (10 GiB free on 2 GPUs); pod asks 20 GiB"
	if status.Code() != fwk.Unschedulable || status.Message() != want {
		t.Fatalf("a share of 20 beside 30 of 40 and a GPU taken whole: %v", status)
	}
	if err := info.RemovePod(klog.Background(), whole); err != nil { // preemption's what-if
		t.Fatal(err)
	}
	if status := p.Filter(context.Background(), state, asking, info); !status.IsSuccess() {
		t.Fatalf("with the whole-GPU pod gone: %v", status)
	}
	plain := framework.NewNodeInfo()
	plain.SetNode(gpuNode(map[string]string{contract.LabelGpuPresent: "true"}, nil))
	if status := p.Filter(context.Background(), state, asking, plain); status.Code() != fwk.UnschedulableAndUnresolvable ||
		!strings.Contains(status.Message(), "does not share its GPUs") {
		t.Fatalf("a node that does not share: %v", status)
	}
}

func TestACPUPodSkipsTheFilterButIsScored(t *testing.T) {
	p := plugin(t)
	state := framework.NewCycleState()
	if _, status := p.PreFilter(context.Background(), state, pod("", ""), nil); !status.IsSkip() {
		t.Fatalf("PreFilter: %v", status)
	}
	gpus := framework.NewNodeInfo()
	gpus.SetNode(gpuNode(map[string]string{contract.LabelGpuPresent: "true"}, nil))
	plain := framework.NewNodeInfo()
	plain.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain"}})
	_, list, status := p.ScoreAll(context.Background(), state, pod("", ""), []fwk.NodeInfo{gpus, plain})
	if !status.IsSuccess() || list[0].Score != 0 || list[1].Score <= list[0].Score {
		t.Fatalf("a CPU pod: %v %v, want the node without GPUs above the GPU node", list, status)
	}
}

func TestNodeEventsQueueOnlyWhatTheRulesRead(t *testing.T) {
	p := plugin(t)
	logger := klog.Background()
	before := gpuNode(map[string]string{contract.LabelGpuProduct: "NVIDIA-H100-80GB-HBM3"}, nil)
	cases := []struct {
		name  string
		after *v1.Node
		want  fwk.QueueingHint
	}{
		{"an unrelated label", gpuNode(map[string]string{
			contract.LabelGpuProduct: "NVIDIA-H100-80GB-HBM3", "team": "a"}, nil), fwk.QueueSkip},
		{"the product", gpuNode(map[string]string{contract.LabelGpuProduct: "NVIDIA-B200"}, nil), fwk.Queue},
		{"a GPU falls sick", gpuNode(map[string]string{contract.LabelGpuProduct: "NVIDIA-H100-80GB-HBM3"},
			map[string]string{contract.AnnGpus: `[{"uuid":"GPU-1","healthy":false}]`}), fwk.Queue},
	}
	for _, c := range cases {
		got, err := p.nodeChanged(logger, nil, before, c.after)
		if err != nil || got != c.want {
			t.Errorf("%s: %v %v, want %v", c.name, got, err, c.want)
		}
	}
	if got, _ := p.nodeChanged(logger, nil, nil, before); got != fwk.Queue {
		t.Errorf("a new node: %v", got)
	}
}

func TestOnlyAGPUPodLeavingANodeQueues(t *testing.T) {
	logger := klog.Background()
	gone := pod("2", "")
	gone.Spec.NodeName = "n"
	if got, _ := podGone(logger, nil, gone, nil); got != fwk.Queue {
		t.Errorf("a GPU pod: %v", got)
	}
	cpu := pod("", "")
	cpu.Spec.NodeName = "n"
	if got, _ := podGone(logger, nil, cpu, nil); got != fwk.QueueSkip {
		t.Errorf("a CPU pod: %v", got)
	}
}

func TestTheHeartbeatGuardTripsWhenMostAgentsFallSilentAtOnce(t *testing.T) {
	h := NewHeartbeats()
	now := time.Unix(1_800_000_000, 0)
	oldest := now.Add(-15 * time.Minute)
	h.Set("a", now)
	h.Set("b", now.Add(-time.Hour))
	h.Set("c", time.Time{}) // a Lease not renewed yet counts as neither
	if why := h.Guard(oldest); why != "" {
		t.Fatalf("one silent of two: %q", why)
	}
	if !h.Silent("b", oldest) || h.Silent("c", oldest) || h.Silent("unknown", oldest) {
		t.Fatal("silent: b only")
	}
	h.Set("a", now.Add(-time.Hour))
	if why := h.Guard(oldest); why != "" {
		t.Fatalf("a renewal within the guard's second moved it: %q", why)
	}
	if why := h.Guard(oldest.Add(time.Second)); why != "many-silent" {
		t.Fatalf("two silent of two, a second later: %q", why)
	}
}

// A renewal moves a node's heartbeat and nothing else; a Lease that comes or goes moves
// Presence (what PreScore's cached fits hold on to), and a deleted one leaves its node
// unmanaged.
func TestLeasesComeRenewAndGo(t *testing.T) {
	h := NewHeartbeats()
	at := time.Unix(1_800_000_000, 123)
	h.Set("a", time.Time{})
	came := h.Presence()
	if renewed, managed := h.Of("a"); !managed || !renewed.IsZero() {
		t.Fatalf("a Lease not renewed yet: %v %v", renewed, managed)
	}
	h.Set("a", at)
	if renewed, managed := h.Of("a"); !managed || !renewed.Equal(at) || h.Presence() != came {
		t.Fatalf("renewed: %v %v, presence %d -> %d", renewed, managed, came, h.Presence())
	}
	h.forget("a")
	if _, managed := h.Of("a"); managed || h.Presence() == came {
		t.Fatal("a deleted Lease still manages its node, or presence did not move")
	}
	// a renewTime past what UnixNano holds stays in the future, not wrapped into the past
	h.Set("b", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC))
	if h.Silent("b", time.Now()) {
		t.Fatal("a renewal in the year 3000 reads as silent")
	}
}

func TestArgsAreCheckedAsTheExtendersConfiguration(t *testing.T) {
	for _, raw := range []string{`{"defaultPlacement": "tight"}`, `{"heartbeatWindow": "-1s"}`} {
		if _, err := config.DecodeGPUScheduler(unknown(raw)); err == nil {
			t.Errorf("%s: accepted", raw)
		}
	}
	args, err := config.DecodeGPUScheduler(unknown(`{"defaultPlacement": "spread", "heartbeatWindow": "5m"}`))
	if err != nil || args.DefaultPlacement != "spread" || args.HeartbeatWindow.Duration != 5*time.Minute {
		t.Fatalf("%+v %v", args, err)
	}
}
