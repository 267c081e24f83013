//go:build !k8s1_34

package spotscheduler

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

var _ fwk.SignPlugin = &SpotScheduler{}

// SignPod: facts.Fragments.
func (p *SpotScheduler) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return facts.Fragments(pod)
}
