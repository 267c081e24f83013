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

const (
	scoredKey   fwk.StateKey = Name + "/scores"
	preScoreKey fwk.StateKey = Name + "/prescore"
)

// Scored is one cycle's scores over the nodes that fit: each policy's 0..10 score (as
// the extender's engine gives it; absent: the policy had nothing to say about this
// pod) and their weighted mean on 0..MaxNodeScore, which NormalizeScore answers.
type Scored struct {
	Nodes []string
	Parts map[string][]float64
	Total []float64
}

func (s *Scored) Clone() fwk.StateData { return s }

// ScoresOf is the cycle's scores (nil before NormalizeScore).
func ScoresOf(cs fwk.CycleState) *Scored {
	data, err := cs.Read(scoredKey)
	if err != nil {
		return nil
	}
	s, _ := data.(*Scored)
	return s
}

// preScored is what PreScore reads once a cycle for NormalizeScore: the pod, and the
// cluster's figures where its scores need them.
type preScored struct {
	s        *state
	figures  *workload.Figures // nil: not needed
	cpu, ram int64             // the pod's requests, as the fragmentation measure reads them
}

func (p *preScored) Clone() fwk.StateData { return p }

// PreScore reads the pod and the cluster's figures (extender/policies/scarcity.py,
// fragmentation.py) once a cycle. Every pod that passed PreFilter is scored (a CPU
// pod prefers nodes without GPUs).
//
// The scores are worked out in three steps, as kube-scheduler's batching expects
// them: PreScore reads the pod and the cluster, Score reads one node (on many
// goroutines at once), NormalizeScore does what needs every node at once (the
// stretch of each score over the nodes, the median of their GPU memory). When
// kube-scheduler batches alike pods, it keeps the other nodes' Score answers and asks
// Score again only of the node it placed the last pod on: Score's answer is a ticket
// to what it read (the scores' ring), and a batched pod costs one node's reading, not
// a pass over the 500 nodes kube-scheduler keeps as candidates.
func (p *GPUScheduler) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	s, err := read(cs)
	if err != nil {
		s = p.read(pod)
		cs.Write(stateKey, s)
	}
	p.dra.refresh(klog.FromContext(ctx))
	pre := &preScored{s: p.claimState(s, pod)}
	weights := p.args.Weights
	if pre.s.pod.WantsGpus() && (weights["scarcity"] > 0 || weights["fragmentation"] > 0) && p.snapshot != nil {
		figures, err := p.cluster.Figures(*p.snapshot)
		if err != nil {
			return fwk.AsStatus(err)
		}
		pre.figures = &figures
		if weights["fragmentation"] > 0 {
			pre.cpu, pre.ram = workload.Requests(pod)
		}
	}
	cs.Write(preScoreKey, pre)
	return nil
}

// Score reads the node (its cached Fit and view) into the scores' ring and answers
// its ticket there; NormalizeScore turns the tickets into scores.
func (p *GPUScheduler) Score(_ context.Context, _ fwk.CycleState, _ *v1.Pod, info fwk.NodeInfo) (int64, *fwk.Status) {
	e := p.fits.entry(p, info)
	if e == nil {
		return 0, nil
	}
	return p.ring.put(e), nil
}

