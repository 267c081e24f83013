// Package score holds what the plugins' scores share: the extender's normalisation.
package score

import "github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"

// Normalise stretches raw scores min-max onto 0..top, as the extender does onto 0..10
// (all alike: every node gets top).
func Normalise(raw []int64, top int64) []int64 {
	out := make([]int64, len(raw))
	low, high := bounds(raw)
	for i, r := range raw {
		if high == low {
			out[i] = top
		} else {
			out[i] = (r - low) * top / (high - low)
		}
	}
	return out
}

// NormaliseList is Normalise over a NormalizeScore list, onto 0..MaxNodeScore.
func NormaliseList(scores fwk.NodeScoreList) {
	raw := make([]int64, len(scores))
	for i := range scores {
		raw[i] = scores[i].Score
	}
	for i, s := range Normalise(raw, fwk.MaxNodeScore) {
		scores[i].Score = s
	}
}

// Stretch is the extender's normalisation of one policy's scores onto 0..10 (floats):
// min-max over the nodes, every node 10 where all are alike.
func Stretch(raw []float64) []float64 {
	out := make([]float64, len(raw))
	low, high := bounds(raw)
	for i, r := range raw {
		if high == low {
			out[i] = 10
		} else {
			out[i] = (r - low) * (10 / (high - low))
		}
	}
	return out
}

// bounds is the lowest and the highest of the values (zeros for none).
func bounds[T int64 | float64](values []T) (T, T) {
	var low, high T
	for i, v := range values {
		if i == 0 {
			low, high = v, v
		}
		low, high = min(low, v), max(high, v)
	}
	return low, high
}
