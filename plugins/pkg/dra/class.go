package dra

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

// Class is the DeviceClass serving the GPU resource, its CEL selectors compiled by
// upstream's compiler (k8s.io/dynamic-resource-allocation/cel, through its cache).
type Class struct {
	Class *resourceapi.DeviceClass
	exprs []cel.CompilationResult
	// Problem: why its devices are not counted (a selector that does not compile, or
	// the first that failed on a device); "" while none.
	Problem string
}

// NewClass compiles the class's selectors through cache (nil class: none).
func NewClass(class *resourceapi.DeviceClass, cache *cel.Cache) *Class {
	if class == nil {
		return nil
	}
	out := &Class{Class: class}
	for _, selector := range class.Spec.Selectors {
		if selector.CEL == nil {
			continue
		}
		compiled := cache.GetOrCompile(selector.CEL.Expression)
		if compiled.Error != nil && out.Problem == "" {
			out.Problem = "selector does not compile: " + compiled.Error.Error()
		}
		out.exprs = append(out.exprs, compiled)
	}
	return out
}

// Matches says whether every selector holds for a device of the driver; a selector
// that fails to compile or to evaluate matches nothing (as in the allocator).
func (c *Class) Matches(driver string, device *resourceapi.Device) bool {
	if c == nil {
		return false
	}
	input := cel.Device{Driver: driver, AllowMultipleAllocations: device.AllowMultipleAllocations,
		Attributes: device.Attributes, Capacity: device.Capacity}
	for _, expr := range c.exprs {
		if expr.Error != nil {
			return false
		}
		ok, _, err := expr.DeviceMatches(context.Background(), input)
		if err != nil {
			if c.Problem == "" {
				c.Problem = "selector could not be evaluated: " + err.Error()
			}
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}
