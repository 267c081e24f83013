package explain

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

// Component is the Event's source: the plugins, in kube-scheduler.
const Component = "gpu-scheduler-plugins"

var events = metrics.NewCounterVec(&metrics.CounterOpts{
	Name: "gpu_scheduler_plugins_placement_events_total",
	Help: "GPUPlacement Events on pods the plugins placed, by outcome (written; dropped: " +
		"rate limit or full queue; failed: the API refused it; duplicate: it existed)",
	StabilityLevel: metrics.ALPHA,
}, []string{"outcome"})

var register sync.Once

// Counts are a writer's outcomes so far.
type Counts struct{ Written, Dropped, Failed, Duplicate atomic.Int64 }

type item struct {
	d    *Decision
	node string
}

// Writer writes the Events off the scheduling path: a bounded queue, one goroutine,
// a token bucket (what does not fit is dropped and counted), as the extender's.
type Writer struct {
	create   func(context.Context, *v1.Event) error
	queue    chan item
	bucket   *Bucket
	instance string
	Counts   Counts
}

// NewWriter writes through create (an error that says AlreadyExists: a duplicate).
func NewWriter(create func(context.Context, *v1.Event) error, rate float64, burst, size int, instance string) *Writer {
	register.Do(func() { legacyregistry.MustRegister(events) })
	if len(instance) > 128 {
		instance = instance[:128]
	}
	return &Writer{create: create, queue: make(chan item, size),
		bucket: NewBucket(rate, float64(burst), time.Now), instance: instance}
}

// ClientWriter writes through a clientset, at the extender's rate (10 a second, 50 at once).
func ClientWriter(client kubernetes.Interface, instance string) *Writer {
	return NewWriter(func(ctx context.Context, ev *v1.Event) error {
		_, err := client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
		return err
	}, 10, 50, 1000, instance)
}

// Admit: whether to work out a decision now; its Event would find a token when
// written. Where not, it is counted dropped, as the writer would count it.
func (w *Writer) Admit() bool {
	if w.bucket.Level()-float64(len(w.queue)) >= 1 {
		return true
	}
	w.count("dropped")
	return false
}

// Queue hands an Event to the writer, or drops it where the queue is full.
func (w *Writer) Queue(d *Decision, node string) {
	select {
	case w.queue <- item{d, node}:
	default:
		w.count("dropped")
	}
}

// Run writes until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-w.queue:
			w.write(ctx, it)
			if w.bucket.Level() < 1 {
				time.Sleep(time.Duration(float64(time.Second) / w.bucket.Rate))
			}
		}
	}
}

// Drain writes what is queued now (tests).
func (w *Writer) Drain(ctx context.Context) {
	for {
		select {
		case it := <-w.queue:
			w.write(ctx, it)
		default:
			return
		}
	}
}

func (w *Writer) write(ctx context.Context, it item) {
	if !w.bucket.Take() {
		w.count("dropped")
		return
	}
	err := w.create(ctx, Body(it.d, it.node, time.Now(), w.instance))
	switch {
	case err == nil:
		w.count("written")
	case apierrors.IsAlreadyExists(err):
		w.count("duplicate")
	default:
		w.count("failed")
		klog.FromContext(ctx).Info("placement event not written", "pod", klog.KRef(it.d.Namespace, it.d.Name), "err", err)
	}
}

func (w *Writer) count(outcome string) {
	switch outcome {
	case "written":
		w.Counts.Written.Add(1)
	case "dropped":
		w.Counts.Dropped.Add(1)
	case "failed":
		w.Counts.Failed.Add(1)
	case "duplicate":
		w.Counts.Duplicate.Add(1)
	}
	events.WithLabelValues(outcome).Inc()
}

// Body is the Event the extender writes (extender/explain.py, event_body), from the plugins.
func Body(d *Decision, node string, now time.Time, instance string) *v1.Event {
	stamp := metav1.NewTime(now.UTC().Truncate(time.Second))
	return &v1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: EventName(d.Name, d.UID), Namespace: d.Namespace},
		InvolvedObject: v1.ObjectReference{APIVersion: "v1", Kind: "Pod",
			Namespace: d.Namespace, Name: d.Name, UID: types.UID(d.UID)},
		Reason:              Reason,
		Message:             Message(d, node, Plugins),
		Type:                v1.EventTypeNormal,
		Action:              "Scheduled",
		Source:              v1.EventSource{Component: Component},
		ReportingController: Component,
		ReportingInstance:   instance,
		FirstTimestamp:      stamp,
		LastTimestamp:       stamp,
		Count:               1,
	}
}

// Bucket is a token bucket: Rate tokens a second, at most burst held (extender/bucket.py).
type Bucket struct {
	Rate     float64
	burst    float64
	mu       sync.Mutex
	tokens   float64
	refilled time.Time
	clock    func() time.Time
}

// NewBucket starts full.
func NewBucket(rate, burst float64, clock func() time.Time) *Bucket {
	return &Bucket{Rate: rate, burst: burst, tokens: burst, refilled: clock(), clock: clock}
}

// Level is the tokens held, refilled to now.
func (b *Bucket) Level() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.at(b.clock())
}

// Take spends one token, if there is one.
func (b *Bucket) Take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock()
	b.tokens, b.refilled = b.at(now), now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

func (b *Bucket) at(now time.Time) float64 {
	return min(b.burst, b.tokens+now.Sub(b.refilled).Seconds()*b.Rate)
}
