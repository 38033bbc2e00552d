package budget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// The lease: Commit does not write each claim. One durable write adds a
// block of headroom to the day (calls and micro-dollars) and the claims
// that follow take from it in memory, until it runs out. The ledger's day
// totals are thus at least the claims committed, and at most those plus
// the lease; a lease is sized so that this never passes a ceiling. A crash
// keeps the lease's rest counted: the day may look up to one lease more
// spent than it was, never less. Close, a new day and a change of ceilings
// give the rest back.

// Lease sizing: the most headroom one top-up leases, beyond the claim that
// needs it (which is always covered, as a reservation of one call was
// before leases).
const (
	// LeaseCalls is the most calls one lease holds. Every committer that
	// finds the lease empty waits for the top-up's write, so at a high
	// rate a small lease stalls the paid path as often as a reservation
	// per call did: measured, 32 left the ceilings-on path at the same
	// rate as before leases, 1024 brought it to the ceilings-off rate. In
	// practice 1% of a ceiling (LeaseShare) is the bound that applies.
	LeaseCalls = 1024
	// LeaseShare bounds a lease by a share of the ceilings: at most
	// 1/LeaseShare (1%) of daily_requests, and at most 1/LeaseShare of
	// the money left under daily_usd and under monthly_usd, and never less
	// than the one claim that needs it. Near a ceiling a lease is thus one
	// call at its worst case.
	LeaseShare = 100
)

// MaxLease is the most calls a lease holds under cfg: the most calls a
// crash can leave counted in the ledger without having been made, besides
// the calls it interrupts. The money a lease holds is bounded by 1% of what
// is left under each money ceiling that is on, or one call's worst case
// when that is more.
func MaxLease(cfg Config) int64 {
	n := int64(LeaseCalls)
	if cfg.DailyRequests > 0 {
		n = min(n, max(1, cfg.DailyRequests/LeaseShare))
	}
	return n
}

// take covers r from its lease (poolOf), in memory, if the lease holds a
// call and r's worst case.
func (g *Global) take(r *Reservation) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	pool := g.poolOf(r)
	if r.Day != g.day || pool.Requests < 1 || pool.SpendMicroUSD < r.Worst {
		return false
	}
	cover(pool, r)
	g.confirm(r)
	return true
}

// poolOf is the lease r takes from: the primary headroom for a claim that
// a shared ledger has yet to take under the soft ceilings, else the lease.
// g.mu is held.
func (g *Global) poolOf(r *Reservation) *DayTotals {
	if r.underSoft {
		return &g.primary
	}
	return &g.lease
}

// cover takes what it can of r from headroom h: the call, if h holds one,
// and up to r's worst case.
func cover(h *DayTotals, r *Reservation) {
	if h.Requests >= 1 {
		h.Requests--
		r.Leased = true
	}
	r.LeasedMicroUSD = min(h.SpendMicroUSD, r.Worst)
	h.SpendMicroUSD -= r.LeasedMicroUSD
}

// topUpFor writes the lease's top-up that covers r, with whatever headroom
// waits to be given back, and takes r from it. g.topUp is held. A claim of
// a day that has ended (the day rolled over between its Claim and its
// Commit) is written alone, one call at its worst case, to its own day.
func (g *Global) topUpFor(ctx context.Context, r *Reservation) error {
	g.mu.Lock()
	day := r.Day
	calls, spend := int64(1), r.Worst
	// hand is the lease while its top-up is written: no one else takes
	// from it meanwhile (committers that need it wait on g.topUp).
	var hand DayTotals
	if day == g.day {
		hand, g.lease = g.lease, DayTotals{}
		n := g.leaseSize(r.Worst, g.limits, g.primary)
		calls = max(0, n-hand.Requests)
		spend = max(0, n*r.Worst-hand.SpendMicroUSD)
	}
	give := slices.Clone(g.giveBack)
	g.mu.Unlock()

	err := g.ledger.Lease(ctx, day, calls, spend, give...)

	g.mu.Lock()
	defer g.mu.Unlock()
	g.gaveBack(give, err)
	if err != nil {
		// The claim stays in memory and its settlement will add it to the
		// ledger. Headroom the ledger already holds for its day covers it
		// first, as far as it goes (not what the write may have given
		// back): a settlement adding a call beside an unused lease could
		// pass the ceiling the lease was sized under.
		if hand != (DayTotals{}) {
			cover(&hand, r)
		} else {
			g.coverFromGiveBack(r)
		}
		g.keep(&g.lease, day, hand)
		return fmt.Errorf("%w: %w", ErrLedger, err)
	}
	hand.Requests += calls
	hand.SpendMicroUSD += spend
	cover(&hand, r)
	g.keep(&g.lease, day, hand)
	return nil
}

