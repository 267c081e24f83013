//go:build k8s1_34

package fwk

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/features"
	fw "k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources/extended"
)

// The types that 1.34 still kept in k8s.io/kubernetes.
type (
	Handle              = fw.Handle
	Plugin              = fw.Plugin
	PreFilterPlugin     = fw.PreFilterPlugin
	FilterPlugin        = fw.FilterPlugin
	PreScorePlugin      = fw.PreScorePlugin
	ScorePlugin         = fw.ScorePlugin
	ReservePlugin       = fw.ReservePlugin
	PostBindPlugin      = fw.PostBindPlugin
	EnqueueExtensions   = fw.EnqueueExtensions
	PreFilterResult     = fw.PreFilterResult
	PreFilterExtensions = fw.PreFilterExtensions
	ScoreExtensions     = fw.ScoreExtensions
	NodeScoreList       = fw.NodeScoreList
	NodeScore           = fw.NodeScore
	PostFilterResult    = fw.PostFilterResult
	NodeToStatusReader  = fw.NodeToStatusReader
)

// MaxNodeScore is the highest score a Score plugin gives.
const MaxNodeScore = fw.MaxNodeScore

// SharedDRAManager is kube-scheduler's DRA state: claims with the allocations it has
// in flight, slices with DeviceTaintRules applied, classes.
type SharedDRAManager = fw.SharedDRAManager

// The parts of SharedDRAManager.
type (
	ResourceClaimTracker = fw.ResourceClaimTracker
	ResourceSliceLister  = fw.ResourceSliceLister
	DeviceClassLister    = fw.DeviceClassLister
)

// ExtendedResourceClass is the DeviceClass kube-scheduler allocates an extended
// resource from (nil: none, or DRAExtendedResource, alpha in 1.34, is off): 1.34 has
// no resolver yet, and its DynamicResources plugin maps names to classes with
// extended.DeviceClassMapping, as here.
func ExtendedResourceClass(m SharedDRAManager, name v1.ResourceName) (*resourceapi.DeviceClass, error) {
	if !utilfeature.DefaultFeatureGate.Enabled(features.DRAExtendedResource) {
		return nil, nil
	}
	mapping, err := extended.DeviceClassMapping(m)
	if err != nil {
		return nil, err
	}
	class, ok := mapping[name]
	if !ok {
		return nil, nil
	}
	return m.DeviceClasses().Get(class)
}
