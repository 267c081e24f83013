package facts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// Health is what the agent's per-GPU annotation says of a node's GPUs: the units of
// nvidia.com/gpu its GPUs make (Total), those of the healthy ones (Healthy), and each
// unhealthy GPU in words. The Python reference is gpu_scheduler.contract.gpu_health.
type Health struct {
	Healthy, Total int64
	Unhealthy      []string
}

// Usable is, of allocatable (what the device plugin advertises), the units a pod can
// be given: all of them where the plugin already left the sick GPUs out, the healthy
// ones where it counts every GPU, and where it counts more than the GPUs make, its
// share of each sick GPU taken off.
func (h *Health) Usable(allocatable int64) int64 {
	if allocatable <= h.Healthy || h.Total <= 0 {
		return allocatable
	}
	if allocatable > h.Total {
		return max(0, allocatable-(h.Total-h.Healthy)*(allocatable/h.Total))
	}
	return h.Healthy
}

// ReadHealth reads the agent's annotation; nil where there is none or it cannot be
// read (then nothing is held against the node). replicas: units a healthy GPU outside
// MIG counts; migSingle: MIG devices are nvidia.com/gpu (GFD's single strategy).
func ReadHealth(value string, replicas int64, migSingle bool) *Health {
	if value == "" || len(value) > contract.MaxGpusAnnotation {
		return nil
	}
	var gpus []any
	if !sharing.Decode(value, &gpus) {
		return nil
	}
	if bytes.TrimSpace([]byte(value))[0] != '[' {
		return nil
	}
	h := &Health{}
	for _, item := range gpus {
		gpu, ok := item.(map[string]any)
		if !ok {
			return nil
		}
		var units int64
		if gpu[contract.GpuMigEnabled] == true {
			if devices, ok := gpu[contract.GpuMigDevices].([]any); ok && migSingle {
				units = int64(len(devices))
			}
		} else {
			units = max(1, replicas)
		}
		h.Total += units
		if gpu[contract.GpuHealthy] != false {
			h.Healthy += units
			continue
		}
		h.Unhealthy = append(h.Unhealthy, unhealthyWords(gpu))
	}
	return h
}

// unhealthyWords: "GPU-… (XID 79; reason; since …)", as the extender words it.
func unhealthyWords(gpu map[string]any) string {
	uuid := clipText(pyStr(gpu[contract.GpuUuid], "unknown"), 64)
	reason := clipText(pyStr(gpu[contract.GpuReason], ""), 120)
	var details []string
	if word := xidWords(gpu[contract.GpuXid]); word != "" && !strings.Contains(reason, word) {
		details = append(details, word)
	}
	if reason != "" {
		details = append(details, reason)
	}
	if since := pyStr(gpu[contract.GpuSince], ""); since != "" {
		details = append(details, "since "+clipText(since, 32))
	}
	if len(details) == 0 {
		return uuid
	}
	return fmt.Sprintf("%s (%s)", uuid, strings.Join(details, "; "))
}

// xidWords: "XID n" for an integer XID (a JSON true or false too: Python's bool is an
// int, and the extender words it so).
func xidWords(xid any) string {
	switch v := xid.(type) {
	case json.Number:
		if n, ok := new(big.Int).SetString(string(v), 10); ok && isInteger(string(v)) {
			return "XID " + n.String()
		}
	case bool:
		if v {
			return "XID True"
		}
		return "XID False"
	}
	return ""
}

func isInteger(number string) bool {
	digits := strings.TrimPrefix(number, "-")
	return digits != "" && strings.Trim(digits, "0123456789") == ""
}

// pyStr is `str(value or fallback)` for the JSON strings and numbers the agent writes.
func pyStr(value any, fallback string) string {
	switch v := value.(type) {
	case string:
		if v != "" {
			return v
		}
	case json.Number:
		if v != "0" {
			return string(v)
		}
	case bool:
		if v {
			return "True"
		}
	}
	return fallback
}

// clipText cuts text to limit characters as gpu_scheduler.textclip.clip_text does.
func clipText(text string, limit int) string {
	runes := []rune(text)
	if len(runes) <= limit {
		return text
	}
	return fmt.Sprintf("%s... (truncated of %d characters)", string(runes[:limit]), len(runes))
}
