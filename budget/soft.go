package budget

import "time"

// The soft ceilings (soft_daily_requests, soft_daily_usd,
// soft_monthly_usd) do not refuse: above one, a read of a plan on "auto"
// goes to the fallback model. Which side of the line a read is on is
// decided with its claim, in the same atomic step as the count, so that
// the primary model takes exactly what the soft ceilings allow, however
// many reads arrive at once: in memory under the brake's lock, and with a
// shared ledger by the ledger itself, which leases primary headroom only
// under the soft ceilings (every instance's calls and money counted).

// ClaimSoft is Claim for a read whose model follows the soft ceilings: it
// goes to the primary model, claimed at primary micro-dollars, only if
// that claim fits under every soft ceiling that is on (one more call
// under soft_daily_requests, primary more micro-dollars under
// soft_daily_usd and soft_monthly_usd), else to the fallback, claimed at
// fallback; the hard ceilings then judge the claim as Claim does. The
// claim's Degraded says which (see Reservation.Soft).
//
// With a shared ledger the day's totals in memory are a view, so a claim
// that fits there stays primary only if the ledger leases it primary
// headroom under the soft ceilings (Commit); otherwise Commit moves it to
// the fallback. A claim that does not fit the view goes to the fallback
// at once: the view counts every instance's calls as of its last refresh
// and this instance's since, so for calls it never says "above" while the
// ledger says "below" (unless leases were given back since); for money it
// counts the calls in flight at their worst case, and may degrade a read
// early until they settle, never late.
func (g *Global) ClaimSoft(primary, fallback int64, now time.Time) (Reservation, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rollover(g.cal.Keys(now))
	if now.After(g.lastNow) {
		g.lastNow = now
	}
	side := g.softSide(primary)
	worst := primary
	if side != "" {
		worst = fallback
	}
	r, err := g.claim(worst, now)
	if err != nil {
		return Reservation{}, err
	}
	r.Soft = true
	if side == "" && g.shared != nil && g.soft != (ceilings{}) {
		// Primary if the ledger agrees, at Commit: written even when no
		// hard ceiling is on, since the soft ones hold across instances.
		r.underSoft, r.fallbackWorst, r.Unbound = true, fallback, false
		g.undecided.Requests++
		g.undecided.SpendMicroUSD += primary
		return r, nil
	}
	g.noteSide(&r, side)
	return r, nil
}

// softSide is the first soft ceiling that one more call at worst would
// pass ("" for none), from the totals in memory less g.undecided: this
// brake's primary claims that a shared ledger has yet to decide. Those
// may yet go to the fallback, and a read sent to the fallback at once
// because of them could reach the ledger first and take a primary slot
// from them (a fallback call counts toward the line too): so a read that
// passes the line only with them is left to the ledger as well. g.mu is
// held.
func (g *Global) softSide(worst int64) string {
	lim := g.soft
	u := g.undecided
	requests, spend, monthSpend := g.requests-u.Requests, g.spend-u.SpendMicroUSD, g.monthSpend-u.SpendMicroUSD
	switch {
	case lim.requests > 0 && requests+1 > lim.requests:
		return "soft_daily_requests"
	case lim.dailyMicro > 0 && spend+worst > lim.dailyMicro:
		return "soft_daily_usd"
	case lim.monthlyMicro > 0 && monthSpend+worst > lim.monthlyMicro:
		return "soft_monthly_usd"
	}
	return ""
}

// softPassed is the first soft ceiling that a lease of one call at worst
// (less what hand, this instance's unused primary headroom, already
// holds) would pass, given a shared ledger's totals; "" for none. g.mu is
// held.
func (g *Global) softPassed(tot SharedTotals, hand DayTotals, worst int64) string {
	calls, spend := max(0, 1-hand.Requests), max(0, worst-hand.SpendMicroUSD)
	lim := g.soft
	switch {
	case lim.requests > 0 && tot.Requests+calls > lim.requests:
		return "soft_daily_requests"
	case lim.dailyMicro > 0 && tot.SpendMicroUSD+spend > lim.dailyMicro:
		return "soft_daily_usd"
	case lim.monthlyMicro > 0 && tot.MonthMicroUSD+spend > lim.monthlyMicro:
		return "soft_monthly_usd"
	}
	return ""
}

