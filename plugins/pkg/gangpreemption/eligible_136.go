//go:build k8s1_34 || k8s1_35 || k8s1_36

package gangpreemption

import (
	v1 "k8s.io/api/core/v1"
	fw "k8s.io/kube-scheduler/framework"
)

// eligible: up to 1.36 DefaultPreemption takes pods one at a time; a pod is a victim
// unless it belongs to a Gang.
func eligible(_ fw.NodeInfo, victim fw.PodInfo, _ *v1.Pod) bool {
	return Gang(victim.GetPod()) == ""
}
