// Package fakedra is kube-scheduler's DRA state as GPUScheduler reads it
// (fwk.SharedDRAManager), over given objects: for the plugins' unit tests and the
// conformance suite. The class resolver is upstream's extended-resource cache.
package fakedra

import (
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// Manager holds the objects; what the plugin does not read stays nil.
type Manager struct {
	fwk.SharedDRAManager
	Classes []*resourceapi.DeviceClass
	Slices  []*resourceapi.ResourceSlice
	Claims  []*resourceapi.ResourceClaim
}

func (f *Manager) ResourceSlices() fwk.ResourceSliceLister  { return slices{f} }
func (f *Manager) DeviceClasses() fwk.DeviceClassLister     { return classes{f} }
func (f *Manager) ResourceClaims() fwk.ResourceClaimTracker { return claims{f: f} }

type slices struct{ f *Manager }

func (s slices) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	return s.f.Slices, nil
}

type classes struct{ f *Manager }

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c.f.Classes, nil }

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, class := range c.f.Classes {
		if class.Name == name {
			return class, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

type claims struct {
	fwk.ResourceClaimTracker
	f *Manager
}

func (c claims) List() ([]*resourceapi.ResourceClaim, error) { return c.f.Claims, nil }

func (c claims) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	for _, claim := range c.f.Claims {
		if claim.Namespace == namespace && claim.Name == name {
			return claim, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

// GatherAllocatedState is the claims' allocations as the claim tracker gathers them:
// a result with a share ID is a shared allocation, its consumed capacity summed.
func (c claims) GatherAllocatedState() (*structured.AllocatedState, error) {
	out := &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	for _, claim := range c.f.Claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				out.AllocatedDevices.Insert(id)
				continue
			}
			out.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			out.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	return out, nil
}
