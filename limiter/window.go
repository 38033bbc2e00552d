package limiter

import "math"

// tick is Resolution in nanoseconds.
const tick = int64(Resolution)

// maxSpan is the largest distance, in nanoseconds, between a window's base
// and a stored time: a uint32 count of ticks.
const maxSpan = int64(math.MaxUint32) * tick

// window is the sliding log of one key: its most recent admitted requests,
// oldest first, in a ring. Times are nanoseconds since the Limiter's epoch.
// Stored time i is base + ring[(head+i) mod len(ring)]*tick; stored times are
// non-decreasing from oldest to newest and never earlier than the request
// they record. A key with one request has no ring: its time is base (most
// keys a flood brings, one request from each of many addresses, stay so).
// A window is guarded by its shard's mutex.
type window struct {
	base int64
	// ring is held by pointer, so that a window is 32 bytes, not 48:
	// most keys never have one.
	ring  *[]uint32
	head  uint32
	n     uint32
	dirty bool // changed since the last Dirty, and its key is in shard.dirty
}

// slots returns the ring, empty when there is none.
func (w *window) slots() []uint32 {
	if w.ring == nil {
		return nil
	}
	return *w.ring
}

// setRing makes r the ring, reusing the slice header of the old one.
func (w *window) setRing(r []uint32) {
	if w.ring == nil {
		w.ring = &r
		return
	}
	*w.ring = r
}

// at returns the stored time of the i-th oldest entry, 0 <= i < n.
func (w *window) at(i int) int64 {
	return w.base + int64(w.off(i))*tick
}

// off returns the offset from base, in ticks, of the i-th oldest entry.
func (w *window) off(i int) uint32 {
	if w.ring == nil {
		return 0 // the one entry, at base
	}
	r := *w.ring
	if len(r) == 0 {
		return 0
	}
	j := int(w.head) + i
	if j >= len(r) {
		j -= len(r)
	}
	return r[j]
}

// newest returns the stored time of the newest entry; n must be > 0.
func (w *window) newest() int64 { return w.at(int(w.n) - 1) }

// wait returns how long after t the k-th newest entry leaves a window of
// length span, or 0 when admitting a request at t keeps the half-open
// window (t-span, t] within k requests.
func (w *window) wait(k int, span, t int64) int64 {
	if k <= 0 || int(w.n) < k {
		return 0
	}
	if d := w.at(int(w.n)-k) + span - t; d > 0 {
		return d
	}
	return 0
}

// dropOldest removes the oldest entry; n must be > 0.
func (w *window) dropOldest() {
	w.n--
	if len(w.slots()) == 0 {
		return
	}
	w.head++
	if int(w.head) == len(w.slots()) {
		w.head = 0
	}
}

// push records a request admitted at t, keeping at most capacity entries.
// Entries at or before t-horizon are dead for both limits and may be
// dropped.
func (w *window) push(t int64, capacity int, horizon int64) {
	if w.n > 0 && t-w.base > maxSpan {
		w.rebase(t, horizon)
	}
	if w.n == 0 {
		w.base, w.head, w.n = t, 0, 1
		if len(w.slots()) > 0 {
			w.slots()[0] = 0
		}
		return
	}
	var o int64
	if d := t - w.base; d > 0 {
		o = (d + tick - 1) / tick // round up: never earlier than t
	}
	// A clock that went backwards records no earlier than the newest.
	if last := int64(w.off(int(w.n) - 1)); o < last {
		o = last
	}
	for w.n > 0 && int(w.n) >= capacity {
		w.dropOldest()
	}
	if w.n == 0 && len(w.slots()) == 0 {
		// Capacity 1: the one entry, still ringless, moves.
		w.base, w.n = w.base+o*tick, 1
		return
	}
	w.fit(capacity)
	w.slots()[w.index(int(w.n))] = uint32(o)
	w.n++
}

// index maps the i-th oldest position to a ring index.
func (w *window) index(i int) int {
	j := int(w.head) + i
	if j >= len(w.slots()) {
		j -= len(w.slots())
	}
	return j
}

// rebase drops dead entries and moves base to the oldest live one, so that
// offsets up to t fit in a uint32 again. horizon is at most MaxWindow, well
// below maxSpan; the maxSpan cutoff only guards against a caller breaking
// that.
func (w *window) rebase(t, horizon int64) {
	cutoff := max(t-horizon, t-maxSpan)
	for w.n > 0 && w.at(0) <= cutoff {
		w.dropOldest()
	}
	if w.n == 0 || len(w.slots()) == 0 {
		return // none left, or the one at base
	}
	shift := w.slots()[w.head]
	for i := range int(w.n) {
		w.slots()[w.index(i)] -= shift
	}
	w.base += int64(shift) * tick
}

// fit makes room for one more entry, n being below capacity: it grows the
// ring (geometrically, up to capacity), or shrinks one left larger than
// capacity by an earlier config.
func (w *window) fit(capacity int) {
	if int(w.n) < len(w.slots()) && len(w.slots()) <= capacity {
		return
	}
	size := capacity
	if len(w.slots()) < capacity {
		size = min(capacity, max(4, 2*len(w.slots())))
	}
	ring := make([]uint32, size)
	for i := range int(w.n) {
		ring[i] = w.off(i)
	}
	w.setRing(ring)
	w.head = 0
}
