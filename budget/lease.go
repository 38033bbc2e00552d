package budget

import (
	"context"
	"fmt"
	"slices"
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

// take covers r from the lease, in memory, if the lease holds a call and
// r's worst case.
func (g *Global) take(r *Reservation) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.Day != g.day || g.lease.Requests < 1 || g.lease.SpendMicroUSD < r.Worst {
		return false
	}
	cover(&g.lease, r)
	return true
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
		n := g.leaseSize(r.Worst)
		calls = max(0, n-hand.Requests)
		spend = max(0, n*r.Worst-hand.SpendMicroUSD)
	}
	give := slices.Clone(g.giveBack)
	g.mu.Unlock()

	err := g.ledger.Lease(ctx, day, calls, spend, give...)

	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		// The claim stays in memory and its settlement will add it to the
		// ledger. Headroom the ledger already holds for its day covers it
		// first, as far as it goes: a settlement adding a call beside an
		// unused lease could pass the ceiling the lease was sized under.
		if hand != (DayTotals{}) {
			cover(&hand, r)
		} else {
			g.coverFromGiveBack(r)
		}
		g.keep(day, hand)
		return fmt.Errorf("%w: %w", ErrLedger, err)
	}
	g.gaveBack(give)
	hand.Requests += calls
	hand.SpendMicroUSD += spend
	cover(&hand, r)
	g.keep(day, hand)
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
// LeaseShare, and such that the ledger stays within every ceiling that is
// on. The ledger's totals are estimated from memory (the claims, the
// lease, what waits to be given back): claims not yet committed count
// there and not yet in the ledger, so the estimate errs on the safe side.
// At least 1: the claim itself passed the ceilings when it was made. g.mu
// is held and the lease is in the caller's hand.
func (g *Global) leaseSize(worst int64) int64 {
	if g.closed {
		return 1
	}
	var dayBack, monthBack DayTotals
	for _, b := range g.giveBack {
		if b.Day == g.day {
			dayBack.Requests += b.Requests
			dayBack.SpendMicroUSD += b.SpendMicroUSD
		}
		if monthOf(b.Day) == g.month {
			monthBack.SpendMicroUSD += b.SpendMicroUSD
		}
	}
	lim := g.limits
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

// keep puts headroom of day back: into the lease if day is today, else to
// be given back to day.
func (g *Global) keep(day string, rest DayTotals) {
	if day == g.day {
		g.lease.Requests += rest.Requests
		g.lease.SpendMicroUSD += rest.SpendMicroUSD
		return
	}
	g.addGiveBack(LedgerDay{Day: day, DayTotals: rest})
}

// returnLease moves today's lease to what the next write gives back.
// g.mu is held.
func (g *Global) returnLease() {
	g.addGiveBack(LedgerDay{Day: g.day, DayTotals: g.lease})
	g.lease = DayTotals{}
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

// gaveBack removes what a write gave back (a copy of g.giveBack's first
// entries, which may have grown since) from g.giveBack. Only the holder of
// g.topUp removes entries, so they are where the copy found them.
func (g *Global) gaveBack(given []LedgerDay) {
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
	if err != nil {
		return fmt.Errorf("%w: give the budget lease back: %w", ErrLedger, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gaveBack(give)
	return nil
}

// monthOf is the month ("2006-01") of day ("2006-01-02").
func monthOf(day string) string {
	if len(day) < len("2006-01") {
		return ""
	}
	return day[:len("2006-01")]
}
