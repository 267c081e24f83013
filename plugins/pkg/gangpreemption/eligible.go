//go:build !k8s1_34 && !k8s1_35 && !k8s1_36

package gangpreemption

import (
	v1 "k8s.io/api/core/v1"
	fw "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

// eligible: from 1.37 a victim is a unit DefaultPreemption evicts whole, one pod or
// every pod of a PodGroup whose disruption mode is All. A unit of several pods is
// kube-scheduler's gang, whole; a single pod is a victim unless it belongs to a Gang.
func eligible(_ fw.NodeInfo, victim preemption.Victim, _ *v1.Pod) bool {
	pods := victim.Pods()
	return len(pods) != 1 || Gang(pods[0].GetPod()) == ""
}
