package dra

import (
	"fmt"
	"strings"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// Node is a node's GPU facts from its devices of the class
// (extender/dra_index.py gpu_facts): the least of them decides product and memory,
// their blocking taints the health.
type Node struct {
	Gpus      []Gpu // in device-name order
	Count     int64 // the devices, clamped as allocatable is
	Product   string
	MemoryMiB int64 // -1: unknown
	// Unhealthy: each tainted device in words ("device gpu-1 (key=value:NoSchedule)").
	Unhealthy []string
	Shareable bool // some device allows multiple allocations
}

// NodeOf reads a node's devices (nil: none).
func NodeOf(gpus []Gpu) *Node {
	if len(gpus) == 0 {
		return nil
	}
	out := &Node{Gpus: gpus, Count: min(int64(len(gpus)), contract.MaxGpus)}
	least := gpus[0]
	for _, g := range gpus {
		if memoryKey(g) < memoryKey(least) || (memoryKey(g) == memoryKey(least) && g.Product < least.Product) {
			least = g
		}
		if len(g.Taints) > 0 {
			out.Unhealthy = append(out.Unhealthy, fmt.Sprintf("device %s (%s)", g.ID.Device, strings.Join(g.Taints, ", ")))
		}
		out.Shareable = out.Shareable || g.Shareable
	}
	out.Product, out.MemoryMiB = least.Product, least.MemoryMiB
	return out
}

// memoryKey orders devices by memory, an unknown memory first (as 0).
func memoryKey(g Gpu) int64 { return max(g.MemoryMiB, 0) }

// Healthy is the devices without a blocking taint.
func (n *Node) Healthy() int64 { return n.Count - int64(len(n.Unhealthy)) }

// Allocated is what claims hold, cluster-wide: the devices some claim has (whole or
// shared), and the memory (MiB) claims consume on each shareable one.
type Allocated struct {
	Held     map[DeviceID]bool
	Consumed map[DeviceID]int64
}

// Used is the node's devices in use: held by a claim and not tainted (a tainted
// device is out of the pool either way).
func (n *Node) Used(a Allocated) int64 {
	var used int64
	for _, g := range n.Gpus {
		if a.Held[g.ID] && len(g.Taints) == 0 {
			used++
		}
	}
	return used
}

// Specs are the node's devices as the GPUs shares are placed on (nil unless some
// device is shareable): named by device, capacity in units of one GiB.
func (n *Node) Specs() []sharing.Spec {
	if !n.Shareable {
		return nil
	}
	out := make([]sharing.Spec, len(n.Gpus))
	for i, g := range n.Gpus {
		out[i] = sharing.Spec{UUID: g.ID.Device, Capacity: sharing.Units(g.MemoryMiB, 0), Healthy: true}
	}
	return out
}

// Shares is each device's state for shares (extender/dra_shares.py, nil unless some
// device is shareable): a shareable device offers its memory less what claims
// consume; one that is not offers none; either is wholly free only while no claim
// holds it and it has no blocking taint.
func (n *Node) Shares(a Allocated) []sharing.Gpu {
	if !n.Shareable {
		return nil
	}
	out := make([]sharing.Gpu, len(n.Gpus))
	for i, g := range n.Gpus {
		capacity := sharing.Units(g.MemoryMiB, 0)
		tainted := len(g.Taints) > 0
		var free int64
		if g.Shareable && !tainted {
			consumed := a.Consumed[g.ID]
			free = max(capacity-(consumed+contract.ShareUnitMiB-1)/contract.ShareUnitMiB, 0)
		}
		out[i] = sharing.Gpu{UUID: g.ID.Device, Capacity: capacity, Free: free,
			WholeFree: !a.Held[g.ID] && !tainted && capacity > 0}
	}
	return out
}
