package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// Ticket carries one admitted request through the pipeline:
//
//	t, r := g.Admit(req, now)       // layers 1, 2, 2b, 3 looked at
//	defer t.Release()               // gives back whatever was not recorded
//	r = t.Reserve(worst, now)       // layer 2 counted, 2b slot, 3 claim
//	r, err = t.Commit(ctx, now)     // the claim on disk, before the call
//	... the call, with t.ClaimRetry before a retry ...
//	used, err := t.Record(ctx, rec, cost, now)  // "$", or t.Fail(ctx, cost)
//
// Cancel ends a request that made no call; Release after Record, Fail or
// Cancel does nothing. A Ticket is used by one
// goroutine at a time (the call's retry hook included).
type Ticket struct {
	g   *Guard
	req Request

	slot    budget.Slot
	claimed [2]budget.Reservation // the call's, then its retry's: claimed[:n]
	n       int
	reserve bool // Reserve took a slot and a claim
	// soft: the read's model follows the soft ceilings (ReserveSoft), its
	// claim at Reserve's worst case for the primary, fallback for the
	// fallback model.
	soft     bool
	fallback int64
	// rateDue: Admit left layer 1's count to Reserve (Guard.joinedRate),
	// or to Count for a request that ends without Reserve.
	rateDue bool
	done    bool // Record, Fail or Cancel settled everything
	// shadowed are the layers whose shadowed refusal was reported.
	shadowed shadows
}

// claims are the budget claims taken so far.
func (t *Ticket) claims() []budget.Reservation { return t.claimed[:t.n] }

// addClaim keeps claim; a call and its one retry are the most a ticket
// takes.
func (t *Ticket) addClaim(claim budget.Reservation) {
	t.claimed[t.n] = claim
	t.n++
}

// Reserve counts the attempt against the daily line (layer 2), reserves a
// read of the quota (2b, fails closed) and claims one call at worst
// micro-dollars of the global budget (3), all in memory and each check and
// take one atomic step. On a refusal nothing stays reserved.
func (t *Ticket) Reserve(worst int64, now time.Time) *Refusal {
	gen := t.g.layers.Deny.generation()
	return t.g.remember(t.req, t.take(worst, now), gen, now)
}

// ReserveSoft is Reserve for a read whose model follows the soft
// ceilings: layer 3 claims it at primary micro-dollars if that fits under
// every soft ceiling, else at fallback (budget.Global.ClaimSoft), the side
// and the count in one atomic step. Side says which once Commit has
// returned.
func (t *Ticket) ReserveSoft(primary, fallback int64, now time.Time) *Refusal {
	t.soft, t.fallback = true, fallback
	return t.Reserve(primary, now)
}

// Side is the side of the soft line that the call's claim was decided on
// (budget.Reservation.Degraded: "" for the primary model) and whether it
// is the first claim on that side since one on the other; ok is false
// when no claim decided it (not ReserveSoft, or the brake failed open).
func (t *Ticket) Side() (degraded string, newSide, ok bool) {
	if t.n == 0 || !t.claimed[0].Soft {
		return "", false, false
	}
	return t.claimed[0].Degraded, t.claimed[0].NewSide, true
}

// CountAtReserve leaves layer 1's count of the request, which
// Guard.CountLater did not count, to Reserve (or Count), as Admit does on
// a guard that decides it with the attempt and the slot.
func (t *Ticket) CountAtReserve() { t.rateDue = true }

// Count is layer 1 for a request whose count Admit left to Reserve but
// that ends without it (an upload refused, an answer kept from the same
// image): every request counts against the rate, as it would with Admit
// counting it. It counts at most once; nil if counted already.
func (t *Ticket) Count(now time.Time) *Refusal {
	if t == nil || !t.rateDue {
		return nil
	}
	t.rateDue = false
	return t.g.Count(t.req, now)
}

