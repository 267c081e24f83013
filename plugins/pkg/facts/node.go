// Package facts reads what the GPU decisions need from Node and Pod objects, once: the
// Go twin of extender/model.py. Every key it reads comes from the generated contract.
package facts

import (
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// Node is what the plugins know about one node, from its labels, allocatable and the
// agent's annotation (extender.model.NodeFacts).
type Node struct {
	Name string
	// Allocatable nvidia.com/gpu (whole GPUs, MIG devices, or replicas), clamped.
	Allocatable int64
	Labelled    bool
	// MemoryMiB is what one pod can count on per GPU (divided by replicas); -1: no label.
	MemoryMiB int64
	Product   string
	// Model is Product without GFD's -SHARED suffix; ModelCode its number (ModelCodeOf).
	Model        string
	ModelCode    int32
	CapacityType string // "spot", "on-demand", or "" (no cloud's label: on-demand)
	Zone         string
	Replicas     int64
	Health       *Health
	// Shared: the agent's device plugin shares these GPUs (gpu-scheduler.io/gpu-sharing
	// or allocatable gpu-scheduler.io/gpu-memory); nil: it does not.
	Shared *sharing.Node
	// Allocatable CPU (millicores) and memory (MiB); -1: not advertised.
	CPUMilli, RAMMiB int64
	// DRA: the GPU facts are a DRA driver's devices (gpuscheduler/dra.go); their
	// health (device taints) is the driver's word, believed without an agent.
	DRA bool
}

// Usable is the GPUs a pod can be given: Allocatable, and on an agent-managed node (or
// a DRA node) no more than the agent (or the driver) reads healthy.
func (n *Node) Usable(managed bool) int64 {
	if n.Health == nil || !(managed || n.DRA) {
		return n.Allocatable
	}
	return n.Health.Usable(n.Allocatable)
}

// Unhealthy lists the sick GPUs in words where they are believed (managed nodes, DRA
// nodes).
func (n *Node) Unhealthy(managed bool) []string {
	if n.Health == nil || !(managed || n.DRA) {
		return nil
	}
	return n.Health.Unhealthy
}

// ReadNode reads a Node (Nodes.Of: once per resourceVersion).
func ReadNode(node *v1.Node) *Node {
	labels := node.Labels
	out := &Node{Name: node.Name, MemoryMiB: -1, Replicas: 1, CPUMilli: -1, RAMMiB: -1}
	if q, ok := node.Status.Allocatable[v1.ResourceCPU]; ok {
		out.CPUMilli = Down(&q, 1000, 0)
	}
	if q, ok := node.Status.Allocatable[v1.ResourceMemory]; ok {
		out.RAMMiB = Down(&q, 1, 20)
	}
	if q, ok := node.Status.Allocatable[v1.ResourceName(contract.ResourceGpu)]; ok {
		out.Allocatable = min(max(q.Value(), 0), contract.MaxGpus)
	}
	_, counted := labels[contract.LabelGpuCount]
	out.Labelled = labels[contract.LabelGpuPresent] == "true" || counted
	out.Replicas = replicas(labels[contract.LabelGpuReplicas])
	if labels[contract.LabelGkeGpuSharingStrategy] != "" {
		out.Replicas = max(out.Replicas, replicas(labels[contract.LabelGkeMaxSharedClients]))
	}
	if memory, ok := nodeMemory(labels); ok {
		out.MemoryMiB = memory / out.Replicas
	}
	out.Product = labels[contract.LabelGpuProduct]
	out.Model = strings.TrimSuffix(out.Product, contract.SharedSuffix)
	out.ModelCode = ModelCodeOf(out.Model)
	out.CapacityType = CapacityType(labels)
	out.Zone = labels[contract.LabelZone]
	migSingle := out.Product != "" && strings.Contains(out.Product, contract.MigPart)
	out.Health = ReadHealth(node.Annotations[contract.AnnGpus], out.Replicas, migSingle)
	var units int64
	if q, ok := node.Status.Allocatable[v1.ResourceName(contract.ResourceGpuMemory)]; ok {
		units = min(max(q.Value(), 0), contract.ShareMaxUnits*64)
	}
	count, counted := LabelInt(labels[contract.LabelGpuCount])
	if !counted {
		count = -1
	}
	memory, known := nodeMemory(labels)
	if !known {
		memory = -1
	}
	out.Shared = sharing.ReadNode(labels, node.Annotations, units, count, memory)
	return out
}

// CapacityType: "spot" when any cloud's spot label carries its spot value,
// "on-demand" when one of those keys carries another value, else "".
func CapacityType(labels map[string]string) string {
	known := false
	for _, pair := range contract.SpotLabels {
		value, ok := labels[pair[0]]
		if !ok {
			continue
		}
		if value == pair[1] {
			return "spot"
		}
		known = true
	}
	if known {
		return "on-demand"
	}
	return ""
}

// LabelInt reads a label value as node affinity's Gt/Lt do: plain digits within int64.
func LabelInt(value string) (int64, bool) {
	if value == "" || len(value) > 63 || strings.Trim(value, "0123456789") != "" {
		return 0, false
	}
	number, err := strconv.ParseInt(value, 10, 64)
	return number, err == nil
}

func nodeMemory(labels map[string]string) (int64, bool) {
	key := contract.LabelGpuMemory
	if _, ok := labels[key]; !ok {
		key = contract.LabelGpuMemoryLegacy
	}
	return LabelInt(labels[key])
}

// replicas is GFD's gpu.replicas as a divisor: 1 unless it says the GPU is shared.
func replicas(value string) int64 {
	if value != "" && len(value) <= 5 && strings.Trim(value, "0123456789") == "" {
		number, _ := strconv.ParseInt(value, 10, 64)
		return max(1, number)
	}
	return 1
}

// Cache keeps each node's facts for its resourceVersion: a node is read once per
// change, not once per Filter and Score call. Two levels: the facts of each Node
// object already read, by pointer, in a map that is only ever replaced, never written
// (Filter runs on 16 goroutines at once; a read lock's shared counter, or sync.Map's
// hashing of an interface key, was the plugins' costliest line there); and behind it,
// by name under a lock, the facts of each node's last resourceVersion, so that a Node
// object decoded again at the same version is not read again.
type Cache struct {
	mu    sync.RWMutex
	nodes map[string]cached

	objects atomic.Pointer[map[*v1.Node]*Node] // never written once published
	fresh   struct {
		sync.Mutex
		objects   map[*v1.Node]*Node // read since the last publication
		published time.Time
	}
}

type cached struct {
	version string
	facts   *Node
}

// NewCache is an empty cache.
func NewCache() *Cache { return &Cache{nodes: map[string]cached{}} }

// Nodes is the facts cache the plugins share: what they read of a node is the same
// for every profile and plugin.
var Nodes = NewCache()

// Publication of the objects read since the last: after publishEvery of them, or
// publishAfter since the last (a map of 5,000 pointers takes about 0.1 ms to copy).
// Objects of nodes changed since stay in the map until it holds staleObjects more
// than the nodes known, then it starts over from the fresh ones.
const (
	publishEvery = 64
	publishAfter = 50 * time.Millisecond
	staleObjects = 1024
)

// Of gives the node's facts, read again only when its resourceVersion changed (an
// object without one, as in tests, is read every time).
func (c *Cache) Of(node *v1.Node) *Node {
	if objects := c.objects.Load(); objects != nil {
		if facts, ok := (*objects)[node]; ok {
			return facts
		}
	}
	version := node.ResourceVersion
	if version == "" {
		return ReadNode(node)
	}
	c.mu.RLock()
	got, ok := c.nodes[node.Name]
	c.mu.RUnlock()
	facts := got.facts
	if !ok || got.version != version {
		facts = ReadNode(node)
		c.mu.Lock()
		c.nodes[node.Name] = cached{version, facts}
		c.mu.Unlock()
	}
	c.remember(node, facts)
	return facts
}

// remember keeps an object's facts for the next publication, and publishes when due.
func (c *Cache) remember(node *v1.Node, facts *Node) {
	c.fresh.Lock()
	defer c.fresh.Unlock()
	if c.fresh.objects == nil {
		c.fresh.objects = map[*v1.Node]*Node{}
	}
	c.fresh.objects[node] = facts
	now := time.Now()
	if len(c.fresh.objects) < publishEvery && now.Sub(c.fresh.published) < publishAfter {
		return
	}
	var before map[*v1.Node]*Node
	if objects := c.objects.Load(); objects != nil {
		before = *objects
	}
	next := make(map[*v1.Node]*Node, len(before)+len(c.fresh.objects))
	c.mu.RLock()
	known := len(c.nodes)
	if len(before) > known+staleObjects {
		// objects of earlier versions and of deleted nodes: keep only the current ones
		for node, facts := range before {
			if got, ok := c.nodes[node.Name]; ok && got.version == node.ResourceVersion {
				next[node] = facts
			}
		}
	} else {
		maps.Copy(next, before)
	}
	c.mu.RUnlock()
	maps.Copy(next, c.fresh.objects)
	c.objects.Store(&next)
	c.fresh.objects = nil
	c.fresh.published = now
}

// Forget drops a deleted node's facts (its objects leave the published map at the
// next pruning).
func (c *Cache) Forget(name string) {
	c.mu.Lock()
	delete(c.nodes, name)
	c.mu.Unlock()
}

// ForgetDeleted has the cache forget the nodes an informer reports deleted
// (kube-scheduler's own Node informer).
func (c *Cache) ForgetDeleted(informer cache.SharedIndexInformer) error {
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if node, ok := Deleted[*v1.Node](obj); ok {
			c.Forget(node.Name)
		}
	}})
	return err
}

// MaxModelCodes bounds the GPU models numbered; past it a model gets -1 (a label
// value is anyone's to write).
const MaxModelCodes = 1 << 16

var modelCodes = struct {
	sync.Mutex
	codes map[string]int32
}{codes: map[string]int32{"": 0}}

// ModelCodeOf numbers GPU models once for the process: 0 for none, -1 past
// MaxModelCodes. What reads many nodes a pod keys by the number, not the string.
func ModelCodeOf(model string) int32 {
	modelCodes.Lock()
	defer modelCodes.Unlock()
	code, ok := modelCodes.codes[model]
	if !ok {
		if len(modelCodes.codes) >= MaxModelCodes {
			return -1
		}
		code = int32(len(modelCodes.codes))
		modelCodes.codes[model] = code
	}
	return code
}
