package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors of the global budget.
var (
	// ErrPaused is wrapped by every *PausedError.
	ErrPaused = errors.New("budget: global budget reached, paused")
	// ErrLedger wraps a failure to write a reservation durably. The
	// reservation still holds in memory; the caller lets the request
	// through (the layer fails open) and counts the fault.
	ErrLedger = errors.New("budget: ledger write failed")
	// ErrMaybeCommitted wraps a shared store's write whose connection
	// failed after its commit was sent, when the store could not read back
	// whether it committed (or did, and lost its answer). The write may be
	// in the store: its caller neither undoes it nor sends it again, and
	// keeps the safe side of both outcomes (what it gave back is given;
	// what it took counts as taken and unused).
	ErrMaybeCommitted = errors.New("budget: the write may have been committed")
)

// PausedError refuses an upstream call that does not fit a ceiling.
type PausedError struct {
	Ceiling    string        // which ceiling: "daily_requests", "daily_usd", "monthly_usd", or "manual" for the operator's switch (for logs only)
	RetryAfter time.Duration // until the ceiling's period ends; BusyRetryAfter when Busy
	// Busy means the money already spent leaves room for the call, and
	// what blocks it is the worst case held by calls still in flight:
	// most of that is given back when they settle, in seconds, so the
	// brake is not engaged and the call may fit soon.
	Busy bool
}

// ManualRetryAfter is the RetryAfter while the operator's switch is on.
// The switch has no end time; this is how often a client may look again.
const ManualRetryAfter = 5 * time.Minute

// BusyRetryAfter is the RetryAfter of a call refused only because of the
// worst cases that calls in flight hold: about the time one upstream call
// takes to settle.
const BusyRetryAfter = 2 * time.Second

func (e *PausedError) Error() string {
	if e.Busy {
		return fmt.Sprintf("budget: %s held by calls in flight, retry after %s", e.Ceiling, e.RetryAfter.Round(time.Second))
	}
	return fmt.Sprintf("budget: %s reached, paused for %s", e.Ceiling, e.RetryAfter.Round(time.Second))
}

func (e *PausedError) Unwrap() error { return ErrPaused }

// Ledger is what the global budget needs from a storage backend: durable
// day totals, written before the upstream calls they cover, and the
// settlement of each call.
type Ledger interface {
	// Lease adds calls and microUSD to day's totals durably, and in the
	// same transaction subtracts each giveBack from its own day (the
	// unused rest of earlier leases). day may be "" when calls and
	// microUSD are 0.
	Lease(ctx context.Context, day string, calls, microUSD int64, giveBack ...LedgerDay) error
	Settle(ctx context.Context, s Settlement) error
}

// SharedLedger is a ledger that several instances of the service write at
// once (PostgreSQL). Deciding from one instance's memory whether a lease
// fits would let each instance spend the whole budget; with a shared
// ledger, Global asks the ledger instead, and a lease is taken only if
// every ceiling still holds after it.
type SharedLedger interface {
	Ledger
	// LeaseUnder adds calls and microUSD to day's totals and its month's
	// durably only if every ceiling of lim that is on still holds after
	// it, and in the same transaction subtracts each giveBack from its own
	// day (whether or not the lease fits). It reports whether the lease
	// was taken, and the day's and month's totals after the transaction.
	// An error wrapping ErrMaybeCommitted is a transaction that may have
	// committed: its giveBack counts as given, its lease as not taken.
	LeaseUnder(ctx context.Context, day string, calls, microUSD int64, lim Ceilings, giveBack ...LedgerDay) (SharedTotals, bool, error)
}

// Reservation is one upstream call's claim on the global budget.
type Reservation struct {
	// ID is the ledger's id of a reservation row, as versions before
	// leases wrote them; 0 for every claim made now.
	ID    uint64
	Day   string
	Month string
	Worst int64 // micro-dollars reserved
	// Leased marks a claim that Commit covered from the durable lease:
	// the call is in the ledger's day totals, and LeasedMicroUSD of its
	// cost (its worst case, unless the top-up it needed failed and the
	// lease's rest covered only part). Its settlement moves the day from
	// that to the actual cost. A claim with neither was not written (its
	// Commit failed, or it is Unbound): its settlement adds the call whole.
	Leased         bool
	LeasedMicroUSD int64
	// Unbound marks a claim made while every ceiling was off: there is
	// nothing to hold across a crash, so Commit writes nothing and the
	// call reaches the ledger with its settlement (the usage record's own
	// transaction), one write fewer per read.
	Unbound bool
	// Soft marks the claim of a read whose model follows the soft
	// ceilings (ClaimSoft): Degraded then names the soft ceiling that sent
	// it to the fallback model ("" : the primary), and NewSide says that
	// the brake's previous claim of the kind was on the other side of the
	// line (the read that enters or leaves degraded mode). Both are final
	// once Commit has returned.
	Soft     bool
	Degraded string
	NewSide  bool
	// underSoft marks a primary claim that a shared ledger has yet to
	// take under the soft ceilings (Commit): taken, it stays primary;
	// refused, it moves to the fallback at fallbackWorst.
	underSoft     bool
	fallbackWorst int64
}