// take is Reserve before its exact refusal is remembered.
func (t *Ticket) take(worst int64, now time.Time) *Refusal {
	g, l, req := t.g, t.g.layers, t.req
	aq, window, joined := g.joinedRate()
	if !joined {
		// Left to Reserve by Admit, but the store went away since: layer
		// 1 alone, first.
		if r := t.Count(now); r != nil {
			return r
		}
	}
	both, r := t.takeAndReserve(aq, window, now)
	if r != nil {
		return r
	}
	if l.Attempts != nil && !both {
		if r := g.open(LayerAttempts, req, &t.shadowed, func() error { return l.Attempts.Take(req.Key, req.DailyLine, now) }); r != nil {
			return r
		}
	}
	if l.Quotas != nil && !both {
		slot, err := l.Quotas.Reserve(req.Key, req.MonthlyQuota, now)
		if r := g.closed(err); r != nil {
			return r
		}
		t.slot = slot
	}
	if l.Brake != nil {
		var claim budget.Reservation
		r := g.open(LayerBudget, req, nil, func() (err error) {
			if t.soft {
				claim, err = l.Brake.ClaimSoft(worst, t.fallback, now)
				return err
			}
			claim, err = l.Brake.Claim(worst, now)
			return err
		})
		if r != nil {
			if l.Quotas != nil {
				l.Quotas.Release(t.slot)
			}
			return r
		}
		if claim.Day != "" { // "" when the brake failed open
			t.addClaim(claim)
		}
	}
	t.reserve = true
	return nil
}

// AttemptsAndQuotas is what the quotas (layer 2b) may also be: a backend
// that writes the daily attempt line (layer 2) and the quota slots through
// one group commit (storage/postgres) takes the attempt and reserves the
// slot in one write, so that a read waits for one commit before its call,
// not two, and decides layer 1's shared window in that write too when
// the rate limiter's store is its own (JoinsWindows). SharesCommit reports
// whether attempts is its own counter. TakeAndReserve decides the window
// (none when window.Store is nil), then takes the attempt under line,
// then a slot of limit: refused is the window's refusal, which, when
// window.Enforce, takes nothing else; take is the attempt's answer as
// AttemptCounter.Take, and an attempt refused when enforceLine takes no
// slot; slot and reserve are the slot's, as Quotas.Reserve.
type AttemptsAndQuotas interface {
	SharesCommit(attempts any) bool
	JoinsWindows(store limiter.SharedWindows) bool
	TakeAndReserve(user string, window limiter.Joined, line int64, enforceLine bool, limit int64,
		now time.Time) (slot budget.Slot, refused *limiter.Refusal, take, reserve error)
}

// takeAndReserve is layers 2 and 2b of Reserve in one write, with layer 1
// when Admit left it here, when the quotas are AttemptsAndQuotas sharing
// the attempt counter's commit (both reports that it ran); aq and window
// are the guard's joinedRate (aq nil: the window is not joined). The
// refusals are as when the layers run one after the other: the window's
// and the attempt's open (shadowed, or failing open), the quota's closed;
// an attempt refused takes no slot when the line is enforced, and one
// taken all the same would be given back.
func (t *Ticket) takeAndReserve(aq AttemptsAndQuotas, window limiter.Joined, now time.Time) (both bool, r *Refusal) {
	g, l, req := t.g, t.g.layers, t.req
	joined := aq != nil
	if !joined {
		aq, _ = l.Quotas.(AttemptsAndQuotas)
		if aq == nil || l.Attempts == nil || !aq.SharesCommit(l.Attempts) {
			return false, nil
		}
	}
	rate := t.rateDue && joined
	if rate {
		window.Enforce = !g.shadowed(LayerRate, req)
	} else {
		window = limiter.Joined{}
	}
	enforceLine := !g.shadowed(LayerAttempts, req)
	var (
		slot    budget.Slot
		refused *limiter.Refusal
		take    error
	)
	reserve := errors.New("guard: the quota slot was not reserved") // kept if TakeAndReserve panics
	func() {
		defer func() {
			if p := recover(); p != nil {
				take = fmt.Errorf("panic: %v", p)
			}
		}()
		slot, refused, take, reserve = aq.TakeAndReserve(req.Key, window, req.DailyLine, enforceLine, req.MonthlyQuota, now)
	}()
	switch failed := take != nil && refusalOf(take) == nil; {
	case rate && !failed:
		if r := t.answerRate(window, refused, now); r != nil {
			return true, r
		}
	case rate:
		// The write failed, the window undecided: layer 1 alone, which
		// decides in memory when its store cannot (a fail-open it
		// counts), so that a flood is still refused while the database
		// is down.
		if r := t.Count(now); r != nil {
			return true, r
		}
	}
	switch r := g.try(LayerAttempts, func() error { return take }); {
	case r == nil: // taken, or the machinery failed (reported)
	case enforceLine:
		if reserve == nil {
			l.Quotas.Release(slot)
		}
		return true, g.refuse(r)
	default:
		g.reportShadowed(req, &t.shadowed, LayerAttempts, r)
	}
	if r := g.closed(reserve); r != nil {
		return true, r
	}
	t.slot = slot
	return true, nil
}

