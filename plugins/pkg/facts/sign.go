//go:build !k8s1_34

package facts

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// SignPod gives kube-scheduler's batching the pod's signature (1.35+: a Filter or Score
// plugin that does not sign turns batching off for every pod of the profile): one
// fragment, the same from each plugin, which the framework keeps once.
func (Signer) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return []fwk.SignFragment{{Key: SignKey, Value: Signature(pod)}}, nil
}