// ScoreExtensions: NormalizeScore.
func (p *GPUScheduler) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore works out each node's weighted mean on 0..MaxNodeScore from the
// nodes Score read: the gpu score (binpack or spread) stretched over them, and for a
// GPU pod the scarcity and fragmentation scores from the cluster's figures. A ticket
// the ring no longer holds (or none) is read again from the snapshot by name.
func (p *GPUScheduler) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	data, err := cs.Read(preScoreKey)
	pre, _ := data.(*preScored)
	if err != nil || pre == nil {
		for i := range scores {
			scores[i].Score = 0
		}
		return nil
	}
	s := pre.s
	work := &p.scratch
	work.Lock()
	defer work.Unlock()
	entries := work.entries[:0]
	defer func() { clear(entries); work.entries = entries[:0] }()
	out := &Scored{Nodes: make([]string, 0, len(scores)), Parts: map[string][]float64{}}
	at := grow(&work.at, len(scores)) // each listed node's place in out (-1: gone)
	for i := range scores {
		e := p.ring.get(scores[i].Score)
		if e == nil || e.view.name != scores[i].Name { // not a ticket Score gave for this node
			e = p.reread(scores[i].Name)
		}
		if e == nil {
			at[i] = -1
			continue
		}
		at[i] = len(entries)
		entries = append(entries, e)
		out.Nodes = append(out.Nodes, scores[i].Name)
	}
	weights := p.args.Weights
	if weights["gpu"] > 0 {
		raw := grow(&work.raw, len(entries))
		for i, e := range entries {
			raw[i] = rawOf(s.pod, &e.view, e.fit.Gpus, s.spread)
		}
		out.Parts["gpu"] = score.Stretch(raw)
	}
	if figures := pre.figures; figures != nil {
		if weights["scarcity"] > 0 && scoresScarcity(s) {
			if part := scarcity(figures.Pressure, entries); part != nil {
				out.Parts["scarcity"] = part
			}
		}
		if weights["fragmentation"] > 0 {
			if gains := p.fragmentation(s.pod, *figures, entries, pre.cpu, pre.ram); gains != nil {
				out.Parts["fragmentation"] = score.Stretch(gains)
			}
		}
	}
	out.Total = total(out.Parts, weights, len(entries))
	for i := range scores {
		scores[i].Score = 0
		if at[i] >= 0 {
			scores[i].Score = int64(math.Round(out.Total[at[i]]))
		}
	}
	cs.Write(scoredKey, out)
	return nil
}

// scoresScarcity: the scarcity score has something to say of the pod, as the
// extender's asks it (extender/policies/scarcity.py): one not restricted to products
// that asks GPUs or shares of its own (claims alone do not count).
func scoresScarcity(s *state) bool {
	return s.pod.Products == nil && (!s.claimed || s.pod.Gpus > 0)
}

// reread is a node's entry read again from the snapshot by name (nil: gone, or no
// snapshot).
func (p *GPUScheduler) reread(name string) *cachedFit {
	if p.snapshot == nil {
		return nil
	}
	info, err := p.snapshot.Get(name)
	if err != nil || info == nil {
		return nil
	}
	return p.fits.entry(p, info)
}

// alike: two nodes' states the fragmentation measure cannot tell apart (it keys its
// memo by model number; a model past the numbered ones is compared by name).
func alike(a, b workload.State) bool {
	return a.Free == b.Free && a.CPUMilli == b.CPUMilli && a.RAMMiB == b.RAMMiB &&
		a.ModelCode == b.ModelCode && (a.ModelCode >= 0 || a.Model == b.Model)
}

