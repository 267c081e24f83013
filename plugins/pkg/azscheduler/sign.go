//go:build !k8s1_34

package azscheduler

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

var _ fwk.SignPlugin = &AZScheduler{}

// SignPod lets kube-scheduler batch pods its plugins decide alike (1.35+: a Filter or
// Score plugin that does not sign turns batching off for every pod of the profile).
func (p *AZScheduler) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return []fwk.SignFragment{{Key: facts.SignKey, Value: facts.Signature(pod)}}, nil
}
