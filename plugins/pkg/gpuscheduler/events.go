package gpuscheduler

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// EventsToRegister: what may let a pod this plugin refused fit. A node that arrives or
// whose labels, allocatable or annotations change (the agent's health and the
// gpus-unhealthy label), a pod deleted from a node (its GPUs freed); and for DRA GPUs,
// as kube-scheduler's DynamicResources plugin registers them, a ResourceSlice added
// or changed (devices published, a taint gone, a DeviceTaintRule deleted), a
// DeviceClass added or changed, and a claim that gave its devices back.
func (p *GPUScheduler) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeLabel |
			fwk.UpdateNodeAllocatable | fwk.UpdateNodeAnnotation}, QueueingHintFn: p.nodeChanged},
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Delete}, QueueingHintFn: podGone},
		{Event: fwk.ClusterEvent{Resource: fwk.ResourceSlice, ActionType: fwk.Add | fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: fwk.DeviceClass, ActionType: fwk.Add | fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: fwk.ResourceClaim, ActionType: fwk.Update | fwk.Delete}, QueueingHintFn: claimFreed},
	}, nil
}

// nodeChanged queues the pod when what the rules read of the node changed.
func (p *GPUScheduler) nodeChanged(_ klog.Logger, _ *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	after, ok := newObj.(*v1.Node)
	if !ok {
		return fwk.Queue, nil
	}
	before, ok := oldObj.(*v1.Node)
	if !ok || before == nil {
		return fwk.Queue, nil // a new node
	}
	a, b := facts.ReadNode(after), facts.ReadNode(before)
	if a.Allocatable != b.Allocatable || a.Labelled != b.Labelled || a.MemoryMiB != b.MemoryMiB ||
		a.Model != b.Model || healthOf(a) != healthOf(b) ||
		after.Labels[contract.LabelGpuSharing] != before.Labels[contract.LabelGpuSharing] {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

func healthOf(n *facts.Node) int64 {
	if n.Health == nil {
		return -1
	}
	return n.Health.Healthy<<32 | n.Health.Total
}

// podGone queues the pod when a pod that held GPUs left its node.
func podGone(_ klog.Logger, _ *v1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	pod, ok := oldObj.(*v1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return fwk.QueueSkip, nil
	}
	if facts.GpuRequest(pod) > 0 {
		return fwk.Queue, nil
	}
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Requests[v1.ResourceName(contract.ResourceGpuMemory)]; ok {
			return fwk.Queue, nil
		}
	}
	return fwk.QueueSkip, nil
}
