package detect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"
)

// Early warnings: the global budget's ceilings watched from its figures
// in memory, so that the operator hears of a ceiling before the brake
// engages, while the service still serves. The brake tells the Warner
// (Observe) on the claim that takes a figure across a share, so that a
// burst's warnings come before its refusals; a poll (Check, every
// DefaultWarnEvery) is the backstop.

// warnPrefix starts the kind of every early warning:
// budget_warn_<ceiling>_<percent>.
const warnPrefix = "budget_warn_"

// The ceilings an early warning watches, by their [budget] keys.
const (
	CeilingDailyRequests = "daily_requests"
	CeilingDailyUSD      = "daily_usd"
	CeilingMonthlyUSD    = "monthly_usd"
)

var warnCeilings = []string{CeilingDailyRequests, CeilingDailyUSD, CeilingMonthlyUSD}

// DefaultWarnEvery is how often the Warner looks at the budget's figures
// on its own, besides being told of each crossing.
const DefaultWarnEvery = 15 * time.Second

// rateWindow is the span the rate in a warning is measured over.
const rateWindow = time.Hour

// BudgetFigures are the global budget's figures and ceilings at one time,
// read from the brake's memory: for an early warning, those it decides on
// (budget.Counted: calls in flight counted, at their worst case for the
// money); for the brake's alert, those it shows (budget.Status). A ceiling
// of 0 is off.
type BudgetFigures struct {
	Day             string // "2006-01-02" in budget.timezone
	Month           string // "2006-01"
	Calls           int64  // upstream calls today
	DayMicroUSD     int64  // spend today, in micro-dollars
	MonthMicroUSD   int64  // spend this month
	DailyRequests   int64  // ceiling on calls per day
	DailyMicroUSD   int64  // ceiling on spend per day
	MonthlyMicroUSD int64  // ceiling on spend per month
}

// WarnerOptions are the Warner's settings. Zero fields mean defaults.
type WarnerOptions struct {
	// Shares are [alerts] warn_at; nil: DefaultWarnAt, empty: no warning.
	Shares   []float64
	Every    time.Duration // DefaultWarnEvery
	Location *time.Location
	Logger   *slog.Logger
	Now      func() time.Time
}

// Warner raises an early warning the first time, each day (each month for
// monthly_usd), that a figure of the global budget reaches a share of its
// ceiling. The brake hands it the figures when one reaches a share
// (Observe), and it reads them from memory, never the disk, on a ticker of
// its own too (Check); what was sent is kept in the Alerter's stored
// state, so a restart sends no warning twice.
type Warner struct {
	a       *Alerter
	figures func(time.Time) BudgetFigures
	o       WarnerOptions

	mu      sync.Mutex // Observe (the brake's goroutines) against Check
	samples []sample   // the last rateWindow of figures, oldest first
	// ceilings are the values last seen, by ceiling name: a raised
	// ceiling re-arms the shares the figure no longer reaches.
	ceilings map[string]int64
}

type sample struct {
	at time.Time
	f  BudgetFigures
}