// GlobalState is what the global budget starts from, loaded from storage.
type GlobalState struct {
	Day        string // "2006-01-02"
	Requests   int64  // calls in the ledger that day (a lease's rest left by a crash included)
	Spend      int64  // micro-dollars that day, open claims and a lease's rest at worst case
	Month      string // "2006-01"
	MonthSpend int64  // micro-dollars that month
	// With a shared ledger, the day's settled calls and costs (the
	// service's figures, see Status), the month's settled costs, and the
	// rests of dead instances.
	SettledCalls, Settled, MonthSettled, Dead int64
}

// Global is layer 3, the emergency brake: a service-wide ceiling on
// upstream calls and money per day, and on money per month. Check and
// reserve are one atomic step in memory, and the claim is covered by
// durable budget before the call (a lease, see Commit), so the ceilings
// hold under concurrency and across a crash.
type Global struct {
	loc    *time.Location
	cal    *Calendar
	ledger Ledger

	mu         sync.Mutex
	manual     bool // the operator's kill switch
	limits     ceilings
	soft       ceilings // the soft ceilings: above one, reads degrade (see Soft)
	day        string
	requests   int64
	spend      int64 // open claims at their worst case included
	month      string
	monthSpend int64
	// The worst cases of claims made by this process and not yet
	// settled, today and this month: the part of spend that calls in
	// flight hold. Claims left open by a crash are not among them; they
	// count as spent.
	open, monthOpen int64

	// The lease: headroom of today that is already in the ledger's
	// totals and not claimed by any call (see Commit). The ledger holds
	// at most the claims in memory plus the lease plus giveBack.
	lease DayTotals
	// primary is, with a shared ledger, the lease of primary headroom:
	// taken only under the soft ceilings as well (every instance's calls
	// counted), for the claims of ClaimSoft that go to the primary model.
	primary DayTotals
	// side is the side of the soft line that degraded mode is on (the
	// Degraded of the claim that entered or left it), for
	// Reservation.NewSide; lineEpoch counts the turns of the day and the
	// changes of the soft ceilings, and degradedIn is lineEpoch when
	// degraded mode was entered (noteSide).
	side                  string
	lineEpoch, degradedIn uint64
	// undecided is what today's primary claims that a shared ledger has
	// yet to take under the soft ceilings (underSoft) hold in the view:
	// their calls and their worst cases (ClaimSoft).
	undecided DayTotals
	// giveBack is headroom of earlier leases no longer used (a past day,
	// or ceilings changed by SetConfig), to subtract from the ledger with
	// the next write.
	giveBack []LedgerDay
	closed   bool // Close ran: leases are one call each from now on

	// topUp serialises lease writes, so that committers that need more
	// headroom at once share one write. It is never held under mu.
	topUp sync.Mutex

	// shared is the ledger when other instances write it too: then a
	// top-up is taken only if the ledger's totals, every instance's, stay
	// under the ceilings (see topUpShared), and the totals it returns
	// refresh this instance's view.
	shared SharedLedger
	// lastNow is the latest clock reading Claim or Check was given, for
	// the retry-after of a refusal that Commit makes.
	lastNow time.Time
	// settled is, with a shared ledger, today's settled costs (every
	// instance's, as its totals last said, and this instance's since):
	// the money spent, without the worst cases that calls in flight on
	// other instances hold; settledCalls the calls they were.
	settled, settledCalls int64
	// monthSettled is the same of this month: its settled costs.
	monthSettled int64
	// dead is, with a shared ledger, the money of today that instances
	// no longer alive hold unsettled (SharedTotals.DeadMicroUSD): spent as
	// far as the ceilings are concerned, since it will never settle.
	dead int64

	// shares watches the figures for the early warnings (shares.go).
	shares shareWatch
}

