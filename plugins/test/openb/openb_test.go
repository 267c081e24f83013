// Package openb holds the plugins to the extender's placements over the openb cluster:
// tests/conformance/openb.py places a sample of the trace's pods, in arrival order,
// with the extender's own cache and engine, each bound before the next; here the same
// pods go through the plugins as kube-scheduler runs them, each added to the NodeInfo
// of the node picked, and every pod must land on the extender's node. make test
// generates the file and runs this for every minor it builds
// (tests/unit/test_plugins.py); alone:
//
//	.venv/bin/python -m tests.conformance.openb --out /tmp/openb.json
//	cd tools/k8s && GPU_SCHEDULER_OPENB=/tmp/openb.json go test -trimpath \
//	    github.com/gpu-scheduler/gpu-scheduler/plugins/test/openb
package openb

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/azscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/gpuscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/spotscheduler"
)

type file struct {
	Now     float64            `json:"now"`
	Tie     float64            `json:"tie"`
	Weights map[string]float64 `json:"weights"`
	Profile struct {
		Plugins      map[string]int64 `json:"plugins"`
		GPUScheduler map[string]int64 `json:"gpuScheduler"`
	} `json:"profile"`
	Config struct {
		DefaultPlacement string  `json:"defaultPlacement"`
		HeartbeatWindow  float64 `json:"heartbeatWindowSeconds"`
	} `json:"config"`
	Nodes  []v1.Node           `json:"nodes"`
	Leases map[string]*float64 `json:"leases"`
	Pods   []placed            `json:"pods"`
}

// placed is one pod and the extender's pick: its node ("" : none fits), that node's
// weighted mean and each policy's score there on 0..10, and how many nodes fit.
type placed struct {
	Pod   v1.Pod             `json:"pod"`
	Node  string             `json:"node"`
	Mean  *float64           `json:"mean"`
	Parts map[string]float64 `json:"parts"`
	Fits  int                `json:"fits"`
	// The extender's pick and its count of nodes that fit with the mix kept as it
	// keeps it (each of the two sequences bound as it picks).
	Kept     string `json:"kept"`
	KeptFits int    `json:"keptFits"`
}

// order is the extender's order of its scoring policies (extender/policies REGISTRY):
// its weighted mean adds them up in it.
var order = []string{"gpu", "spot", "group", "scarcity", "fragmentation"}

type scorer interface {
	PreScore(context.Context, fwk.CycleState, *v1.Pod, []fwk.NodeInfo) *fwk.Status
	Score(context.Context, fwk.CycleState, *v1.Pod, fwk.NodeInfo) (int64, *fwk.Status)
	ScoreExtensions() fwk.ScoreExtensions
}

type cluster struct {
	gpu   *gpuscheduler.GPUScheduler
	spot  *spotscheduler.SpotScheduler
	group *azscheduler.AZScheduler
	infos map[string]*framework.NodeInfo
	order []string
	// renew, where the mix is worked out afresh for every pod: a GPUScheduler of its
	// own for each pod, whose figures start from nothing.
	renew func()
}

// build is the plugins over the file's nodes, none of its pods bound yet; fresh: a new
// GPUScheduler for each pod (the extender run with its mix worked out every time).
func build(f *file, fresh bool) *cluster {
	hb := gpuscheduler.NewHeartbeats()
	for name, renewed := range f.Leases {
		at := time.Time{}
		if renewed != nil {
			at = time.Unix(0, int64(math.Round(*renewed*1e6))*1e3)
		}
		hb.Set(name, at)
	}
	now := time.Unix(0, int64(f.Now*1e9))
	args := config.GPUSchedulerArgs{
		DefaultPlacement: f.Config.DefaultPlacement,
		HeartbeatWindow:  &metav1.Duration{Duration: time.Duration(f.Config.HeartbeatWindow * float64(time.Second))},
		Namespace:        "gpu-scheduler",
		Weights:          f.Profile.GPUScheduler,
	}
	c := &cluster{spot: &spotscheduler.SpotScheduler{}, infos: map[string]*framework.NodeInfo{}}
	all := make([]fwk.NodeInfo, 0, len(f.Nodes))
	for i := range f.Nodes {
		info := framework.NewNodeInfo()
		info.SetNode(&f.Nodes[i])
		c.infos[f.Nodes[i].Name] = info
		c.order = append(c.order, f.Nodes[i].Name)
		all = append(all, info)
	}
	list := func() ([]fwk.NodeInfo, error) { return all, nil }
	c.group = azscheduler.NewWith(contract.TopologyLevels, list)
	gpu := func() { c.gpu = gpuscheduler.NewWith(args, hb, func() time.Time { return now }).OverNodes(list) }
	gpu()
	if fresh {
		c.renew = gpu
	}
	return c
}

