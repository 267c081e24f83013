package spotscheduler

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

func kindNode(name string, spot bool) *v1.Node {
	labels := map[string]string{}
	if spot {
		labels[contract.SpotLabels[0][0]] = contract.SpotLabels[0][1]
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// The count follows the informer: one kind until a spot node joins on-demand ones, one
// kind again once it is relabelled or deleted; an all-spot cluster is one kind too.
func TestKindsFollowTheNodeInformer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(kindNode("a", false), kindNode("b", false))
	factory := informers.NewSharedInformerFactory(client, 0)
	kinds := NewKinds()
	if kinds.OneKind() {
		t.Fatal("one kind before the informer delivered anything")
	}
	if err := kinds.Watch(factory.Core().V1().Nodes().Informer()); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	eventually(t, "two on-demand nodes are one kind", kinds.OneKind)
	nodes := client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, kindNode("s", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a spot node among on-demand ones mixes them", func() bool { return !kinds.OneKind() })
	if _, err := nodes.Update(ctx, kindNode("s", false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "relabelled on-demand: one kind", kinds.OneKind)
	for _, name := range []string{"a", "b"} {
		if _, err := nodes.Update(ctx, kindNode(name, true), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "two spot, one on-demand: mixed", func() bool { return !kinds.OneKind() })
	if err := nodes.Delete(ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every node spot: one kind", kinds.OneKind)
}

// PreScore skips on a cluster of one kind without reading the nodes, and scores a mixed
// one from the nodes it is given.
func TestPreScoreSkipsAClusterOfOneKind(t *testing.T) {
	infos := []fwk.NodeInfo{}
	for _, n := range []*v1.Node{kindNode("x", true), kindNode("y", false)} {
		info := framework.NewNodeInfo()
		info.SetNode(n)
		infos = append(infos, info)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{contract.AnnSpot: "prefer"}}}
	oneKind := NewKinds()
	oneKind.synced = func() bool { return true }
	oneKind.set("x", false, false)
	if st := NewWith(oneKind).PreScore(context.Background(), framework.NewCycleState(), pod, infos); !st.IsSkip() {
		t.Fatalf("a cluster of on-demand nodes: PreScore %v, want Skip", st)
	}
	mixed := NewKinds()
	mixed.synced = func() bool { return true }
	mixed.set("x", true, false)
	mixed.set("y", false, false)
	if st := NewWith(mixed).PreScore(context.Background(), framework.NewCycleState(), pod, infos); !st.IsSuccess() {
		t.Fatalf("a mixed cluster: PreScore %v, want the nodes scored", st)
	}
	if st := NewWith(nil).PreScore(context.Background(), framework.NewCycleState(), pod, infos); !st.IsSuccess() {
		t.Fatalf("no count: PreScore %v, want the nodes read and scored", st)
	}
}
