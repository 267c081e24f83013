package facts

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

func TestHealthCountsUnitsAsTheExtenderDoes(t *testing.T) {
	value := `[{"uuid":"GPU-a","healthy":true},{"uuid":"GPU-b","healthy":false,"xid":79,` +
		`"reason":"fell off the bus","since":"2026-12-01T10:00:00Z"}]`
	h := ReadHealth(value, 2, false) // time-sliced twice: each GPU is 2 units
	if h.Healthy != 2 || h.Total != 4 {
		t.Fatalf("%+v", h)
	}
	if want := "GPU-b (XID 79; fell off the bus; since 2026-12-01T10:00:00Z)"; h.Unhealthy[0] != want {
		t.Fatalf("%q", h.Unhealthy[0])
	}
	// The device plugin still advertises all 4: the sick GPU's 2 are taken off.
	if got := h.Usable(4); got != 2 {
		t.Fatalf("usable %d", got)
	}
	for _, bad := range []string{"", "{}", `[1]`, "[", strings.Repeat(" ", contract.MaxGpusAnnotation+1)} {
		if ReadHealth(bad, 1, false) != nil {
			t.Errorf("%q read as health", bad)
		}
	}
}

func TestCapacityTypeReadsEveryCloudsLabel(t *testing.T) {
	for _, pair := range contract.SpotLabels {
		if got := CapacityType(map[string]string{pair[0]: pair[1]}); got != "spot" {
			t.Errorf("%s=%s: %q", pair[0], pair[1], got)
		}
		if got := CapacityType(map[string]string{pair[0]: "other"}); got != "on-demand" {
			t.Errorf("%s=other: %q", pair[0], got)
		}
	}
	if got := CapacityType(nil); got != "" {
		t.Errorf("no label: %q", got)
	}
}

func TestAMemoryLabelIsReadAsNodeAffinityReadsIt(t *testing.T) {
	for value, want := range map[string]int64{"81559": 81559, "80Gi": -1, "-1": -1, "": -1,
		"99999999999999999999": -1} {
		node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
			Labels: map[string]string{contract.LabelGpuMemory: value}}}
		if got := ReadNode(node).MemoryMiB; got != want {
			t.Errorf("%q: %d, want %d", value, got, want)
		}
	}
}

func TestTheCacheReadsANodeOncePerResourceVersion(t *testing.T) {
	c := NewCache()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1"},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceName(contract.ResourceGpu): resource.MustParse("8")}}}
	first := c.Of(node)
	if c.Of(node) != first {
		t.Fatal("read again at the same resourceVersion")
	}
	changed := node.DeepCopy()
	changed.ResourceVersion = "2"
	changed.Status.Allocatable[v1.ResourceName(contract.ResourceGpu)] = resource.MustParse("4")
	if got := c.Of(changed); got == first || got.Allocatable != 4 {
		t.Fatalf("a new resourceVersion kept the old facts: %+v", got)
	}
}

// The objects read are published by pointer (the first at once, then once publishEvery
// more of them were read): a
// published object's facts are found without the lock, a new object of the same node
// is read by its resourceVersion, and the map starts over once it holds staleObjects
// more objects than there are nodes.
func TestObjectsReadArePublishedByPointer(t *testing.T) {
	c := NewCache()
	nodes := make([]*v1.Node, publishEvery+1)
	for i := range nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n-%d", i), ResourceVersion: "1"}}
		c.Of(nodes[i])
	}
	published := c.objects.Load()
	if published == nil {
		t.Fatal("nothing published")
	}
	if len(*published) != len(nodes) {
		t.Fatalf("after %d objects, %d published", len(nodes), len(*published))
	}
	// a published object is answered from the map, even were the name level gone
	first := c.Of(nodes[0])
	c.mu.Lock()
	clear(c.nodes)
	c.mu.Unlock()
	if c.Of(nodes[0]) != first {
		t.Fatal("a published object was read again")
	}
	// the same node decoded again at a new version: its own facts
	again := nodes[1].DeepCopy()
	again.ResourceVersion = "2"
	again.Status.Allocatable = v1.ResourceList{v1.ResourceName(contract.ResourceGpu): resource.MustParse("2")}
	if got := c.Of(again); got.Allocatable != 2 {
		t.Fatalf("a new object of a published node: %+v", got)
	}
	// objects of nodes that changed pile up until the map starts over
	for i := 0; i < 2*staleObjects; i++ {
		changed := nodes[0].DeepCopy()
		changed.ResourceVersion = fmt.Sprint(i + 3)
		c.Of(changed)
	}
	if n := len(*c.objects.Load()); n > len(c.nodes)+staleObjects {
		t.Fatalf("%d objects published for %d nodes", n, len(c.nodes))
	}
}

func TestMemorySizesAreWordedAsTheExtenderWordsThem(t *testing.T) {
	for value, want := range map[string]int64{"40Gi": 40960, "81920": 81920, "80G": 76293, " 24Gi ": 24576} {
		if got, err := ParseMiB(value); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", value, got, err, want)
		}
	}
	for value, words := range map[string]string{
		"lots":     "not a quantity: 'lots' (use e.g. 2, 500m, 40Gi, 80G or 1e3)",
		"-5Gi":     "memory must not be negative: '-5Gi'",
		"1e999999": "quantity '1e999999' is beyond 2**63-1",
	} {
		if _, err := ParseMiB(value); err == nil || err.Error() != words {
			t.Errorf("%q: %v, want %q", value, err, words)
		}
	}
}

// Nodes kube-scheduler's informer reports deleted are forgotten, so their objects leave
// the published map at its next pruning.
func TestDeletedNodesAreForgotten(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone", ResourceVersion: "1"}}
	client := fake.NewClientset(gone)
	factory := informers.NewSharedInformerFactory(client, 0)
	c := NewCache()
	if err := c.ForgetDeleted(factory.Core().V1().Nodes().Informer()); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// the fake client does not replay a delete to a watch started after it: wait for
	// the informer's watch (synced means listed, not yet watching)
	for deadline := time.Now().Add(5 * time.Second); !watching(client); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the informer never watched the nodes")
		}
	}
	time.Sleep(50 * time.Millisecond) // the action is recorded before the watch is opened
	c.Of(gone)
	if err := client.CoreV1().Nodes().Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c.mu.RLock()
		_, known := c.nodes["gone"]
		c.mu.RUnlock()
		if !known {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a deleted node's facts are still kept")
		}
	}
}

// watching: the fake client has been asked to watch nodes.
func watching(client *fake.Clientset) bool {
	for _, action := range client.Actions() {
		if action.GetVerb() == "watch" && action.GetResource().Resource == "nodes" {
			return true
		}
	}
	return false
}
