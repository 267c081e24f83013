// Package config holds the plugins' arguments: the same settings as the extender's
// configuration (extender/config.py), rendered by the chart from the same values.
package config

import (
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// GPUSchedulerArgs are GPUScheduler's pluginConfig args.
type GPUSchedulerArgs struct {
	// DefaultPlacement: binpack (fewest GPUs left) or spread, for pods that do not say.
	DefaultPlacement string `json:"defaultPlacement,omitempty"`
	// HeartbeatWindow: an agent whose Lease is older than this is silent (0: off).
	HeartbeatWindow *metav1.Duration `json:"heartbeatWindow,omitempty"`
	// Namespace holds the agents' heartbeat Leases (the install's namespace).
	Namespace string `json:"namespace,omitempty"`
	// Weights of the scores GPUScheduler adds up, as the extender's weights of the same
	// policies: gpu (binpack or spread), scarcity and fragmentation. A policy left out
	// keeps the extender's default; 0 turns it off. The plugin's own weight in the
	// profile is best their sum (the scores are their weighted mean).
	Weights map[string]int64 `json:"weights,omitempty"`
}

// ScorePolicies are GPUScheduler's scores, in the order it adds them.
var ScorePolicies = []string{"gpu", "scarcity", "fragmentation"}

// DefaultWeights are the extender's default weights of GPUScheduler's scores.
var DefaultWeights = map[string]int64{
	"gpu": contract.WeightGpu, "scarcity": contract.WeightScarcity,
	"fragmentation": contract.WeightFragmentation,
}

// AZSchedulerArgs are AZScheduler's pluginConfig args.
type AZSchedulerArgs struct {
	// GroupLevels: the topology labels a placement group packs along, tightest first.
	GroupLevels []string `json:"groupLevels,omitempty"`
}

// Defaults the extender uses (extender/config.py).
const (
	DefaultPlacement       = "binpack"
	DefaultHeartbeatWindow = 900 * time.Second
	DefaultNamespace       = "gpu-scheduler"
)

// DecodeGPUScheduler decodes and checks GPUScheduler's args (nil: the defaults).
func DecodeGPUScheduler(obj runtime.Object) (GPUSchedulerArgs, error) {
	args := GPUSchedulerArgs{}
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return args, fmt.Errorf("GPUScheduler args: %w", err)
		}
	}
	if args.DefaultPlacement == "" {
		args.DefaultPlacement = DefaultPlacement
	}
	if !slices.Contains(contract.Placements, args.DefaultPlacement) {
		return args, fmt.Errorf("GPUScheduler args: defaultPlacement %q: use binpack or spread",
			args.DefaultPlacement)
	}
	if args.HeartbeatWindow == nil {
		args.HeartbeatWindow = &metav1.Duration{Duration: DefaultHeartbeatWindow}
	}
	if args.HeartbeatWindow.Duration < 0 {
		return args, fmt.Errorf("GPUScheduler args: heartbeatWindow must not be negative")
	}
	if args.Namespace == "" {
		args.Namespace = DefaultNamespace
	}
	weights := maps.Clone(DefaultWeights)
	for name, weight := range args.Weights {
		if _, known := weights[name]; !known {
			return args, fmt.Errorf("GPUScheduler args: weights.%s: not one of %v", name, ScorePolicies)
		}
		if weight < 0 || weight > 1000 {
			return args, fmt.Errorf("GPUScheduler args: weights.%s must be 0..1000", name)
		}
		weights[name] = weight
	}
	args.Weights = weights
	return args, nil
}

// DecodeAZScheduler decodes and checks AZScheduler's args (nil: the defaults).
func DecodeAZScheduler(obj runtime.Object) (AZSchedulerArgs, error) {
	args := AZSchedulerArgs{}
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return args, fmt.Errorf("AZScheduler args: %w", err)
		}
	}
	if len(args.GroupLevels) == 0 {
		args.GroupLevels = contract.TopologyLevels
	}
	seen := map[string]bool{}
	for _, level := range args.GroupLevels {
		if level == "" || seen[level] {
			return args, fmt.Errorf("AZScheduler args: groupLevels must be distinct label keys")
		}
		seen[level] = true
	}
	return args, nil
}
