package gpuscheduler

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// Fit is one node as the gpu rule reads it: its facts, whether its agent is believed
// (it holds a heartbeat Lease), and the GPUs its pods already request.
type Fit struct {
	Node    *facts.Node
	Managed bool
	Renewed time.Time // its agent's last heartbeat (Managed: it has one)
	Used    int64
	// Gpus: a sharing node's GPUs as the fit rule places its pods (nil elsewhere).
	Gpus []sharing.Gpu
}

// Free is the GPUs left to a new pod (may be negative while a sick GPU is still held);
// on a sharing node no more than its wholly free GPUs.
func (f Fit) Free() int64 {
	free := f.Node.Usable(f.Managed) - f.Used
	if f.Node.Shared != nil {
		wholly := int64(0)
		for _, g := range f.Gpus {
			if g.WholeFree {
				wholly++
			}
		}
		free = min(free, wholly)
	}
	return free
}

// RefuseAny is the gpu rule for any pod: RefuseShares for one asking shares, else
// Refuse.
func RefuseAny(pod *facts.Pod, f Fit) int {
	if len(pod.Shares) > 0 {
		return RefuseShares(pod, f)
	}
	return Refuse(pod, f)
}

// Refuse is the gpu rule for a whole-GPU pod (extender/policies/gpu.py, refuse): 0
// where the pod fits, else the first refusal code that holds.
func Refuse(pod *facts.Pod, f Fit) int {
	n, want := f.Node, pod.Gpus
	switch {
	case n.Allocatable == 0 && !n.Labelled:
		return contract.GpuNoGpus
	case n.Allocatable == 0:
		return contract.GpuNotAdvertised
	}
	if code := refuseKind(pod, n); code != 0 {
		return code
	}
	switch {
	case n.Allocatable < want:
		return contract.GpuTooFew
	case n.Usable(f.Managed) < want:
		return contract.GpuUnhealthy
	case f.Free() < want:
		return contract.GpuBusy
	}
	return 0
}

// refuseKind is the part of the gpu rule about the kind of GPU, whole or shared: the
// pod's products, its GPU memory per GPU.
func refuseKind(pod *facts.Pod, n *facts.Node) int {
	switch {
	case pod.Products != nil && (n.Model == "" || !pod.Products[n.Model]):
		return contract.GpuProduct
	case pod.MinMemory >= 0 && n.MemoryMiB < 0:
		return contract.GpuNoMemoryLabel
	case pod.MinMemory >= 0 && n.MemoryMiB < pod.MinMemory:
		return contract.GpuLowMemory
	}
	return 0
}

// Words puts a refusal code into the extender's words (the conformance suite holds
// them equal: `gpu-scheduler explain` and the troubleshooting guide serve both paths).
func Words(pod *facts.Pod, f Fit, code int) string {
	n, want := f.Node, pod.Gpus
	switch code {
	case contract.GpuNotShared:
		return notSharedWords
	case contract.GpuShareTooBig, contract.GpuShareNoRoom:
		return ShareWords(pod, f.Gpus, code)
	case contract.GpuNoGpus:
		return fmt.Sprintf("node has no GPUs (no allocatable %s)", contract.ResourceGpu)
	case contract.GpuNotAdvertised:
		return fmt.Sprintf("node is labelled with GPUs but advertises no allocatable %s yet",
			contract.ResourceGpu)
	case contract.GpuProduct:
		have := n.Product
		if have == "" {
			have = fmt.Sprintf("unknown (no %s label)", contract.LabelGpuProduct)
		}
		return fmt.Sprintf("GPU product %s is not one of %s=%s", have, contract.AnnGpuProducts,
			strings.Join(facts.SortedProducts(pod.Products), ","))
	case contract.GpuNoMemoryLabel:
		return fmt.Sprintf("node publishes no GPU memory label (%s); %s needs it",
			contract.LabelGpuMemory, contract.AnnMinGpuMemory)
	case contract.GpuLowMemory:
		return fmt.Sprintf("GPU memory %d MiB per GPU is below %s=%d MiB", n.MemoryMiB,
			contract.AnnMinGpuMemory, pod.MinMemory)
	case contract.GpuTooFew:
		return fmt.Sprintf("node has %d GPUs in all; pod requests %d", n.Allocatable, want)
	}
	usable := n.Usable(f.Managed)
	sick := n.Unhealthy(f.Managed)
	if code == contract.GpuUnhealthy {
		list := strings.Join(sick, ", ")
		if list == "" {
			list = "unknown"
		}
		return fmt.Sprintf("%d of %d GPUs healthy; pod requests %d; unhealthy: %s", usable,
			n.Allocatable, want, list)
	}
	note := ""
	if usable < n.Allocatable {
		note = fmt.Sprintf(" (%d unhealthy)", len(sick))
	}
	return fmt.Sprintf("%d of %d GPUs free%s; pod requests %d", max(f.Free(), 0), usable, note, want)
}

// Unresolvable: no change in the cluster's load heals the code.
func Unresolvable(code int) bool { return contract.GpuUnresolvable[code] }

// rawOf is the gpu score before normalisation (higher is better), from a node's view
// (and its GPUs, for a pod asking shares): binpack leaves the fewest GPUs free, spread
// the most; a CPU pod prefers nodes without GPUs.
func rawOf(pod *facts.Pod, v *view, gpus []sharing.Gpu, spread bool) float64 {
	switch {
	case len(pod.Shares) > 0:
		return BestFit(pod, gpus, spread)
	case pod.Gpus == 0:
		if v.gpuNode {
			return 0
		}
		return 1
	case spread:
		return float64(v.free - pod.Gpus)
	}
	return float64(pod.Gpus - v.free)
}