// bind adds the pod, bound to node, to the node's NodeInfo (its generation moves).
func (c *cluster) bind(pod *v1.Pod, node string) {
	bound := pod.DeepCopy()
	bound.Spec.NodeName = node
	bound.Status.Phase = v1.PodRunning
	// as kube-scheduler's cycle: Reserve, then the pod is in the node's NodeInfo
	c.gpu.Reserve(context.Background(), nil, bound, node)
	c.infos[node].AddPod(bound)
}

// cycle is one pod's scheduling cycle: the nodes that fit, and over them each policy's
// 0..10 score unrounded (GPUScheduler's parts; SpotScheduler's and AZScheduler's
// normalized scores over 10) and kube-scheduler's sum of weight x plugin score.
type cycle struct {
	fits    []string
	parts   map[string][]float64
	kube    []int64
	refusal string
}

func (c *cluster) run(ctx context.Context, f *file, pod *v1.Pod) (cycle, error) {
	var out cycle
	if c.renew != nil && facts.GpuRequest(pod) > 0 { // a CPU pod reads no figures
		c.renew()
	}
	state := framework.NewCycleState()
	_, spotPre := c.spot.PreFilter(ctx, state, pod, nil)
	_, gpuPre := c.gpu.PreFilter(ctx, state, pod, nil)
	for _, pre := range []*fwk.Status{spotPre, gpuPre} {
		if !pre.IsSuccess() && !pre.IsSkip() {
			out.refusal = pre.Message()
			return out, nil
		}
	}
	for _, name := range c.order {
		var status *fwk.Status
		if spotPre.IsSuccess() {
			status = c.spot.Filter(ctx, state, pod, c.infos[name])
		}
		if status.IsSuccess() && gpuPre.IsSuccess() {
			status = c.gpu.Filter(ctx, state, pod, c.infos[name])
		}
		if status.IsSuccess() {
			out.fits = append(out.fits, name)
		}
	}
	if len(out.fits) == 0 {
		return out, nil
	}
	infos := make([]fwk.NodeInfo, len(out.fits))
	for i, name := range out.fits {
		infos[i] = c.infos[name]
	}
	out.parts = map[string][]float64{}
	out.kube = make([]int64, len(out.fits))
	scored, list, status := c.gpu.ScoreAll(ctx, state, pod, infos)
	if !status.IsSuccess() {
		return out, fmt.Errorf("GPUScheduler scores: %v", status)
	}
	for i, name := range out.fits {
		if scored.Nodes[i] != name || list[i].Name != name {
			return out, fmt.Errorf("GPUScheduler scored %s at %d, not %s", scored.Nodes[i], i, name)
		}
	}
	for i := range list {
		out.kube[i] += f.Profile.Plugins[gpuscheduler.Name] * list[i].Score
	}
	for _, policy := range config.ScorePolicies {
		if part, ok := scored.Parts[policy]; ok {
			out.parts[policy] = part
		}
	}
	for _, p := range []struct {
		policy, plugin string
		scorer
	}{{"spot", spotscheduler.Name, c.spot}, {"group", azscheduler.Name, c.group}} {
		status := p.PreScore(ctx, state, pod, infos)
		if status.IsSkip() {
			// kube-scheduler leaves the plugin out: 0 on every node. SpotScheduler
			// skips a pod with a preference where the nodes are all alike, which the
			// extender's spot policy scores 10 on every node.
			if rule := spotscheduler.Preference(pod); p.policy == "spot" && (rule == "prefer" || rule == "avoid") {
				out.parts["spot"] = alike(len(out.fits))
			}
			continue
		}
		if !status.IsSuccess() {
			return out, fmt.Errorf("%s PreScore: %v", p.plugin, status)
		}
		list := make(fwk.NodeScoreList, len(out.fits))
		for i, name := range out.fits {
			s, st := p.Score(ctx, state, pod, infos[i])
			if !st.IsSuccess() {
				return out, fmt.Errorf("%s Score on %s: %v", p.plugin, name, st)
			}
			list[i] = fwk.NodeScore{Name: name, Score: s}
		}
		if ext := p.ScoreExtensions(); ext != nil {
			if st := ext.NormalizeScore(ctx, state, pod, list); !st.IsSuccess() {
				return out, fmt.Errorf("%s NormalizeScore: %v", p.plugin, st)
			}
		}
		part := make([]float64, len(list))
		for i, ns := range list {
			part[i] = float64(ns.Score) / 10
			out.kube[i] += f.Profile.Plugins[p.plugin] * ns.Score
		}
		out.parts[p.policy] = part
	}
	return out, nil
}

