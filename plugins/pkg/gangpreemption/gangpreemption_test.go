package gangpreemption

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

func pod(namespace string, labels, annotations map[string]string, owners ...metav1.OwnerReference) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "p", Namespace: namespace, Labels: labels, Annotations: annotations,
		OwnerReferences: owners,
	}}
}

func owner(uid string, controller bool) metav1.OwnerReference {
	return metav1.OwnerReference{Kind: "Job", Name: "j", UID: types.UID(uid), Controller: &controller}
}

// The extender's pod_gang (gpu_scheduler/podspec.py), but for PodGroups: the same
// keys, in the same order of precedence.
func TestGangKeysAsTheExtender(t *testing.T) {
	podset := map[string]string{"kueue.x-k8s.io/podset": "main"}
	cases := []struct {
		name string
		pod  *v1.Pod
		want string
	}{
		{"none", pod("ml", nil, nil), ""},
		{"group annotation", pod("ml", nil, map[string]string{"gpu-scheduler.io/group": "train"}), "group/ml/train"},
		{"empty group", pod("ml", nil, map[string]string{"gpu-scheduler.io/group": ""}), ""},
		{"no namespace", pod("", nil, map[string]string{"gpu-scheduler.io/group": "t"}), "group/default/t"},
		{"kueue plain pods", pod("ml", map[string]string{"kueue.x-k8s.io/pod-group-name": "g"}, nil), "kueue-pods/ml/g"},
		{"group before kueue", pod("ml", map[string]string{"kueue.x-k8s.io/pod-group-name": "g"},
			map[string]string{"gpu-scheduler.io/group": "t"}), "group/ml/t"},
		{"kueue workload named", pod("ml", podset, map[string]string{"kueue.x-k8s.io/workload": "job-w"}), "kueue/ml/job-w"},
		{"kueue workload by its controller", pod("ml", podset, nil, owner("u1", false), owner("u2", true)), "kueue/ml/u2"},
		{"kueue podset, nothing to name it", pod("ml", podset, nil, owner("u1", false)), ""},
		{"owner without kueue", pod("ml", nil, nil, owner("u2", true)), ""},
		{"long names clipped", pod("ml", nil, map[string]string{"gpu-scheduler.io/group": strings.Repeat("x", 300)}),
			"group/ml/" + strings.Repeat("x", 253)},
	}
	for _, c := range cases {
		if got := Gang(c.pod); got != c.want {
			t.Errorf("%s: Gang = %q, want %q", c.name, got, c.want)
		}
	}
}

func podInfo(t *testing.T, p *v1.Pod) *framework.PodInfo {
	t.Helper()
	info, err := framework.NewPodInfo(p)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestAPodThatPreemptedWaitsQuietBeforePreemptingAgain(t *testing.T) {
	var o once
	start := time.Unix(1_800_000_000, 0)
	if o.lately("a", start) {
		t.Fatal("a pod that never preempted may preempt")
	}
	o.mark("a", start)
	if !o.lately("a", start.Add(Quiet-time.Millisecond)) || o.lately("b", start) {
		t.Fatal("only the pod that preempted waits, and within Quiet")
	}
	if o.lately("a", start.Add(Quiet)) {
		t.Fatal("after Quiet it may preempt again")
	}
	o.mark("b", start.Add(Quiet))
	if _, kept := o.at["a"]; kept {
		t.Fatal("entries past Quiet are forgotten")
	}
}