// ceilings are Config's limits in integer units; 0 means off.
type ceilings struct {
	requests, dailyMicro, monthlyMicro int64
}

func ceilingsOf(cfg Config) ceilings {
	return ceilings{requests: cfg.DailyRequests, dailyMicro: MicroUSD(cfg.DailyUSD), monthlyMicro: MicroUSD(cfg.MonthlyUSD)}
}

func softCeilingsOf(cfg Config) ceilings {
	return ceilings{requests: cfg.SoftDailyRequests, dailyMicro: MicroUSD(cfg.SoftDailyUSD), monthlyMicro: MicroUSD(cfg.SoftMonthlyUSD)}
}

// MicroUSD converts dollars to integer micro-dollars: the decimal the
// operator wrote (the shortest one that reads back as usd), cut after its
// sixth decimal, so that a ceiling is never raised by rounding, and never
// lowered by the float's binary error either (2.01 is 2,010,000, where
// floor(2.01 * 1e6) would be 2,009,999).
func MicroUSD(usd float64) int64 {
	if !(usd > 0 && usd < maxUSD) {
		return int64(math.Floor(usd * 1e6)) // 0, negative or absurd: left to the config's checks
	}
	whole, frac, _ := strings.Cut(strconv.FormatFloat(usd, 'f', -1, 64), ".")
	w, err1 := strconv.ParseInt(whole, 10, 64)
	f, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err1 != nil || err2 != nil {
		return int64(math.Floor(usd * 1e6))
	}
	return w*1e6 + f
}

// maxUSD bounds the dollars MicroUSD converts exactly: far above any
// ceiling, far below int64's micro-dollars.
const maxUSD = 1e12

// NewGlobal returns the brake for cfg, starting from state.
func NewGlobal(cfg Config, loc *time.Location, ledger Ledger, state GlobalState) (*Global, error) {
	if ledger == nil || loc == nil {
		return nil, errors.New("budget: the global budget needs a ledger and a time zone")
	}
	g := &Global{
		loc: loc, cal: NewCalendar(loc), ledger: ledger, limits: ceilingsOf(cfg), soft: softCeilingsOf(cfg),
		day: state.Day, requests: state.Requests, spend: state.Spend,
		month: state.Month, monthSpend: state.MonthSpend,
		settled: state.Settled, settledCalls: state.SettledCalls, monthSettled: state.MonthSettled, dead: state.Dead,
	}
	g.shared, _ = ledger.(SharedLedger)
	return g, nil
}

// SetConfig applies new ceilings at once; what was spent is kept. A lease
// sized under other ceilings is given back with the next ledger write (a
// commit that needs headroom, or Close), so that the ledger does not count
// headroom a lowered ceiling no longer allows.
func (g *Global) SetConfig(cfg Config) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next, soft := ceilingsOf(cfg), softCeilingsOf(cfg)
	switch {
	case next != g.limits:
		g.returnLease()
	case soft != g.soft:
		g.returnPrimary()
	}
	if soft != g.soft {
		g.lineEpoch++
	}
	g.limits = next
	g.soft = soft
}

// Soft says which side of the soft ceilings the day (and month) is on: the
// first soft ceiling reached ("soft_daily_requests", "soft_daily_usd" or
// "soft_monthly_usd"), or "" when none is (or none is on). It follows from
// the totals the brake holds (with a shared ledger, its view of them),
// which a restart reloads from the ledger, so a crash does not reset it.
// It is a look, for the figures: a read's side is decided with its claim,
// ClaimSoft.
func (g *Global) Soft(now time.Time) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rollover(g.cal.Keys(now))
	return g.softLocked()
}

// softLocked is Soft with g.mu held and the day rolled over.
func (g *Global) softLocked() string {
	lim := g.soft
	switch {
	case lim.requests > 0 && g.requests >= lim.requests:
		return "soft_daily_requests"
	case lim.dailyMicro > 0 && g.spend >= lim.dailyMicro:
		return "soft_daily_usd"
	case lim.monthlyMicro > 0 && g.monthSpend >= lim.monthlyMicro:
		return "soft_monthly_usd"
	}
	return ""
}

// Claim takes one upstream call and worst micro-dollars in memory, or
// refuses with a *PausedError when that would pass a ceiling. Check and
// claim are one atomic step. With every ceiling off it still claims, so
// the ledger always holds each day's calls and spend: for the dashboard,
// and so that a ceiling switched on mid-day starts from the truth.
func (g *Global) Claim(worst int64, now time.Time) (Reservation, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rollover(g.cal.Keys(now))
	if now.After(g.lastNow) {
		g.lastNow = now
	}
	return g.claim(worst, now)
}