func alike(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = 10
	}
	return out
}

// means is each fitting node's weighted mean of the parts on 0..10, added up as the
// extender's weighted_means adds them: in its policies' order, over the weights of the
// policies that scored.
func (c cycle) means(weights map[string]float64) []float64 {
	out := make([]float64, len(c.fits))
	sum := 0.0
	for _, policy := range order {
		part, ok := c.parts[policy]
		if !ok || weights[policy] == 0 {
			continue
		}
		sum += weights[policy]
		for i := range out {
			out[i] += weights[policy] * part[i]
		}
	}
	if sum > 0 {
		for i := range out {
			out[i] *= 1 / sum
		}
	}
	return out
}

// pick is the node of the highest value, values within tie of it tying, ties broken by
// node name; and its value.
func pick[T int64 | float64](names []string, values []T, tie T) (string, T) {
	if len(names) == 0 {
		return "", 0
	}
	best := values[0]
	for _, v := range values {
		best = max(best, v)
	}
	chosen := ""
	for i, name := range names {
		if values[i] >= best-tie && (chosen == "" || name < chosen) {
			chosen = name
		}
	}
	return chosen, best
}

// TestSamePlacements places every pod of GPU_SCHEDULER_OPENB's file and compares the
// nodes with the extender's. It writes what it checked to GPU_SCHEDULER_OPENB_REPORT.
func TestSamePlacements(t *testing.T) {
	path := os.Getenv("GPU_SCHEDULER_OPENB")
	if path == "" {
		t.Skip("GPU_SCHEDULER_OPENB names no placement file (make test generates one)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f file
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, policy := range config.ScorePolicies {
		sum += f.Profile.GPUScheduler[policy]
		if float64(f.Profile.GPUScheduler[policy]) != f.Weights[policy] {
			t.Fatalf("GPUScheduler's %s weight %d is not the extender's %v", policy, f.Profile.GPUScheduler[policy], f.Weights[policy])
		}
	}
	if f.Profile.Plugins[gpuscheduler.Name] != sum {
		t.Fatalf("GPUScheduler's weight %d is not the sum of its scores' %d", f.Profile.Plugins[gpuscheduler.Name], sum)
	}
	ctx := context.Background()
	c, kept := build(&f, true), build(&f, false)
	used := map[string]bool{}
	placedPods, disagree, parted, rounded, elsewhere, worst := 0, 0, 0, 0, 0, 0.0
	var problems, keptProblems []string
	for k := range f.Pods {
		want := &f.Pods[k]
		pod := &want.Pod
		got, err := c.run(ctx, &f, pod)
		if err != nil {
			t.Fatalf("pod %d (%s): %v", k, pod.Name, err)
		}
		means := got.means(f.Weights)
		node, mean := pick(got.fits, means, f.Tie)
		kube, _ := pick(got.fits, got.kube, 0)
		if kube != node {
			rounded++
		}
		if node != want.Node || len(got.fits) != want.Fits {
			disagree++
			problems = append(problems, describe(k, want, got, means, node, mean))
		} else if want.Mean != nil {
			worst = max(worst, math.Abs(mean-*want.Mean))
			if at := slices.Index(got.fits, node); !sameParts(got.parts, at, want.Parts) {
				parted++
				problems = append(problems, describe(k, want, got, means, node, mean))
			}
		}
		// The mix as each side keeps it: one GPUScheduler for every pod, as
		// kube-scheduler keeps it, against the extender's own refresh.
		other, err := kept.run(ctx, &f, pod)
		if err != nil {
			t.Fatalf("pod %d (%s), the mix kept: %v", k, pod.Name, err)
		}
		if len(other.fits) != want.KeptFits {
			problems = append(problems, fmt.Sprintf("pod %d (%s), the mix kept: %d nodes fit, for the extender %d",
				k, pod.Name, len(other.fits), want.KeptFits))
		}
		if at, _ := pick(other.fits, other.means(f.Weights), f.Tie); at != want.Kept {
			elsewhere++
			keptProblems = append(keptProblems, fmt.Sprintf("pod %d (%s): %q, the extender %q", k, pod.Name, at, want.Kept))
		}
		// Each sequence bound where the extender bound it: a pod placed elsewhere does
		// not carry over into the later pods' clusters, each pod is compared on its own.
		if want.Kept != "" {
			kept.bind(pod, want.Kept)
		}
		if want.Node != "" {
			c.bind(pod, want.Node)
			placedPods++
			used[want.Node] = true
		}
	}
	for i, problem := range problems {
		if i == 10 {
			t.Errorf("... and %d more pods placed elsewhere or scored otherwise", len(problems)-10)
			break
		}
		t.Error(problem)
	}
	if worst > 1e-6 {
		t.Errorf("the picked nodes' weighted means differ from the extender's by up to %g", worst)
	}
	if len(keptProblems) > 0 {
		t.Logf("the mix kept, the first pods placed elsewhere: %s", strings.Join(keptProblems[:min(3, len(keptProblems))], "; "))
	}
	t.Logf("%d pods over %d nodes: %d placed on %d nodes; %d placed elsewhere than the extender, %d "+
		"on its node with other scores there; kube-scheduler's rounded sum would pick another node "+
		"for %d; means within %.1g; the mix kept as each side keeps it: %d placed elsewhere",
		len(f.Pods), len(f.Nodes), placedPods, len(used), disagree, parted, rounded, worst, elsewhere)
	if report := os.Getenv("GPU_SCHEDULER_OPENB_REPORT"); report != "" {
		line := fmt.Sprintf(`{"pods": %d, "nodes": %d, "placed": %d, "used": %d, "disagree": %d, `+
			`"scored_otherwise": %d, "rounded": %d, "mean_diff": %g, "kept_elsewhere": %d}`,
			len(f.Pods), len(f.Nodes), placedPods, len(used), disagree, parted, rounded, worst, elsewhere)
		if err := os.WriteFile(report, []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sameParts: the node's scores are the extender's there, policy by policy, within
// 1e-6 of 10 (the conformance suite's scores, to the last bits of a float).
func sameParts(parts map[string][]float64, at int, want map[string]float64) bool {
	if len(parts) != len(want) {
		return false
	}
	for policy, part := range parts {
		expected, ok := want[policy]
		if !ok || math.Abs(part[at]-expected) > 1e-6 {
			return false
		}
	}
	return true
}

// describe says where a pod parts from the extender: both picks, and each part of the
// nodes' scores on the plugins' side.
func describe(k int, want *placed, got cycle, means []float64, node string, mean float64) string {
	extender := "none"
	if want.Mean != nil {
		extender = fmt.Sprintf("%.12f", *want.Mean)
	}
	lines := []string{fmt.Sprintf("pod %d (%s): plugins %q (mean %.12f, %d fit), extender %q (mean %s, %d fit; %v)",
		k, want.Pod.Name, node, mean, len(got.fits), want.Node, extender, want.Fits, want.Parts)}
	if got.refusal != "" {
		lines = append(lines, "  PreFilter: "+got.refusal)
	}
	for i, name := range got.fits {
		if name != node && name != want.Node {
			continue
		}
		var parts []string
		for _, policy := range order {
			if part, ok := got.parts[policy]; ok {
				parts = append(parts, fmt.Sprintf("%s %.6f", policy, part[i]))
			}
		}
		sort.Strings(parts)
		lines = append(lines, fmt.Sprintf("  %s: mean %.12f, kube %d; %s", name, means[i], got.kube[i], strings.Join(parts, ", ")))
	}
	return strings.Join(lines, "\n")
}
