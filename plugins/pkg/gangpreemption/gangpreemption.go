// Package gangpreemption is the GangPreemption framework plugin: kube-scheduler's
// DefaultPreemption with the extender's gang rule (extender/preemption.py). The
// profile of the plugins path runs it in DefaultPreemption's place.
//
// DefaultPreemption evicts pods one at a time: it may take one worker of a
// multi-node job and leave the others holding their GPUs idle. Here a pod of a gang
// that kube-scheduler does not itself evict whole, one carrying gpu-scheduler.io/group
// or belonging to a Kueue workload or plain-pod group (Gang), is not a victim:
// preempting such gangs is Kueue's (it evicts workloads whole). Upstream PodGroups
// are kube-scheduler's own: from 1.37 DefaultPreemption makes the pods of a PodGroup
// whose disruption mode is All one victim across nodes, evicted together, and such a
// victim stays eligible. The rule is upstream's customisation point, IsEligiblePod;
// everything else is DefaultPreemption's (victim choice, budgets, the node it picks,
// asynchronous preemption, PodGroup preemption), but for the extender's "once per
// preemption" (once.go).
//
// The extender path, which cannot replace DefaultPreemption, drops a node whose
// victims would split a gang; a gang whose members all run on that node and are all
// victims may go there. Here no such gang is a victim: IsEligiblePod sees one victim
// at a time, and DefaultPreemption's reprieve could keep one member and evict another.
package gangpreemption

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// Name is the plugin's name in a scheduler profile.
const Name = "GangPreemption"

// GangPreemption is DefaultPreemption with IsEligiblePod set: every extension point
// DefaultPreemption has at the minor (PostFilter, PreEnqueue, PodGroupPostFilter) is
// its own.
type GangPreemption struct {
	*defaultpreemption.DefaultPreemption
	once once
}

// Name is the plugin's name.
func (p *GangPreemption) Name() string { return Name }

// New builds DefaultPreemption with its defaults (the share and number of candidate
// nodes kube-scheduler's own profile uses: 10% and 100) and the scheduler's feature
// gates, and sets its IsEligiblePod.
func New(ctx context.Context, _ runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
	args := &config.DefaultPreemptionArgs{
		MinCandidateNodesPercentage: 10,
		MinCandidateNodesAbsolute:   100,
	}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	plugin, err := defaultpreemption.New(ctx, args, fh, fts)
	if err != nil {
		return nil, err
	}
	plugin.IsEligiblePod = eligible
	return &GangPreemption{DefaultPreemption: plugin}, nil
}

// Gang is the gang a pod belongs to that kube-scheduler does not evict whole, as a key
// ("kind/namespace/name"), or "": its gpu-scheduler.io/group, its Kueue plain-pod
// group, or the Kueue workload it is a pod of (the Workload it names, else the UID of
// its controlling owner). As the extender's pod_gang (gpu_scheduler/podspec.py) but
// for the PodGroup it may join, which is kube-scheduler's to keep whole.
func Gang(pod *v1.Pod) string {
	namespace := pod.Namespace
	if namespace == "" {
		namespace = "default"
	}
	key := func(kind, name string) string {
		return kind + "/" + clip(namespace) + "/" + clip(name)
	}
	if name := pod.Annotations[contract.AnnGroup]; name != "" {
		return key("group", name)
	}
	if name := pod.Labels[contract.LabelKueuePodGroup]; name != "" {
		return key("kueue-pods", name)
	}
	if _, ok := pod.Labels[contract.LabelKueuePodset]; ok {
		name := pod.Annotations[contract.AnnKueueWorkload]
		if name == "" {
			name = controllerUID(pod)
		}
		if name != "" {
			return key("kueue", name)
		}
	}
	return ""
}

// controllerUID: the UID of the object that controls the pod (its Job, ...), or "".
func controllerUID(pod *v1.Pod) string {
	for _, owner := range pod.OwnerReferences {
		if owner.Controller != nil && *owner.Controller {
			return string(owner.UID)
		}
	}
	return ""
}

// clip keeps a key's parts as long as the extender keeps them.
func clip(s string) string {
	if len(s) > 253 {
		return s[:253]
	}
	return s
}
