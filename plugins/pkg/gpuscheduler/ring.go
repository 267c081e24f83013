package gpuscheduler

import "sync/atomic"

// ring holds what Score read of each node, for NormalizeScore: Score answers a ticket
// (a number that only grows) and NormalizeScore takes the entry back by it. Upstream's
// batching keeps a cycle's Score answers for its next alike pods and sends them to
// NormalizeScore again, so a ticket must outlive its cycle: it holds while fewer than
// ringSize nodes have been scored since (a batch lasts half a second and scores one
// node a pod after its first cycle; a cycle scores at most a few thousand). A ticket
// the ring no longer holds is read again by name.
type ring struct {
	next  atomic.Int64
	slots []ringSlot
}

type ringSlot struct {
	ticket int64
	entry  *cachedFit
}

const ringSize = 1 << 15

// put keeps an entry and answers its ticket (from 1 up). Score calls it on many
// goroutines at once: each gets a slot of its own.
func (r *ring) put(e *cachedFit) int64 {
	ticket := r.next.Add(1)
	slot := &r.slots[ticket&(ringSize-1)]
	slot.ticket, slot.entry = ticket, e
	return ticket
}

// get is the entry of a ticket (nil: never given, or its slot taken since).
func (r *ring) get(ticket int64) *cachedFit {
	if ticket <= 0 {
		return nil
	}
	if slot := &r.slots[ticket&(ringSize-1)]; slot.ticket == ticket {
		return slot.entry
	}
	return nil
}

func newRing() *ring { return &ring{slots: make([]ringSlot, ringSize)} }
