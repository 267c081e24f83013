package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// ClaimUnits is what a claim's requests ask of one shareable device each, in units of
// gpu-scheduler.io/gpu-memory (1 GiB, rounded up): a request asking capacity memory
// counts once per device it asks (count), in order (gpu_scheduler.dra
// claim_memory_requests); nil when none asks memory.
func ClaimUnits(claim *resourceapi.ResourceClaim) []int64 {
	var out []int64
	requests := claim.Spec.Devices.Requests
	for i := range requests[:min(len(requests), contract.DraMaxRequests)] {
		exactly := requests[i].Exactly
		if exactly == nil || exactly.Capacity == nil {
			continue
		}
		mib := MemoryMiB(exactly.Capacity.Requests)
		if mib <= 0 {
			continue
		}
		count := exactly.Count
		if count <= 0 || count > contract.DraMaxRequests {
			count = 1
		}
		units := min((mib+contract.ShareUnitMiB-1)/contract.ShareUnitMiB, contract.ShareMaxUnits)
		for range count {
			out = append(out, units)
		}
	}
	return out[:min(len(out), contract.DraMaxRequests)]
}

// MemoryMiB is the memory in a map of capacity names to quantities ("memory" in any
// domain; several are summed, a negative one counts 0), in MiB.
func MemoryMiB[Name ~string](capacities map[Name]resource.Quantity) int64 {
	var total int64
	for name, q := range capacities {
		if short(string(name)) == contract.DraCapacityMemory {
			total += MiB(q)
		}
	}
	return total
}

func short(qualified string) string {
	for i := len(qualified) - 1; i >= 0; i-- {
		if qualified[i] == '/' {
			return qualified[i+1:]
		}
	}
	return qualified
}
