// Package fwk is the one place that knows where kube-scheduler's framework types live
// in each supported minor. Kubernetes 1.35 moved the plugin interfaces, Handle,
// PreFilterResult and NodeScoreList from k8s.io/kubernetes/pkg/scheduler/framework to
// k8s.io/kube-scheduler/framework (kubernetes PR #133172); the method signatures read
// the same in every minor, so the plugins name every type through these aliases and
// one source tree builds for 1.34 (build tag k8s1_34, set by tools/k8s/build.sh) and
// for 1.35 and later (no tag).
package fwk

import fw "k8s.io/kube-scheduler/framework"

// Types that were already in the staging module in 1.34.
type (
	CycleState           = fw.CycleState
	StateData            = fw.StateData
	StateKey             = fw.StateKey
	Status               = fw.Status
	Code                 = fw.Code
	NodeInfo             = fw.NodeInfo
	PodInfo              = fw.PodInfo
	ClusterEvent         = fw.ClusterEvent
	ClusterEventWithHint = fw.ClusterEventWithHint
	EventResource        = fw.EventResource
	QueueingHint         = fw.QueueingHint
)

// Status codes and queueing hints.
const (
	Success                      = fw.Success
	Error                        = fw.Error
	Unschedulable                = fw.Unschedulable
	UnschedulableAndUnresolvable = fw.UnschedulableAndUnresolvable
	Skip                         = fw.Skip
	Queue                        = fw.Queue
	QueueSkip                    = fw.QueueSkip
)

// Event resources and actions.
const (
	Node                  = fw.Node
	Pod                   = fw.Pod
	Add                   = fw.Add
	Delete                = fw.Delete
	UpdateNodeLabel       = fw.UpdateNodeLabel
	UpdateNodeAllocatable = fw.UpdateNodeAllocatable
	UpdateNodeAnnotation  = fw.UpdateNodeAnnotation
	UpdateNodeTaint       = fw.UpdateNodeTaint
	Update                = fw.Update
	ResourceClaim         = fw.ResourceClaim
	ResourceSlice         = fw.ResourceSlice
	DeviceClass           = fw.DeviceClass
)

// NewStatus is the framework's.
var NewStatus = fw.NewStatus

// AsStatus is the framework's.
var AsStatus = fw.AsStatus
