package workload

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

func TestShapeOfRoundsUpOnTheExtendersGrid(t *testing.T) {
	for _, c := range []struct {
		cpu, ram, wantCPU, wantRAM int64
	}{
		{1, 1, 1000, 4096},
		{1000, 4096, 1000, 4096},
		{16000, 65536, 16000, 65536},
		{16001, 65537, 20000, 81920},
		{0, 0, 0, 0},
	} {
		got := ShapeOf(2, c.cpu, c.ram, nil)
		if got.CPUMilli != c.wantCPU || got.RAMMiB != c.wantRAM {
			t.Errorf("ShapeOf(%d, %d) = %+v, want %d, %d", c.cpu, c.ram, got, c.wantCPU, c.wantRAM)
		}
	}
	if got := ShapeOf(1, 0, 0, []string{"b", "a"}).Products; got != "a,b" {
		t.Errorf("products %q, want sorted a,b", got)
	}
}

// One 8-GPU pod among 1-GPU pods: multi-GPU pods ask 8 of 12 GPUs, so the power is 1
// and the 8-GPU shape weighs as eight 1-GPU pods; a restricted shape weighs its pods.
func TestMixWeighsByPodsAndGpus(t *testing.T) {
	one, eight := ShapeOf(1, 1000, 4096, nil), ShapeOf(8, 1000, 4096, nil)
	restricted := ShapeOf(1, 1000, 4096, []string{"Tesla-T4"})
	mix := MixOf(map[Shape]int64{one: 3, eight: 1, restricted: 1})
	shares := map[Shape]float64{}
	sum := 0.0
	for _, e := range mix {
		shares[e.Shape] = e.Share
		sum += e.Share
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Fatalf("shares sum to %v", sum)
	}
	if mix[0].Shape != eight {
		t.Errorf("heaviest first: %+v", mix)
	}
	// restricted: 1/5 of the pods; the rest (4/5) split 3:8 between one and eight
	want := map[Shape]float64{restricted: 0.2, one: 0.8 * 3 / 11, eight: 0.8 * 8 / 11}
	for shape, w := range want {
		if math.Abs(shares[shape]-w) > 1e-9 {
			t.Errorf("%+v: share %v, want %v", shape, shares[shape], w)
		}
	}
}

// Ten shapes whose weights (0.2, 0.2, 0.1 x 4, 0.05 x 4) reach Coverage exactly at the
// ninth: whether a float sum of them reaches 0.95 depends on its order, which a map's
// iteration changes (as tests/unit/test_fragmentation.py's AT_THE_EDGE).
func TestTheMixIsTheSameWhateverTheMapsOrder(t *testing.T) {
	counts := map[Shape]int64{
		ShapeOf(4, 2000, 4096, nil): 1, ShapeOf(4, 12000, 114688, nil): 1,
		ShapeOf(2, 1000, 65536, nil): 1, ShapeOf(2, 20000, 114688, nil): 1,
		ShapeOf(4, 1000, 4096, []string{"NVIDIA-L40S"}):            1,
		ShapeOf(4, 1000, 65536, []string{"NVIDIA-A100-SXM4-40GB"}): 1,
		ShapeOf(1, 2000, 4096, nil):                                1, ShapeOf(1, 2000, 16384, nil): 1,
		ShapeOf(1, 8000, 65536, nil): 1, ShapeOf(1, 12000, 16384, nil): 1,
	}
	first := MixOf(counts)
	if len(first) != 9 {
		t.Fatalf("%d shapes kept, want 9: %+v", len(first), first)
	}
	for range 200 {
		again := MixOf(maps.Clone(counts))
		if len(again) != len(first) {
			t.Fatalf("%d shapes kept, then %d", len(first), len(again))
		}
		for i := range again {
			if again[i].Shape != first[i].Shape {
				t.Fatalf("shape %d: %+v, then %+v", i, first[i].Shape, again[i].Shape)
			}
		}
	}
}

