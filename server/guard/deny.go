package guard

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"

	"breakwater/limiter"
)

// The deny cache answers a flood from memory. A refusal whose retry-after
// is exact (nothing but the operator can reopen the layer before it) is
// remembered per user until then, and a repeat is refused from memory,
// before any layer runs: no database round trip, not even layer 1's
// count, on any backend. What is exact:
//
//   - layer 1, the rate window and the burst: a refusal counts nothing and
//     RetryAfter is when the oldest request leaves the window;
//   - layer 2, the daily line: attempts are never given back within a day;
//   - layer 2b, the plan quota, when the recorded reads alone reach it:
//     they are never given back within a month (a quota held only by reads
//     in flight may reopen when one fails, so that refusal is not kept).
//
// Not kept: the global budget's refusals (the operator's brake has no
// reopening time; a ceiling's totals go down when a call in flight
// settles below its worst case, a claim is given back or another instance
// returns its lease's rest; they are decided from memory anyway,
// budget.Global's view), the usage pause and a quota the database could
// not read.
//
// What the operator changes (a plan, a ban, a key, a reload, the brake, a
// cooldown) is cleared with Clear, whole; a refusal decided while a Clear
// happened is not kept (the generation). A line refusal is kept with the
// plan and the lines it was decided under, and answers only a request
// under the same ones. A resync, which finds no change but may bring one
// whose notice was lost, uses Refresh: each refusal is decided again by
// the first request that meets it, the others answered from it meanwhile
// (recheckFor at most), so that a flood in progress is not let at the
// database by every request in flight.
//
// A refusal is kept per route (Request.Route) as well: a guarded route's
// guard may share a cache with others, its keys (a client address, a
// user id) being the same on every route.
//
// Outside a Guard, a layer that a FailOpen runs (a guarded route's fail
// limit, the invite limits) keeps its own refusals under a scope and a key
// of its choosing (Lookup, Keep): a limiter's rate and burst refusals and
// a fail limit's cooldown are exact, as layer 1's; "in_flight", "global"
// and "capacity" are not (an attempt in flight ends, an hour's failures
// age, a key is evicted). A cache made Beside another (the guarded routes'
// and the invites' beside the OCR route's) is cleared with it, so every
// operator change that clears the one clears both, while a flood of many
// addresses on a route fills its own bound, never the other's.

// DefaultDenyEntries is the deny cache's bound when NewDeny is given 0:
// about 10 MiB at most.
const DefaultDenyEntries = 1 << 16

// Deny remembers refusals until their retry-after; see above. A nil *Deny
// remembers nothing. It is safe for concurrent use.
type Deny struct {
	max      int
	n        atomic.Int64  // entries: the accepted path skips the lock while none
	gen      atomic.Uint64 // Clears so far; changed under mu
	answered atomic.Uint64 // refusals answered from memory

	mu sync.Mutex
	m  map[denyKey]*denyEntry
	h  denyHeap // by until, the soonest first: what the bound evicts
	// beside are the caches made Beside this one: cleared with it.
	beside []*Deny
	// refreshes counts Refresh: an entry decided before the last one is
	// decided again once (live).
	refreshes uint64
}

// NewDeny returns a deny cache of at most max entries (0:
// DefaultDenyEntries). Full, it evicts the entry that expires soonest.
func NewDeny(max int) *Deny {
	if max <= 0 {
		max = DefaultDenyEntries
	}
	return &Deny{max: max, m: map[denyKey]*denyEntry{}}
}

// Beside returns a new deny cache of at most max entries (0:
// DefaultDenyEntries), apart from d's, that every Clear of d clears as
// well. A nil d gives a nil cache: it remembers nothing.
func (d *Deny) Beside(max int) *Deny {
	if d == nil {
		return nil
	}
	b := NewDeny(max)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.beside = append(d.beside, b)
	return b
}

// denyKey is a user's refusals on a route by one kind of layer: the rate
// limit (layer 1), which Count answers alone, or the lines (layers 2 and
// 2b); or, kept with Keep, a key's refusals in a scope (scoped set).
type denyKey struct {
	user, plan, route string
	rate, scoped      bool
}

type denyEntry struct {
	key           denyKey
	layer, reason string
	until         time.Time
	line, quota   int64     // the lines of a line refusal
	i             int       // in the heap
	checked       uint64    // the Refreshes before it was decided
	recheck       time.Time // when a request went to decide it again after a Refresh; zero: none yet
}

