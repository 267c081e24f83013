package facts

import (
	"fmt"
	"strconv"

	inf "gopkg.in/inf.v0"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// PodShares is what a pod asks of shared GPUs (gpu_scheduler.sharing.pod_shares): the
// units of each container that asks a share, in the kubelet's order (init containers,
// sidecars among them, then app containers, each in spec order), or the words of a
// request no GPU could ever meet.
func PodShares(pod *v1.Pod) ([]int64, string) {
	var units []int64
	for _, group := range []struct {
		containers []v1.Container
		init       bool
	}{{pod.Spec.InitContainers, true}, {pod.Spec.Containers, false}} {
		for _, c := range group.containers {
			amount, named := request(c, contract.ResourceGpuMemory)
			if amount.IsZero() {
				if named {
					return nil, fmt.Sprintf("container %s asks 0 %s: ask at least 1 (GiB), or leave the "+
						"resource out", c.Name, contract.ResourceGpuMemory)
				}
				continue
			}
			sidecar := c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
			if group.init && !sidecar {
				return nil, fmt.Sprintf("init container %s asks %s: only app containers and sidecars "+
					"(restartPolicy: Always) may ask a GPU share", c.Name, contract.ResourceGpuMemory)
			}
			n, why := shareUnits(amount, c.Name)
			if why != "" {
				return nil, why
			}
			units = append(units, n)
			if whole, _ := request(c, contract.ResourceGpu); !whole.IsZero() {
				return nil, fmt.Sprintf("container %s asks both %s and %s: a container gets whole GPUs "+
					"or a share of one, not both", c.Name, contract.ResourceGpu, contract.ResourceGpuMemory)
			}
		}
	}
	return units, ""
}

// request is a container's request for a resource, a limit implying it, and whether
// the container names the resource at all.
func request(c v1.Container, name string) (resource.Quantity, bool) {
	key := v1.ResourceName(name)
	if q, ok := c.Resources.Requests[key]; ok {
		return q, true
	}
	q, ok := c.Resources.Limits[key]
	return q, ok
}

// shareUnits is a share's size in units, or why no GPU could ever meet it.
func shareUnits(amount resource.Quantity, name string) (int64, string) {
	value, ok := amount.AsInt64() // before AsDec, which turns amount into its inf.Dec form
	dec := amount.AsDec()
	text := dec.String()
	integral := dec.Scale() <= 0
	if !integral {
		// 2.0 is 2; 2.5 is not whole
		rounded := new(inf.Dec).Round(dec, 0, inf.RoundDown)
		integral = rounded.Cmp(dec) == 0
		if integral {
			text = rounded.String()
		}
	}
	if !integral {
		return 0, fmt.Sprintf("container %s: %s must be a whole number of GiB, got %s", name,
			contract.ResourceGpuMemory, text)
	}
	if !ok || value > contract.ShareMaxUnits {
		hint := ""
		if !ok || value >= 1<<20 {
			hint = " (the unit is 1 GiB: write 16, not 16Gi)"
		}
		if ok {
			text = strconv.FormatInt(value, 10)
		}
		return 0, fmt.Sprintf("container %s: %s=%s is more than any GPU has (at most %d GiB)%s", name,
			contract.ResourceGpuMemory, text, contract.ShareMaxUnits, hint)
	}
	return value, ""
}