func TestCountsKeepTheMixUntilOnePercentMoved(t *testing.T) {
	c := NewCounts()
	one := ShapeOf(1, 1000, 4096, nil)
	c.Add(one, 200)
	first := c.Mix()
	c.Add(one, 1) // 1 of 201 pods moved: the same mix
	if &c.Mix()[0] != &first[0] {
		t.Error("the mix was worked out again after 0.5% of the pods moved")
	}
	c.Add(one, 2) // 3 of 203: past 1%
	if &c.Mix()[0] == &first[0] {
		t.Error("the mix was kept after 1.5% of the pods moved")
	}
	again := c.Mix()
	c.Add(ShapeOf(2, 1000, 4096, nil), 1) // a new shape: at once
	if &c.Mix()[0] == &again[0] {
		t.Error("a new shape did not change the mix")
	}
}

func TestFragmentation(t *testing.T) {
	mix := MixOf(map[Shape]int64{ShapeOf(4, 1000, 4096, nil): 1, ShapeOf(1, 1000, 4096, nil): 1})
	f := NewFragmentation(mix)
	four := 0.0
	for _, e := range mix {
		if e.Shape.Gpus == 4 {
			four = e.Share
		}
	}
	node := State{Free: 4, CPUMilli: 8000, RAMMiB: 1 << 20, Model: "A", ModelCode: 1}
	if got := f.F(node); got != 0 {
		t.Errorf("4 free GPUs fit every shape: F = %v", got)
	}
	three := State{Free: 3, CPUMilli: 8000, RAMMiB: 1 << 20, Model: "A", ModelCode: 1}
	if got, want := f.F(three), 3*four; math.Abs(got-want) > 1e-12 {
		t.Errorf("3 free GPUs: F = %v, want %v", got, want)
	}
	starved := State{Free: 4, CPUMilli: 500, RAMMiB: 1 << 20, Model: "A", ModelCode: 1}
	if got := f.F(starved); got != 4 {
		t.Errorf("no CPU beside the GPUs: F = %v, want 4", got)
	}
	// Taking the last GPU leaves nothing to fragment; taking one of four breaks a 4.
	if last, one := f.Gain(State{1, 8000, 1 << 20, "A", 1}, 1, 1000, 0), f.Gain(node, 1, 1000, 0); last <= one {
		t.Errorf("gain of the last GPU %v not above breaking four %v", last, one)
	}
	restricted := NewFragmentation(MixOf(map[Shape]int64{ShapeOf(1, 0, 0, []string{"B"}): 1}))
	if got := restricted.F(State{Free: 2, Model: "A", ModelCode: 1, CPUMilli: Unlimited, RAMMiB: Unlimited}); got != 2 {
		t.Errorf("a model no shape may use is all fragmented: F = %v", got)
	}
}

func TestPressure(t *testing.T) {
	got := Pressure(map[string]float64{"T4": 3}, 6, map[string]int64{"T4": 4, "A100": 12})
	if math.Abs(got["T4"]-2) > 1e-12 || got["A100"] != 0 {
		t.Errorf("pressure %v, want T4 2 (half the demand on a quarter of the GPUs), A100 0", got)
	}
	if Pressure(nil, 0, map[string]int64{"T4": 1}) != nil {
		t.Error("pressure without demand")
	}
}

// The cluster reads each version of a pod once: a node read again (a pod placed beside
// the others) reuses what its pods gave, and an updated pod (a new resourceVersion) is
// read anew.
func TestClusterReadsEachPodVersionOnce(t *testing.T) {
	version := 0
	gpuPod := func(gpus string) *v1.Pod {
		q := resource.MustParse(gpus)
		version++
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid", ResourceVersion: fmt.Sprint(version)}, Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q, v1.ResourceCPU: resource.MustParse("2")},
			Limits:   v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q}}}}}}
	}
	c := NewCluster(facts.ReadNode)
	first, cpuOnly := gpuPod("2"), &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "cpu", ResourceVersion: "1"}}
	read := c.readPod(first)
	if read == nil || read.Gpus != 2 || read.CPUMilli != 2000 || c.readPod(first) != read {
		t.Fatalf("a pod's read: %+v, and again %p", read, c.readPod(first))
	}
	if c.readPod(cpuOnly) != nil {
		t.Fatal("a pod without GPUs is read as one")
	}
	updated := gpuPod("4")
	if got := c.readPod(updated); got == read || got.Gpus != 4 {
		t.Fatalf("a new version of the pod: %+v", got)
	}
	if again := first.DeepCopy(); c.readPod(again) != read {
		t.Fatal("the same version decoded again is read again")
	}
	node := facts.ReadNode(&v1.Node{Status: v1.NodeStatus{Allocatable: v1.ResourceList{
		v1.ResourceName(contract.ResourceGpu): resource.MustParse("8")}}})
	info := framework.NewNodeInfo(first, cpuOnly, updated)
	if got, want := place(node, info.GetPods(), c.readPod), Read(node, info.GetPods()); !reflect.DeepEqual(got, want) {
		t.Fatalf("read through the memo %+v, directly %+v", got, want)
	}
}

