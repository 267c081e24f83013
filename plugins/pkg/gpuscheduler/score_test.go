package gpuscheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// batchCluster: GPU nodes with 0..7 of their 8 GPUs taken, and the plugin over them.
func batchCluster(t *testing.T) (*GPUScheduler, []fwk.NodeInfo) {
	t.Helper()
	var infos []fwk.NodeInfo
	for i := range 8 {
		node := gpuNode(map[string]string{contract.LabelGpuPresent: "true",
			contract.LabelGpuProduct: "NVIDIA-H100-80GB-HBM3"}, nil)
		node.Name = fmt.Sprintf("n%d", i)
		var pods []*v1.Pod
		if i > 0 {
			held := pod(fmt.Sprint(i), "")
			held.Name, held.UID, held.Spec.NodeName = "held-"+node.Name, types.UID("uid-"+node.Name), node.Name
			pods = append(pods, held)
		}
		info := framework.NewNodeInfo(pods...)
		info.SetNode(node)
		infos = append(infos, info)
	}
	p := plugin(t).OverNodes(func() ([]fwk.NodeInfo, error) { return infos, nil })
	return p, infos
}

// kube-scheduler's batching (1.35+) keeps a cycle's Score answers and, for the next
// alike pod, calls PreScore over the kept nodes and the one it placed on, Score on that
// one alone, and NormalizeScore over the kept answers and the new one
// (runtime/batch.go, rescoreHintedNode). The scores must be those of a whole cycle
// over the same nodes: the tickets of the kept nodes still lead to what Score read.
func TestABatchedPodScoresAsAWholeCycle(t *testing.T) {
	p, infos := batchCluster(t)
	ctx := context.Background()
	asking := pod("1", "")
	first := framework.NewCycleState()
	if status := p.PreScore(ctx, first, asking, infos); !status.IsSuccess() {
		t.Fatal(status)
	}
	kept := make(fwk.NodeScoreList, len(infos)) // Score's answers, as the batch keeps them
	for i, info := range infos {
		ticket, status := p.Score(ctx, first, asking, info)
		if !status.IsSuccess() {
			t.Fatal(status)
		}
		kept[i] = fwk.NodeScore{Name: info.Node().Name, Score: ticket}
	}
	if status := p.NormalizeScore(ctx, first, asking, append(fwk.NodeScoreList(nil), kept...)); !status.IsSuccess() {
		t.Fatal(status)
	}
	// the pod goes to n3; kube-scheduler keeps the others' answers
	chosen := infos[3].(*framework.NodeInfo)
	placed := pod("1", "")
	placed.Name, placed.UID, placed.Spec.NodeName = "placed", "uid-placed", "n3"
	chosen.AddPod(placed)
	p.Reserve(ctx, first, placed, "n3")
	var others []fwk.NodeInfo
	var list fwk.NodeScoreList
	for i, info := range infos {
		if i != 3 {
			others = append(others, info)
			list = append(list, kept[i])
		}
	}
	batched := framework.NewCycleState()
	if status := p.PreScore(ctx, batched, asking, append(others, chosen)); !status.IsSuccess() {
		t.Fatal(status)
	}
	fresh, status := p.Score(ctx, batched, asking, chosen)
	if !status.IsSuccess() {
		t.Fatal(status)
	}
	list = append(list, fwk.NodeScore{Name: "n3", Score: fresh})
	snapshot := p.snapshot
	p.snapshot = nil // no reading again by name: the tickets alone
	if status := p.NormalizeScore(ctx, batched, asking, list); !status.IsSuccess() {
		t.Fatal(status)
	}
	p.snapshot = snapshot
	_, whole, status := p.ScoreAll(ctx, framework.NewCycleState(), asking, append(others, chosen))
	if !status.IsSuccess() {
		t.Fatal(status)
	}
	for i := range whole {
		if list[i] != whole[i] {
			t.Fatalf("batched %v, a whole cycle %v", list, whole)
		}
	}
	if list[len(list)-1].Score <= whole[0].Score {
		t.Fatalf("n3, one GPU fuller, should rank above n0 for binpack: %v", list)
	}
}

