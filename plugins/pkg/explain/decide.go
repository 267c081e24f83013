package explain

import (
	"sort"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// Policies are the extender's scoring policies, in its order (the plugins score them
// under these names: GPUScheduler gpu, scarcity and fragmentation, SpotScheduler spot,
// AZScheduler group).
var Policies = []string{"gpu", "spot", "group", "scarcity", "fragmentation"}

const keyPrefix = "GPUPlacement/"

// scores is one plugin's normalised list, kept for the cycle (the framework's own
// slice: nothing is copied, and the framework does not change it after NormalizeScore).
type scores fwk.NodeScoreList

func (s scores) Clone() fwk.StateData { return s }

// Keep remembers a plugin's normalised scores (0..MaxNodeScore) for the cycle, under
// its policy's name; called at the end of its NormalizeScore.
func Keep(cs fwk.CycleState, policy string, list fwk.NodeScoreList) {
	if cs != nil {
		cs.Write(fwk.StateKey(keyPrefix+policy), scores(list))
	}
}

// Kept is the lists kept this cycle, by policy.
func Kept(cs fwk.CycleState) map[string]fwk.NodeScoreList {
	out := map[string]fwk.NodeScoreList{}
	for _, policy := range Policies {
		if data, err := cs.Read(fwk.StateKey(keyPrefix + policy)); err == nil {
			if list, ok := data.(scores); ok {
				out[policy] = fwk.NodeScoreList(list)
			}
		}
	}
	return out
}

// Best is the positions of the keep highest scores, best first, then by name; where
// more tie at the lowest score kept than there is room for, the first of them in
// kube-scheduler's order (extender/explain.py, best).
func Best(names []string, values []int64, keep int) []int {
	if keep <= 0 {
		return nil
	}
	chosen := make([]int, 0, min(keep, len(values)))
	if len(values) <= keep {
		for i := range values {
			chosen = append(chosen, i)
		}
	} else {
		sorted := append([]int64(nil), values...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] > sorted[j] })
		floor := sorted[keep-1]
		for i, v := range values {
			if v > floor {
				chosen = append(chosen, i)
			}
		}
		for i, v := range values {
			if v == floor && len(chosen) < keep {
				chosen = append(chosen, i)
			}
		}
	}
	sort.SliceStable(chosen, func(a, b int) bool {
		i, j := chosen[a], chosen[b]
		if values[i] != values[j] {
			return values[i] > values[j]
		}
		return names[i] < names[j]
	})
	return chosen
}

// Pod is what the Event names of the pod.
type Pod struct {
	Namespace, Name, UID string
	Gpus                 int64
}

// Hooks read what a message says of a kept candidate beyond its scores.
type Hooks struct {
	Health func(node string) *[2]int64 // nil: no health notes
	Note   func(node string) string    // nil: no group notes
}

// Decide builds the decision from the cycle's candidates (names) and each policy's
// 0..10 part of their scores, aligned with names, with the policies' weights (a
// policy without parts or weight did not score). No names: the filters left one
// node, which kube-scheduler binds without scoring.
func Decide(pod Pod, chosen string, names []string, parts map[string][]float64, weights map[string]int64, keep int, hooks Hooks) *Decision {
	d := &Decision{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Gpus: pod.Gpus}
	if len(names) == 0 {
		d.Candidates = 1
		d.Top = []Candidate{{Node: chosen, Score: 10}}
		return d
	}
	var used [][]float64
	for _, policy := range Policies {
		if part, ok := parts[policy]; ok && weights[policy] > 0 && len(part) == len(names) {
			used = append(used, part)
			d.Weights = append(d.Weights, Weight{policy, int(weights[policy])})
		}
	}
	values := Means(used, d.Weights, len(names))
	d.Candidates = len(names)
	for _, i := range Best(names, values, keep) {
		c := Candidate{Node: names[i], Score: values[i], Parts: make([]Part, len(used))}
		for k, part := range used {
			c.Parts[k] = Part{d.Weights[k].Policy, part[i]}
		}
		if hooks.Health != nil {
			c.Health = hooks.Health(names[i])
		}
		if hooks.Note != nil {
			c.Note = hooks.Note(names[i])
		}
		d.Top = append(d.Top, c)
	}
	return d
}

// Parts is a kept list's 0..10 parts in the order of names (the framework's lists
// share one order; a list in another is looked up by name, 0 where a node is missing).
func Parts(names []string, list fwk.NodeScoreList) []float64 {
	out := make([]float64, len(names))
	if len(list) != len(names) {
		return byName(names, list)
	}
	for i := range list {
		if list[i].Name != names[i] {
			return byName(names, list)
		}
		out[i] = float64(list[i].Score) / 10
	}
	return out
}

func byName(names []string, list fwk.NodeScoreList) []float64 {
	at := make(map[string]int64, len(list))
	for _, s := range list {
		at[s.Name] = s.Score
	}
	out := make([]float64, len(names))
	for i, name := range names {
		out[i] = float64(at[name]) / 10
	}
	return out
}

// Means is the extender's integer 0..10 score of each candidate: the weighted mean
// of the parts, in the extender's arithmetic (extender/engine.py, weighted_means and
// rounded: half up, clamped).
func Means(parts [][]float64, weights []Weight, n int) []int64 {
	totals := make([]float64, n)
	sum := 0
	for k, w := range weights {
		sum += w.Weight
		for i, v := range parts[k] {
			totals[i] = totals[i] + float64(float64(w.Weight)*v) // no fused multiply-add
		}
	}
	out := make([]int64, len(totals))
	if sum == 0 {
		return out
	}
	scale := 1.0 / float64(sum)
	for i, t := range totals {
		out[i] = min(max(int64(float64(t*scale)+0.5), 0), 10)
	}
	return out
}
