package sharing

import (
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// ReadNode reads a sharing node from its labels, annotations and allocatable units
// (extender.model._shared_node): nil for a node that does not share (no sharing mode
// label and no allocatable units). count and memoryMiB are the labels' GPU count and
// memory per GPU (-1: none readable).
func ReadNode(labels, annotations map[string]string, units, count, memoryMiB int64) *Node {
	mode, labelled := labels[contract.LabelGpuSharing]
	if !slices.Contains(contract.SharingModes, mode) && units <= 0 {
		return nil
	}
	if !labelled {
		mode = "unlabelled"
	}
	return &Node{
		Mode:   mode,
		Gpus:   ReadGpus(annotations[contract.AnnGpus], count, memoryMiB),
		Report: ReadReport(annotations[contract.AnnGpuShares]),
		Units:  units,
	}
}

// ReadGpus is a sharing node's GPUs in index order (gpu_scheduler.sharing.node_gpus):
// from the agent's per-GPU annotation (UUID, memory, reserve, health; a GPU in MIG
// mode is not shared), else count GPUs of memoryMiB from the labels, named gpu-0,
// gpu-1... Empty when neither can be read.
func ReadGpus(annotation string, count, memoryMiB int64) []Spec {
	var entries []any
	if annotation != "" && len(annotation) <= contract.MaxGpusAnnotation && Decode(annotation, &entries) &&
		len(entries) > 0 && len(entries) <= contract.ShareMaxGpus {
		gpus := make([]Spec, 0, len(entries))
		for _, item := range entries {
			entry, ok := item.(map[string]any)
			if !ok {
				return nil
			}
			uuid, ok := entry[contract.GpuUuid].(string)
			if !ok || uuid == "" || utf8.RuneCountInString(uuid) > 128 {
				return nil
			}
			var units int64
			if memory, ok := entry[contract.GpuMemoryMib].(json.Number); ok {
				if mib, isInt := Int(memory); isInt {
					reserved := int64(0)
					if r, ok := entry[contract.GpuReservedMib].(json.Number); ok {
						if v, isInt := Int(r); isInt && v > 0 {
							reserved = v
						}
					}
					units = Units(mib, reserved)
				}
			}
			mig := entry[contract.GpuMigEnabled] == true
			healthy := entry[contract.GpuHealthy] != false && !mig
			if mig {
				units = 0
			}
			gpus = append(gpus, Spec{uuid, units, healthy})
		}
		return gpus
	}
	if count <= 0 || count > contract.ShareMaxGpus {
		return nil
	}
	units := Units(memoryMiB, 0)
	gpus := make([]Spec, count)
	for i := range gpus {
		gpus[i] = Spec{"gpu-" + strconv.Itoa(i), units, units > 0}
	}
	return gpus
}
