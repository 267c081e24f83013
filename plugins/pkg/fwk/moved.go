//go:build !k8s1_34

package fwk

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	fw "k8s.io/kube-scheduler/framework"
)

// The types that moved to the staging module in 1.35.
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
	// SignPlugin and SignFragment: batching of alike pods (1.35+).
	SignPlugin   = fw.SignPlugin
	SignFragment = fw.SignFragment
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
	DeviceClassResolver  = fw.DeviceClassResolver
)

// ExtendedResourceClass is the DeviceClass kube-scheduler allocates an extended
// resource from (nil: none, or DRAExtendedResource is off): its own resolver, which
// prefers the newest class and at equal times the name that sorts first.
func ExtendedResourceClass(m SharedDRAManager, name v1.ResourceName) (*resourceapi.DeviceClass, error) {
	resolver := m.DeviceClassResolver()
	if resolver == nil {
		return nil, nil
	}
	return resolver.GetDeviceClass(name), nil
}
