// Package explain writes the GPUPlacement Event on a pod the plugins placed: the
// extender's Event (extender/explain.py), word for word, so `gpu-scheduler explain`
// and the troubleshooting guide serve both paths. The plugins' NormalizeScore calls
// keep their lists in the cycle's state (Keep); GPUScheduler's PostBind picks the best
// candidates from them and queues the Event for a background writer (Writer).
package explain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Reason is the Event's reason, as the extender's.
const Reason = "GPUPlacement"

// Top is the candidates kept per decision, as the extender keeps.
const Top = 8

// MaxMessage is the extender's bound on the Event's message.
const MaxMessage = 1024

// Voice says who scored, in the message's words (extender/explain.py, Voice).
type Voice struct {
	Score, Whose, Who, Others, Filters string
}

// Extender and Plugins are the two paths' voices.
var (
	Extender = Voice{"extender score", "the extender's", "The extender",
		"kube-scheduler's own plugins", "kube-scheduler's own filters"}
	Plugins = Voice{"gpu-scheduler score", "gpu-scheduler's", "gpu-scheduler",
		"kube-scheduler's other plugins", "kube-scheduler's filters"}
)

// Part is one policy's 0..10 score of a candidate.
type Part struct {
	Policy string
	Value  float64
}

// Weight is one policy's weight.
type Weight struct {
	Policy string
	Weight int
}

// Failure is why some nodes failed the filter, and how many.
type Failure struct {
	Reason string
	Nodes  int
}

// Candidate is one of the best-scored nodes.
type Candidate struct {
	Node  string
	Score int64 // the weighted mean of Parts, 0..10
	Parts []Part
	// Health is (GPUs a pod can be given, GPUs advertised) where some are unhealthy.
	Health *[2]int64
	// Note is what drew a placement group's pod here (the topology level); "" none.
	Note string
	// Avoided: passed over for a soft taint the pod does not tolerate.
	Avoided bool
}

// Decision is what one scoring decided (extender/explain.py, Decision).
type Decision struct {
	Namespace, Name, UID string
	Gpus                 int64
	Candidates           int
	Top                  []Candidate // best first
	Weights              []Weight
	Failed               []Failure
	Picked               bool
}

func parts(c Candidate) string {
	if len(c.Parts) == 0 {
		return "no policy"
	}
	out := make([]string, len(c.Parts))
	for i, p := range c.Parts {
		out[i] = fmt.Sprintf("%s %.0f", p.Policy, p.Value)
	}
	return strings.Join(out, ", ")
}

// Clip cuts text to limit characters as the extender's clip_text does.
func Clip(text string, limit int) string {
	size := utf8.RuneCountInString(text)
	if size <= limit {
		return text
	}
	runes := []rune(text)
	return fmt.Sprintf("%s... (truncated of %d characters)", string(runes[:limit]), size)
}

// Message is the Event's message for d once the pod is bound to chosen.
func Message(d *Decision, chosen string, voice Voice) string {
	rank := -1
	for i, c := range d.Top {
		if c.Node == chosen {
			rank = i
			break
		}
	}
	plural := "s"
	if d.Gpus == 1 {
		plural = ""
	}
	head := fmt.Sprintf("%d GPU%s on %s", d.Gpus, plural, chosen)
	if rank < 0 {
		text := fmt.Sprintf("%s: not among %s best %d of %d candidates; %s decided",
			head, voice.Whose, len(d.Top), d.Candidates, voice.Others)
		if len(d.Top) > 0 {
			best := d.Top[0]
			text += fmt.Sprintf(" (%s best: %s, score %d: %s)", voice.Whose, best.Node, best.Score, parts(best))
		}
		return Clip(text, MaxMessage-64)
	}
	node := d.Top[rank]
	if len(node.Parts) == 0 && !d.Picked {
		return onlyFit(d, head, voice)
	}
	if node.Health != nil {
		head += fmt.Sprintf(" (%d of %d GPUs there healthy)", node.Health[0], node.Health[1])
	}
	if node.Note != "" {
		head += fmt.Sprintf(", with its placement group (%s)", node.Note)
	}
	weights := make([]string, len(d.Weights))
	for i, w := range d.Weights {
		weights[i] = fmt.Sprintf("%s %d", w.Policy, w.Weight)
	}
	plural = "s"
	if d.Candidates == 1 {
		plural = ""
	}
	text := fmt.Sprintf("%s: %s %d/10, rank %d of %d candidate%s (%s; weights %s)", head,
		voice.Score, node.Score, rank+1, d.Candidates, plural, parts(node), strings.Join(weights, ", "))
	return Clip(text+runnerUp(d, node, chosen, voice), MaxMessage-64)
}

