package gpuscheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/test/fakedra"
)

func gpuClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com"},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}},
			ExtendedResourceName: ptr.To(contract.ResourceGpu),
		},
	}
}

// gpuSlice is a node's ResourceSlice of count GPUs as the NVIDIA DRA driver publishes it.
func gpuSlice(node, product, memory string, count int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.nvidia.com"},
		Spec: resourceapi.ResourceSliceSpec{Driver: contract.DraNvidiaDriver, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}},
	}
	for i := range count {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": {StringValue: ptr.To("gpu")}, "productName": {StringValue: ptr.To(product)}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(memory)}},
		})
	}
	return s
}

// allocated is a claim kube-scheduler allocated the given devices of a node's pool.
func allocated(name, node string, devices ...string) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}}}
	for _, d := range devices {
		claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: contract.DraNvidiaDriver, Pool: node, Device: d})
	}
	return claim
}

// draNodeObject is a Node of a DRA driver's GPUs: no nvidia.com/gpu allocatable.
func draNodeObject(name string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1",
		Labels: map[string]string{contract.LabelZone: "z1"}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("64"),
			v1.ResourceMemory: resource.MustParse("512Gi")}}}
}

func filterOn(t *testing.T, p *GPUScheduler, asking *v1.Pod, info fwk.NodeInfo) *fwk.Status {
	t.Helper()
	state := framework.NewCycleState()
	if _, status := p.PreFilter(context.Background(), state, asking, nil); !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	return p.Filter(context.Background(), state, asking, info)
}

// A node whose GPUs a DRA driver publishes is served from its devices: their count,
// product and memory, a device taint as a sick GPU, and the devices claims hold in
// use; the pods' nvidia.com/gpu requests, which NodeInfo counts too, are not counted
// again. A node whose device plugin advertises nvidia.com/gpu keeps its own facts.
func TestADraNodeIsServedFromItsDevices(t *testing.T) {
	fakedra.ExtendedResources(t)
	slice := gpuSlice("dra-h100", "NVIDIA H100 80GB HBM3", "81559Mi", 8)
	slice.Spec.Devices[7].Taints = []resourceapi.DeviceTaint{
		{Key: "gpu.nvidia.com/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	manager := &fakedra.Manager{Classes: []*resourceapi.DeviceClass{gpuClass()},
		Slices: []*resourceapi.ResourceSlice{slice, gpuSlice("dp", "NVIDIA L4", "23034Mi", 4)},
		Claims: []*resourceapi.ResourceClaim{allocated("first", "dra-h100", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4")}}
	p := plugin(t).WithDRA(manager)
	first := pod("5", "") // as kube-scheduler's NodeInfo holds it: its request counted there
	first.Name, first.UID = "first", types.UID("uid-first")
	info := framework.NewNodeInfo(first)
	info.SetNode(draNodeObject("dra-h100"))

	h100 := map[string]string{contract.AnnGpuProducts: "NVIDIA-H100-80GB-HBM3"}
	cases := []struct {
		gpus        string
		annotations map[string]string
		code        fwk.Code
		words       string
	}{
		{"2", h100, fwk.Success, ""},
		{"3", nil, fwk.Unschedulable, "2 of 7 GPUs free (1 unhealthy); pod requests 3"},
		{"8", nil, fwk.UnschedulableAndUnresolvable,
			"7 of 8 GPUs healthy; pod requests 8; unhealthy: device gpu-7 (gpu.nvidia.com/unhealthy=xid-79:NoSchedule)"},
		{"9", nil, fwk.UnschedulableAndUnresolvable, "node has 8 GPUs in all; pod requests 9"},
		{"1", map[string]string{contract.AnnMinGpuMemory: "90Gi"}, fwk.UnschedulableAndUnresolvable,
			"GPU memory 81559 MiB per GPU is below " + contract.AnnMinGpuMemory + "=92160 MiB"},
	}
	for _, c := range cases {
		asking := pod(c.gpus, "")
		asking.Annotations = c.annotations
		status := filterOn(t, p, asking, info)
		if status.Code() != c.code || (c.words != "" && status.Message() != c.words) {
			t.Errorf("%s GPUs %v: %v, want %v %q", c.gpus, c.annotations, status, c.code, c.words)
		}
	}
	fit := p.fit(info)
	if fit.Node.CPUMilli != 64000 || fit.Node.Zone != "z1" || fit.Node.Model != "NVIDIA-H100-80GB-HBM3" || fit.Used != 5 {
		t.Errorf("the Node's own facts are kept beside the devices': %+v used %d", fit.Node, fit.Used)
	}

	// the claim gives its devices back: the next cycle counts them free
	manager.Claims = nil
	if status := filterOn(t, p, pod("7", ""), info); !status.IsSuccess() {
		t.Errorf("7 GPUs once the claim is gone: %v", status)
	}

	// the device plugin wins: a Node advertising nvidia.com/gpu keeps its facts
	dp := gpuNode(nil, nil)
	dp.Name = "dp"
	dp.Status.Allocatable[v1.ResourceName(contract.ResourceGpu)] = resource.MustParse("2")
	held := pod("2", "")
	held.Name, held.UID = "held", types.UID("uid-held")
	dpInfo := framework.NewNodeInfo(held)
	dpInfo.SetNode(dp)
	if status := filterOn(t, p, pod("1", ""), dpInfo); status.Code() != fwk.Unschedulable {
		t.Errorf("a device-plugin node counts its pods' requests: %v", status)
	}

	// no class serves nvidia.com/gpu: the DRA node has no GPUs at all
	manager.Classes = nil
	if status := filterOn(t, p, pod("1", ""), info); status.Code() != fwk.UnschedulableAndUnresolvable ||
		status.Message() != fmt.Sprintf("node has no GPUs (no allocatable %s)", contract.ResourceGpu) {
		t.Errorf("without the class: %v", status)
	}
}

// A pod whose only GPU request is a claim asking memory of a shareable device passes
// every node (kube-scheduler allocates the claim) and is scored as that share: best
// fit puts it beside the claim that left the least room.
func TestAClaimOnlyPodIsScoredAsItsShare(t *testing.T) {
	fakedra.ExtendedResources(t)
	shared := func(node string) *resourceapi.ResourceSlice {
		s := gpuSlice(node, "NVIDIA H100 80GB HBM3", "80Gi", 1)
		s.Spec.Devices[0].AllowMultipleAllocations = ptr.To(true)
		return s
	}
	big := allocated("big", "busy", "gpu-0")
	big.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("share-1"))
	big.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse("60Gi")}
	small := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com",
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse("20Gi")}}}}}}}}
	manager := &fakedra.Manager{Classes: []*resourceapi.DeviceClass{gpuClass()},
		Slices: []*resourceapi.ResourceSlice{shared("busy"), shared("idle")},
		Claims: []*resourceapi.ResourceClaim{big, small}}
	p := plugin(t).WithDRA(manager)
	var nodes []fwk.NodeInfo
	for _, name := range []string{"idle", "busy"} {
		info := framework.NewNodeInfo()
		info.SetNode(draNodeObject(name))
		nodes = append(nodes, info)
	}
	asking := pod("", "")
	asking.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("small")}}
	state := framework.NewCycleState()
	if _, status := p.PreFilter(context.Background(), state, asking, nil); status.Code() != fwk.Skip {
		t.Fatalf("PreFilter of a claim-only pod: %v, want Skip (no GPU rule filters it)", status)
	}
	scored, _, status := p.ScoreAll(context.Background(), state, asking, nodes)
	if !status.IsSuccess() {
		t.Fatalf("scores: %v", status)
	}
	gpu := scored.Parts["gpu"]
	if scored.Nodes[1] != "busy" || !(gpu[1] > gpu[0]) {
		t.Fatalf("best fit: %v %v, want busy above idle", scored.Nodes, gpu)
	}
	if _, ok := scored.Parts["scarcity"]; ok {
		t.Fatal("a claim-only pod got a scarcity score (the extender gives none)")
	}
	fit := p.fit(nodes[1])
	if fit.Used != 1 || len(fit.Gpus) != 1 || fit.Gpus[0].Free != 20 || fit.Gpus[0].WholeFree {
		t.Fatalf("busy's device: used %d gpus %+v", fit.Used, fit.Gpus)
	}
	// a pod asking a whole GPU beside the claim is scored as both, as the extender's
	// View.pod_shares reads it, and keeps its scarcity score (it asks GPUs of its own)
	both := pod("1", "")
	both.Spec.ResourceClaims = asking.Spec.ResourceClaims
	s := p.claimState(p.read(both), both)
	if !s.claimed || s.pod.Gpus != 1 || !slices.Equal(s.pod.Shares, []int64{20}) || !scoresScarcity(s) {
		t.Fatalf("whole GPU and a claim: %+v %+v", s, s.pod)
	}
	if scoresScarcity(p.claimState(p.read(asking), asking)) {
		t.Fatal("a claim-only pod would get a scarcity score")
	}
}

