package gpuscheduler

import (
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// fakeDRA is kube-scheduler's DRA state as the plugin reads it, over given objects;
// the class resolver is upstream's (dra_resolver*_test.go).
type fakeDRA struct {
	fwk.SharedDRAManager // what the plugin does not read
	classes              []*resourceapi.DeviceClass
	slices               []*resourceapi.ResourceSlice
	claims               []*resourceapi.ResourceClaim
}

func (f *fakeDRA) ResourceSlices() fwk.ResourceSliceLister  { return fakeSlices{f} }
func (f *fakeDRA) DeviceClasses() fwk.DeviceClassLister     { return fakeClasses{f} }
func (f *fakeDRA) ResourceClaims() fwk.ResourceClaimTracker { return fakeClaims{f: f} }

type fakeSlices struct{ f *fakeDRA }

func (s fakeSlices) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	return s.f.slices, nil
}

type fakeClasses struct{ f *fakeDRA }

func (c fakeClasses) List() ([]*resourceapi.DeviceClass, error) { return c.f.classes, nil }

func (c fakeClasses) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, class := range c.f.classes {
		if class.Name == name {
			return class, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

type fakeClaims struct {
	fwk.ResourceClaimTracker
	f *fakeDRA
}

func (c fakeClaims) List() ([]*resourceapi.ResourceClaim, error) { return c.f.claims, nil }

func (c fakeClaims) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	for _, claim := range c.f.claims {
		if claim.Namespace == namespace && claim.Name == name {
			return claim, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

// GatherAllocatedState is the claims' allocations as the claim tracker gathers them:
// a result with a share ID is a shared allocation, its consumed capacity summed.
func (c fakeClaims) GatherAllocatedState() (*structured.AllocatedState, error) {
	out := &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	for _, claim := range c.f.claims {
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
