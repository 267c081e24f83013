package facts

import "k8s.io/client-go/tools/cache"

// Deleted is the object an informer's delete handler was given, as a T: the object
// itself, or the last state the informer knew of it where it missed the deletion
// (cache.DeletedFinalStateUnknown).
func Deleted[T any](obj any) (T, bool) {
	if gone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = gone.Obj
	}
	out, ok := obj.(T)
	return out, ok
}
