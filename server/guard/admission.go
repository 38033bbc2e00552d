package guard

import (
	"context"
	"fmt"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// An Admission carries one request through the guard, step by step:
//
//	a, r := g.Admit(req, now)        // before the body: layer 1, and looks at 2, 2b, 3
//	                                 // (AdmitKeyed, then a.Look after the upload, for a
//	                                 // request that may be answered from storage)
//	defer a.Release()                // gives back whatever was not recorded
//	r = a.End(now)                   // it ends without a call: a bad upload, an answer
//	                                 // from storage, a key held elsewhere
//	r = a.Reserve(worst, now)        // layer 2 counted, a 2b slot, a layer 3 claim
//	r = a.Commit(ctx, now)           // the claim durable, before the call
//	... the call, with a.ClaimRetry before a retry; a.Gone if the client went first ...
//	used, r := a.Record(ctx, rec, cost, now)  // "$", or a.Fail(ctx, cost)
//
// Each step returns nil or a *Refusal whose Kind says what it is (a limit,
// the brake, storage failing, the client gone), and decides inside what
// it counts, writes and gives back; the table in docs/DESIGN.md ("The
// admission, step by step") lists it per path. When layer 1 counts the
// request is decided in one place, rateAt. A step out of order is a bug of
// the caller's and panics. An Admission is used by one goroutine at a time
// (the call's retry hook included).
type Admission struct {
	g    *Guard
	req  Request
	step Step

	slot    budget.Slot
	claimed [2]budget.Reservation // the call's, then its retry's: claimed[:n]
	n       int
	// soft: the read's model follows the soft ceilings (ReserveSoft), its
	// claim at Reserve's worst case for the primary, fallback for the
	// fallback model.
	soft     bool
	fallback int64
	// rateDue: layer 1 has not counted the request yet and will, at the
	// step rateAt names.
	rateDue bool
	// shadowed are the layers whose shadowed refusal was reported.
	shadowed shadows
}

// Step is where an admission stands.
type Step uint8

const (
	// StepAdmitted: passed the checks before the body (AdmitKeyed: only
	// layer 1's remembered refusals, and its count on a guard that does
	// not leave it to the reservation's write).
	StepAdmitted Step = iota + 1
	// StepLooked: layers 2, 2b and 3 looked at, nothing taken (Admit does
	// it before the body, Look after a keyed request's upload).
	StepLooked
	// StepReserved: the attempt counted, a quota slot and a budget claim
	// taken in memory (Reserve).
	StepReserved
	// StepCommitted: the claim is covered by durable budget; the call may
	// be made (Commit).
	StepCommitted
	// StepRecorded: the usage record is on disk (Record).
	StepRecorded
	// StepFailed: the call gave no result and was settled (Fail).
	StepFailed
	// StepReleased: ended without a call (End, Gone, a refused Commit,
	// Release): whatever it held is given back.
	StepReleased
)

var stepNames = [...]string{"none", "admitted", "looked", "reserved", "committed", "recorded", "failed", "released"}

func (s Step) String() string {
	if int(s) < len(stepNames) {
		return stepNames[s]
	}
	return fmt.Sprintf("Step(%d)", s)
}

// Step is where a stands; 0 for a nil admission.
func (a *Admission) Step() Step {
	if a == nil {
		return 0
	}
	return a.step
}

// must panics unless a stands at one of steps: the caller's order is
// wrong, and money would be counted wrong if it went on.
func (a *Admission) must(method string, steps ...Step) {
	for _, s := range steps {
		if a.step == s {
			return
		}
	}
	panic(fmt.Sprintf("guard: Admission.%s at step %s, want one of %v", method, a.step, steps))
}

// Admit runs what is checked before the request body is read, all from
// memory: the usage pause, the deny cache, layer 1, and looks at layers 2,
// 2b and 3 without taking anything, so that a user with nothing left today
// or this month, or a service whose brake is engaged, costs no upload.
// The admission it returns stands at StepLooked.
func (g *Guard) Admit(req Request, now time.Time) (*Admission, *Refusal) {
	a := Admission{g: g, req: req, step: StepAdmitted, rateDue: true} // on the stack until admitted: a refusal allocates nothing
	if r := g.paused(now); r != nil {
		return nil, r
	}
	if r := g.remembered(req, false, now); r != nil {
		return nil, r
	}
	if r := a.rate(rateBeforeBody, now); r != nil {
		return nil, r
	}
	if r := a.look(now); r != nil {
		return nil, r // the admission ends with its count, if still due, untaken
	}
	admitted := a
	return &admitted, nil
}

// AdmitKeyed is Admit for a request that may be answered from storage
// without a call (one with an Idempotency-Key): only layer 1 is decided
// before the body, since a repeat uses nothing else. Look follows the
// upload when a call is needed after all, End when it is not.
func (g *Guard) AdmitKeyed(req Request, now time.Time) (*Admission, *Refusal) {
	a := Admission{g: g, req: req, step: StepAdmitted, rateDue: true}
	if r := a.rate(rateBeforeBody, now); r != nil {
		return nil, r
	}
	admitted := a
	return &admitted, nil
}

// Look is the rest of Admit for a keyed admission once its upload is in
// and no stored answer was found: the usage pause, the deny cache, and the
// looks at layers 2, 2b and 3. On a refusal the request ends.
func (a *Admission) Look(now time.Time) *Refusal {
	a.must("Look", StepAdmitted)
	g := a.g
	r := g.paused(now)
	if r == nil {
		r = g.remembered(a.req, false, now)
	}
	if r == nil {
		r = a.look(now)
	}
	if r == nil {
		return nil
	}
	a.step = StepReleased
	if r2 := a.rate(rateEnded, now); r2 != nil {
		return r2
	}
	return r
}

// look is layers 2, 2b and 3 looked at, nothing taken; an exact refusal
// is remembered.
func (a *Admission) look(now time.Time) *Refusal {
	gen := a.g.layers.Deny.generation()
	if r := a.g.remember(a.req, a.lookAt(now), gen, now); r != nil {
		return r
	}
	a.step = StepLooked
	return nil
}

func (a *Admission) lookAt(now time.Time) *Refusal {
	g, l, req := a.g, a.g.layers, a.req
	if l.Attempts != nil {
		if r := g.open(LayerAttempts, req, &a.shadowed, func() error { return l.Attempts.Check(req.Key, req.DailyLine, now) }); r != nil {
			return r
		}
	}
	if l.Quotas != nil {
		if r := g.closed(l.Quotas.Check(req.Key, req.MonthlyQuota, now)); r != nil {
			return r
		}
	}
	if l.Brake != nil {
		if r := g.open(LayerBudget, req, nil, func() error { return l.Brake.Check(now) }); r != nil {
			return r
		}
	}
	return nil
}

// End ends a request that makes no call and took nothing: an upload
// refused, an answer from storage (a repeat of its idempotency key, the
// same image within the dedupe window), a key another instance holds.
// Every request counts against the rate whichever way it ends, so a flood
// of them is limited as any other: the refusal is layer 1's, if it
// refuses the request now.
func (a *Admission) End(now time.Time) *Refusal {
	a.must("End", StepAdmitted, StepLooked)
	a.step = StepReleased
	return a.rate(rateEnded, now)
}

// Gone ends a request whose client went away before its call: it still
// counts against the rate if it has not yet (it was let in and uploaded),
// and a reservation is given back, its claims settled at zero. The
// refusal it returns is of KindGone.
func (a *Admission) Gone(ctx context.Context, now time.Time) *Refusal {
	a.must("Gone", StepAdmitted, StepLooked, StepCommitted)
	if a.step == StepCommitted {
		a.cancel(ctx)
	}
	a.step = StepReleased
	a.rate(rateEnded, now)
	return &Refusal{Layer: LayerClient, Reason: "gone", RetryAfter: time.Second}
}

// A rateStep is a point where a request may be counted by layer 1.
type rateStep uint8

const (
	rateBeforeBody rateStep = iota // Admit, AdmitKeyed
	rateReserve                    // Reserve
	rateEnded                      // End, Gone, a keyed request's Look refusing it
)

// rateAt is the one place that decides when layer 1 counts a request
// (the "rate" column of the admission table in docs/DESIGN.md). It is
// counted once, at the first of these:
//
//   - before the body, unless the backend decides layer 1's shared window
//     in the reservation's write (joined: storage/postgres), where a
//     remembered refusal is still answered but the count waits, so that
//     an accepted request makes one round trip before its call, not two;
//   - the reservation's write, on such a backend (rateInWrite);
//   - the step that ends the request without a reservation: End, Gone,
//     or a keyed request's Look refusing it (its stored answer was looked
//     up and its key claimed: work a flood must pay for in rate).
//
// A request Admit's looks refuse before the body on such a backend is
// not counted: it cost no round trip and no upload. A reservation on a
// backend whose store went away since Admit counts layer 1 alone, first.
//
// joined is the guard's joinedRate at the step, read once by the caller.
func (a *Admission) rateAt(s rateStep, joined bool) rateAction {
	if !a.rateDue {
		return rateNone
	}
	switch s {
	case rateBeforeBody:
		if joined {
			return rateLater
		}
	case rateReserve:
		if joined {
			return rateInWrite
		}
	}
	return rateNow
}

type rateAction uint8

const (
	rateNone    rateAction = iota // counted already
	rateLater                     // still due: a later step counts it
	rateNow                       // counted now, in memory (or the joined store, by the limiter)
	rateInWrite                   // counted by the reservation's write (takeAndReserve)
)

// rate applies rateAt at s.
func (a *Admission) rate(s rateStep, now time.Time) *Refusal {
	_, _, joined := a.g.joinedRate()
	return a.apply(a.rateAt(s, joined), now)
}

// apply does what rateAt decided: a count now, or (still due) only the
// answer to a remembered refusal of layer 1; a count in the write is the
// write's (takeAndReserve).
func (a *Admission) apply(act rateAction, now time.Time) *Refusal {
	switch act {
	case rateLater:
		return a.g.remembered(a.req, true, now)
	case rateNow:
		a.rateDue = false
		return a.g.count(a.req, now)
	}
	return nil
}

// count is layer 1 alone: the deny cache, then the rate and burst limits.
func (g *Guard) count(req Request, now time.Time) *Refusal {
	l := g.layers
	if l.Rate == nil {
		return nil
	}
	if r := g.remembered(req, true, now); r != nil {
		return r
	}
	gen := l.Deny.generation()
	return g.remember(req, g.open(LayerRate, req, nil, func() error { return l.Rate.Allow(req.Key, now) }), gen, now)
}

// JoinableRate is a rate limiter (layer 1) whose shared window a backend
// may decide in its own write (limiter.Limiter with a store): Joined is
// the store and thresholds, Admitted records in memory what the store
// admitted.
type JoinableRate interface {
	Joined() (limiter.Joined, bool)
	Admitted(key string, now time.Time)
}

// joinedRate returns the quotas and layer 1's window when the quotas'
// backend decides the window, the attempt and the slot in one write: the
// quotas share the attempt counter's commit and join the rate limiter's
// store.
func (g *Guard) joinedRate() (AttemptsAndQuotas, limiter.Joined, bool) {
	l := g.layers
	aq, ok := l.Quotas.(AttemptsAndQuotas)
	if !ok || l.Attempts == nil || !aq.SharesCommit(l.Attempts) {
		return nil, limiter.Joined{}, false
	}
	jr, ok := l.Rate.(JoinableRate)
	if !ok {
		return nil, limiter.Joined{}, false
	}
	j, ok := jr.Joined()
	if !ok || !aq.JoinsWindows(j.Store) {
		return nil, limiter.Joined{}, false
	}
	return aq, j, true
}