// claim is Claim with g.mu held and the day rolled over.
func (g *Global) claim(worst int64, now time.Time) (Reservation, error) {
	if err := g.decide(worst, now); err != nil {
		return Reservation{}, err
	}
	g.requests++
	g.spend += worst
	g.monthSpend += worst
	g.open += worst
	g.monthOpen += worst
	g.watchShares()
	return Reservation{Day: g.day, Month: g.month, Worst: worst, Unbound: g.limits == ceilings{} && !g.manual}, nil
}

// Check refuses, as Claim would for the cheapest call, when the brake is
// engaged: by the operator, or because a ceiling is already reached. It
// claims nothing: a cheap look before the request body is read.
func (g *Global) Check(now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rollover(g.cal.Keys(now))
	return g.decide(1, now) // the cheapest call: one micro-dollar
}

// decide is check as Claim and Check apply it: with a shared ledger, a
// money ceiling held only by calls in flight (busy) does not refuse, since
// this instance's view counts other instances' calls in flight at their
// worst case until it is refreshed, and the ledger decides at Commit.
// g.mu is held.
func (g *Global) decide(worst int64, now time.Time) error {
	err := g.check(worst, now)
	if pe, ok := err.(*PausedError); ok && pe.Busy && g.shared != nil {
		return nil
	}
	return err
}

// check is Claim's test of worst against every ceiling; g.mu is held.
func (g *Global) check(worst int64, now time.Time) error {
	lim := g.limits
	switch {
	case g.manual:
		return &PausedError{Ceiling: "manual", RetryAfter: ManualRetryAfter}
	case lim.requests > 0 && g.requests+1 > lim.requests:
		return &PausedError{Ceiling: "daily_requests", RetryAfter: nextDay(now, g.loc).Sub(now)}
	case lim.dailyMicro > 0 && g.spend+worst > lim.dailyMicro:
		spent := g.spend - g.open
		if g.shared != nil {
			// Busy only while what blocks the call may still settle: the
			// worst cases of calls in flight and the rests of live
			// instances' leases. A dead instance's rest never settles; it
			// counts as spent, so that once only dead rests hold the
			// ceiling it is reached (paused, with its alert), not busy for
			// the rest of the day.
			spent = g.settled + g.dead
		}
		return moneyPaused("daily_usd", spent+worst <= lim.dailyMicro, nextDay(now, g.loc).Sub(now))
	case lim.monthlyMicro > 0 && g.monthSpend+worst > lim.monthlyMicro:
		return moneyPaused("monthly_usd", g.monthSpend-g.monthOpen+worst <= lim.monthlyMicro, nextMonth(now, g.loc).Sub(now))
	}
	return nil
}

// moneyPaused is the refusal of a money ceiling: busy, with a short wait,
// when only the worst cases of calls in flight block the call, else paused
// until the period ends.
func moneyPaused(ceiling string, busy bool, untilReset time.Duration) *PausedError {
	if busy {
		return &PausedError{Ceiling: ceiling, RetryAfter: min(BusyRetryAfter, untilReset), Busy: true}
	}
	return &PausedError{Ceiling: ceiling, RetryAfter: untilReset}
}

// SetManual engages or releases the operator's kill switch. The caller
// persists it; while engaged, every call is refused.
func (g *Global) SetManual(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.manual = on
}

// Commit covers a claim with durable budget, so that it still counts
// after a crash; call it once per claim, before the upstream call. With a
// SharedLedger, a top-up the ledger refuses (other instances have taken
// the room) refuses the claim with a *PausedError: the claim is dropped
// (r.Day becomes "", so settling it writes nothing) and the call must not
// be made. It takes the claim from
// the lease when the lease holds a call and the claim's worst case, with
// no write; otherwise it tops the lease up with one durable write (shared
// by the committers waiting for it) and takes the claim from that. If the
// write fails, the claim still holds in memory, nothing more is leased,
// and the error wraps ErrLedger; the lease's rest, too small for the claim,
// is then taken by it, so that its settlement, which adds what the lease
// did not hold, cannot push the ledger past a ceiling. An Unbound claim is
// not written.
func (g *Global) Commit(ctx context.Context, r *Reservation) error {
	if r.Day == "" || r.Unbound || r.Committed() {
		return nil
	}
	if g.take(r) {
		return nil
	}
	g.topUp.Lock()
	defer g.topUp.Unlock()
	if g.take(r) { // another committer's top-up had room for this claim too
		return nil
	}
	if g.shared != nil {
		return g.topUpShared(ctx, r)
	}
	return g.topUpFor(ctx, r)
}