// answerRate answers layer 1 as TakeAndReserve decided it: refused, when
// window.Enforce (nothing was taken), or reported as shadowed; an
// admission is recorded in the rate limiter's memory.
func (t *Ticket) answerRate(window limiter.Joined, refused *limiter.Refusal, now time.Time) *Refusal {
	g := t.g
	t.rateDue = false
	if refused == nil {
		if jr, ok := g.layers.Rate.(JoinableRate); ok {
			jr.Admitted(t.req.Key, now)
		}
		return nil
	}
	r := refusalOf(refused)
	if window.Enforce {
		return g.refuse(r)
	}
	g.reportShadowed(t.req, nil, LayerRate, r)
	return nil
}

// Commit covers the claims with durable budget (the brake's lease, which
// writes about once per budget.LeaseCalls calls), so that they still count
// after a crash; call it before the upstream call. It tells a "no" apart
// from a fault, so that the caller never has to guess which it got:
//
//   - a claim a shared ledger refuses under its ceilings
//     (budget.SharedLedger: other instances took the room) is the brake's
//     refusal, as Reserve would have made it: refused is set and err is
//     nil. Nothing failed; it is answered and alerted as the brake is.
//   - a claim the ledger cannot take (the write failed) refuses the call
//     (layer "usage", reason "ledger_failing") and pauses paid calls as a
//     failed usage record does, since the ledger and the usage records
//     share one database and the read would be paid for and then
//     withheld: refused is that refusal and err the write's error, which
//     the caller reports as the fault it is.
//
// Either way the caller then Cancels the ticket.
func (t *Ticket) Commit(ctx context.Context, now time.Time) (refused *Refusal, err error) {
	for i := range t.claims() {
		if t.claimed[i].Committed() {
			continue
		}
		err := t.commit(ctx, &t.claimed[i])
		if err == nil {
			continue
		}
		if r := refusalOf(err); r != nil {
			return t.g.refuse(r), nil
		}
		t.g.records.start(now)
		return t.g.refuse(&Refusal{Layer: LayerUsage, Reason: "ledger_failing", RetryAfter: UsagePause}), err
	}
	return nil, nil
}

// commit writes one claim; a panic in the brake is its machinery failing
// (reported, and the claim left uncommitted but held in memory).
func (t *Ticket) commit(ctx context.Context, claim *budget.Reservation) (err error) {
	defer func() {
		if p := recover(); p != nil {
			t.g.hooks.failedOpen(LayerBudget, fmt.Errorf("panic: %v", p))
			err = nil
		}
	}()
	return t.g.layers.Brake.Commit(ctx, claim)
}

// ClaimRetry claims one more call at worst micro-dollars for a retry of
// the upstream call, and commits it durably before the retry is made. It
// reports false when the budget has no room (or its machinery failed): a
// retry is never worth an unclaimed call, and the request then ends with
// the first call's failure. A guard without a brake always allows it.
func (t *Ticket) ClaimRetry(ctx context.Context, worst int64, now time.Time) bool {
	b := t.g.layers.Brake
	switch {
	case b == nil:
		return true
	case t.n == len(t.claimed):
		return false // one retry per call
	}
	var claim budget.Reservation
	r := t.g.try(LayerBudget, func() (err error) {
		claim, err = b.Claim(worst, now)
		return err
	})
	if r != nil || claim.Day == "" {
		return false
	}
	t.addClaim(claim) // held, so that it is settled whatever happens next
	if err := t.commit(ctx, &t.claimed[t.n-1]); err != nil {
		if refusalOf(err) != nil {
			// A shared ledger's refusal: no room, nothing failing. The
			// claim was dropped (nothing to settle): forget it, so that
			// the first call stays the one that answers.
			t.n--
			return false
		}
		// As in Commit: no retry on a ledger that cannot take its claim.
		t.g.records.start(now)
		return false
	}
	return true
}

