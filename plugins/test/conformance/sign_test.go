//go:build !k8s1_34

package conformance

import (
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/azscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/gpuscheduler"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/spotscheduler"
)

// Every plugin signs pods (facts.Signer), or kube-scheduler 1.35+ batches none.
var (
	_ fwk.SignPlugin = &gpuscheduler.GPUScheduler{}
	_ fwk.SignPlugin = &spotscheduler.SpotScheduler{}
	_ fwk.SignPlugin = &azscheduler.AZScheduler{}
)
