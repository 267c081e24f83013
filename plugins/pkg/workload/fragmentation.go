package workload

import (
	"math"
	"slices"
)

// Unlimited stands for a node's CPU or memory where it advertises none.
const Unlimited = int64(1) << 62

// Quantise rounds a fragmentation score to 9 decimals as numpy's round(x, 9) does, as
// the extender rounds it: sums of the same shares added in another order (numpy's,
// Go's) then rank nodes alike.
func Quantise(value float64) float64 { return math.RoundToEven(value*1e9) / 1e9 }

// State is a node as the fragmentation measure reads it: free GPUs, free CPU
// (millicores) and memory (MiB) beside them, and its GPU model.
type State struct {
	Free, CPUMilli, RAMMiB int64
	Model                  string
	ModelCode              int32 // facts.ModelCodeOf(Model); -1: not numbered
}

type key struct {
	free, cpuAt, ramAt int
	model              int32
}

// MaxMemo bounds the states remembered per mix.
const MaxMemo = 1 << 16

// Fragmentation is FGD's expected fragmentation over one mix
// (extender/policies/fragmentation.py): a node's free GPUs are fragmented for a shape
// that cannot run there (too few free GPUs, too little free CPU or memory, a product
// it is not allowed on), and F(node) = free GPUs x the share of the mix that cannot.
type Fragmentation struct {
	mix       Mix
	cpuLevels []int64
	ramLevels []int64
	products  []map[string]bool // per shape; nil: any model
	top       int64
	memo      map[key]float64
}

// NewFragmentation is the measure for a mix.
func NewFragmentation(mix Mix) *Fragmentation {
	f := &Fragmentation{mix: mix, products: make([]map[string]bool, len(mix)), memo: map[key]float64{}}
	for i, entry := range mix {
		s := entry.Shape
		f.cpuLevels = append(f.cpuLevels, s.CPUMilli)
		f.ramLevels = append(f.ramLevels, s.RAMMiB)
		f.top = max(f.top, s.Gpus)
		if s.Restricted() {
			f.products[i] = map[string]bool{}
			for _, p := range s.ProductList() {
				f.products[i][p] = true
			}
		}
	}
	slices.Sort(f.cpuLevels)
	slices.Sort(f.ramLevels)
	f.cpuLevels, f.ramLevels = slices.Compact(f.cpuLevels), slices.Compact(f.ramLevels)
	return f
}

// Mix is the mix the measure is for.
func (f *Fragmentation) Mix() Mix { return f.mix }

// levelsAt is how many levels are at most value.
func levelsAt(levels []int64, value int64) int {
	at, found := slices.BinarySearch(levels, value)
	if found {
		at++
	}
	return at
}

// F is a node's expected fragmentation.
func (f *Fragmentation) F(s State) float64 {
	if s.Free <= 0 {
		return 0
	}
	k := key{int(min(s.Free, f.top)), levelsAt(f.cpuLevels, s.CPUMilli), levelsAt(f.ramLevels, s.RAMMiB), s.ModelCode}
	fitting, ok := f.memo[k]
	if !ok || s.ModelCode < 0 {
		fitting = 0
		for i, entry := range f.mix {
			shape := entry.Shape
			if shape.Gpus <= s.Free && shape.CPUMilli <= s.CPUMilli && shape.RAMMiB <= s.RAMMiB &&
				(f.products[i] == nil || (s.Model != "" && f.products[i][s.Model])) {
				fitting += entry.Share
			}
		}
		if len(f.memo) >= MaxMemo {
			clear(f.memo)
		}
		if s.ModelCode >= 0 {
			f.memo[k] = fitting
		}
	}
	return float64(s.Free) * (1 - fitting)
}

// Gain is F(before) - F(after placing a pod of gpus, cpu and memory): the smaller the
// increase in fragmentation, the higher.
func (f *Fragmentation) Gain(before State, gpus, cpuMilli, ramMiB int64) float64 {
	after := State{before.Free - gpus, Sub(before.CPUMilli, cpuMilli), Sub(before.RAMMiB, ramMiB), before.Model, before.ModelCode}
	return Quantise(f.F(before) - f.F(after))
}

// Sub is a - b within the extender's column bounds (its arithmetic cannot overflow).
func Sub(a, b int64) int64 {
	const limit = int64(1) << 61
	return a - min(max(b, -limit), limit)
}