// settlement splits the claims for a call that ended at cost: every claim
// but the last was a busy call whose bill is unknown, so it keeps its worst
// case; the last is the call that answered.
func (t *Ticket) settlement() (earlier []budget.Reservation, last budget.Reservation, ok bool) {
	if t.n == 0 {
		return nil, budget.Reservation{}, false
	}
	return t.claimed[:t.n-1], t.claimed[t.n-1], true
}

// Record is "$": the quota increment, the usage row and the settlement of
// the call's claim at cost, in one durable transaction, before the answer.
// It returns the user's reads this month, counting this one. On an error
// nothing of the read is counted, the quota slot is given back, and paid
// calls pause (see Admit): the caller withholds the result. On an error
// wrapping budget.ErrMaybeCommitted the record may have been written:
// neither its settlement nor its slot is given back (the safe side of
// both outcomes), and the result is still withheld.
func (t *Ticket) Record(ctx context.Context, rec budget.UsageRecord, cost int64, now time.Time) (used int64, err error) {
	g := t.g
	earlier, last, claimed := t.settlement()
	for _, c := range earlier {
		t.settle(ctx, c, c.Worst)
	}
	var settlement budget.Settlement
	if claimed {
		settlement = last.Settlement(cost)
	}
	if err := g.layers.Usage.RecordUsage(ctx, t.slot.Month, rec, settlement); err != nil {
		t.done = true
		g.records.start(now)
		if errors.Is(err, budget.ErrMaybeCommitted) {
			if claimed {
				g.layers.Brake.Settled(last, last.Worst)
			}
			return 0, err
		}
		if claimed {
			t.settle(ctx, last, cost)
		}
		t.releaseSlot()
		return 0, err
	}
	g.records.end()
	if claimed {
		g.layers.Brake.Settled(last, cost)
	}
	t.done = true
	return g.layers.Quotas.Confirm(t.slot), nil
}

// Fail settles a call that gave no result at cost (its worst case when
// the bill is unknown), and gives the quota slot back.
func (t *Ticket) Fail(ctx context.Context, cost int64) {
	earlier, last, claimed := t.settlement()
	for _, c := range earlier {
		t.settle(ctx, c, c.Worst)
	}
	if claimed {
		t.settle(ctx, last, cost)
	}
	t.done = true
	t.releaseSlot()
}

// Cancel ends a request that made no call (the client went away before
// it): its claims are settled at zero and its quota slot given back.
func (t *Ticket) Cancel(ctx context.Context) {
	for _, c := range t.claims() {
		if c.Unbound {
			t.g.layers.Brake.Settled(c, 0) // never written: nothing to undo on disk
			continue
		}
		t.settle(ctx, c, 0)
	}
	t.done = true
	t.releaseSlot()
}

// Release gives the quota slot back unless Record, Fail or Cancel has
// settled the request; its claims, if any, stay at their worst case (a
// call may have been made). It can always be deferred, even after a
// panic, and is safe on a nil Ticket.
func (t *Ticket) Release() {
	if t == nil || t.done || !t.reserve {
		return
	}
	t.done = true
	t.releaseSlot()
}

func (t *Ticket) releaseSlot() {
	if t.g.layers.Quotas != nil && t.reserve {
		t.g.layers.Quotas.Release(t.slot)
	}
}

// settle closes a claim in memory and the ledger. If the write fails, the
// claim keeps counting at its worst case, which errs on the safe side.
func (t *Ticket) settle(ctx context.Context, c budget.Reservation, cost int64) {
	if err := t.g.layers.Brake.Settle(ctx, c, cost); err != nil {
		t.g.hooks.failedOpen(LayerBudget, err)
	}
}
