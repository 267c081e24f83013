package dra

import (
	"strings"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// ProductLabel is an NVML product name as GPU Feature Discovery writes it into
// nvidia.com/gpu.product (gpu_scheduler.contract.product_label_value, no suffix):
// every character other than A-Za-z0-9 - _ . and space deleted, runs of spaces one
// "-", cut to a label value's length with its trailing "-._" trimmed.
func ProductLabel(name string) string {
	kept := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9',
			r == '-', r == '_', r == '.', r == ' ':
			return r
		}
		return -1
	}, name)
	model := strings.Join(strings.Fields(kept), "-")
	if len(model) > contract.MaxLabelValue {
		model = strings.TrimRight(model[:contract.MaxLabelValue], "-._")
	}
	return model
}
