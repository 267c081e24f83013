package facts

import (
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
)

// Pod is a pod being scheduled with its knobs read and checked once
// (extender.model.PodFacts).
type Pod struct {
	Gpus int64
	// Shares: units of gpu-scheduler.io/gpu-memory asked, per container that asks.
	Shares    []int64
	MinMemory int64 // MiB per GPU; -1: not asked
	Products  map[string]bool
	// Placement is what the pod asks (binpack or spread), "" where it asks nothing:
	// the configured default then applies (Spread).
	Placement string
	Spot      string
	Group     string
	Namespace string
	Error     string // the annotations it cannot honour: every node fails with it
}

// Spread: the pod is spread, by its own word or, where it says nothing, by the
// configured default.
func (p *Pod) Spread(defaultPlacement string) bool {
	if p.Placement == "" {
		return defaultPlacement == "spread"
	}
	return p.Placement == "spread"
}

// The pod read last, by the object: kube-scheduler hands the same *v1.Pod to every
// plugin's SignPod, PreFilter and PreScore of one cycle (an update is a new object),
// so one reading serves the three plugins' six calls.
var last atomic.Pointer[readPod]

type readPod struct {
	pod   *v1.Pod
	facts *Pod
}

// PodOf is ReadPod of the pod, read once per object.
func PodOf(pod *v1.Pod) *Pod {
	if got := last.Load(); got != nil && got.pod == pod {
		return got.facts
	}
	facts := ReadPod(pod)
	last.Store(&readPod{pod, facts})
	return facts
}

// GpuRequest is the pod's nvidia.com/gpu as kube-scheduler sums it (init containers,
// sidecars and all).
func GpuRequest(pod *v1.Pod) int64 {
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	q := requests[v1.ResourceName(contract.ResourceGpu)]
	return q.Value()
}

// ReadPod reads a pod (PodOf: once per object).
func ReadPod(pod *v1.Pod) *Pod {
	out := &Pod{Gpus: GpuRequest(pod), MinMemory: -1, Namespace: pod.Namespace}
	shares, err := PodShares(pod)
	if err != "" {
		out.Error = err
		return out
	}
	out.Shares = shares
	ann := pod.Annotations
	var errs []string
	if raw, ok := ann[contract.AnnMinGpuMemory]; ok {
		if value, err := ParseMiB(raw); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%s is not a memory size (use e.g. 40Gi, 80G, or MiB "+
				"as an integer): %s", contract.AnnMinGpuMemory, pyRepr(raw), err))
		} else {
			out.MinMemory = value
		}
	}
	if products, why := Products(ann); why != "" {
		errs = append(errs, why)
	} else {
		out.Products = products
	}
	if raw, ok := ann[contract.AnnSpot]; ok {
		if slices.Contains(contract.SpotPreferences, raw) {
			out.Spot = raw
		} else {
			errs = append(errs, fmt.Sprintf("%s=%s: use prefer, avoid, require or forbid",
				contract.AnnSpot, pyRepr(raw)))
		}
	}
	if raw, ok := ann[contract.AnnPlacement]; ok {
		if slices.Contains(contract.Placements, raw) {
			out.Placement = raw
		} else {
			errs = append(errs, fmt.Sprintf("%s=%s: use binpack or spread", contract.AnnPlacement, pyRepr(raw)))
		}
	}
	if out.Spot == "" && (out.Gpus > 0 || len(out.Shares) > 0) {
		out.Spot = "avoid"
	}
	out.Group = ann[contract.AnnGroup]
	out.Error = strings.Join(errs, "; ")
	return out
}

// Products are the GPU products a pod's annotation restricts it to (nil: any), or why
// they cannot be read.
func Products(ann map[string]string) (map[string]bool, string) {
	raw, ok := ann[contract.AnnGpuProducts]
	if !ok {
		return nil, ""
	}
	products := parseProducts(raw)
	switch {
	case products == nil:
		return nil, contract.AnnGpuProducts + " is empty"
	case len(products) > contract.MaxProducts || longest(products) > contract.MaxLabelValue:
		return nil, fmt.Sprintf("%s=%s: at most %d products, each a label value of at most 63 characters",
			contract.AnnGpuProducts, pyRepr(raw), contract.MaxProducts)
	}
	return products, ""
}

// WantsGpus: the pod asks whole GPUs or a share of one.
func (p *Pod) WantsGpus() bool { return p.Gpus > 0 || len(p.Shares) > 0 }

func parseProducts(raw string) map[string]bool {
	out := map[string]bool{}
	for _, part := range strings.Split(raw, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out[strings.TrimSuffix(part, contract.SharedSuffix)] = true
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func longest(products map[string]bool) int {
	n := 0
	for p := range products {
		n = max(n, len([]rune(p)))
	}
	return n
}

// SortedProducts lists products in order, for words.
func SortedProducts(products map[string]bool) []string {
	out := make([]string, 0, len(products))
	for p := range products {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// ParseMiB reads GPU memory as a user writes it (gpu_scheduler.contract.parse_mib):
// 40Gi, 80G, 512Mi, or a plain MiB integer; errors are worded as the extender's.
func ParseMiB(value string) (int64, error) {
	text := strings.TrimSpace(value)
	if text != "" && strings.Trim(text, "0123456789") == "" {
		if len(text) > 18 {
			return 0, fmt.Errorf("memory size %s is beyond 2**63-1", pyRepr(text))
		}
		return strconv.ParseInt(text, 10, 64)
	}
	amount, err := parseQuantity(text)
	if err != nil {
		return 0, err
	}
	if amount.Sign() < 0 {
		return 0, fmt.Errorf("memory must not be negative: %s", pyRepr(value))
	}
	// Whole bytes, rounded down (Python's int() of the exact amount), then MiB.
	whole := new(big.Int).Quo(amount.Num(), amount.Denom())
	return whole.Int64() >> 20, nil
}

// pyRepr is how the extender shows a value in its words (gpu_scheduler.textclip.clip):
// Python's repr of at most 1,025 characters, the result cut to 1,024 and marked.
func pyRepr(s string) string {
	runes := []rune(s)
	shown := runes
	if len(shown) > clipLimit+1 {
		shown = shown[:clipLimit+1]
	}
	text := []rune(quote(string(shown)))
	if len(text) <= clipLimit {
		return string(text)
	}
	whole := ""
	if len(runes) > clipLimit {
		whole = fmt.Sprintf(" of %d characters", len(runes))
	}
	return string(text[:clipLimit]) + "... (truncated" + whole + ")"
}

const clipLimit = 1024

// quote is Python's repr of a string: single quotes unless it holds one and no double.
func quote(s string) string {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	var b strings.Builder
	b.WriteString(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case string(r) == q:
			b.WriteString(`\` + q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteString(q)
	return b.String()
}

// Signer, embedded in each plugin, gives it SignPod (sign.go; 1.34 has no batching).
type Signer struct{}

// SignKey names the batching signature fragment the plugins share (KEP-5598): pods
// with equal fragments are decided alike by all three.
const SignKey = "v1.Pod.Metadata.Annotations.GPUScheduler()"

// Signature is what the plugins read of a pod beyond its requests (which
// NodeResourcesFit signs): the knobs in its annotations, and its namespace where it
// names a placement group. JSON-marshallable, lists sorted.
func Signature(pod *v1.Pod) any {
	read := PodOf(pod)
	namespace := ""
	if read.Group != "" {
		namespace = read.Namespace
	}
	return []any{read.Gpus, read.Shares, read.MinMemory, SortedProducts(read.Products),
		read.Placement, read.Spot, read.Group, namespace, read.Error}
}