// Settle replaces r's worst case by the actual cost, in the ledger and in
// memory. Use it when no usage record carries the settlement (the call
// failed); a failed call whose cost is unknown should be settled at
// r.Worst. A claim whose Commit failed is added to the ledger whole. If
// the ledger write fails, memory keeps the claim at its worst case too, as
// the ledger does, and the error is returned.
func (g *Global) Settle(ctx context.Context, r Reservation, actual int64) error {
	if r.Day == "" {
		return nil
	}
	if err := g.ledger.Settle(ctx, r.Settlement(actual)); err != nil {
		g.Settled(r, r.Worst)
		return err
	}
	g.Settled(r, actual)
	return nil
}

// Committed reports whether the claim is in the ledger at its worst case
// (leased, or a reservation row of an earlier version).
func (r Reservation) Committed() bool {
	return r.ID != 0 || (r.Leased && r.LeasedMicroUSD == r.Worst)
}

// Settlement is what settles r at actual in the ledger, for a transaction
// that carries it (the usage record's). For a claim whose Commit failed it
// adds the call to its day whole.
func (r Reservation) Settlement(actual int64) Settlement {
	return Settlement{ID: r.ID, Day: r.Day, ActualMicroUSD: actual, Leased: r.Leased, LeasedMicroUSD: r.LeasedMicroUSD}
}

// Settled updates memory for a reservation whose settlement the caller has
// already committed (with the usage record).
func (g *Global) Settled(r Reservation, actual int64) {
	if r.Day == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.decided(&r) // a claim whose Commit failed
	delta := actual - r.Worst
	if r.Day == g.day {
		g.settled += actual
		g.settledCalls++
		g.spend += delta
		g.open = max(g.open-r.Worst, 0)
	}
	if r.Month == g.month {
		g.monthSettled += actual
		g.monthSpend += delta
		g.monthOpen = max(g.monthOpen-r.Worst, 0)
	}
}

// Status is the brake's state for operators.
type Status struct {
	Day           string
	Requests      int64
	SpendMicroUSD int64
	Month         string
	MonthMicroUSD int64
	// The ceilings in force (0 = off) and the operator's switch.
	DailyRequests   int64
	DailyMicroUSD   int64
	MonthlyMicroUSD int64
	Manual          bool
	// Degraded names the soft ceiling reached (see Global.Soft), "" when
	// reads go to the primary model.
	Degraded  string
	Engaged   bool   // the next cheapest call would be refused, and not only for calls in flight
	EngagedBy string // which ceiling, when Engaged
}

// Status returns today's and this month's figures.
func (g *Global) Status(now time.Time) Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rollover(g.cal.Keys(now))
	st := Status{
		Day: g.day, Requests: g.requests, SpendMicroUSD: g.spend, Month: g.month, MonthMicroUSD: g.monthSpend,
		DailyRequests: g.limits.requests, DailyMicroUSD: g.limits.dailyMicro, MonthlyMicroUSD: g.limits.monthlyMicro,
		Manual: g.manual, Degraded: g.softLocked(),
	}
	if g.shared != nil {
		// The service's figures: the calls every instance made today and
		// their cost, and the month's cost, as settled; the ledger's
		// totals also hold every instance's unused lease, which was not
		// spent.
		st.Requests, st.SpendMicroUSD, st.MonthMicroUSD = g.settledCalls, g.settled, g.monthSettled
	}
	var pe *PausedError
	if errors.As(g.check(1, now), &pe) && !pe.Busy {
		st.Engaged, st.EngagedBy = true, pe.Ceiling
	}
	return st
}

// rollover starts a new day or month. Nothing of yesterday carries into
// today: the rest of its lease is given back to it with the next write;
// reservations still in flight settle against their own day. Days
// only move forward, so a late request with an older clock reading counts
// in the current day and never wipes it.
func (g *Global) rollover(day, month string) {
	if day > g.day {
		g.returnLease() // the old day's rest, to its own day
		g.lineEpoch++
		g.undecided = DayTotals{}
		g.day, g.requests, g.spend, g.open = day, 0, 0, 0
		g.settled, g.settledCalls, g.dead = 0, 0, 0
	}
	if month > g.month {
		g.month, g.monthSpend, g.monthOpen, g.monthSettled = month, 0, 0, 0
	}
}
