package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"breakwater/budget"
)

// Commit covers the claims with durable budget (the brake's lease, which
// writes about once per budget.LeaseCalls calls), so that they still count
// after a crash; call it before the upstream call. A refusal ends the
// request (no call is made; its claims are settled at zero and its slot
// given back), and its Kind says which it is:
//
//   - KindBrake: a claim a shared ledger refuses under its ceilings
//     (budget.SharedLedger: other instances took the room), as Reserve
//     would have refused it. Nothing failed; it is answered and alerted
//     as the brake is.
//   - KindStorage: the ledger could not take the claim (the write
//     failed): layer "usage", reason "ledger_failing", and Fault the
//     write's error, which the caller reports as the fault it is. Paid
//     calls pause as after a failed usage record, since the ledger and
//     the usage records share one database and the read would be paid
//     for and then withheld.
func (a *Admission) Commit(ctx context.Context, now time.Time) *Refusal {
	a.must("Commit", StepReserved)
	for i := range a.claims() {
		if a.claimed[i].Committed() {
			continue
		}
		err := a.commit(ctx, &a.claimed[i])
		if err == nil {
			continue
		}
		r := refusalOf(err)
		if r == nil {
			a.g.records.start(now)
			r = &Refusal{Layer: LayerUsage, Reason: "ledger_failing", RetryAfter: UsagePause, Fault: err}
		}
		a.cancel(ctx)
		a.step = StepReleased
		return a.g.refuse(r)
	}
	a.step = StepCommitted
	return nil
}

// commit writes one claim; a panic in the brake is its machinery failing
// (reported, and the claim left uncommitted but held in memory).
func (a *Admission) commit(ctx context.Context, claim *budget.Reservation) (err error) {
	defer func() {
		if p := recover(); p != nil {
			a.g.hooks.failedOpen(LayerBudget, fmt.Errorf("panic: %v", p))
			err = nil
		}
	}()
	return a.g.layers.Brake.Commit(ctx, claim)
}

// ClaimRetry claims one more call at worst micro-dollars for a retry of
// the upstream call, and commits it durably before the retry is made. It
// reports false when the budget has no room (or its machinery failed): a
// retry is never worth an unclaimed call, and the request then ends with
// the first call's failure. A guard without a brake always allows it.
func (a *Admission) ClaimRetry(ctx context.Context, worst int64, now time.Time) bool {
	b := a.g.layers.Brake
	switch {
	case b == nil:
		return true
	case a.n == len(a.claimed):
		return false // one retry per call
	}
	var claim budget.Reservation
	r := a.g.try(LayerBudget, func() (err error) {
		claim, err = b.Claim(worst, now)
		return err
	})
	if r != nil || claim.Day == "" {
		return false
	}
	a.addClaim(claim) // held, so that it is settled whatever happens next
	if err := a.commit(ctx, &a.claimed[a.n-1]); err != nil {
		if refusalOf(err) != nil {
			// A shared ledger's refusal: no room, nothing failing. The
			// claim was dropped (nothing to settle): forget it, so that
			// the first call stays the one that answers.
			a.n--
			return false
		}
		// As in Commit: no retry on a ledger that cannot take its claim.
		a.g.records.start(now)
		return false
	}
	return true
}

// settlement splits the claims for a call that ended at cost: every claim
// but the last was a busy call whose bill is unknown, so it keeps its worst
// case; the last is the call that answered.
func (a *Admission) settlement() (earlier []budget.Reservation, last budget.Reservation, ok bool) {
	if a.n == 0 {
		return nil, budget.Reservation{}, false
	}
	return a.claimed[:a.n-1], a.claimed[a.n-1], true
}

// Record is "$": the quota increment, the usage row and the settlement of
// the call's claim at cost, in one durable transaction, before the answer.
// It returns the user's reads this month, counting this one. A refusal
// (KindStorage, reason "record_failed", Fault the write's error) means
// the result must be withheld: nothing of the read is counted, the quota
// slot is given back, and paid calls pause (UsagePause). When the fault
// wraps budget.ErrMaybeCommitted the record may have been written:
// neither its settlement nor its slot is given back (the safe side of
// both outcomes), and the result is still withheld.
func (a *Admission) Record(ctx context.Context, rec budget.UsageRecord, cost int64, now time.Time) (used int64, r *Refusal) {
	a.must("Record", StepCommitted)
	g := a.g
	earlier, last, claimed := a.settlement()
	for _, c := range earlier {
		a.settle(ctx, c, c.Worst)
	}
	var settlement budget.Settlement
	if claimed {
		settlement = last.Settlement(cost)
	}
	if err := g.layers.Usage.RecordUsage(ctx, a.slot.Month, rec, settlement); err != nil {
		a.step = StepFailed
		g.records.start(now)
		switch {
		case errors.Is(err, budget.ErrMaybeCommitted):
			if claimed {
				g.layers.Brake.Settled(last, last.Worst)
			}
		default:
			if claimed {
				a.settle(ctx, last, cost)
			}
			a.releaseSlot()
		}
		return 0, &Refusal{Layer: LayerUsage, Reason: "record_failed", RetryAfter: UsagePause, Fault: err}
	}
	g.records.end()
	if claimed {
		g.layers.Brake.Settled(last, cost)
	}
	a.step = StepRecorded
	return g.layers.Quotas.Confirm(a.slot), nil
}

// Fail settles a call that gave no result at cost (its worst case when
// the bill is unknown), and gives the quota slot back.
func (a *Admission) Fail(ctx context.Context, cost int64) {
	a.must("Fail", StepCommitted)
	earlier, last, claimed := a.settlement()
	for _, c := range earlier {
		a.settle(ctx, c, c.Worst)
	}
	if claimed {
		a.settle(ctx, last, cost)
	}
	a.step = StepFailed
	a.releaseSlot()
}

// cancel ends a request that made no call (the client went away before
// it, or its claim was refused): its claims are settled at zero and its
// quota slot given back.
func (a *Admission) cancel(ctx context.Context) {
	for _, c := range a.claims() {
		if c.Unbound {
			a.g.layers.Brake.Settled(c, 0) // never written: nothing to undo on disk
			continue
		}
		a.settle(ctx, c, 0)
	}
	a.releaseSlot()
}

// Release gives back whatever a holds unless a step has settled it: the
// quota slot of a reservation (its claims, if any, stay at their worst
// case: a call may have been made). It can always be deferred, even
// after a panic, and is safe on a nil Admission.
func (a *Admission) Release() {
	if a == nil {
		return
	}
	switch a.step {
	case StepReserved, StepCommitted:
		a.releaseSlot()
	}
	switch a.step {
	case StepRecorded, StepFailed:
	default:
		a.step = StepReleased
	}
}

func (a *Admission) releaseSlot() {
	if a.g.layers.Quotas != nil {
		a.g.layers.Quotas.Release(a.slot)
	}
}

// settle closes a claim in memory and the ledger. If the write fails, the
// claim keeps counting at its worst case, which errs on the safe side.
func (a *Admission) settle(ctx context.Context, c budget.Reservation, cost int64) {
	if err := a.g.layers.Brake.Settle(ctx, c, cost); err != nil {
		a.g.hooks.failedOpen(LayerBudget, err)
	}
}