// coverFromGiveBack covers what it can of r from the headroom of its day
// waiting to be given back. g.topUp is held.
func (g *Global) coverFromGiveBack(r *Reservation) {
	for i := range g.giveBack {
		if g.giveBack[i].Day == r.Day {
			cover(&g.giveBack[i].DayTotals, r)
			return
		}
	}
}

// leaseSize is how many calls at worst each the top-up for a claim of
// today at worst should lease, counting that claim: within LeaseCalls and
// LeaseShare, and such that the ledger stays within every ceiling of lim
// that is on. The ledger's totals are estimated from memory (the claims,
// the lease, the other lease (other), what waits to be given back):
// claims not yet committed count there and not yet in the ledger, so the
// estimate errs on the safe side. At least 1: the claim itself passed the
// ceilings when it was made. g.mu is held and the lease is in the
// caller's hand.
func (g *Global) leaseSize(worst int64, lim ceilings, other DayTotals) int64 {
	if g.closed {
		return 1
	}
	dayBack, monthBack := other, other
	for _, b := range g.giveBack {
		if b.Day == g.day {
			dayBack.Requests += b.Requests
			dayBack.SpendMicroUSD += b.SpendMicroUSD
		}
		if monthOf(b.Day) == g.month {
			monthBack.SpendMicroUSD += b.SpendMicroUSD
		}
	}
	n := int64(LeaseCalls)
	if lim.requests > 0 {
		// The claim is among g.requests; n calls from the lease count it.
		n = min(n, max(1, lim.requests/LeaseShare), lim.requests-(g.requests-1)-dayBack.Requests)
	}
	if worst > 0 {
		if lim.dailyMicro > 0 {
			n = min(n, moneyCalls(lim.dailyMicro-(g.spend-worst)-dayBack.SpendMicroUSD, worst))
		}
		if lim.monthlyMicro > 0 {
			n = min(n, moneyCalls(lim.monthlyMicro-(g.monthSpend-worst)-monthBack.SpendMicroUSD, worst))
		}
	}
	return max(n, 1)
}

// moneyCalls is how many calls at worst a lease may hold under a money
// ceiling with room left: what fits, and no more than LeaseShare of the
// room unless that is less than one call.
func moneyCalls(room, worst int64) int64 {
	return min(room/worst, max(1, room/LeaseShare/worst))
}

// keep puts headroom of day back: into pool (a lease of g) if day is
// today, else to be given back to day.
func (g *Global) keep(pool *DayTotals, day string, rest DayTotals) {
	if day == g.day {
		pool.Requests += rest.Requests
		pool.SpendMicroUSD += rest.SpendMicroUSD
		return
	}
	g.addGiveBack(LedgerDay{Day: day, DayTotals: rest})
}

// returnLease moves today's leases to what the next write gives back.
// g.mu is held.
func (g *Global) returnLease() {
	g.addGiveBack(LedgerDay{Day: g.day, DayTotals: g.lease})
	g.lease = DayTotals{}
	g.returnPrimary()
}

// returnPrimary moves today's primary headroom (leased under the soft
// ceilings) to what the next write gives back. g.mu is held.
func (g *Global) returnPrimary() {
	g.addGiveBack(LedgerDay{Day: g.day, DayTotals: g.primary})
	g.primary = DayTotals{}
}

// addGiveBack adds b to what the next write gives back, one entry per day.
func (g *Global) addGiveBack(b LedgerDay) {
	if b.DayTotals == (DayTotals{}) {
		return
	}
	for i := range g.giveBack {
		if g.giveBack[i].Day == b.Day {
			g.giveBack[i].Requests += b.Requests
			g.giveBack[i].SpendMicroUSD += b.SpendMicroUSD
			return
		}
	}
	g.giveBack = append(g.giveBack, b)
}

// gaveBack removes what a write that ended with err gave back (a copy of
// g.giveBack's first entries, which may have grown since) from g.giveBack:
// when it succeeded, and when it may have committed (ErrMaybeCommitted:
// sent again, it could be given back twice). Only the holder of g.topUp
// removes entries, so they are where the copy found them.
func (g *Global) gaveBack(given []LedgerDay, err error) {
	if err != nil && !errors.Is(err, ErrMaybeCommitted) {
		return
	}
	for i, b := range given {
		g.giveBack[i].Requests -= b.Requests
		g.giveBack[i].SpendMicroUSD -= b.SpendMicroUSD
	}
	g.giveBack = slices.DeleteFunc(g.giveBack, func(b LedgerDay) bool { return b.DayTotals == (DayTotals{}) })
}

