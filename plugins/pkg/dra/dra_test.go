package dra

import (
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
)

const driver = "gpu.nvidia.com"

var celCache = cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})

func gpuClass(expression string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com"},
		Spec: resourceapi.DeviceClassSpec{
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expression}}},
			ExtendedResourceName: ptr.To("nvidia.com/gpu"),
		},
	}
}

const selector = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"

// device is a GPU as the NVIDIA DRA driver publishes it.
func device(name, kind, product, memory string) resourceapi.Device {
	return resourceapi.Device{
		Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                            {StringValue: ptr.To(kind)},
			"productName":                     {StringValue: ptr.To(product)},
			"resource.kubernetes.io/pciBusID": {StringValue: ptr.To("0000:16:00.0")},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: resource.MustParse(memory)},
		},
	}
}

func slice(node string, generation int64, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpus"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
}

func TestTheClassSelectsTheGpusOfANode(t *testing.T) {
	class := NewClass(gpuClass(selector), celCache)
	mig := device("mig-0", "mig", "NVIDIA H100 80GB HBM3", "10Gi")
	sick := device("gpu-1", "gpu", "NVIDIA L4", "23034Mi")
	sick.Taints = []resourceapi.DeviceTaint{
		{Key: "gpu.nvidia.com/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		{Key: "note", Effect: "None"},
	}
	read := ReadSlice(slice("n1", 1, device("gpu-0", "gpu", "NVIDIA H100 80GB HBM3", "81559Mi"), mig, sick), class.Matches)
	want := []Gpu{
		{ID: DeviceID{driver, "n1", "gpu-0"}, Product: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559},
		{ID: DeviceID{driver, "n1", "gpu-1"}, Product: "NVIDIA-L4", MemoryMiB: 23034,
			Taints: []string{"gpu.nvidia.com/unhealthy=xid-79:NoSchedule"}},
	}
	if !reflect.DeepEqual(read.Nodes["n1"], want) || len(read.Nodes) != 1 {
		t.Fatalf("read %+v, want %+v", read.Nodes, want)
	}
	if class.Problem != "" {
		t.Fatalf("problem %q", class.Problem)
	}
}

func TestABrokenSelectorMatchesNothingAndSaysWhy(t *testing.T) {
	class := NewClass(gpuClass("device.driver =="), celCache)
	if class.Matches(driver, ptr.To(device("gpu-0", "gpu", "NVIDIA L4", "1Gi"))) || class.Problem == "" {
		t.Fatalf("a selector that does not compile matched (problem %q)", class.Problem)
	}
	var none *Class
	if none.Matches(driver, ptr.To(device("gpu-0", "gpu", "NVIDIA L4", "1Gi"))) {
		t.Fatal("no class matched a device")
	}
}

func TestOnlyTheNewestGenerationOfAPoolAndOnlyNodeLocalDevices(t *testing.T) {
	all := func(string, *resourceapi.Device) bool { return true }
	old := slice("n1", 1, device("gpu-old", "gpu", "NVIDIA L4", "1Gi"))
	current := slice("n1", 2, device("gpu-b", "gpu", "NVIDIA L4", "1Gi"), device("gpu-a", "gpu", "NVIDIA L4", "1Gi"))
	everywhere := slice("n2", 1, device("gpu-x", "gpu", "NVIDIA L4", "1Gi"))
	everywhere.Spec.NodeName, everywhere.Spec.AllNodes = nil, ptr.To(true)
	perDevice := slice("n3", 1, device("gpu-0", "gpu", "NVIDIA L4", "1Gi"), device("gpu-1", "gpu", "NVIDIA L4", "1Gi"))
	perDevice.Spec.NodeName, perDevice.Spec.PerDeviceNodeSelection = nil, ptr.To(true)
	perDevice.Spec.Devices[0].NodeName = ptr.To("n3")
	perDevice.Spec.Devices[1].AllNodes = ptr.To(true)
	var read []Slice
	for _, s := range []*resourceapi.ResourceSlice{old, current, everywhere, perDevice} {
		read = append(read, ReadSlice(s, all))
	}
	nodes := NodeGpus(read)
	names := map[string][]string{}
	for node, gpus := range nodes {
		for _, g := range gpus {
			names[node] = append(names[node], g.ID.Device)
		}
	}
	want := map[string][]string{"n1": {"gpu-a", "gpu-b"}, "n3": {"gpu-0"}}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("nodes %v, want %v", names, want)
	}
}

func TestAPoolsGenerationIsTakenPerNode(t *testing.T) {
	// One pool of two slices over two nodes, n2's already republished: each node keeps
	// its own newest devices, as the extender's index (extender/dra_index.py) and
	// kube-scheduler 1.34's GatherPools (only the slices for the node) take them. 1.35+
	// allocates nothing from the pool until it is whole; its own DRA filter holds that.
	all := func(string, *resourceapi.Device) bool { return true }
	first := slice("n1", 1, device("gpu-a", "gpu", "NVIDIA L4", "1Gi"))
	second := slice("n2", 2, device("gpu-b", "gpu", "NVIDIA L4", "1Gi"))
	first.Spec.Pool.Name, second.Spec.Pool.Name = "rack", "rack"
	first.Spec.Pool.ResourceSliceCount, second.Spec.Pool.ResourceSliceCount = 2, 2
	nodes := NodeGpus([]Slice{ReadSlice(first, all), ReadSlice(second, all)})
	if len(nodes["n1"]) != 1 || len(nodes["n2"]) != 1 {
		t.Fatalf("nodes %v, want one GPU on each", nodes)
	}
}

