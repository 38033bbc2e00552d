package limiter

import (
	"sync/atomic"
	"time"
)

// Several processes that serve one service may share their limits: a
// store (a database that every instance reaches) then decides each key,
// with the semantics of the memory limiter, so that a client that
// alternates between instances gets one limit, not one per instance. The
// store is a defense layer's: when it cannot decide (unreachable, slow), the
// decision is made in memory, as without a store, and the fault is
// reported to the onFault given to Share. The memory keeps what this
// process admitted and began meanwhile, so that its fallback decisions
// start from this process's own view rather than from nothing.

// SharedWindows decides a [Limiter]'s keys in a store that several
// processes share.
type SharedWindows interface {
	// Take decides a request for key at now under cfg (defaults applied)
	// exactly as [Limiter.Allow] does in memory, and records it when it is
	// admitted: nil when admitted, else the refusal with its exact
	// RetryAfter. An error means the store could not decide.
	Take(key string, cfg Config, now time.Time) (*Refusal, error)
}

// FailOutcome is how an attempt ended, for [SharedFails.Finish].
type FailOutcome string

// The outcomes of an attempt.
const (
	OutcomeFail    FailOutcome = "fail"
	OutcomeSucceed FailOutcome = "succeed"
	// OutcomeRelease ends an attempt that was neutral or cancelled.
	OutcomeRelease FailOutcome = "release"
)

// SharedFails decides a [FailLimiter]'s keys in a store that several
// processes share, with the semantics of [FailLimiter.Begin] and the
// outcomes of an [Attempt]. Its MaxKeys is the store's to bound: it never
// refuses with ReasonCapacity.
type SharedFails interface {
	// Begin starts an attempt on every key at now, or refuses it and
	// records nothing (nil, nil: begun).
	Begin(keys []string, cfg FailConfig, now time.Time) (*Refusal, error)
	// Finish ends an attempt begun at begun with its outcome at now. It
	// returns the keys whose cooldown a failure started, and whether the
	// failure tripped the service-wide net (at most once an hour for
	// every process). An OutcomeRelease with a zero begun ends no attempt
	// and changes nothing, but costs what ending a failed one costs (and
	// a refusing Begin what a Begin that begins costs): it is
	// [FailLimiter.EndRefused]'s, for an attempt Begin refused.
	Finish(keys []string, outcome FailOutcome, cfg FailConfig, begun, now time.Time) (started []string, tripped bool, err error)
	// Cooling lists the keys in a cooldown at now, sorted by key.
	Cooling(now time.Time) ([]Cooldown, error)
	// Clear lifts key's cooldown and forgets its run and its backoff.
	Clear(key string) (bool, error)
	// GlobalFailures returns the failures over every key in the last hour
	// at now, counted in whole minutes.
	GlobalFailures(now time.Time) (int, error)
}

// shared is a store and where its faults go.
type shared[S any] struct {
	store   S
	onFault func(error)
}

func (s *shared[S]) fault(err error) {
	if s.onFault != nil {
		s.onFault(err)
	}
}

// sharedWindows is where a Limiter's store is kept.
type sharedWindows = atomic.Pointer[shared[SharedWindows]]

// Share makes store decide every key of l from the next call on; onFault
// (nil: none) is told of every decision the store could not make, which l
// then made in memory. A nil store goes back to memory alone.
func (l *Limiter) Share(store SharedWindows, onFault func(error)) {
	if store == nil {
		l.shared.Store(nil)
		return
	}
	l.shared.Store(&shared[SharedWindows]{store: store, onFault: onFault})
}

// allowShared is Allow with a store: the store decides; memory records
// what it admitted, and decides alone when it cannot.
func (l *Limiter) allowShared(sh *shared[SharedWindows], s *settings, key string, now time.Time) error {
	r, err := sh.store.Take(key, s.cfg, now)
	if err != nil {
		sh.fault(err)
		return l.allowLocal(s, key, now)
	}
	if r != nil {
		return r
	}
	_ = l.allowLocal(s, key, now) // this process's view, for a fallback
	return nil
}

