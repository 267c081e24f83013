//go:build !k8s1_34 && !k8s1_35 && !k8s1_36

package gangpreemption

import (
	"testing"

	fw "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

func TestVictimsOfAGangAreNotEligibleUnlessKubeSchedulerEvictsThemWhole(t *testing.T) {
	lone := podInfo(t, pod("ml", nil, nil))
	member := podInfo(t, pod("ml", nil, map[string]string{"gpu-scheduler.io/group": "train"}))
	victim := func(keyType fw.EntityKeyType, pods ...fw.PodInfo) preemption.Victim {
		v, err := preemption.NewVictim(pods, 0, keyType)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if !eligible(nil, victim(fw.PodKeyType, lone), nil) {
		t.Error("a pod of no gang is a victim")
	}
	if eligible(nil, victim(fw.PodKeyType, member), nil) {
		t.Error("a member of a gpu-scheduler.io/group alone is no victim")
	}
	if !eligible(nil, victim(fw.PodGroupKeyType, member, lone), nil) {
		t.Error("a PodGroup kube-scheduler evicts whole is a victim")
	}
}
