package gpuscheduler

import (
	"fmt"
	"strings"
	"sync"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// Usages keeps each sharing node's GPUs as the fit rule places its pods, per NodeInfo
// generation: a node is fitted once per change, and a preemption what-if (a clone
// with pods taken away, a generation of its own) gets its own answer.
type Usages struct {
	mu    sync.Mutex
	nodes map[string]usage
}

type usage struct {
	generation int64
	gpus       []sharing.Gpu
}

// NewUsages is an empty cache.
func NewUsages() *Usages { return &Usages{nodes: map[string]usage{}} }

// Of is the node's GPUs once its pods are placed on them (extender cache_shares:
// what the agent reports, then the pods it has not reported yet, in the order the
// node lists them).
func (u *Usages) Of(node *sharing.Node, info fwk.NodeInfo) []sharing.Gpu {
	name, generation := info.Node().Name, info.GetGeneration()
	u.mu.Lock()
	got, ok := u.nodes[name]
	u.mu.Unlock()
	if ok && got.generation == generation {
		return got.gpus
	}
	var bound []sharing.Bound
	for _, pi := range info.GetPods() {
		pod := pi.GetPod()
		whole := facts.GpuRequest(pod)
		shares, _ := facts.PodShares(pod)
		if whole > 0 || len(shares) > 0 {
			bound = append(bound, sharing.Bound{Key: string(pod.UID), Whole: whole, Shares: shares})
		}
	}
	gpus, _ := sharing.Usage(node.Gpus, node.Report, bound)
	u.mu.Lock()
	if len(u.nodes) > 1<<16 {
		clear(u.nodes)
	}
	u.nodes[name] = usage{generation, gpus}
	u.mu.Unlock()
	return gpus
}

// RefuseShares is the gpu rule for a pod asking shares (extender/policies/gpu.py):
// 0 where its shares (and whole GPUs) fit the node's GPUs by the fit rule.
func RefuseShares(pod *facts.Pod, f Fit) int {
	n := f.Node
	need := maxOf(pod.Shares)
	if n.Shared == nil {
		return contract.GpuNotShared
	}
	if code := refuseKind(pod, n); code != 0 {
		return code
	}
	short := sharing.Largest(f.Gpus) < need
	if !short && (len(pod.Shares) > 1 || pod.Gpus > 0) {
		_, fits := sharing.Fit(f.Gpus, pod.Shares, pod.Gpus)
		short = !fits
	}
	switch {
	case short && biggest(f.Gpus) < need:
		return contract.GpuShareTooBig
	case short:
		return contract.GpuShareNoRoom
	}
	return 0
}

// ShareWords puts a share refusal into the extender's words.
func ShareWords(pod *facts.Pod, gpus []sharing.Gpu, code int) string {
	need := maxOf(pod.Shares)
	if code == contract.GpuShareTooBig {
		return fmt.Sprintf("no GPU here has %d GiB (the largest has %d GiB); pod asks %s=%d of one GPU",
			need, biggest(gpus), contract.ResourceGpuMemory, need)
	}
	wholly, total := int64(0), int64(0)
	best := -1
	for i, g := range gpus {
		if g.WholeFree {
			wholly++
		}
		total += g.Free
		if best < 0 || g.Free > gpus[best].Free {
			best = i
		}
	}
	if pod.Gpus > 0 && wholly < pod.Gpus {
		return fmt.Sprintf("%d GPUs wholly free (none shared); pod requests %d", wholly, pod.Gpus)
	}
	parts := make([]string, len(pod.Shares))
	for i, s := range pod.Shares {
		parts[i] = fmt.Sprint(s)
	}
	asked := strings.Join(parts, "+")
	if best >= 0 && gpus[best].Free >= need {
		var pieces []string
		for _, g := range gpus[:min(len(gpus), 16)] {
			pieces = append(pieces, fmt.Sprint(g.Free))
		}
		return fmt.Sprintf("the shares %s GiB fit no set of its GPUs, one GPU each (free: %s GiB)", asked,
			strings.Join(pieces, ", "))
	}
	piece := "none"
	if best >= 0 {
		piece = fmt.Sprintf("%d GiB on %s", gpus[best].Free, gpus[best].UUID)
	}
	return fmt.Sprintf("no single GPU has %d GiB free: the largest free piece is %s (%d GiB free on %d "+
		"GPUs); pod asks %s GiB", need, piece, total, len(gpus), asked)
}

// notSharedWords is the refusal of a node that does not share its GPUs.
var notSharedWords = fmt.Sprintf("node does not share its GPUs (no %s label, no allocatable %s)",
	contract.LabelGpuSharing, contract.ResourceGpuMemory)

// BestFit is the gpu score of a share pod: the units left on the GPU its largest
// share goes to, fewest best under binpack, most under spread (a node where the fit
// rule finds no room: last).
func BestFit(pod *facts.Pod, gpus []sharing.Gpu, spread bool) float64 {
	left, fits := LeftAfter(gpus, pod.Shares, pod.Gpus)
	switch {
	case !fits && spread:
		return -1
	case !fits:
		return -(1 << 20)
	case spread:
		return float64(left)
	}
	return -float64(left)
}

// LeftAfter is what is left on the GPU the largest share goes to, right after it is
// placed (the extender's share_columns.place).
func LeftAfter(gpus []sharing.Gpu, shares []int64, whole int64) (int64, bool) {
	p, fits := sharing.Fit(gpus, shares, whole)
	if !fits {
		return 0, false
	}
	largest := 0
	for k, s := range shares {
		if s > shares[largest] {
			largest = k
		}
	}
	free := make([]int64, len(gpus))
	for i, g := range gpus {
		free[i] = g.Free
	}
	for k, i := range p.Shares {
		free[i] -= shares[k]
		if k == largest {
			return free[i], true
		}
	}
	return 0, true
}

func maxOf(values []int64) int64 {
	var top int64
	for _, v := range values {
		top = max(top, v)
	}
	return top
}

func biggest(gpus []sharing.Gpu) int64 {
	var top int64
	for _, g := range gpus {
		top = max(top, g.Capacity)
	}
	return top
}