// scratch is NormalizeScore's working memory, kept from one call to the next (a few
// tens of kilobytes a call at 500 nodes, which the garbage collector paid for
// otherwise): what Scored keeps is allocated anew. NormalizeScore runs on the
// scheduling goroutine; the lock is for a caller that would not.
type scratch struct {
	sync.Mutex
	entries []*cachedFit
	at      []int
	raw     []float64
	gains   []float64
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
func scarcity(pressure map[string]float64, nodes []*cachedFit) []float64 {
	top := 0.0
	for _, value := range pressure {
		top = max(top, value)
	}
	if top <= 0 {
		return nil
	}
	out := make([]float64, len(nodes))
	for i, e := range nodes {
		if i > 0 && e.view.state.Model == nodes[i-1].view.state.Model { // alike neighbours: one lookup
			out[i] = out[i-1]
			continue
		}
		value := 1.0 // a model nobody is restricted to, or none known
		if model := e.view.state.Model; model != "" {
			if pressed, ok := pressure[model]; ok {
				left := 1 - min(1, pressed)
				value = left * left
			}
		}
		out[i] = 10 * value
	}
	return out
}

// fragmentation is each node's fragmentation gain for the pod (nil: the score has
// nothing to say): on whole GPUs over the workload mix, on partial GPUs over the share
// mix for a pod asking shares; cpu and ram: the pod's requests.
func (p *GPUScheduler) fragmentation(read *facts.Pod, figures workload.Figures, nodes []*cachedFit, cpu, ram int64) []float64 {
	if len(read.Shares) > 0 {
		if len(figures.ShareMix) == 0 {
			return nil
		}
		return shareGains(read, figures.ShareMix, nodes, cpu, ram)
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
	out := grow(&p.scratch.gains, len(nodes))
	for i, e := range nodes {
		if i > 0 && alike(e.view.state, nodes[i-1].view.state) { // alike nodes side by side: one reading
			out[i] = out[i-1]
			continue
		}
		out[i] = p.frag.Gain(e.view.state, read.Gpus, cpu, ram)
	}
	if sharesWeight != 0 {
		for i, excess := range excessMemory(nodes) {
			out[i] -= sharesWeight * float64(read.Gpus) * excess
		}
	}
	return out
}

// excessMemory is how far each node's GPU memory exceeds the median of the sharing
// nodes', in GPUs of that median (0 on a node that does not share): a whole-GPU pod
// pays for taking memory shares could have used.
func excessMemory(nodes []*cachedFit) []float64 {
	var sharing []float64
	for _, e := range nodes {
		if e.view.memory >= 0 {
			sharing = append(sharing, float64(e.view.memory))
		}
	}
	out := make([]float64, len(nodes))
	unit := workload.Median(sharing)
	if len(sharing) == 0 || unit <= 0 {
		return out
	}
	for i, e := range nodes {
		if e.view.memory >= 0 {
			out[i] = max(float64(e.view.memory)/unit-1, 0)
		}
	}
	return out
}

// shareGains is each node's gain in the partial-GPU measure once the pod's shares are
// placed by the fit rule (where it finds no room: below every node where it does).
func shareGains(read *facts.Pod, mix []workload.ShareClass, nodes []*cachedFit, cpu, ram int64) []float64 {
	var capacities []float64
	for _, e := range nodes {
		for _, g := range e.fit.Gpus {
			if g.Capacity > 0 {
				capacities = append(capacities, float64(g.Capacity))
			}
		}
	}
	unit := workload.Median(capacities)
	out := make([]float64, len(nodes))
	placed := make([]bool, len(nodes))
	some, all := false, true
	for i, e := range nodes {
		free, capacity := workload.Columns(e.fit.Gpus)
		s := e.view.state
		before := workload.ShareFragments(free, capacity, mix, s.CPUMilli, s.RAMMiB, unit)
		after := free
		if p, ok := sharing.Fit(e.fit.Gpus, read.Shares, read.Gpus); ok {
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

// ScoreAll takes the nodes through the score steps as kube-scheduler does in one
// cycle (PreScore, Score on each, NormalizeScore) and answers the cycle's scores and
// the normalised list (tests, the conformance suite, the openb replay).
func (p *GPUScheduler) ScoreAll(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*Scored, fwk.NodeScoreList, *fwk.Status) {
	if status := p.PreScore(ctx, cs, pod, nodes); !status.IsSuccess() {
		return nil, nil, status
	}
	list := make(fwk.NodeScoreList, len(nodes))
	for i, info := range nodes {
		score, status := p.Score(ctx, cs, pod, info)
		if !status.IsSuccess() {
			return nil, nil, status
		}
		list[i] = fwk.NodeScore{Name: info.Node().Name, Score: score}
	}
	if status := p.NormalizeScore(ctx, cs, pod, list); !status.IsSuccess() {
		return nil, nil, status
	}
	return ScoresOf(cs), list, nil
}