// Share makes store decide every key of f from the next Begin on, as
// [Limiter.Share] does for a Limiter.
func (f *FailLimiter) Share(store SharedFails, onFault func(error)) {
	if store == nil {
		f.shared.Store(nil)
		return
	}
	f.shared.Store(&shared[SharedFails]{store: store, onFault: onFault})
}

// sharedPart is what an Attempt begun in a store carries: the store, when
// it began, and the same attempt in memory (nil if memory refused it).
type sharedPart struct {
	sh    *shared[SharedFails]
	begun time.Time
	local *Attempt
}

// beginShared is Begin with a store.
func (f *FailLimiter) beginShared(sh *shared[SharedFails], keys []string, now time.Time) (*Attempt, error) {
	r, err := sh.store.Begin(keys, f.cfg, now)
	if err != nil {
		sh.fault(err)
		return f.beginLocal(keys, now)
	}
	if r != nil {
		// The memory's reads of an attempt begun, changing nothing: the
		// refusal costs about what beginning costs, as in memory alone
		// (EndRefused then reads what Fail reads).
		f.readKeys(keys, now)
		return nil, r
	}
	local, _ := f.beginLocal(keys, now) // this process's view, for a fallback
	return &Attempt{f: f, keys: append([]string(nil), keys...), shared: &sharedPart{sh: sh, begun: now, local: local}}, nil
}

// finishShared ends a shared attempt in the store and in memory; if the
// store cannot, memory's answer stands.
func (a *Attempt) finishShared(outcome FailOutcome, now time.Time) (tripped bool) {
	p := a.shared
	a.done = true
	var localTripped bool
	switch outcome {
	case OutcomeFail:
		localTripped = p.local.Fail(now)
	case OutcomeSucceed:
		p.local.Succeed(now)
	default:
		p.local.release()
	}
	started, tripped, err := p.sh.store.Finish(a.keys, outcome, a.f.cfg, p.begun, now)
	if err != nil {
		p.sh.fault(err)
		a.started = p.local.CooldownsStarted()
		return localTripped
	}
	a.started = started
	return tripped
}

// EndRefused does, for an attempt on keys that Begin refused at now (a
// cooldown, the net, attempts in flight), the work that ending a begun
// attempt takes, and changes nothing: it reads each key as Fail would,
// and with a store it has the store end an attempt that holds nothing
// (an OutcomeRelease with a zero begun: one round trip, as a Fail's).
// A caller whose refusals must not tell the limit's from a failure by
// the time they take (the invite check) calls it where it calls Fail
// for an attempt it began.
func (f *FailLimiter) EndRefused(keys []string, now time.Time) {
	f.readKeys(keys, now)
	if sh := f.shared.Load(); sh != nil {
		if _, _, err := sh.store.Finish(keys, OutcomeRelease, f.cfg, time.Time{}, now); err != nil {
			sh.fault(err)
		}
	}
}

// Joined is a Limiter's decision that a caller carries in a write of its
// own, with other layers' (a database that decides the rate window, the
// daily line and the quota in one round trip): the store that decides
// and the thresholds it decides under.
type Joined struct {
	Store  SharedWindows
	Config Config // defaults applied
	// Enforce says that a refusal ends the request; false in shadow
	// mode, which the caller applies (Limiter.Joined leaves it false).
	Enforce bool
}

// Joined returns the store and thresholds that decide l's keys, for a
// caller that has the store decide a key in its own write; the caller
// then tells l of an admission with Admitted. ok is false when l has no
// store or no limit: Allow decides, or admits everything.
func (l *Limiter) Joined() (j Joined, ok bool) {
	s := l.settings.Load()
	sh := l.shared.Load()
	if s.capacity == 0 || sh == nil {
		return Joined{}, false
	}
	return Joined{Store: sh.store, Config: s.cfg}, true
}

// Admitted records in memory a request for key at now that the store
// admitted in a caller's write (Joined), as Allow records the store's
// admissions: this process's view, for the decisions it makes alone when
// the store cannot.
func (l *Limiter) Admitted(key string, now time.Time) {
	if s := l.settings.Load(); s.capacity > 0 {
		_ = l.allowLocal(s, key, now)
	}
}