func TestAClaimGivingItsDevicesBackQueuesThePod(t *testing.T) {
	held := allocated("c", "n", "gpu-0")
	released := held.DeepCopy()
	released.Status.Allocation = nil
	for _, c := range []struct {
		before, after *resourceapi.ResourceClaim
		want          fwk.QueueingHint
	}{
		{held, released, fwk.Queue},
		{held, nil, fwk.Queue},
		{released, held, fwk.QueueSkip},
		{held, held, fwk.QueueSkip},
	} {
		var after any
		if c.after != nil {
			after = c.after
		}
		if got, _ := claimFreed(klog.Background(), nil, c.before, after); got != c.want {
			t.Errorf("%v -> %v: %v, want %v", c.before.Status.Allocation != nil, c.after, got, c.want)
		}
	}
	events, _ := plugin(t).EventsToRegister(context.Background())
	seen := map[fwk.EventResource]bool{}
	for _, e := range events {
		seen[e.Event.Resource] = true
	}
	for _, kind := range []fwk.EventResource{fwk.ResourceSlice, fwk.DeviceClass, fwk.ResourceClaim} {
		if !seen[kind] {
			t.Errorf("no %s event registered", kind)
		}
	}
}

// A new class serving nvidia.com/gpu while no slice is left: the last class's devices
// are not kept.
func TestANewClassWithNoSlicesLeavesNoDevices(t *testing.T) {
	fakedra.ExtendedResources(t)
	manager := &fakedra.Manager{Classes: []*resourceapi.DeviceClass{gpuClass()},
		Slices: []*resourceapi.ResourceSlice{gpuSlice("dra-h100", "NVIDIA H100 80GB HBM3", "81559Mi", 8)}}
	p := plugin(t).WithDRA(manager)
	info := framework.NewNodeInfo()
	info.SetNode(draNodeObject("dra-h100"))
	if status := filterOn(t, p, pod("1", ""), info); !status.IsSuccess() {
		t.Fatalf("the devices of the class: %v", status)
	}
	manager.Classes, manager.Slices = []*resourceapi.DeviceClass{gpuClass()}, nil // a new object
	if status := filterOn(t, p, pod("1", ""), info); status.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("no slice under the new class, yet: %v", status)
	}
}