// Len returns how many refusals are remembered, expired ones included
// until they are evicted or looked up.
func (d *Deny) Len() int {
	if d == nil {
		return 0
	}
	return int(d.n.Load())
}

// Answered returns how many refusals the cache has answered.
func (d *Deny) Answered() uint64 {
	if d == nil {
		return 0
	}
	return d.answered.Load()
}

// Clear forgets every refusal: an operator's change may have reopened
// any of them. A refusal being decided meanwhile is not kept.
func (d *Deny) Clear() {
	if d == nil {
		return
	}
	d.mu.Lock()
	beside := d.beside
	d.gen.Add(1)
	clear(d.m)
	d.h = nil
	d.n.Store(0)
	d.mu.Unlock()
	for _, b := range beside {
		b.Clear()
	}
}

// recheckFor is how long, after a Refresh, the first request that meets
// a remembered refusal has to decide it again while the others are still
// answered from it; past it, without a new decision, the refusal is
// dropped and each request decided.
const recheckFor = 100 * time.Millisecond

// Refresh has every refusal decided again once: for a resync, which finds
// no change but may bring one whose notice was lost. Unlike Clear it
// drops nothing at once: the first request that meets a refusal decides
// it again (and renews it, if it is refused again), while the others are
// answered from it for at most recheckFor; so a flood under way costs
// one round trip a key, not one a request in flight. A refusal decided
// across a Refresh is kept. The caches Beside d are refreshed too.
func (d *Deny) Refresh() {
	if d == nil {
		return
	}
	d.mu.Lock()
	beside := d.beside
	d.refreshes++
	d.mu.Unlock()
	for _, b := range beside {
		b.Refresh()
	}
}

// generation is taken before a decision, and remember keeps the refusal
// only if no Clear came between.
func (d *Deny) generation() uint64 {
	if d == nil {
		return 0
	}
	return d.gen.Load()
}

// lookup returns the refusal remembered for req's key and kind (rate:
// layer 1's; else the lines'), its RetryAfter what is left of it at now;
// nil if none holds.
func (d *Deny) lookup(req Request, rate bool, now time.Time) *Refusal {
	if d == nil || d.n.Load() == 0 {
		return nil
	}
	k := denyKey{user: req.Key, plan: req.Plan, route: req.Route, rate: rate}
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.live(k, now)
	switch {
	case e == nil:
		return nil
	case !rate && (e.line != req.DailyLine || e.quota != req.MonthlyQuota || req.ShadowDaily && e.layer == LayerAttempts):
		return nil
	}
	d.answered.Add(1)
	return &Refusal{Layer: e.layer, Reason: e.reason, RetryAfter: e.until.Sub(now)}
}

// live returns the entry under k if it still holds at now, and drops it
// if it has expired. One decided before the last Refresh is not returned
// to the first caller, which decides it again, and is returned to the
// others for recheckFor; then, not renewed, it is dropped. d.mu is held.
func (d *Deny) live(k denyKey, now time.Time) *denyEntry {
	e := d.m[k]
	switch {
	case e == nil:
		return nil
	case !now.Before(e.until):
	case e.checked == d.refreshes:
		return e
	case e.recheck.IsZero():
		e.recheck = now
		return nil
	case now.Sub(e.recheck) < recheckFor:
		return e
	}
	d.remove(e)
	return nil
}

// Generation returns how many Clears have come so far. Take it before a
// decision and give it to Keep: a refusal decided while a Clear happened
// is not kept.
func (d *Deny) Generation() uint64 { return d.generation() }

// Lookup returns the refusal kept for key in scope (Keep), its RetryAfter
// what is left of it at now; nil if none holds. It counts in Answered.
func (d *Deny) Lookup(scope, key string, now time.Time) *Refusal {
	if d == nil || d.n.Load() == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.live(denyKey{user: key, route: scope, scoped: true}, now)
	if e == nil {
		return nil
	}
	d.answered.Add(1)
	return &Refusal{Layer: e.layer, Reason: e.reason, RetryAfter: e.until.Sub(now)}
}

