package sharing

import (
	"strings"
	"testing"
)

func gpus(free ...int64) []Gpu {
	out := make([]Gpu, len(free))
	for i, f := range free {
		out[i] = Gpu{UUID: "g" + string(rune('0'+i)), Capacity: 40, Free: f, WholeFree: f == 40}
	}
	return out
}

// Best fit: each share to the GPU with the least free that holds it, ties to the
// lowest index; whole GPUs first, the wholly free ones, lowest index first.
func TestFitIsBestFitAfterWholeGpus(t *testing.T) {
	p, ok := Fit(gpus(40, 10, 12, 40), []int64{10, 11}, 1)
	if !ok || p.Whole[0] != 0 || p.Shares[0] != 1 || p.Shares[1] != 2 {
		t.Fatalf("placement %+v %v: want GPU 0 whole, 10 on GPU 1, 11 on GPU 2", p, ok)
	}
	if _, ok := Fit(gpus(40, 10), []int64{10}, 2); ok {
		t.Error("two whole GPUs placed where one is wholly free")
	}
	if _, ok := Fit(gpus(5, 5), []int64{6}, 0); ok {
		t.Error("a share of 6 placed on GPUs with 5 free each")
	}
}

// What the agent reports counts for the pods still bound; the others are fitted in
// order; a report entry for a pod gone is dropped.
func TestUsageReadsTheReportThenFitsTheRest(t *testing.T) {
	specs := []Spec{{"a", 40, true}, {"b", 40, true}, {"c", 40, false}}
	report := ReadReport(`{"a": {"uid-1": 30, "uid-gone": 10}, "b": {"uid-2": "whole"}}`)
	state, misfits := Usage(specs, report, []Bound{
		{Key: "uid-1", Shares: []int64{30}}, {Key: "uid-2", Whole: 1}, {Key: "uid-3", Shares: []int64{8}},
		{Key: "uid-4", Whole: 1},
	})
	if misfits != 1 {
		t.Errorf("misfits %d, want 1 (no GPU wholly free for uid-4)", misfits)
	}
	if state[0].Free != 2 || state[1].Free != 0 || state[2].Free != 0 || state[0].WholeFree {
		t.Errorf("state %+v: want a 40-30-8=2 free, b taken whole, c sick", state)
	}
}

func TestReadReportRefusesWhatAnAgentNeverWrites(t *testing.T) {
	for _, bad := range []string{
		`{"a": {"default/pod": 4}}`, `{"a": {"uid": 4.0}}`, `{"a": {"uid": 0}}`, `{"a": {"uid": 1025}}`,
		`{"a": {"uid": true}}`, `{"a": {"uid": "half"}}`, `[1]`, `{"a": 4}`, `{`,
		strings.Repeat("[", 1025) + strings.Repeat("]", 1025),
	} {
		if ReadReport(bad) != nil {
			t.Errorf("ReadReport(%.40q) read", bad)
		}
	}
	if got := ReadReport(`{"a": {"uid": 99999999999999999999999}}`); got != nil {
		t.Errorf("a number past int64 read: %+v", got)
	}
}

func TestReadGpusFallsBackToTheLabels(t *testing.T) {
	got := ReadGpus(`[{"uuid": "GPU-1", "memoryMiB": 40960, "reservedMiB": 2048}, {"uuid": "GPU-2", "memoryMiB": 81920.0},`+
		` {"uuid": "GPU-3", "memoryMiB": 40960, "migEnabled": true}, {"uuid": "GPU-4", "memoryMiB": 40960, "healthy": false}]`, 4, 40960)
	want := []Spec{{"GPU-1", 38, true}, {"GPU-2", 0, true}, {"GPU-3", 0, false}, {"GPU-4", 40, false}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("GPU %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if labels := ReadGpus(`{"not": "a list"}`, 2, 16384); len(labels) != 2 || labels[1] != (Spec{"gpu-1", 16, true}) {
		t.Errorf("from the labels: %+v", labels)
	}
	if ReadGpus(`[1]`, 2, 16384) != nil {
		t.Error("an annotation with an entry not an object must give no GPUs")
	}
}
