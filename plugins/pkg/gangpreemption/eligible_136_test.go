//go:build k8s1_34 || k8s1_35 || k8s1_36

package gangpreemption

import "testing"

func TestVictimsOfAGangAreNotEligible(t *testing.T) {
	if !eligible(nil, podInfo(t, pod("ml", nil, nil)), nil) {
		t.Error("a pod of no gang is a victim")
	}
	member := pod("ml", map[string]string{"kueue.x-k8s.io/pod-group-name": "g"}, nil)
	if eligible(nil, podInfo(t, member), nil) {
		t.Error("a member of a Kueue plain-pod group is no victim")
	}
}
