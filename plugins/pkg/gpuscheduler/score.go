package gpuscheduler

import (
	"context"
	"math"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/score"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/workload"
)

const scoredKey fwk.StateKey = Name + "/scores"

// Scored is one cycle's scores over the nodes that fit: each policy's 0..10 score (as
// the extender's engine gives it; absent: the policy had nothing to say about this
// pod) and their weighted mean on 0..MaxNodeScore, which Score answers.
type Scored struct {
	Nodes []string
	Parts map[string][]float64
	Total []float64
	index map[string]int // built only where NormalizeScore's list is not in Nodes' order
}

func (s *Scored) Clone() fwk.StateData { return s }

// ScoresOf is the cycle's scores (nil before PreScore).
func ScoresOf(cs fwk.CycleState) *Scored {
	data, err := cs.Read(scoredKey)
	if err != nil {
		return nil
	}
	s, _ := data.(*Scored)
	return s
}

// PreScore scores every node that fits at once: the gpu score (binpack or spread) is
// stretched over them, and for a GPU pod the scarcity and fragmentation scores read
// the cluster's figures (extender/policies/scarcity.py, fragmentation.py). Every pod
// that passed PreFilter is scored (a CPU pod prefers nodes without GPUs).
func (p *GPUScheduler) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	s, err := read(cs)
	if err != nil {
		s = p.read(pod)
		cs.Write(stateKey, s)
	}
	p.dra.refresh(klog.FromContext(ctx))
	s = p.claimState(s, pod)
	out := &Scored{Nodes: make([]string, 0, len(nodes)), Parts: map[string][]float64{}}
	work := &p.scratch
	work.Lock()
	defer work.Unlock()
	fits, used := work.fits[:0], work.used[:0]
	defer func() { work.fits, work.used = fits[:0], used[:0] }()
	p.fits.read(p, nodes, func(name string, _ fwk.NodeInfo, fit *Fit, u [2]int64) {
		out.Nodes = append(out.Nodes, name)
		fits, used = append(fits, fit), append(used, u)
	})
	weights := p.args.Weights
	if weights["gpu"] > 0 {
		raw := grow(&work.raw, len(fits))
		for i, fit := range fits {
			raw[i] = Raw(s.pod, *fit, s.spread)
		}
		out.Parts["gpu"] = score.Stretch(raw)
	}
	if s.pod.WantsGpus() && (weights["scarcity"] > 0 || weights["fragmentation"] > 0) && p.snapshot != nil {
		figures, err := p.cluster.Figures(*p.snapshot)
		if err != nil {
			return fwk.AsStatus(err)
		}
		if weights["scarcity"] > 0 && s.pod.Products == nil && !s.claimed {
			if part := scarcity(figures.Pressure, fits); part != nil {
				out.Parts["scarcity"] = part
			}
		}
		if weights["fragmentation"] > 0 {
			if gains := p.fragmentation(pod, s.pod, figures, fits, used); gains != nil {
				out.Parts["fragmentation"] = score.Stretch(gains)
			}
		}
	}
	out.Total = total(out.Parts, weights, len(fits))
	cs.Write(scoredKey, out)
	return nil
}

// alike: two nodes' states the fragmentation measure cannot tell apart (it keys its
// memo by model number; a model past the numbered ones is compared by name).
func alike(a, b workload.State) bool {
	return a.Free == b.Free && a.CPUMilli == b.CPUMilli && a.RAMMiB == b.RAMMiB &&
		a.ModelCode == b.ModelCode && (a.ModelCode >= 0 || a.Model == b.Model)
}

// scratch is PreScore's working memory, kept from one call to the next (a few tens of
// kilobytes a call at 500 nodes, which the garbage collector paid for otherwise): what
// Scored keeps is allocated anew. PreScore runs on the scheduling goroutine; the lock
// is for a caller that would not.
type scratch struct {
	sync.Mutex
	fits   []*Fit
	used   [][2]int64
	raw    []float64
	gains  []float64
	states []workload.State
}

// grow is the buffer at *buf with n elements (their values left to be written).
func grow[T any](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n)
	}
	*buf = (*buf)[:n]
	return *buf
}

// scarcity scores each node (1 - min(1, its model's pressure))^2 on 0..10, absolute: a
// model the restricted pods need much of is left to them (nil: no pressure anywhere).
func scarcity(pressure map[string]float64, fits []*Fit) []float64 {
	top := 0.0
	for _, value := range pressure {
		top = max(top, value)
	}
	if top <= 0 {
		return nil
	}
	out := make([]float64, len(fits))
	for i, fit := range fits {
		value := 1.0 // a model nobody is restricted to, or none known
		if pressed, ok := pressure[fit.Node.Model]; ok && fit.Node.Model != "" {
			left := 1 - min(1, pressed)
			value = left * left
		}
		out[i] = 10 * value
	}
	return out
}

