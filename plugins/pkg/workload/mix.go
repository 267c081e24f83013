// Package workload is what the scarcity and fragmentation scores read of the whole
// cluster (extender/workload.py): the shapes of the GPU pods it runs and their mix,
// and per GPU model the pressure of the demand restricted to it. Cluster keeps them
// from kube-scheduler's snapshot, node by node as nodes change.
package workload

import (
	"math"
	"slices"
	"strings"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// MaxShapes and Coverage: the mix keeps the shapes that weigh most, at most MaxShapes
// of them and only as many as cover Coverage of the weight.
const (
	MaxShapes = 128
	Coverage  = 0.95
	// Decimals: weights are ordered, and their coverage compared, to this many
	// decimals, as the extender does (extender/workload.py): a float sum's last bits
	// depend on its order, which a map's iteration does not keep.
	Decimals = 12
	// RefreshShare: the mix is worked out again once the pods placed and gone since
	// the last time reach this share of the pods counted now, or a shape came or went.
	RefreshShare = 0.01
)

// Shape is what decides where a GPU pod can go: whole GPUs, CPU and memory on a coarse
// grid, and the products it is restricted to ("": any; else sorted, comma-joined).
type Shape struct {
	Gpus     int64
	CPUMilli int64
	RAMMiB   int64
	Products string
}

// Restricted: the shape may run on some products only.
func (s Shape) Restricted() bool { return s.Products != "" }

// ProductList is the shape's products.
func (s Shape) ProductList() []string {
	if s.Products == "" {
		return nil
	}
	return strings.Split(s.Products, ",")
}

func roundUp(value, step int64) int64 { return -floorDiv(-value, step) * step }

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// ShapeOf is a GPU pod's shape: CPU rounded up to whole cores (4 cores above 16),
// memory to 4 GiB (16 GiB above 64 GiB).
func ShapeOf(gpus, cpuMilli, ramMiB int64, products []string) Shape {
	cpuStep, ramStep := int64(1000), int64(4096)
	if cpuMilli > 16000 {
		cpuStep = 4000
	}
	if ramMiB > 65536 {
		ramStep = 16384
	}
	joined := ""
	if len(products) > 0 {
		sorted := slices.Clone(products)
		slices.Sort(sorted)
		joined = strings.Join(sorted, ",")
	}
	return Shape{gpus, roundUp(cpuMilli, cpuStep), roundUp(ramMiB, ramStep), joined}
}

var scale = math.Pow10(Decimals)

// rounded is x to Decimals decimals, scaled to a whole number.
func rounded(x float64) float64 { return math.Round(x * scale) }

// Entry is one kept shape and its share of the kept weight (the shares sum to 1).
type Entry struct {
	Shape Shape
	Share float64
}

// Mix is the kept shapes, heaviest first.
type Mix []Entry

// weights: a restricted shape weighs its share of the pods; the unrestricted shapes
// split the rest by pods x GPUs^a, a twice the share of the GPUs asked that
// multi-GPU pods ask (at most 1).
func weights(counts map[Shape]int64) map[Shape]float64 {
	var pods, asked, multi int64
	for shape, count := range counts {
		pods += count
		asked += count * max(shape.Gpus, 1)
		if shape.Gpus > 1 {
			multi += count * shape.Gpus
		}
	}
	if pods == 0 {
		return nil
	}
	power := min(1.0, 2.0*float64(multi)/float64(asked))
	grown := map[Shape]float64{}
	var grownSum float64
	var grownPods int64
	for shape, count := range counts {
		if shape.Restricted() {
			continue
		}
		grown[shape] = float64(count) * math.Pow(float64(max(shape.Gpus, 1)), power)
		grownSum += grown[shape]
		grownPods += count
	}
	if grownSum == 0 {
		grownSum = 1
	}
	rest := float64(grownPods) / float64(pods) / grownSum
	out := make(map[Shape]float64, len(counts))
	for shape, count := range counts {
		if g, ok := grown[shape]; ok {
			out[shape] = g * rest
		} else {
			out[shape] = float64(count) / float64(pods)
		}
	}
	return out
}

// MixOf is the shapes that weigh most with their share of the kept weight, heaviest
// first (ties: fewer GPUs, less CPU, less memory, products, as the extender orders).
func MixOf(counts map[Shape]int64) Mix {
	w := weights(counts)
	var total float64
	type item struct {
		shape  Shape
		weight float64
	}
	items := make([]item, 0, len(w))
	for shape, weight := range w {
		items = append(items, item{shape, weight})
	}
	// The total's last bits depend on the order (the extender sums in its dict's):
	// the cutoff compares it to Decimals decimals.
	for _, it := range items {
		total += it.weight
	}
	if total <= 0 {
		return nil
	}
	slices.SortFunc(items, func(a, b item) int {
		switch aw, bw := rounded(a.weight), rounded(b.weight); {
		case aw != bw:
			if aw > bw {
				return -1
			}
			return 1
		case a.shape.Gpus != b.shape.Gpus:
			return int(a.shape.Gpus - b.shape.Gpus)
		case a.shape.CPUMilli != b.shape.CPUMilli:
			return cmp64(a.shape.CPUMilli, b.shape.CPUMilli)
		case a.shape.RAMMiB != b.shape.RAMMiB:
			return cmp64(a.shape.RAMMiB, b.shape.RAMMiB)
		}
		return slices.Compare(a.shape.ProductList(), b.shape.ProductList())
	})
	var covered float64
	kept, enough := 0, rounded(Coverage*total)
	for _, it := range items {
		kept++
		covered += it.weight
		if kept >= MaxShapes || rounded(covered) >= enough {
			break
		}
	}
	mix := make(Mix, kept)
	for i := range kept {
		mix[i] = Entry{items[i].shape, items[i].weight / covered}
	}
	return mix
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Counts is the count of placed GPU pods by shape, and their mix: Mix answers the same
// value until the counts have moved by RefreshShare of the pods or a shape came or went
// (the fragmentation score's table is kept per mix).
type Counts struct {
	counts map[Shape]int64
	mix    Mix
	fresh  bool
	moved  int64
	pods   int64
}

// NewCounts is an empty count.
func NewCounts() *Counts { return &Counts{counts: map[Shape]int64{}} }

// Add counts delta pods of a shape.
func (c *Counts) Add(shape Shape, delta int64) {
	count := c.counts[shape] + delta
	if count > 0 {
		c.counts[shape] = count
	} else {
		delete(c.counts, shape)
	}
	if count <= 0 || count == delta {
		c.fresh = false
	}
	c.pods += delta
	c.moved += abs(delta)
}

// Mix is the current mix (see Counts).
func (c *Counts) Mix() Mix {
	if !c.fresh || float64(c.moved) >= RefreshShare*float64(max(c.pods, 1)) {
		c.mix, c.fresh, c.moved = MixOf(c.counts), true, 0
	}
	return c.mix
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// Pressure is, per GPU model, the share of GPU demand that can only run on it over its
// share of the cluster's GPUs (empty without demand or GPUs).
func Pressure(demand map[string]float64, totalDemand float64, capacity map[string]int64) map[string]float64 {
	var totalCapacity int64
	for _, amount := range capacity {
		totalCapacity += amount
	}
	if totalDemand == 0 || totalCapacity == 0 {
		return nil
	}
	out := make(map[string]float64, len(capacity))
	for product, amount := range capacity {
		if amount > 0 {
			out[product] = (demand[product] / totalDemand) / (float64(amount) / float64(totalCapacity))
		}
	}
	return out
}

// ClassKey is a class of what placed pods ask of GPUs: kind "share" (size: units of
// one GPU) or "whole" (size: GPUs), with the CPU and memory beside it on the mix's grid.
type ClassKey struct {
	Kind     string
	Size     int64
	CPUMilli int64
	RAMMiB   int64
}

// ShareClass is a class and its share of the placed pods' classes.
type ShareClass struct {
	ClassKey
	Weight float64
}

// ShareMixOf is the heaviest classes (at most contract.ShareMaxClasses; ties in the
// classes' order), weights summing to 1; empty where no pod asks a share.
func ShareMixOf(counts map[ClassKey]int64) []ShareClass {
	type item struct {
		key   ClassKey
		count int64
	}
	items := make([]item, 0, len(counts))
	shares := false
	for key, count := range counts {
		items = append(items, item{key, count})
		shares = shares || key.Kind == "share"
	}
	if !shares {
		return nil
	}
	slices.SortFunc(items, func(a, b item) int {
		switch {
		case a.count != b.count:
			return cmp64(b.count, a.count)
		case a.key.Kind != b.key.Kind:
			return strings.Compare(a.key.Kind, b.key.Kind)
		case a.key.Size != b.key.Size:
			return cmp64(a.key.Size, b.key.Size)
		case a.key.CPUMilli != b.key.CPUMilli:
			return cmp64(a.key.CPUMilli, b.key.CPUMilli)
		}
		return cmp64(a.key.RAMMiB, b.key.RAMMiB)
	})
	items = items[:min(len(items), contract.ShareMaxClasses)]
	var total int64
	for _, it := range items {
		total += it.count
	}
	out := make([]ShareClass, len(items))
	for i, it := range items {
		out[i] = ShareClass{it.key, float64(it.count) / float64(total)}
	}
	return out
}
