// Package sharing is the Go twin of gpu_scheduler/sharing.py: what a sharing node's
// GPUs are, what its agent reports each pod holds, and the one fit rule that says
// which GPU each share goes to (the rule the agent's device plugin steers the kubelet
// by, so a node and its scheduler never disagree).
package sharing

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// Whole is what the agent's report says a pod holds of a GPU it holds whole.
const Whole = "whole"

// Units is the units of sharing a GPU of memoryMiB offers, less reservedMiB (0: unknown).
func Units(memoryMiB, reservedMiB int64) int64 {
	if memoryMiB <= 0 {
		return 0
	}
	return min(max(memoryMiB-max(reservedMiB, 0), 0)/contract.ShareUnitMiB, contract.ShareMaxUnits)
}

// Spec is one GPU of a sharing node as its facts give it.
type Spec struct {
	UUID     string
	Capacity int64 // units
	Healthy  bool
}

// Node is a node whose GPUs the agent's device plugin shares: its mode, its GPUs in
// index order, the agent's report (nil: none readable) and its allocatable units.
type Node struct {
	Mode   string
	Gpus   []Spec
	Report Report
	Units  int64
}

// Gpu is one GPU's state: capacity, units free for shares (0 when sick or given
// whole), and whether a whole-GPU pod may take it.
type Gpu struct {
	UUID      string
	Capacity  int64
	Free      int64
	WholeFree bool
}

// Placement is where a pod goes on one node: the GPUs it takes whole, and the GPU of
// each of its shares (in the request's order).
type Placement struct {
	Whole  []int
	Shares []int
}

// Fit places a pod asking whole GPUs and shares (in the kubelet's order): whole GPUs
// are the wholly free ones, lowest index first; each share goes to the GPU with the
// least free that holds it (ties: the lowest index), never one this pod takes whole.
// ok false: it does not fit.
func Fit(gpus []Gpu, shares []int64, whole int64) (Placement, bool) {
	free := make([]int64, len(gpus))
	for i, g := range gpus {
		free[i] = g.Free
	}
	var p Placement
	if whole > 0 {
		for i, g := range gpus {
			if g.WholeFree && int64(len(p.Whole)) < whole {
				p.Whole = append(p.Whole, i)
			}
		}
		if int64(len(p.Whole)) < whole {
			return Placement{}, false
		}
		for _, i := range p.Whole {
			free[i] = -1
		}
	}
	p.Shares = make([]int, len(shares))
	for k, need := range shares {
		best := -1
		for i, left := range free {
			if left >= need && (best < 0 || left < free[best]) {
				best = i
			}
		}
		if best < 0 {
			return Placement{}, false
		}
		free[best] -= need
		p.Shares[k] = best
	}
	return p, true
}

// After is the GPUs once the placement of shares is made.
func After(gpus []Gpu, p Placement, shares []int64) []Gpu {
	out := append([]Gpu(nil), gpus...)
	for _, i := range p.Whole {
		out[i] = Gpu{out[i].UUID, out[i].Capacity, 0, false}
	}
	for k, i := range p.Shares {
		out[i] = Gpu{out[i].UUID, out[i].Capacity, out[i].Free - shares[k], false}
	}
	return out
}

// Largest is the most units one share could still be given on these GPUs.
func Largest(gpus []Gpu) int64 {
	var top int64
	for _, g := range gpus {
		top = max(top, g.Free)
	}
	return top
}

// Bound is a pod on a sharing node as Usage needs it.
type Bound struct {
	Key    string // its UID, as the agent's report names it
	Whole  int64
	Shares []int64
}

