//go:build !k8s1_34

package gpuscheduler

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

var _ fwk.SignPlugin = &GPUScheduler{}

// SignPod: facts.Fragments.
func (p *GPUScheduler) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return facts.Fragments(pod)
}
