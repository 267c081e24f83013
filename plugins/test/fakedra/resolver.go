//go:build !k8s1_34

package fakedra

import (
	"testing"

	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// DeviceClassResolver is upstream's extended-resource cache over the classes.
func (f *Manager) DeviceClassResolver() fwk.DeviceClassResolver {
	cache := extendedresourcecache.NewExtendedResourceCache(klog.Background())
	for _, class := range f.Classes {
		cache.OnAdd(class, true)
	}
	return cache
}

// ExtendedResources: the resolver answers whatever the gate (1.35+).
func ExtendedResources(testing.TB) {}
