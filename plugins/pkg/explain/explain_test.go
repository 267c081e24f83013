package explain

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// placementCase is one of tests/unit/test_plugins_explain.py's cases.
type placementCase struct {
	Namespace, Name, UID string
	Gpus                 int64
	Names                []string
	Parts                map[string][]float64
	Weights              map[string]int64
	Keep                 int
	Health               map[string][2]int64
	Notes                map[string]string
	Voice, Chosen        string
	Message              string
	EventName            string `json:"event_name"`
}

// TestTheExtendersWords: the cases the extender's builder worded
// (GPU_SCHEDULER_PLACEMENT_CASES, written by tests/unit/test_plugins_explain.py)
// are worded alike here; skipped without them.
func TestTheExtendersWords(t *testing.T) {
	path := os.Getenv("GPU_SCHEDULER_PLACEMENT_CASES")
	if path == "" {
		t.Skip("GPU_SCHEDULER_PLACEMENT_CASES not set (tests/unit/test_plugins_explain.py sets it)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []placementCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		hooks := Hooks{
			Health: func(node string) *[2]int64 {
				if h, ok := c.Health[node]; ok {
					return &h
				}
				return nil
			},
			Note: func(node string) string { return c.Notes[node] },
		}
		pod := Pod{Namespace: c.Namespace, Name: c.Name, UID: c.UID, Gpus: c.Gpus}
		d := Decide(pod, c.Chosen, c.Names, c.Parts, c.Weights, c.Keep, hooks)
		voice := Plugins
		if c.Voice == "extender" {
			voice = Extender
		}
		if got := Message(d, c.Chosen, voice); got != c.Message {
			t.Errorf("case %d:\n  go:     %q\n  python: %q", i, got, c.Message)
		}
		if got := EventName(c.Name, c.UID); got != c.EventName {
			t.Errorf("case %d: event name %q, python %q", i, got, c.EventName)
		}
	}
	t.Logf("%d placement cases worded alike", len(cases)) // the Python side reads the count
}

func TestBestKeepsTheFirstOfATieInKubeSchedulersOrder(t *testing.T) {
	names := []string{"d", "c", "b", "a", "e"}
	got := Best(names, []int64{5, 7, 5, 5, 9}, 3)
	if want := []int{4, 1, 0}; !equal(got, want) {
		t.Fatalf("best %v, want %v (e 9, c 7, then d: the first 5 in order)", got, want)
	}
	if got := Best(names, []int64{1, 1}, 0); len(got) != 0 {
		t.Fatalf("keep 0: %v", got)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAKeptListIsReadBackAlignedByName(t *testing.T) {
	cs := framework.NewCycleState()
	Keep(cs, "spot", fwk.NodeScoreList{{Name: "b", Score: 100}, {Name: "a", Score: 50}})
	kept := Kept(cs)
	if len(kept) != 1 {
		t.Fatalf("kept %v", kept)
	}
	if got := Parts([]string{"a", "b", "c"}, kept["spot"]); got[0] != 5 || got[1] != 10 || got[2] != 0 {
		t.Fatalf("parts %v", got)
	}
}

func TestTheMessageOfATypicalPlacement(t *testing.T) {
	pod := Pod{Namespace: "default", Name: "train", UID: "u1", Gpus: 2}
	d := Decide(pod, "tight", []string{"roomy", "tight"},
		map[string][]float64{"gpu": {0, 10}, "spot": {10, 10}}, map[string]int64{"gpu": 5, "spot": 5}, Top, Hooks{})
	want := "2 GPUs on tight: gpu-scheduler score 10/10, rank 1 of 2 candidates (gpu 10, spot 10; " +
		"weights gpu 5, spot 5). Runner-up roomy, score 5: lower on gpu 0 against 10"
	if got := Message(d, "tight", Plugins); got != want {
		t.Fatalf("message\n  %q\nwant\n  %q", got, want)
	}
}

func TestTheWriterWritesOnceAndCountsWhatItCouldNot(t *testing.T) {
	var written []*v1.Event
	fail := error(nil)
	w := NewWriter(func(_ context.Context, ev *v1.Event) error {
		if fail != nil {
			return fail
		}
		written = append(written, ev)
		return nil
	}, 1, 2, 2, "host")
	d := Decide(Pod{Namespace: "ns", Name: "p", UID: "u", Gpus: 1}, "n", nil, nil, nil, Top, Hooks{})
	for range 3 {
		if w.Admit() {
			w.Queue(d, "n")
		}
	}
	w.Drain(context.Background())
	if len(written) != 2 || w.Counts.Written.Load() != 2 || w.Counts.Dropped.Load() != 1 {
		t.Fatalf("written %d, counts written %d dropped %d", len(written), w.Counts.Written.Load(), w.Counts.Dropped.Load())
	}
	ev := written[0]
	if ev.Name != EventName("p", "u") || ev.Reason != Reason || ev.Source.Component != Component ||
		ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.UID != "u" || ev.Count != 1 ||
		ev.Message != "1 GPU on n: the only node kube-scheduler's filters left" {
		t.Fatalf("event %+v", ev)
	}
	w.bucket = NewBucket(1, 5, time.Now)
	fail = apierrors.NewAlreadyExists(schema.GroupResource{Resource: "events"}, ev.Name)
	w.Queue(d, "n")
	w.Drain(context.Background())
	fail = errors.New("forbidden")
	w.Queue(d, "n")
	w.Drain(context.Background())
	if w.Counts.Duplicate.Load() != 1 || w.Counts.Failed.Load() != 1 {
		t.Fatalf("duplicate %d failed %d", w.Counts.Duplicate.Load(), w.Counts.Failed.Load())
	}
}

func TestTheBucketRefillsAtItsRate(t *testing.T) {
	now := time.Unix(0, 0)
	b := NewBucket(2, 1, func() time.Time { return now })
	if !b.Take() || b.Take() {
		t.Fatal("a burst of one")
	}
	now = now.Add(500 * time.Millisecond)
	if !b.Take() {
		t.Fatal("refilled one token in half a second at 2/s")
	}
}

func TestAMessageIsClippedAsTheExtenderClipsIt(t *testing.T) {
	if got := Clip(strings.Repeat("é", 5), 3); got != "ééé... (truncated of 5 characters)" {
		t.Fatal(got)
	}
}
