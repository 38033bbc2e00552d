package budget

import (
	"math"
	"slices"
	"time"
)

// Shares of the ceilings: the brake tells a watcher (the early warnings)
// the moment a figure it decides on reaches a share of its ceiling, on the
// claim or the shared ledger's answer that takes it there, rather than
// leaving the watcher to find it on a poll after the brake has engaged.
// Between crossings the cost is a few comparisons per claim.

// Counted are the figures the brake decides on, and the ceilings in force
// (0: off). On one instance they are its memory: the calls of the day,
// those in flight included, and the money settled plus the worst cases of
// calls in flight. With a shared ledger they are every instance's, as the
// ledger's totals last said, which also hold the headroom other instances
// have leased and not yet used (at most 1% of a ceiling each).
type Counted struct {
	Day   string // "2006-01-02"
	Month string // "2006-01"
	// Requests are the day's calls counted against daily_requests.
	Requests int64
	// SpendMicroUSD is the day's money counted against daily_usd, and
	// MonthMicroUSD the month's against monthly_usd.
	SpendMicroUSD, MonthMicroUSD int64

	DailyRequests, DailyMicroUSD, MonthlyMicroUSD int64
}

// Counted returns the figures the brake decides on at now.
func (g *Global) Counted(now time.Time) Counted {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rollover(g.cal.Keys(now))
	return g.countedLocked()
}

// countedLocked is Counted with g.mu held.
func (g *Global) countedLocked() Counted {
	return Counted{
		Day: g.day, Month: g.month, Requests: g.requests, SpendMicroUSD: g.spend, MonthMicroUSD: g.monthSpend,
		DailyRequests: g.limits.requests, DailyMicroUSD: g.limits.dailyMicro, MonthlyMicroUSD: g.limits.monthlyMicro,
	}
}

// shareWatch is the brake's watcher of shares (see OnShare).
type shareWatch struct {
	percents []int64 // ascending
	fn       func(Counted)
	// The period and ceilings next was set for: a new day, month or
	// ceiling arms every share of it again.
	day, month string
	lim        ceilings
	// next is, per ceiling, the figure at which fn is next called: the
	// lowest share not yet reached (math.MaxInt64: none, or the ceiling
	// is off).
	next ceilings
}

// OnShare has fn told the figures the brake decides on each time one of
// them reaches one of percents (whole percents of its ceiling) that it had
// not reached in its period (the day; the month for monthly_usd) since
// this Global started or its ceiling changed: by a claim (Claim) or, with
// a shared ledger, by the ledger's totals (a top-up's answer, Refresh).
// Every share reached at once is one call. fn may thus hear of a share
// again (after a restart, a new ceiling); telling it once per period for
// the service is its own business. fn runs on the caller's goroutine with
// the brake's lock held, before the claim that reached the share returns,
// so that anything it raises comes before what the brake decides next (a
// refusal): it must not block and must not call g. A later OnShare
// replaces the watcher; nil fn or no percents watch nothing.
func (g *Global) OnShare(percents []int64, fn func(Counted)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ps := slices.Sorted(slices.Values(percents))
	g.shares = shareWatch{percents: ps, fn: fn}
	if len(ps) == 0 {
		g.shares.fn = nil
	}
}

// watchShares tells the watcher when a figure has reached its next share,
// or the period or the ceilings have changed since it last looked; else it
// only compares (inlined in the claim). g.mu is held.
func (g *Global) watchShares() {
	w := &g.shares
	if g.requests >= w.next.requests || g.spend >= w.next.dailyMicro || g.monthSpend >= w.next.monthlyMicro ||
		w.lim != g.limits || w.day != g.day || w.month != g.month {
		g.crossShares()
	}
}

// crossShares moves each ceiling's next share past its figure and tells
// the watcher if one was reached. g.mu is held.
func (g *Global) crossShares() {
	w := &g.shares
	newDay, newMonth := w.day != g.day, w.month != g.month
	if newDay || w.lim.requests != g.limits.requests {
		w.next.requests = 0 // every share again
	}
	if newDay || w.lim.dailyMicro != g.limits.dailyMicro {
		w.next.dailyMicro = 0
	}
	if newMonth || w.lim.monthlyMicro != g.limits.monthlyMicro {
		w.next.monthlyMicro = 0
	}
	w.day, w.month, w.lim = g.day, g.month, g.limits
	reached := w.pass(&w.next.requests, g.requests, g.limits.requests)
	reached = w.pass(&w.next.dailyMicro, g.spend, g.limits.dailyMicro) || reached
	reached = w.pass(&w.next.monthlyMicro, g.monthSpend, g.limits.monthlyMicro) || reached
	if reached && w.fn != nil {
		w.fn(g.countedLocked())
	}
}

// pass sets *next to the lowest share of limit above figure, if figure
// reached *next, and reports whether figure reaches a share at all then.
func (w *shareWatch) pass(next *int64, figure, limit int64) bool {
	if figure < *next {
		return false
	}
	*next = math.MaxInt64
	if limit <= 0 || w.fn == nil {
		return false // nothing to watch: compared no more until the period or the ceiling changes
	}
	reached := false
	for _, p := range w.percents {
		at := ShareOf(p, limit)
		if figure < at {
			*next = at
			break
		}
		reached = true
	}
	return reached
}

// ShareOf is the least figure that reaches percent of limit: percent ×
// limit / 100, rounded up, in integers (no overflow, no float rounding).
func ShareOf(percent, limit int64) int64 {
	return limit/100*percent + (limit%100*percent+99)/100
}