// fragmentation is each node's fragmentation gain for the pod (nil: the score has
// nothing to say): on whole GPUs over the workload mix, on partial GPUs over the share
// mix for a pod asking shares.
func (p *GPUScheduler) fragmentation(pod *v1.Pod, read *facts.Pod, figures workload.Figures, fits []*Fit, used [][2]int64) []float64 {
	cpu, ram := workload.Requests(pod)
	states := grow(&p.scratch.states, len(fits))
	for i, fit := range fits {
		used, usedRAM := used[i][0], used[i][1]
		states[i] = workload.State{Free: fit.Free(), CPUMilli: workload.Unlimited, RAMMiB: workload.Unlimited,
			Model: fit.Node.Model, ModelCode: fit.Node.ModelCode}
		if fit.Node.CPUMilli >= 0 {
			states[i].CPUMilli = fit.Node.CPUMilli - used
		}
		if fit.Node.RAMMiB >= 0 {
			states[i].RAMMiB = fit.Node.RAMMiB - usedRAM
		}
	}
	if len(read.Shares) > 0 {
		if len(figures.ShareMix) == 0 {
			return nil
		}
		return shareGains(read, figures.ShareMix, fits, states, cpu, ram)
	}
	if read.Gpus == 0 || len(figures.Mix) == 0 {
		return nil
	}
	if p.frag == nil || &p.frag.Mix()[0] != &figures.Mix[0] {
		p.frag = workload.NewFragmentation(figures.Mix)
	}
	var sharesWeight float64
	for _, class := range figures.ShareMix {
		if class.Kind == "share" {
			sharesWeight += class.Weight
		}
	}
	out := grow(&p.scratch.gains, len(fits))
	for i := range fits {
		if i > 0 && alike(states[i], states[i-1]) { // alike nodes side by side: one reading
			out[i] = out[i-1]
			continue
		}
		out[i] = p.frag.Gain(states[i], read.Gpus, cpu, ram)
	}
	if sharesWeight != 0 {
		for i, excess := range excessMemory(fits) {
			out[i] -= sharesWeight * float64(read.Gpus) * excess
		}
	}
	return out
}

// excessMemory is how far each node's GPU memory exceeds the median of the sharing
// nodes', in GPUs of that median (0 on a node that does not share): a whole-GPU pod
// pays for taking memory shares could have used.
func excessMemory(fits []*Fit) []float64 {
	memory := make([]float64, len(fits))
	var sharing []float64
	for i, fit := range fits {
		if fit.Node.Shared != nil {
			memory[i] = float64(max(fit.Node.MemoryMiB, 0))
			sharing = append(sharing, memory[i])
		}
	}
	out := make([]float64, len(fits))
	unit := workload.Median(sharing)
	if len(sharing) == 0 || unit <= 0 {
		return out
	}
	for i := range fits {
		out[i] = max(memory[i]/unit-1, 0)
	}
	return out
}

// shareGains is each node's gain in the partial-GPU measure once the pod's shares are
// placed by the fit rule (where it finds no room: below every node where it does).
func shareGains(read *facts.Pod, mix []workload.ShareClass, fits []*Fit, states []workload.State, cpu, ram int64) []float64 {
	var capacities []float64
	for _, fit := range fits {
		for _, g := range fit.Gpus {
			if g.Capacity > 0 {
				capacities = append(capacities, float64(g.Capacity))
			}
		}
	}
	unit := workload.Median(capacities)
	out := make([]float64, len(fits))
	placed := make([]bool, len(fits))
	some, all := false, true
	for i, fit := range fits {
		free, capacity := workload.Columns(fit.Gpus)
		s := states[i]
		before := workload.ShareFragments(free, capacity, mix, s.CPUMilli, s.RAMMiB, unit)
		after := free
		if p, ok := sharing.Fit(fit.Gpus, read.Shares, read.Gpus); ok {
			after, placed[i] = workload.PlacedColumn(free, p, read.Shares), true
		}
		some, all = some || placed[i], all && placed[i]
		out[i] = before - workload.ShareFragments(after, capacity, mix, workload.Sub(s.CPUMilli, cpu), workload.Sub(s.RAMMiB, ram), unit)
	}
	if some && !all {
		low := math.Inf(1)
		for i, gain := range out {
			if placed[i] {
				low = min(low, gain)
			}
		}
		for i := range out {
			if !placed[i] {
				out[i] = low - 1
			}
		}
	}
	return out
}

// total is the policies' weighted mean on 0..MaxNodeScore; a policy that had nothing
// to say counts 0 everywhere (its weight still divides: the mean is each part's share
// of the plugin's weight in the profile, as the extender's parts are of its own).
func total(parts map[string][]float64, weights map[string]int64, n int) []float64 {
	out := make([]float64, n)
	var sum int64
	for _, name := range config.ScorePolicies {
		sum += weights[name]
	}
	if sum == 0 {
		return out
	}
	for _, name := range config.ScorePolicies {
		part, w := parts[name], float64(weights[name])
		for i := range part {
			out[i] += w * part[i]
		}
	}
	scale := float64(fwk.MaxNodeScore) / 10 / float64(sum)
	for i := range out {
		out[i] *= scale
	}
	return out
}

// Score is 0: NormalizeScore gives each node its weighted mean from PreScore (a map
// from node to score, filled for 500 nodes a pod, costs more than the whole score).
func (p *GPUScheduler) Score(context.Context, fwk.CycleState, *v1.Pod, fwk.NodeInfo) (int64, *fwk.Status) {
	return 0, nil
}

// ScoreExtensions: NormalizeScore.
func (p *GPUScheduler) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore gives each node its weighted mean, on 0..MaxNodeScore. kube-scheduler
// lists the nodes in the order PreScore had them; a list in another order is matched
// by name.
func (p *GPUScheduler) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	s := ScoresOf(cs)
	if s == nil {
		return nil
	}
	for i := range scores {
		at := i
		if i >= len(s.Nodes) || s.Nodes[i] != scores[i].Name {
			if s.index == nil {
				s.index = make(map[string]int, len(s.Nodes))
				for k, name := range s.Nodes {
					s.index[name] = k
				}
			}
			var ok bool
			if at, ok = s.index[scores[i].Name]; !ok {
				scores[i].Score = 0
				continue
			}
		}
		scores[i].Score = int64(math.Round(s.Total[at]))
	}
	return nil
}