// Close gives the lease's rest back to the ledger, so that after a clean
// shutdown each day's totals are exactly the calls made and their cost.
// Call it once no call is in flight, before the ledger closes. The brake
// still works after it, one call per lease. If the write fails, the rest
// keeps counting (the safe side) and the error wraps ErrLedger.
func (g *Global) Close(ctx context.Context) error {
	g.topUp.Lock()
	defer g.topUp.Unlock()
	g.mu.Lock()
	g.closed = true
	g.returnLease()
	give := slices.Clone(g.giveBack)
	g.mu.Unlock()
	if len(give) == 0 {
		return nil
	}
	err := g.ledger.Lease(ctx, "", 0, 0, give...)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gaveBack(give, err)
	if err != nil {
		return fmt.Errorf("%w: give the budget lease back: %w", ErrLedger, err)
	}
	return nil
}

// monthOf is the month ("2006-01") of day ("2006-01-02").
func monthOf(day string) string {
	if len(day) < len("2006-01") {
		return ""
	}
	return day[:len("2006-01")]
}

// sharedTries bounds the top-ups of one claim on a shared ledger: a
// refused top-up is tried again, sized from the ledger's fresh totals, as
// long as they leave room for a smaller one.
const sharedTries = 3

// topUpShared is topUpFor on a ledger other instances write too: the
// ledger takes the top-up only if its totals stay under every ceiling,
// and returns them, which refresh this instance's view of the day and the
// month (the other instances' calls included). A refused top-up is tried
// again sized from the fresh totals (near a ceiling, one call); if even
// that does not fit, the claim is refused with a *PausedError and dropped.
// A primary claim of ClaimSoft leases primary headroom, under the soft
// ceilings too: if that does not fit because of a soft ceiling, the claim
// moves to the fallback and leases as any other claim. g.topUp is held.
func (g *Global) topUpShared(ctx context.Context, r *Reservation) error {
	if err := g.leaseShared(ctx, r); err != errSoftLine {
		return err
	}
	if r.Unbound || g.take(r) {
		return nil
	}
	return g.leaseShared(ctx, r)
}

// errSoftLine is leaseShared's answer for a primary claim that the soft
// ceilings refused: the claim has moved to the fallback, still to lease.
var errSoftLine = errors.New("budget: primary headroom refused under the soft ceilings")

// leaseShared is one claim's top-up of its lease (poolOf) on a shared
// ledger, tried again as topUpShared says. g.topUp is held.
func (g *Global) leaseShared(ctx context.Context, r *Reservation) error {
	var next int64 // the size of the next try, from the totals of a refusal
	for try := 1; ; try++ {
		g.mu.Lock()
		day := r.Day
		pool, lim, other := &g.lease, g.limits, g.primary
		if r.underSoft {
			pool, lim, other = &g.primary, tighter(g.limits, g.soft), g.lease
		}
		n := int64(1)
		var hand DayTotals
		if day == g.day {
			hand, *pool = *pool, DayTotals{}
			n = g.leaseSize(r.Worst, lim, other)
			if r.underSoft {
				n = min(n, g.primaryShare())
			}
			if next > 0 {
				n = min(n, next)
			}
		}
		calls := max(0, n-hand.Requests)
		spend := max(0, n*r.Worst-hand.SpendMicroUSD)
		give := slices.Clone(g.giveBack)
		under := lim.shared()
		g.mu.Unlock()

		tot, ok, err := g.shared.LeaseUnder(ctx, day, calls, spend, under, give...)

		g.mu.Lock()
		g.gaveBack(give, err) // given back whether or not the lease fitted
		if err != nil {
			if hand != (DayTotals{}) {
				cover(&hand, r)
			} else {
				g.coverFromGiveBack(r)
			}
			g.keep(pool, day, hand)
			g.mu.Unlock()
			return fmt.Errorf("%w: %w", ErrLedger, err)
		}
		if ok {
			hand.Requests += calls
			hand.SpendMicroUSD += spend
			cover(&hand, r)
			g.confirm(r)
		}
		g.keep(pool, day, hand)
		g.refresh(day, tot)
		if ok {
			g.mu.Unlock()
			return nil
		}
		next = min(n-1, fits(tot, hand, r.Worst, under))
		if try < sharedTries && next >= 1 {
			g.mu.Unlock()
			continue
		}
		g.drop(day, r)
		if side := g.softPassed(tot, hand, r.Worst); r.underSoft && side != "" {
			g.toFallback(r, side)
			g.mu.Unlock()
			return errSoftLine
		}
		err = g.refuseShared(r, g.limits.shared(), tot, calls, spend)
		g.mu.Unlock()
		return err
	}
}