func TestANodesFactsComeFromItsLeastDevice(t *testing.T) {
	gpus := []Gpu{
		{ID: DeviceID{driver, "n", "gpu-0"}, Product: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559},
		{ID: DeviceID{driver, "n", "gpu-1"}, Product: "NVIDIA-L4", MemoryMiB: 23034, Taints: []string{"k=v:NoExecute"}},
		{ID: DeviceID{driver, "n", "gpu-2"}, Product: "NVIDIA-A10", MemoryMiB: 23034},
	}
	n := NodeOf(gpus)
	if n.Count != 3 || n.Product != "NVIDIA-A10" || n.MemoryMiB != 23034 || n.Healthy() != 2 ||
		!reflect.DeepEqual(n.Unhealthy, []string{"device gpu-1 (k=v:NoExecute)"}) || n.Shareable {
		t.Fatalf("facts %+v", n)
	}
	if NodeOf(nil) != nil {
		t.Fatal("a node without devices has DRA facts")
	}
	// held devices count in use, a held tainted one does not (it is out of the pool)
	held := Allocated{Held: map[DeviceID]bool{gpus[0].ID: true, gpus[1].ID: true, {driver, "m", "gpu-0"}: true}}
	if used := n.Used(held); used != 1 {
		t.Fatalf("used %d, want 1", used)
	}
	if n.Shares(held) != nil || n.Specs() != nil {
		t.Fatal("a node of no shareable device has shares")
	}
}

func TestShareableDevicesOfferWhatClaimsLeft(t *testing.T) {
	gpus := []Gpu{
		{ID: DeviceID{driver, "n", "gpu-0"}, MemoryMiB: 81920, Shareable: true},
		{ID: DeviceID{driver, "n", "gpu-1"}, MemoryMiB: 81920},
		{ID: DeviceID{driver, "n", "gpu-2"}, MemoryMiB: 81920, Shareable: true, Taints: []string{"k:NoSchedule"}},
	}
	n := NodeOf(gpus)
	a := Allocated{Held: map[DeviceID]bool{gpus[0].ID: true}, Consumed: map[DeviceID]int64{gpus[0].ID: 60*1024 + 1}}
	got := n.Shares(a)
	want := []struct {
		free  int64
		whole bool
	}{{80 - 61, false}, {0, true}, {0, false}}
	for i, g := range got {
		if g.UUID != gpus[i].ID.Device || g.Capacity != 80 || g.Free != want[i].free || g.WholeFree != want[i].whole {
			t.Fatalf("gpu %d: %+v, want %+v", i, g, want[i])
		}
	}
	if specs := n.Specs(); len(specs) != 3 || specs[1].Capacity != 80 || !specs[2].Healthy {
		t.Fatalf("specs %+v", specs)
	}
}

func TestAClaimAsksMemoryPerDevice(t *testing.T) {
	claim := &resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{
			{Name: "a", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com", Count: 2,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse("20Gi")}}}},
			{Name: "b", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}},
			{Name: "c", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com",
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"gpu.nvidia.com/memory": resource.MustParse("1500Mi")}}}},
		},
	}}}
	if got := ClaimUnits(claim); !reflect.DeepEqual(got, []int64{20, 20, 2}) {
		t.Fatalf("units %v", got)
	}
}

func TestProductsAreWrittenAsGfdLabelsThem(t *testing.T) {
	for name, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":               "NVIDIA-H100-80GB-HBM3",
		"Tesla T4 (rev  a1)":                  "Tesla-T4-rev-a1",
		"NVIDIA  A100-SXM4-80GB ":             "NVIDIA-A100-SXM4-80GB",
		"x" + string(make([]byte, 0)) + "Ünï": "xn",
	} {
		if got := ProductLabel(name); got != want {
			t.Errorf("%q: %q, want %q", name, got, want)
		}
	}
	long := ProductLabel("NVIDIA " + string(repeat('A', 60)) + " ..x")
	if len(long) > 63 || long[len(long)-1] == '-' {
		t.Errorf("long: %q", long)
	}
}

func repeat(c byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = c
	}
	return out
}

func TestMemoryIsWholeMiBRoundedDown(t *testing.T) {
	for text, want := range map[string]int64{"81559Mi": 81559, "80G": 76293, "1Mi": 1, "1048575": 0, "-1Gi": 0} {
		if got := MiB(resource.MustParse(text)); got != want {
			t.Errorf("%s: %d, want %d", text, got, want)
		}
	}
}
