package workload

import (
	"slices"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// ShareFragments is FGD's measure on partial GPUs for one node
// (extender/share_columns.py, share_fragments), in units of GPU memory: what the share
// mix's classes can expect to be unable to use, weighted by how often each comes. A
// class that cannot run on the node at all finds all the free memory a fragment; a
// share class that can finds the GPUs with less free than its share; a whole-GPU class
// that can finds each partly used GPU, counted as unit units (one GPU's worth).
// free and capacity are the node's GPUs' (free below 0: a GPU taken whole meanwhile).
func ShareFragments(free, capacity []int64, mix []ShareClass, cpuMilli, ramMiB int64, unit float64) float64 {
	var total, wholly, partial int64
	for i, f := range free {
		usable := max(f, 0)
		total += usable
		whole := f == capacity[i] && capacity[i] > 0
		if whole {
			wholly++
		} else if usable > 0 {
			partial++
		}
	}
	var out float64
	for _, class := range mix {
		runs := cpuMilli >= class.CPUMilli && ramMiB >= class.RAMMiB
		frag := float64(total)
		if class.Kind == "share" {
			var small int64
			holds := false
			for _, f := range free {
				usable := max(f, 0)
				if usable < class.Size {
					small += usable
				} else if usable > 0 {
					holds = true
				}
			}
			if runs && holds {
				frag = float64(small)
			}
		} else if runs && wholly >= class.Size {
			frag = float64(partial) * unit
		}
		out += class.Weight * frag
	}
	return out
}

// Columns is a node's GPUs as two columns: free and capacity.
func Columns(gpus []sharing.Gpu) ([]int64, []int64) {
	free, capacity := make([]int64, len(gpus)), make([]int64, len(gpus))
	for i, g := range gpus {
		free[i], capacity[i] = g.Free, g.Capacity
	}
	return free, capacity
}

// PlacedColumn is the free column once a placement is made: the GPUs taken whole have 0.
func PlacedColumn(free []int64, p sharing.Placement, shares []int64) []int64 {
	out := slices.Clone(free)
	for _, i := range p.Whole {
		out[i] = 0
	}
	for k, i := range p.Shares {
		out[i] -= shares[k]
	}
	return out
}

// Median is numpy's median of the values (0 for none).
func Median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