// Usage is each GPU's state on a sharing node: the GPUs, less what the agent reports
// each bound pod holds (pods no longer bound are dropped from the report), less the
// bound pods it has not reported yet, fitted in the order given. It also answers how
// many bound pods did not fit.
func Usage(specs []Spec, report Report, pods []Bound) ([]Gpu, int) {
	index := make(map[string]int, len(specs))
	state := make([]Gpu, len(specs))
	for i, s := range specs {
		index[s.UUID] = i
		free := s.Capacity
		if !s.Healthy {
			free = 0
		}
		state[i] = Gpu{s.UUID, s.Capacity, free, s.Healthy && s.Capacity > 0}
	}
	bound := make(map[string]bool, len(pods))
	for _, pod := range pods {
		bound[pod.Key] = true
	}
	reported := map[string]bool{}
	for _, entry := range report {
		i, ok := index[entry.UUID]
		if !ok {
			continue
		}
		for _, held := range entry.Pods {
			if !bound[held.Key] {
				continue
			}
			reported[held.Key] = true
			state[i].WholeFree = false
			if held.Whole {
				state[i].Free = 0
			} else {
				state[i].Free = max(state[i].Free-held.Units, 0)
			}
		}
	}
	misfits := 0
	for _, pod := range pods {
		if reported[pod.Key] {
			continue
		}
		p, ok := Fit(state, pod.Shares, pod.Whole)
		if !ok {
			misfits++
			continue
		}
		state = After(state, p, pod.Shares)
	}
	return state, misfits
}

// Report is the agent's gpu-shares annotation: per GPU, what each pod holds there (in
// the annotation's order, as Python's dict keeps it).
type Report []ReportGpu

// ReportGpu is one GPU's entry of a Report.
type ReportGpu struct {
	UUID string
	Pods []Held
}

// Held is what one pod holds of a GPU: units, or the GPU whole.
type Held struct {
	Key   string
	Units int64
	Whole bool
}

// ReadReport reads the agent's gpu-shares annotation; nil when absent or unreadable
// (then every bound pod is fitted), and for an older agent's report keyed by
// namespace/name. The order of its entries does not change Usage's answer.
func ReadReport(value string) Report {
	if value == "" || len(value) > contract.ShareMaxAnnotation {
		return nil
	}
	var gpus map[string]any
	if !Decode(value, &gpus) || gpus == nil || len(gpus) > contract.ShareMaxGpus {
		return nil
	}
	report := make(Report, 0, len(gpus))
	for uuid, value := range gpus {
		pods, ok := value.(map[string]any)
		if !ok {
			return nil
		}
		entry := ReportGpu{UUID: uuid}
		for key, units := range pods {
			if key == "" || utf8.RuneCountInString(key) > contract.ShareMaxPodKey || strings.Contains(key, "/") {
				return nil
			}
			held := Held{Key: key}
			switch units := units.(type) {
			case string:
				if units != Whole {
					return nil
				}
				held.Whole = true
			case json.Number:
				n, isInt := Int(units)
				if !isInt || n <= 0 || n > contract.ShareMaxUnits {
					return nil
				}
				held.Units = n
			default:
				return nil
			}
			entry.Pods = append(entry.Pods, held)
		}
		report = append(report, entry)
	}
	return report
}

// MaxDepth: the extender's JSON decoder (orjson) refuses a document nested deeper, so
// this one does too.
const MaxDepth = 1024

// Decode reads one JSON value of an annotation with numbers kept as written (Python
// tells 5 from 5.0), refusing what the extender's decoder refuses (nesting past
// MaxDepth): the one reader of the agent's annotations in the plugins.
func Decode(value string, into any) bool {
	if depth(value) > MaxDepth {
		return false
	}
	decoder := json.NewDecoder(strings.NewReader(value))
	decoder.UseNumber()
	if err := decoder.Decode(into); err != nil || decoder.More() {
		return false
	}
	return true
}

// Int reads a JSON number Python reads as an int (digits only) within int64.
func Int(n json.Number) (int64, bool) {
	text := string(n)
	if strings.ContainsAny(text, ".eE") {
		return 0, false
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		if big, ok := new(big.Int).SetString(text, 10); ok {
			if big.Sign() > 0 {
				return math.MaxInt64, true
			}
			return math.MinInt64, true
		}
		return 0, false
	}
	return v, true
}

// depth is how deep the document's arrays and objects nest (strings skipped).
func depth(value string) int {
	deepest, level, quoted, escaped := 0, 0, false, false
	for i := 0; i < len(value); i++ {
		c := value[i]
		switch {
		case quoted && escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case quoted && c == '"':
			quoted = false
		case quoted:
		case c == '"':
			quoted = true
		case c == '[' || c == '{':
			level++
			deepest = max(deepest, level)
		case c == ']' || c == '}':
			level--
		}
	}
	return deepest
}