// onlyFit: the one node the filters left (kube-scheduler binds it without scoring).
func onlyFit(d *Decision, head string, voice Voice) string {
	if d.Candidates == 1 {
		return Clip(fmt.Sprintf("%s: the only node %s left", head, voice.Filters), 960)
	}
	text := fmt.Sprintf("%s: the only one of %d candidates that fits", head, d.Candidates)
	if len(d.Failed) > 0 {
		out := make([]string, len(d.Failed))
		for i, f := range d.Failed {
			out[i] = fmt.Sprintf("%d x %s", f.Nodes, f.Reason)
		}
		text += "; the others: " + strings.Join(out, "; ")
	}
	return Clip(text, MaxMessage-64)
}

// runnerUp is the sentence on the best other candidate, and what it lost on.
func runnerUp(d *Decision, node Candidate, chosen string, voice Voice) string {
	var runner *Candidate
	for i := range d.Top {
		if d.Top[i].Node != chosen {
			runner = &d.Top[i]
			break
		}
	}
	if runner == nil {
		return ". No other candidate."
	}
	why := lostOn(d, node, runner)
	switch {
	case runner.Avoided:
		return fmt.Sprintf(". %s scored %d, but has a PreferNoSchedule taint the pod does not tolerate",
			runner.Node, runner.Score)
	case runner.Score > node.Score:
		return fmt.Sprintf(". %s preferred %s (score %d); %s outweighed that", voice.Who,
			runner.Node, runner.Score, voice.Others)
	case runner.Score == node.Score:
		breaker := "kube-scheduler"
		if d.Picked {
			breaker = "the extender"
		}
		text := fmt.Sprintf(". %s scored %d too (%s broke the tie)", runner.Node, runner.Score, breaker)
		if why != "" {
			text += "; it is lower on " + why
		}
		return text
	}
	text := fmt.Sprintf(". Runner-up %s, score %d", runner.Node, runner.Score)
	if why != "" {
		text += ": lower on " + why
	}
	return text
}

// lostOn: the policies the runner-up scored lower on, the weightiest first.
func lostOn(d *Decision, node Candidate, runner *Candidate) string {
	weights := map[string]int{}
	for _, w := range d.Weights {
		weights[w.Policy] = w.Weight
	}
	mine := map[string]float64{}
	for _, p := range node.Parts {
		mine[p.Policy] = p.Value
	}
	type loss struct {
		by    float64
		p     string
		v, me float64
	}
	var lost []loss
	for _, p := range runner.Parts {
		if me := mine[p.Policy]; me > p.Value {
			lost = append(lost, loss{float64(weights[p.Policy]) * (me - p.Value), p.Policy, p.Value, me})
		}
	}
	sort.SliceStable(lost, func(i, j int) bool { // Python's sorted(..., reverse=True) of (by, p, v)
		a, b := lost[i], lost[j]
		if a.by != b.by {
			return a.by > b.by
		}
		if a.p != b.p {
			return a.p > b.p
		}
		return a.v > b.v
	})
	out := make([]string, len(lost))
	for i, l := range lost {
		out[i] = fmt.Sprintf("%s %.0f against %.0f", l.p, l.v, l.me)
	}
	return strings.Join(out, ", ")
}

// EventName is one name per pod for every replica (a DNS subdomain of at most 253).
func EventName(pod, uid string) string {
	digest := sha256.Sum256([]byte(uid))
	runes := []rune(pod)
	if len(runes) > 200 {
		runes = runes[:200]
	}
	return string(runes) + "." + hex.EncodeToString(digest[:])[:10] + ".gpu-placement"
}
