package gangpreemption

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
)

// Quiet is how long a pod that preempted may not preempt again: the extender's "once
// per preemption" (extender/preemption.py, RECENT). kube-scheduler 1.34 may try the
// pod again before its nomination shows on the pod (its victims deleted at once, the
// pod's status not yet patched); DefaultPreemption then finds the pod eligible and
// takes one victim more. From 1.35 kube-scheduler holds such a pod itself; the rule
// costs nothing there.
const Quiet = 5 * time.Second

// once remembers when each pod last preempted.
type once struct {
	mu sync.Mutex
	at map[types.UID]time.Time
}

// lately: the pod preempted less than Quiet before now.
func (o *once) lately(uid types.UID, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.at[uid]
	return ok && now.Sub(at) < Quiet
}

// mark records a preemption of the pod at now, and forgets those past Quiet.
func (o *once) mark(uid types.UID, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.at == nil {
		o.at = map[types.UID]time.Time{}
	}
	for other, at := range o.at {
		if now.Sub(at) >= Quiet {
			delete(o.at, other)
		}
	}
	o.at[uid] = now
}

// PostFilter is DefaultPreemption's, but for a pod that preempted within Quiet: that
// one waits for its victims (Unschedulable, retried as any pod is).
func (p *GangPreemption) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, m fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	if p.once.lately(pod.UID, time.Now()) {
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption: waiting for the victims of this pod's last preemption")
	}
	result, status := p.DefaultPreemption.PostFilter(ctx, state, pod, m)
	if status.IsSuccess() && result != nil && result.NominatingInfo != nil && result.NominatedNodeName != "" {
		p.once.mark(pod.UID, time.Now())
	}
	return result, status
}
