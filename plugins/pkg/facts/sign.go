//go:build !k8s1_34

package facts

import (
	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// Fragments is the signature the three plugins give kube-scheduler's batching (1.35+:
// a Filter or Score plugin that does not sign turns batching off for every pod of the
// profile): one fragment, the same from each, which the framework keeps once.
func Fragments(pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return []fwk.SignFragment{{Key: SignKey, Value: Signature(pod)}}, nil
}