func gpuNodeInfo(t *testing.T, name string, pods ...*v1.Pod) *framework.NodeInfo {
	t.Helper()
	info := framework.NewNodeInfo(pods...)
	info.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceName(contract.ResourceGpu): resource.MustParse("8")}}})
	return info
}

// A node is read again when its pods change, also where kube-scheduler 1.36+ put the
// NodeInfo's generation back after assuming a pod group's member into it, and when it
// is touched although its NodeInfo did not move (its DRA devices changed).
func TestTheClusterReadsANodeAgainWhenItsPodsOrItsDevicesChange(t *testing.T) {
	whole := func(name, gpus string) *v1.Pod {
		q := resource.MustParse(gpus)
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), ResourceVersion: "1"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q, v1.ResourceCPU: resource.MustParse("1")},
				Limits:   v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q}}}}}}
	}
	model := "NVIDIA-A100"
	read := func(node *v1.Node) *facts.Node {
		f := facts.ReadNode(node)
		f.Model = model
		return f
	}
	c := NewCluster(read)
	info := gpuNodeInfo(t, "n", whole("a", "2"))
	used := func() [2]int64 { // as the figures read the node
		c.mu.Lock()
		defer c.mu.Unlock()
		placed := c.refresh(info).placed
		return [2]int64{placed.CPUMilli, placed.RAMMiB}
	}
	if used := used(); used[0] != 1000 {
		t.Fatalf("one pod: %v", used)
	}
	generation := info.Generation
	info.AddPod(whole("b", "2"))
	info.Generation = generation // Snapshot.AssumePod puts it back
	if used := used(); used[0] != 2000 {
		t.Fatalf("a pod assumed with the generation put back: %v", used)
	}
	model = "NVIDIA-H100"
	c.Touch("n")
	c.mu.Lock()
	s := c.refresh(info)
	c.mu.Unlock()
	if s.placed.Model != "NVIDIA-H100" {
		t.Fatalf("a touched node whose NodeInfo did not move: %+v", s.placed)
	}
}

// Used reads a NodeInfo as given and leaves the figures alone: a preemption's what-if
// (the node without its victims) must not become the cluster's figures.
func TestUsedLeavesTheFiguresAlone(t *testing.T) {
	c := NewCluster(facts.ReadNode)
	gpus := func(name string) *v1.Pod {
		q := resource.MustParse("1")
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), ResourceVersion: "1"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q, v1.ResourceCPU: resource.MustParse("2")},
				Limits:   v1.ResourceList{v1.ResourceName(contract.ResourceGpu): q}}}}}}
	}
	info := gpuNodeInfo(t, "n", gpus("a"), gpus("b"))
	before := c.Update([]fwk.NodeInfo{info})
	whatIf := info.Snapshot().(*framework.NodeInfo)
	if err := whatIf.RemovePod(klog.Background(), gpus("a")); err != nil {
		t.Fatal(err)
	}
	if used := c.Used(whatIf); used[0] != 2000 {
		t.Fatalf("the what-if's pods: %v", used)
	}
	c.mu.Lock()
	seen := c.byName["n"]
	c.mu.Unlock()
	if seen.placed.CPUMilli != 4000 || seen.info != fwk.NodeInfo(info) || len(before.Mix) == 0 {
		t.Fatalf("the figures took the what-if: %+v", seen.placed)
	}
}
