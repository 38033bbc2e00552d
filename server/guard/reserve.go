package guard

import (
	"errors"
	"fmt"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// claims are the budget claims taken so far.
func (a *Admission) claims() []budget.Reservation { return a.claimed[:a.n] }

// addClaim keeps claim; a call and its one retry are the most an
// admission takes.
func (a *Admission) addClaim(claim budget.Reservation) {
	a.claimed[a.n] = claim
	a.n++
}

// Reserve counts the attempt against the daily line (layer 2), reserves a
// read of the quota (2b, fails closed) and claims one call at worst
// micro-dollars of the global budget (3), all in memory and each check and
// take one atomic step. On a refusal nothing stays reserved.
//
// A refused reservation ends the request (StepReleased).
func (a *Admission) Reserve(worst int64, now time.Time) *Refusal {
	a.must("Reserve", StepLooked)
	gen := a.g.layers.Deny.generation()
	if r := a.g.remember(a.req, a.take(worst, now), gen, now); r != nil {
		a.step = StepReleased
		return r
	}
	a.step = StepReserved
	return nil
}

// ReserveSoft is Reserve for a read whose model follows the soft
// ceilings: layer 3 claims it at primary micro-dollars if that fits under
// every soft ceiling, else at fallback (budget.Global.ClaimSoft), the side
// and the count in one atomic step. Side says which once Commit has
// returned.
func (a *Admission) ReserveSoft(primary, fallback int64, now time.Time) *Refusal {
	a.soft, a.fallback = true, fallback
	return a.Reserve(primary, now)
}

// Side is the side of the soft line that the call's claim was decided on
// (budget.Reservation.Degraded: "" for the primary model) and whether it
// is the first claim on that side since one on the other; ok is false
// when no claim decided it (not ReserveSoft, or the brake failed open).
func (a *Admission) Side() (degraded string, newSide, ok bool) {
	if a.n == 0 || !a.claimed[0].Soft {
		return "", false, false
	}
	return a.claimed[0].Degraded, a.claimed[0].NewSide, true
}

// take is Reserve before its exact refusal is remembered.
func (a *Admission) take(worst int64, now time.Time) *Refusal {
	g, l, req := a.g, a.g.layers, a.req
	aq, window, joined := g.joinedRate()
	act := a.rateAt(rateReserve, joined)
	if r := a.apply(act, now); r != nil {
		return r
	}
	both, r := a.takeAndReserve(aq, window, act == rateInWrite, now)
	if r != nil {
		return r
	}
	if l.Attempts != nil && !both {
		if r := g.open(LayerAttempts, req, &a.shadowed, func() error { return l.Attempts.Take(req.Key, req.DailyLine, now) }); r != nil {
			return r
		}
	}
	if l.Quotas != nil && !both {
		slot, err := l.Quotas.Reserve(req.Key, req.MonthlyQuota, now)
		if r := g.closed(err); r != nil {
			return r
		}
		a.slot = slot
	}
	if l.Brake != nil {
		var claim budget.Reservation
		r := g.open(LayerBudget, req, nil, func() (err error) {
			if a.soft {
				claim, err = l.Brake.ClaimSoft(worst, a.fallback, now)
				return err
			}
			claim, err = l.Brake.Claim(worst, now)
			return err
		})
		if r != nil {
			if l.Quotas != nil {
				l.Quotas.Release(a.slot)
			}
			return r
		}
		if claim.Day != "" { // "" when the brake failed open
			a.addClaim(claim)
		}
	}
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
// when rateAt left it here (rate), when the quotas are AttemptsAndQuotas sharing
// the attempt counter's commit (both reports that it ran); aq and window
// are the guard's joinedRate (aq nil: the window is not joined). The
// refusals are as when the layers run one after the other: the window's
// and the attempt's open (shadowed, or failing open), the quota's closed;
// an attempt refused takes no slot when the line is enforced, and one
// taken all the same would be given back.
func (a *Admission) takeAndReserve(aq AttemptsAndQuotas, window limiter.Joined, rate bool, now time.Time) (both bool, r *Refusal) {
	g, l, req := a.g, a.g.layers, a.req
	joined := aq != nil
	if !joined {
		aq, _ = l.Quotas.(AttemptsAndQuotas)
		if aq == nil || l.Attempts == nil || !aq.SharesCommit(l.Attempts) {
			return false, nil
		}
	}
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
		if r := a.answerRate(window, refused, now); r != nil {
			return true, r
		}
	case rate:
		// The write failed, the window undecided: layer 1 alone, which
		// decides in memory when its store cannot (a fail-open it
		// counts), so that a flood is still refused while the database
		// is down.
		if r := a.apply(rateNow, now); r != nil {
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
		g.reportShadowed(req, &a.shadowed, LayerAttempts, r)
	}
	if r := g.closed(reserve); r != nil {
		return true, r
	}
	a.slot = slot
	return true, nil
}

// answerRate answers layer 1 as TakeAndReserve decided it: refused, when
// window.Enforce (nothing was taken), or reported as shadowed; an
// admission is recorded in the rate limiter's memory.
func (a *Admission) answerRate(window limiter.Joined, refused *limiter.Refusal, now time.Time) *Refusal {
	g := a.g
	a.rateDue = false
	if refused == nil {
		if jr, ok := g.layers.Rate.(JoinableRate); ok {
			jr.Admitted(a.req.Key, now)
		}
		return nil
	}
	r := refusalOf(refused)
	if window.Enforce {
		return g.refuse(r)
	}
	g.reportShadowed(a.req, nil, LayerRate, r)
	return nil
}