// fits is how many calls at worst a lease may hold, counting hand (this
// instance's unused lease, which the totals include), under the ceilings
// of lim given a shared ledger's totals.
func fits(tot SharedTotals, hand DayTotals, worst int64, lim Ceilings) int64 {
	n := int64(LeaseCalls)
	if lim.DailyRequests > 0 {
		n = min(n, lim.DailyRequests-tot.Requests+hand.Requests)
	}
	if worst > 0 {
		if lim.DailyMicroUSD > 0 {
			n = min(n, (lim.DailyMicroUSD-tot.SpendMicroUSD+hand.SpendMicroUSD)/worst)
		}
		if lim.MonthlyMicroUSD > 0 {
			n = min(n, (lim.MonthlyMicroUSD-tot.MonthMicroUSD+hand.SpendMicroUSD)/worst)
		}
	}
	return n
}

// refresh sets the view of day and its month from a shared ledger's
// totals: every instance's calls and money, less this instance's unused
// leases (which the view does not count as spent). g.mu is held.
func (g *Global) refresh(day string, tot SharedTotals) {
	unused := DayTotals{Requests: g.lease.Requests + g.primary.Requests, SpendMicroUSD: g.lease.SpendMicroUSD + g.primary.SpendMicroUSD}
	if day == g.day {
		g.requests = max(tot.Requests-unused.Requests, 0)
		g.spend = max(tot.SpendMicroUSD-unused.SpendMicroUSD, 0)
		g.settled, g.settledCalls, g.dead = tot.SettledMicroUSD, tot.SettledCalls, tot.DeadMicroUSD
	}
	if monthOf(day) == g.month {
		g.monthSpend = max(tot.MonthMicroUSD-unused.SpendMicroUSD, 0)
		g.monthSettled = tot.MonthSettledMicroUSD
	}
	g.watchShares() // every instance's figures: a share another one's calls reached
}

// drop takes a claim of day that the shared ledger refused out of what
// calls in flight hold: it is not in the ledger's totals, and the view
// refreshed from them does not count it. g.mu is held.
func (g *Global) drop(day string, r *Reservation) {
	if day == g.day {
		g.open = max(g.open-r.Worst, 0)
	}
	if monthOf(day) == g.month {
		g.monthOpen = max(g.monthOpen-r.Worst, 0)
	}
}

// refuseShared drops a claim the shared ledger refused and returns its
// refusal: the ceiling that the top-up would have passed, until its period
// ends, or, for daily_usd, busy when the money settled that day and the
// rests of dead instances still leave room for the call (what blocks it is
// the worst cases of calls in flight and live instances' lease rests,
// which settle in seconds). g.mu is held.
func (g *Global) refuseShared(r *Reservation, lim Ceilings, tot SharedTotals, calls, spend int64) error {
	now := g.lastNow
	worst := max(r.Worst, 1)
	r.Day, r.Month = "", ""
	switch {
	case lim.DailyRequests > 0 && tot.Requests+calls > lim.DailyRequests:
		return &PausedError{Ceiling: "daily_requests", RetryAfter: nextDay(now, g.loc).Sub(now)}
	case lim.DailyMicroUSD > 0 && tot.SpendMicroUSD+spend > lim.DailyMicroUSD:
		return moneyPaused("daily_usd", tot.SettledMicroUSD+tot.DeadMicroUSD+worst <= lim.DailyMicroUSD, nextDay(now, g.loc).Sub(now))
	}
	var pe *PausedError
	if errors.As(g.check(worst, now), &pe) && pe.Ceiling == "monthly_usd" {
		return pe
	}
	return moneyPaused("monthly_usd", true, nextMonth(now, g.loc).Sub(now))
}

// Refresh sets the view of today and this month from a shared ledger's
// totals, every instance's calls and money, and gives back what waits to
// be given back; with any other ledger it does nothing. Call it now and
// then (every second, say): Check, Claim and Status then see the other
// instances' spending between this instance's top-ups.
func (g *Global) Refresh(ctx context.Context, now time.Time) error {
	if g.shared == nil {
		return nil
	}
	g.topUp.Lock()
	defer g.topUp.Unlock()
	g.mu.Lock()
	g.rollover(g.cal.Keys(now))
	day := g.day
	give := slices.Clone(g.giveBack)
	g.mu.Unlock()
	tot, _, err := g.shared.LeaseUnder(ctx, day, 0, 0, Ceilings{}, give...)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gaveBack(give, err)
	if err != nil {
		return fmt.Errorf("%w: refresh from the shared ledger: %w", ErrLedger, err)
	}
	if day == g.day {
		g.refresh(day, tot)
	}
	return nil
}