// NewWarner returns a Warner that raises its warnings through a and reads
// the figures from figures.
func NewWarner(a *Alerter, figures func(time.Time) BudgetFigures, o WarnerOptions) (*Warner, error) {
	if a == nil || figures == nil || o.Location == nil {
		return nil, errors.New("detect: the warner needs an alerter, the budget's figures and a time zone")
	}
	if o.Shares == nil {
		o.Shares = DefaultWarnAt
	}
	o.Shares = slices.Sorted(slices.Values(o.Shares))
	if o.Every <= 0 {
		o.Every = DefaultWarnEvery
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Warner{a: a, figures: figures, o: o, ceilings: map[string]int64{}}, nil
}

// Run checks the figures every o.Every until ctx ends.
func (w *Warner) Run(ctx context.Context) {
	if len(w.o.Shares) == 0 {
		return
	}
	t := time.NewTicker(w.o.Every)
	defer t.Stop()
	for {
		w.Check(w.o.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Percents are the shares watched, in whole percents, ascending: what the
// brake tells Observe of (budget.Global.OnShare).
func (w *Warner) Percents() []int64 {
	out := make([]int64, len(w.o.Shares))
	for i, s := range w.o.Shares {
		out[i] = int64(sharePercent(s))
	}
	return out
}

// Check reads the figures once, at now, and raises the warnings due.
func (w *Warner) Check(now time.Time) {
	f := w.figures(now) // read before w.mu: the brake calls Observe under its own lock
	w.observe(f, now)
}

// Observe raises the warnings due for f, the figures at which the brake
// found a share reached, before the brake decides anything else: it only
// takes the Warner's and the Alerter's locks, and queues what it raises
// without waiting.
func (w *Warner) Observe(f BudgetFigures) {
	w.observe(f, w.o.Now())
}

func (w *Warner) observe(f BudgetFigures, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.remember(now, f)
	for _, c := range warnCeilings {
		w.checkCeiling(c, now, f)
	}
}

// remember keeps f for the rate, dropping what is older than rateWindow.
func (w *Warner) remember(now time.Time, f BudgetFigures) {
	cut := 0
	for cut < len(w.samples) && now.Sub(w.samples[cut].at) > rateWindow {
		cut++
	}
	w.samples = append(w.samples[cut:], sample{at: now, f: f})
}

// watched is one ceiling's figure, ceiling and period.
type watched struct {
	figure, ceiling int64
	money           bool
	period          func(time.Time) string
	periodStart     time.Time
	reopens         time.Time
	of              func(BudgetFigures) (figure int64, period string)
}

// watchOf is ceiling c's figure, value and period at now in loc.
func watchOf(c string, now time.Time, f BudgetFigures, loc *time.Location) watched {
	l := now.In(loc)
	dayStart := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
	day := func(t time.Time) string { return t.In(loc).Format("2006-01-02") }
	switch c {
	case CeilingDailyRequests:
		return watched{figure: f.Calls, ceiling: f.DailyRequests, period: day, periodStart: dayStart, reopens: dayStart.AddDate(0, 0, 1),
			of: func(f BudgetFigures) (int64, string) { return f.Calls, f.Day }}
	case CeilingDailyUSD:
		return watched{figure: f.DayMicroUSD, ceiling: f.DailyMicroUSD, money: true, period: day, periodStart: dayStart, reopens: dayStart.AddDate(0, 0, 1),
			of: func(f BudgetFigures) (int64, string) { return f.DayMicroUSD, f.Day }}
	}
	monthStart := time.Date(l.Year(), l.Month(), 1, 0, 0, 0, 0, loc)
	return watched{figure: f.MonthMicroUSD, ceiling: f.MonthlyMicroUSD, money: true,
		period: func(t time.Time) string { return t.In(loc).Format("2006-01") }, periodStart: monthStart, reopens: monthStart.AddDate(0, 1, 0),
		of: func(f BudgetFigures) (int64, string) { return f.MonthMicroUSD, f.Month }}
}

// checkCeiling raises the warning of the highest share of c that the
// figure has reached and that was not sent this period; the lower shares
// reached with it are stored as sent, so they do not follow.
func (w *Warner) checkCeiling(c string, now time.Time, f BudgetFigures) {
	wt := watchOf(c, now, f, w.o.Location)
	prev, seen := w.ceilings[c]
	w.ceilings[c] = wt.ceiling
	if wt.ceiling <= 0 {
		return
	}
	if seen && wt.ceiling > prev {
		// The operator raised the ceiling (the warnings' own advice): the
		// shares the figure is now below warn again when reached.
		var rearm []string
		for _, s := range w.o.Shares {
			if !reaches(wt.figure, wt.ceiling, s) {
				rearm = append(rearm, WarnKind(c, s))
			}
		}
		w.a.Rearm(rearm...)
	}
	var due []string
	top := -1.0
	for _, s := range w.o.Shares {
		if !reaches(wt.figure, wt.ceiling, s) {
			break
		}
		kind := WarnKind(c, s)
		if !w.a.SentIn(kind, wt.period, now) {
			due = append(due, kind)
			top = s
		}
	}
	if len(due) == 0 {
		return
	}
	summary, details := w.warning(c, top, wt, now)
	w.a.AlertOnce(due[len(due)-1], wt.period, summary, details, due[:len(due)-1]...)
}

// reaches reports whether figure reaches share of ceiling, in integers
// as the brake finds it (budget.ShareOf): share × ceiling, rounded up.
func reaches(figure, ceiling int64, share float64) bool {
	p := int64(sharePercent(share))
	return figure >= ceiling/100*p+(ceiling%100*p+99)/100
}

// WarnKind is the alert kind of the early warning of share of ceiling.
func WarnKind(ceiling string, share float64) string {
	return fmt.Sprintf("%s%s_%d", warnPrefix, ceiling, sharePercent(share))
}

// warning is the summary and figures of an early warning.
func (w *Warner) warning(c string, share float64, wt watched, now time.Time) (string, map[string]string) {
	amount := func(v float64) string {
		if wt.money {
			return usdText(int64(v))
		}
		return plural(int64(v), "call")
	}
	what := map[string]string{CeilingDailyRequests: "today's upstream calls", CeilingDailyUSD: "today's spend", CeilingMonthlyUSD: "this month's spend"}[c]
	// The figure is the brake's: what it decides the next call on.
	counted := "calls in flight included"
	if wt.money {
		counted = "calls in flight counted at their worst case"
	}
	summary := fmt.Sprintf("%s reached %d%% of %s: %s of %s", what, sharePercent(share), c,
		amount(float64(wt.figure)), amount(float64(wt.ceiling)))
	rate, over := w.rate(wt, now)
	details := map[string]string{
		"ceiling":    fmt.Sprintf("%s = %s", c, amount(float64(wt.ceiling))),
		"figure":     fmt.Sprintf("%s (%.1f%%), %s", amount(float64(wt.figure)), 100*float64(wt.figure)/float64(wt.ceiling), counted),
		"rate":       fmt.Sprintf("%s per hour (%s)", amount(math.Round(rate)), over),
		"resets at":  wt.reopens.Format("2006-01-02 15:04 MST"),
		"reached at": etaText(wt, rate, now),
	}
	return summary, details
}

// rate is the figure's growth per hour over the last hour of samples of
// this period, or, when the Warner has watched for less than a minute of
// it, the average since the period started; over says which.
func (w *Warner) rate(wt watched, now time.Time) (perHour float64, over string) {
	_, cur := wt.of(w.samples[len(w.samples)-1].f)
	for _, s := range w.samples {
		fig, period := wt.of(s.f)
		if period != cur {
			continue
		}
		span := now.Sub(s.at)
		if span < time.Minute {
			break
		}
		return float64(wt.figure-fig) / span.Hours(), "over the last " + durText(span)
	}
	since := now.Sub(wt.periodStart)
	if since < time.Minute {
		since = time.Minute
	}
	return float64(wt.figure) / since.Hours(), "average since " + wt.periodStart.Format("2006-01-02 15:04")
}

// etaText says when the ceiling is reached at perHour.
func etaText(wt watched, perHour float64, now time.Time) string {
	left := float64(wt.ceiling - wt.figure)
	if left <= 0 {
		return "already: the brake refuses the calls that do not fit until it resets"
	}
	if perHour <= 0 {
		return "not at this rate (no growth)"
	}
	at := now.Add(time.Duration(left / perHour * float64(time.Hour)))
	if !at.Before(wt.reopens) {
		return "not before it reopens, at this rate"
	}
	return fmt.Sprintf("%s (in %s)", at.In(wt.reopens.Location()).Format("2006-01-02 15:04 MST"), durText(at.Sub(now)))
}

// usdText is micro-dollars as dollars: to the cent when that is exact,
// else to the hundredth of a cent, so that $9.9990 never reads $10.00.
func usdText(micro int64) string {
	if micro%10_000 == 0 {
		return fmt.Sprintf("$%.2f", float64(micro)/1e6)
	}
	return fmt.Sprintf("$%.4f", float64(micro)/1e6)
}

// durText is d to the minute, as "2h30m", "45m" or "0m".
func durText(d time.Duration) string {
	m := int64(d.Round(time.Minute) / time.Minute)
	if m >= 60 {
		return fmt.Sprintf("%dh%02dm", m/60, m%60)
	}
	return fmt.Sprintf("%dm", m)
}

// BrakeAlert is the summary and figures of the brake_engaged alert when
// ceiling ("daily_requests", "daily_usd", "monthly_usd" or "manual")
// refuses calls at now: the ceiling, its value, the count against it (f
// are the figures the brake decides on, budget.Counted) and when it
// reopens. They go to the operator only; no client sees them.
func BrakeAlert(ceiling string, f BudgetFigures, now time.Time, loc *time.Location) (string, map[string]string) {
	if ceiling == "manual" {
		return "the global budget brake is engaged by the operator's manual switch: upstream calls are refused (503)",
			map[string]string{
				"ceiling":    "manual (breakwater brake on)",
				"count":      fmt.Sprintf("%s and %s today, %s this month", plural(f.Calls, "call"), usdText(f.DayMicroUSD), usdText(f.MonthMicroUSD)),
				"reopens at": "when the operator releases it: breakwater brake off",
			}
	}
	wt := watchOf(ceiling, now, f, loc)
	amount := func(v int64) string {
		if wt.money {
			return usdText(v)
		}
		return plural(v, "call")
	}
	per := map[string]string{CeilingDailyRequests: "today, calls in flight included",
		CeilingDailyUSD:   "today, calls in flight counted at their worst case",
		CeilingMonthlyUSD: "this month, calls in flight counted at their worst case"}[ceiling]
	summary := fmt.Sprintf("the global budget brake is engaged by %s (%s): upstream calls are refused (503)", ceiling, amount(wt.ceiling))
	return summary, map[string]string{
		"ceiling":    fmt.Sprintf("%s = %s", ceiling, amount(wt.ceiling)),
		"count":      fmt.Sprintf("%s %s", amount(wt.figure), per),
		"reopens at": fmt.Sprintf("%s (in %s)", wt.reopens.Format("2006-01-02 15:04 MST"), durText(wt.reopens.Sub(now))),
	}
}
