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

// Slice is what one ResourceSlice says of the GPU class: its pool and generation
// and, per node, its devices of the class.
type Slice struct {
	Driver, Pool string
	Generation   int64
	Nodes        map[string][]Gpu
}

// ReadSlice reads a slice's node-local devices that match: those of a slice for one
// node (nodeName), or with perDeviceNodeSelection each device's own nodeName. Devices
// for a node selector or all nodes are no node's GPUs.
func ReadSlice(slice *resourceapi.ResourceSlice, matches func(driver string, device *resourceapi.Device) bool) Slice {
	spec := &slice.Spec
	out := Slice{Driver: spec.Driver, Pool: spec.Pool.Name, Generation: spec.Pool.Generation}
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

// NodeGpus is each node's devices of the class over all slices: of each pool only the
// newest generation among the slices with devices on that node (older ones are on their
// way out), in device-name order. Per node, as the extender's index takes it and as
// kube-scheduler 1.34 gathers a node's pools: a pool whose slices on another node moved
// on first does not empty this one. 1.35+ allocates nothing from a pool while it is
// being republished or not listed whole; its own DRA filter holds that back, this rule
// stays the more permissive one on every minor.
func NodeGpus(slices []Slice) map[string][]Gpu {
	type pool struct{ node, driver, name string }
	newest := map[pool]int64{}
	for _, s := range slices {
		for node := range s.Nodes {
			key := pool{node, s.Driver, s.Pool}
			if g, ok := newest[key]; !ok || s.Generation > g {
				newest[key] = s.Generation
			}
		}
	}
	out := map[string][]Gpu{}
	for _, s := range slices {
		for node, gpus := range s.Nodes {
			if s.Generation == newest[pool{node, s.Driver, s.Pool}] {
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