// Keep keeps r, a refusal of key in scope that a FailOpen's check
// returned at now, until its retry-after, if it is exact (a limiter's
// "rate" or "burst", a fail limit's "cooldown") and no Clear came since
// gen (Generation, taken before the decision); it reports whether it
// kept it. A nil d keeps nothing.
func (d *Deny) Keep(scope, key string, r *Refusal, gen uint64, now time.Time) bool {
	if d == nil || !exactLimit(r) {
		return false
	}
	return d.keep(denyKey{user: key, route: scope, scoped: true}, r, 0, 0, gen, now)
}

// exactLimit reports whether r, a limiter's or a fail limit's refusal,
// holds until its retry-after unless the operator changes something: a
// sliding window's refusal counts nothing and a cooldown ends at a set
// time; attempts in flight end, an hour's failures age and a full
// limiter evicts, any time.
func exactLimit(r *Refusal) bool {
	if r == nil || r.Busy || r.RetryAfter <= 0 {
		return false
	}
	switch r.Reason {
	case limiter.ReasonRate, limiter.ReasonBurst, limiter.ReasonCooldown:
		return true
	}
	return false
}

// remember keeps r, an exact refusal of req at now decided in generation
// gen, until its retry-after.
func (d *Deny) remember(req Request, r *Refusal, gen uint64, now time.Time) {
	_ = d.keep(denyKey{user: req.Key, plan: req.Plan, route: req.Route, rate: r.Layer == LayerRate}, r, req.DailyLine, req.MonthlyQuota, gen, now)
}

// keep keeps r under k, with the lines it was decided under, until its
// retry-after at now, unless a Clear came since generation gen.
func (d *Deny) keep(k denyKey, r *Refusal, line, quota int64, gen uint64, now time.Time) bool {
	until := now.Add(r.RetryAfter)
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.gen.Load() {
		return false // cleared while it was decided: it may be stale
	}
	for len(d.h) > 0 && !now.Before(d.h[0].until) {
		d.remove(d.h[0])
	}
	if e := d.m[k]; e != nil {
		e.layer, e.reason, e.until, e.line, e.quota = r.Layer, r.Reason, until, line, quota
		e.checked, e.recheck = d.refreshes, time.Time{}
		heap.Fix(&d.h, e.i)
		return true
	}
	if len(d.h) >= d.max {
		if !d.h[0].until.Before(until) {
			return false // it would be the first to go
		}
		d.remove(d.h[0])
	}
	e := &denyEntry{key: k, layer: r.Layer, reason: r.Reason, until: until, line: line, quota: quota, checked: d.refreshes}
	d.m[k] = e
	heap.Push(&d.h, e)
	d.n.Store(int64(len(d.h)))
	return true
}

// remove drops e; d.mu is held.
func (d *Deny) remove(e *denyEntry) {
	heap.Remove(&d.h, e.i)
	delete(d.m, e.key)
	d.n.Store(int64(len(d.h)))
}

// denyHeap orders entries by until (container/heap).
type denyHeap []*denyEntry

func (h denyHeap) Len() int           { return len(h) }
func (h denyHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h denyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}
func (h *denyHeap) Push(x any) {
	e := x.(*denyEntry)
	e.i = len(*h)
	*h = append(*h, e)
}
func (h *denyHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// exact reports whether r, a refusal of req at now, holds until its
// retry-after unless the operator changes something (see above).
func (g *Guard) exact(req Request, r *Refusal, now time.Time) bool {
	switch {
	case r.Busy || r.RetryAfter <= 0:
		return false
	case r.Layer == LayerRate, r.Layer == LayerAttempts && r.Reason == "daily_line":
		return true
	case r.Layer == LayerQuota && r.Reason == "monthly_quota":
		return g.layers.Quotas != nil && g.layers.Quotas.Used(req.Key, now) >= req.MonthlyQuota
	}
	return false
}

// remembered answers req from the deny cache (rate: layer 1's refusals,
// else the lines'), reported as any refusal is; nil if it holds none.
func (g *Guard) remembered(req Request, rate bool, now time.Time) *Refusal {
	if r := g.layers.Deny.lookup(req, rate, now); r != nil {
		return g.refuse(r)
	}
	return nil
}

// remember keeps r in the deny cache if it is exact, and returns it.
func (g *Guard) remember(req Request, r *Refusal, gen uint64, now time.Time) *Refusal {
	if r != nil && g.layers.Deny != nil && g.exact(req, r, now) {
		g.layers.Deny.remember(req, r, gen, now)
	}
	return r
}
