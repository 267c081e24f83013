// Package dra reads what the GPU rules need of Dynamic Resource Allocation
// (resource.k8s.io/v1): the devices of the DeviceClass serving nvidia.com/gpu that a
// DRA driver publishes for each node, which of them claims hold, and what shareable
// devices have left (the Go twin of gpu_scheduler/dra.py and extender/dra_index.py).
// Everything here is a pure function of API objects; kube-scheduler's shared DRA
// manager hands them over (gpuscheduler/dra.go).
package dra

import (
	"math"
	"sort"
	"strings"

	inf "gopkg.in/inf.v0"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// DeviceID names a device as a claim's allocation result does.
type DeviceID struct{ Driver, Pool, Device string }

// Gpu is one device of the GPU class published for a node.
type Gpu struct {
	ID        DeviceID
	Product   string // as GFD would label it; "": the driver names none
	MemoryMiB int64  // -1: no memory capacity
	// Taints: its NoSchedule/NoExecute taints (its own and DeviceTaintRules'), as
	// key=value:Effect; a pod asking for the extended resource tolerates none.
	Taints []string
	// Shareable: allowMultipleAllocations (consumable capacity): claims share it.
	Shareable bool
}

// Slice is what one ResourceSlice says of the GPU class: its pool, generation and the
// pool's slice count at that generation and, per node, its devices of the class.
type Slice struct {
	Driver, Pool string
	Generation   int64
	Count        int64 // resourceSliceCount
	Nodes        map[string][]Gpu
}

// ReadSlice reads a slice's node-local devices that match: those of a slice for one
// node (nodeName), or with perDeviceNodeSelection each device's own nodeName. Devices
// for a node selector or all nodes are no node's GPUs.
func ReadSlice(slice *resourceapi.ResourceSlice, matches func(driver string, device *resourceapi.Device) bool) Slice {
	spec := &slice.Spec
	out := Slice{Driver: spec.Driver, Pool: spec.Pool.Name, Generation: spec.Pool.Generation, Count: spec.Pool.ResourceSliceCount}
	perDevice := spec.PerDeviceNodeSelection != nil && *spec.PerDeviceNodeSelection
	for i := range spec.Devices {
		device := &spec.Devices[i]
		where := spec.NodeName
		if perDevice {
			where = device.NodeName
		}
		if where == nil || *where == "" || !matches(spec.Driver, device) {
			continue
		}
		if out.Nodes == nil {
			out.Nodes = map[string][]Gpu{}
		}
		out.Nodes[*where] = append(out.Nodes[*where], readGpu(spec.Driver, spec.Pool.Name, device))
	}
	return out
}

func readGpu(driver, pool string, device *resourceapi.Device) Gpu {
	gpu := Gpu{ID: DeviceID{driver, pool, device.Name}, MemoryMiB: -1, Taints: BlockingTaints(device.Taints)}
	gpu.Shareable = device.AllowMultipleAllocations != nil && *device.AllowMultipleAllocations
	for name, attr := range device.Attributes {
		if own(driver, string(name)) == contract.DraAttrProduct && attr.StringValue != nil && *attr.StringValue != "" {
			gpu.Product = ProductLabel(*attr.StringValue)
		}
	}
	for name, capacity := range device.Capacity {
		if own(driver, string(name)) == contract.DraCapacityMemory {
			if mib := MiB(capacity.Value); mib > 0 {
				gpu.MemoryMiB = mib
			}
		}
	}
	return gpu
}

// own is a qualified name's short name when its domain is the driver's (a name
// without a domain is the driver's), else "".
func own(driver, qualified string) string {
	at := strings.LastIndexByte(qualified, '/')
	if at < 0 {
		return qualified
	}
	if qualified[:at] != driver {
		return ""
	}
	return qualified[at+1:]
}

// MiB is a memory quantity in whole MiB, rounded down; 0 for a negative amount.
func MiB(q resource.Quantity) int64 {
	bytes := q.AsDec()
	if bytes.Sign() <= 0 {
		return 0
	}
	whole := new(inf.Dec).Round(bytes, 0, inf.RoundDown).UnscaledBig()
	if !whole.IsInt64() {
		return math.MaxInt64 >> 20
	}
	return whole.Int64() >> 20
}

// BlockingTaints are a device's taints that keep new pods off it (NoSchedule,
// NoExecute), as key=value:Effect, at most contract.DraMaxTaints of them.
func BlockingTaints(taints []resourceapi.DeviceTaint) []string {
	var out []string
	for _, taint := range taints {
		effect := string(taint.Effect)
		if taint.Key == "" || (effect != contract.DraBlockingEffects[0] && effect != contract.DraBlockingEffects[1]) {
			continue
		}
		text := clip(taint.Key, 253)
		if taint.Value != "" {
			text += "=" + clip(taint.Value, 63)
		}
		out = append(out, text+":"+effect)
		if len(out) >= contract.DraMaxTaints {
			break
		}
	}
	return out
}

func clip(text string, limit int) string {
	if runes := []rune(text); len(runes) > limit {
		return string(runes[:limit])
	}
	return text
}

// NodeGpus is each node's devices of the class over all slices (those without devices
// of the class too), as upstream's allocator gathers a node's pools (GatherPools): of
// each pool, the newest generation among the node's slices; used where the node has as
// many slices at it as the pool says, or else where the pool has that many at it over
// all nodes and no newer one anywhere. A pool being republished, or not all listed
// yet, gives the node none of its devices. In device-name order.
func NodeGpus(slices []Slice) map[string][]Gpu {
	type pool struct{ driver, name string }
	type nodePool struct {
		node string
		pool
	}
	newest := map[nodePool]int64{}
	top := map[pool]int64{}
	for _, s := range slices {
		p := pool{s.Driver, s.Pool}
		if g, ok := top[p]; !ok || s.Generation > g {
			top[p] = s.Generation
		}
		for node := range s.Nodes {
			k := nodePool{node, p}
			if g, ok := newest[k]; !ok || s.Generation > g {
				newest[k] = s.Generation
			}
		}
	}
	type tally struct{ have, want int64 }
	mine := map[nodePool]tally{} // the node's slices at its newest generation
	all := map[pool]map[int64]int64{}
	for _, s := range slices {
		p := pool{s.Driver, s.Pool}
		if all[p] == nil {
			all[p] = map[int64]int64{}
		}
		all[p][s.Generation]++
		for node := range s.Nodes {
			k := nodePool{node, p}
			if s.Generation == newest[k] {
				t := mine[k]
				t.have, t.want = t.have+1, max(t.want, s.Count)
				mine[k] = t
			}
		}
	}
	usable := func(k nodePool) bool {
		t := mine[k]
		if t.have == t.want {
			return true
		}
		return top[k.pool] == newest[k] && all[k.pool][newest[k]] == t.want
	}
	out := map[string][]Gpu{}
	for _, s := range slices {
		for node, gpus := range s.Nodes {
			k := nodePool{node, pool{s.Driver, s.Pool}}
			if s.Generation == newest[k] && usable(k) {
				out[node] = append(out[node], gpus...)
			}
		}
	}
	for _, gpus := range out {
		sort.Slice(gpus, func(i, j int) bool { return less(gpus[i].ID, gpus[j].ID) })
	}
	return out
}

func less(a, b DeviceID) bool {
	if a.Device != b.Device {
		return a.Device < b.Device
	}
	if a.Driver != b.Driver {
		return a.Driver < b.Driver
	}
	return a.Pool < b.Pool
}