// primaryShare bounds a lease of primary headroom by a share of the room
// left under soft_daily_requests (1/LeaseShare, at least one call), as
// the leases under a money ceiling are bounded by the money left: near the
// line an instance's unused primary headroom, which the others' reads see
// as taken, is then a call or so. g.mu is held.
func (g *Global) primaryShare() int64 {
	if g.soft.requests <= 0 {
		return LeaseCalls
	}
	room := g.soft.requests - (g.requests - 1) - g.lease.Requests // the claim is among g.requests
	return max(1, room/LeaseShare)
}

// confirm makes a primary claim that a shared ledger's primary headroom
// now covers final. g.mu is held.
func (g *Global) confirm(r *Reservation) {
	if r.underSoft {
		g.decided(r)
		g.noteSide(r, "")
	}
}

// decided takes r, if a shared ledger had yet to decide it, out of what
// undecided claims hold. g.mu is held.
func (g *Global) decided(r *Reservation) {
	if !r.underSoft {
		return
	}
	r.underSoft = false
	if r.Day == g.day {
		g.undecided.Requests = max(0, g.undecided.Requests-1)
		g.undecided.SpendMicroUSD = max(0, g.undecided.SpendMicroUSD-r.Worst)
	}
}

// toFallback moves a primary claim that the soft ceiling side refused
// (the shared ledger did not lease it primary headroom) to the fallback
// model at its worst case: the claim is back in the view at that worst
// case, and leases as any other claim, or not at all when every ceiling is
// off. g.mu is held, and the claim was dropped from the view (drop).
func (g *Global) toFallback(r *Reservation, side string) {
	g.decided(r)
	r.Worst, r.fallbackWorst = r.fallbackWorst, 0
	r.Unbound = g.limits == (ceilings{}) && !g.manual
	if r.Day == g.day {
		g.requests++
		g.spend += r.Worst
		g.open += r.Worst
	}
	if r.Month == g.month {
		g.monthSpend += r.Worst
		g.monthOpen += r.Worst
	}
	g.noteSide(r, side)
}

// noteSide decides r on side of the soft line, and whether it enters or
// leaves degraded mode. Degraded mode, once entered, ends only when the
// day turns or the soft ceilings change (lineEpoch): within them, a
// primary claim near the line (a shared ledger's late answer, headroom
// another instance gave back, money in flight settled below its worst
// case) goes to the primary model without leaving it, so a burst at the
// line raises one alert, not one each way per such read. g.mu is held.
func (g *Global) noteSide(r *Reservation, side string) {
	r.Degraded = side
	if side == "" && g.side != "" && g.degradedIn == g.lineEpoch {
		r.NewSide = false
		return
	}
	r.NewSide = side != g.side
	if r.NewSide && side != "" {
		g.degradedIn = g.lineEpoch
	}
	g.side = side
}

// tighter is, for each ceiling, the lower of a's and b's that are on.
func tighter(a, b ceilings) ceilings {
	low := func(x, y int64) int64 {
		if x <= 0 || (y > 0 && y < x) {
			return y
		}
		return x
	}
	return ceilings{requests: low(a.requests, b.requests), dailyMicro: low(a.dailyMicro, b.dailyMicro),
		monthlyMicro: low(a.monthlyMicro, b.monthlyMicro)}
}

// shared is c as a shared ledger takes it.
func (c ceilings) shared() Ceilings {
	return Ceilings{DailyRequests: c.requests, DailyMicroUSD: c.dailyMicro, MonthlyMicroUSD: c.monthlyMicro}
}