// A ticket the ring no longer holds (or a list NormalizeScore did not get from Score)
// is read again by name from the snapshot: the same scores.
func TestALostTicketIsReadAgainByName(t *testing.T) {
	p, infos := batchCluster(t)
	ctx := context.Background()
	asking := pod("2", "")
	want := wholeCycle(t, p, asking, infos)
	lost := framework.NewCycleState()
	if status := p.PreScore(ctx, lost, asking, infos); !status.IsSuccess() {
		t.Fatal(status)
	}
	list := make(fwk.NodeScoreList, len(infos))
	for i, info := range infos {
		list[i] = fwk.NodeScore{Name: info.Node().Name, Score: want[i].Score + ringSize*1000} // no such ticket
	}
	list[0].Score = 0
	if status := p.NormalizeScore(ctx, lost, asking, list); !status.IsSuccess() {
		t.Fatal(status)
	}
	for i := range want {
		if list[i] != want[i] {
			t.Fatalf("read again %v, want %v", list, want)
		}
	}
	// a node gone from the snapshot scores 0 and takes no part in the others' stretch
	list = fwk.NodeScoreList{{Name: "gone"}, {Name: "n0"}, {Name: "n7"}}
	if status := p.NormalizeScore(ctx, lost, asking, list); !status.IsSuccess() || list[0].Score != 0 ||
		list[2].Score <= list[1].Score {
		t.Fatalf("with a node gone: %v %v", list, status)
	}
}

// The ring hands each ticket's entry back while its slot holds it, and nothing for a
// ticket it never gave or has given its slot away since.
func TestTheRingHoldsATicketUntilItsSlotIsTaken(t *testing.T) {
	r := newRing()
	a, b := &cachedFit{}, &cachedFit{}
	ta := r.put(a)
	if r.get(ta) != a || r.get(0) != nil || r.get(-1) != nil || r.get(ta+1) != nil {
		t.Fatal("a ticket just given")
	}
	for range ringSize - 1 {
		r.put(b)
	}
	if r.get(ta) != a {
		t.Fatal("the ring lost a ticket before its slot came round")
	}
	r.put(b)
	if r.get(ta) != nil {
		t.Fatal("a ticket whose slot was taken still answered")
	}
}

// kube-scheduler calls Score on 16 goroutines at once: the tickets they answer lead
// to the same scores as one goroutine's (run under -race, this also checks the cache's
// and the ring's locking).
func TestScoreOnManyGoroutinesAtOnce(t *testing.T) {
	p, infos := batchCluster(t)
	ctx := context.Background()
	asking := pod("1", "")
	want := wholeCycle(t, p, asking, infos)
	for range 20 {
		for _, info := range infos { // a new generation each round: the entries are read again
			info.(*framework.NodeInfo).SetNode(info.Node())
		}
		state := framework.NewCycleState()
		if status := p.PreScore(ctx, state, asking, infos); !status.IsSuccess() {
			t.Fatal(status)
		}
		list := make(fwk.NodeScoreList, len(infos))
		var wg sync.WaitGroup
		for i, info := range infos {
			wg.Go(func() {
				ticket, _ := p.Score(ctx, state, asking, info)
				list[i] = fwk.NodeScore{Name: info.Node().Name, Score: ticket}
			})
		}
		wg.Wait()
		if status := p.NormalizeScore(ctx, state, asking, list); !status.IsSuccess() {
			t.Fatal(status)
		}
		for i := range want {
			if list[i] != want[i] {
				t.Fatalf("on many goroutines %v, on one %v", list, want)
			}
		}
	}
}

// wholeCycle is the scores of one whole cycle over the nodes (the reference the
// batching and the concurrent Score are held to).
func wholeCycle(t *testing.T, p *GPUScheduler, asking *v1.Pod, infos []fwk.NodeInfo) fwk.NodeScoreList {
	t.Helper()
	_, list, status := p.ScoreAll(context.Background(), framework.NewCycleState(), asking, infos)
	if !status.IsSuccess() {
		t.Fatal(status)
	}
	return list
}
