package budget

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// bookLedger is a Ledger in memory that keeps the day totals as storage
// does, counts its writes, can fail them, and checks at every write that
// no total passes a ceiling of cfg.
type bookLedger struct {
	mu         sync.Mutex
	cfg        Config
	days       map[string]DayTotals
	monthBase  int64 // spend of the month's days before the test's
	leases     int   // Lease writes
	lastLease  [2]int64
	lastGive   []LedgerDay
	fail       func() bool // a write fails when it reports true
	violations []string
}

func newBook(cfg Config) *bookLedger { return &bookLedger{cfg: cfg, days: map[string]DayTotals{}} }

func (b *bookLedger) failing() bool { return b.fail != nil && b.fail() }

func (b *bookLedger) Lease(_ context.Context, day string, calls, micro int64, give ...LedgerDay) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lease(day, calls, micro, give...)
}

// lease is Lease with b.mu held.
func (b *bookLedger) lease(day string, calls, micro int64, give ...LedgerDay) error {
	if b.failing() {
		return errors.New("disk full")
	}
	if calls < 0 || micro < 0 || (day == "" && calls+micro != 0) {
		b.violations = append(b.violations, fmt.Sprintf("lease %q %d %d", day, calls, micro))
	}
	b.leases++
	b.lastLease, b.lastGive = [2]int64{calls, micro}, append([]LedgerDay(nil), give...)
	if day != "" {
		d := b.days[day]
		d.Requests += calls
		d.SpendMicroUSD += micro
		b.days[day] = d
	}
	for _, g := range give {
		d := b.days[g.Day]
		d.Requests -= g.Requests
		d.SpendMicroUSD -= g.SpendMicroUSD
		if d.Requests < 0 || d.SpendMicroUSD < 0 {
			b.violations = append(b.violations, fmt.Sprintf("%s given back below zero: %+v", g.Day, d))
		}
		b.days[g.Day] = d
	}
	b.check("lease")
	return nil
}

func (b *bookLedger) Settle(_ context.Context, s Settlement) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failing() {
		return errors.New("disk full")
	}
	d := b.days[s.Day]
	if s.ID != 0 {
		b.violations = append(b.violations, fmt.Sprintf("settlement of a reservation row %d", s.ID))
	}
	if !s.Leased {
		d.Requests++
	}
	d.SpendMicroUSD += s.ActualMicroUSD - s.LeasedMicroUSD
	b.days[s.Day] = d
	b.check("settle")
	return nil
}

// check records every total over a ceiling of b.cfg; b.mu is held.
func (b *bookLedger) check(what string) {
	month := b.monthBase
	for day, d := range b.days {
		if b.cfg.DailyRequests > 0 && d.Requests > b.cfg.DailyRequests {
			b.violations = append(b.violations, fmt.Sprintf("after a %s: %s holds %d calls, over %d", what, day, d.Requests, b.cfg.DailyRequests))
		}
		if c := MicroUSD(b.cfg.DailyUSD); c > 0 && d.SpendMicroUSD > c {
			b.violations = append(b.violations, fmt.Sprintf("after a %s: %s holds %d µ$, over %d", what, day, d.SpendMicroUSD, c))
		}
		month += d.SpendMicroUSD
	}
	if c := MicroUSD(b.cfg.MonthlyUSD); c > 0 && month > c {
		b.violations = append(b.violations, fmt.Sprintf("after a %s: the month holds %d µ$, over %d", what, month, c))
	}
}

func (b *bookLedger) day(day string) DayTotals {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.days[day]
}

func (b *bookLedger) writes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leases
}

func (b *bookLedger) assertClean(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, v := range b.violations {
		t.Error(v)
	}
}

var leaseNoon = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const leaseDay = "2026-11-30"

func mustGlobal(t *testing.T, cfg Config, l Ledger, st GlobalState) *Global {
	t.Helper()
	if st.Day == "" {
		st.Day, st.Month = leaseDay, "2026-11"
	}
	g, err := NewGlobal(cfg, time.UTC, l, st)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// call claims, commits and settles one call as the guard does on success:
// the settlement in the usage record's write, then memory.
func call(t *testing.T, g *Global, l Ledger, worst, actual int64, now time.Time) Reservation {
	t.Helper()
	r, err := g.Claim(worst, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(t.Context(), &r); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(t.Context(), r.Settlement(actual)); err != nil {
		t.Fatal(err)
	}
	g.Settled(r, actual)
	return r
}

// With generous ceilings, 100 calls in a row take a ledger write about
// once per LeaseCalls calls, not once each; Close gives the rest back, so
// that the ledger then holds exactly the calls made and their cost.
func TestLeaseWritesOncePerBlock(t *testing.T) {
	cfg := Config{DailyRequests: 1_000_000, DailyUSD: 1000, MonthlyUSD: 10_000}
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	for range 100 {
		if r := call(t, g, l, 1000, 400, leaseNoon); !r.Leased || r.ID != 0 {
			t.Fatalf("claim %+v, want leased", r)
		}
	}
	if got, most := l.writes(), (100+LeaseCalls-1)/LeaseCalls+1; got > most {
		t.Errorf("%d ledger writes for 100 calls, want at most %d", got, most)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: LeaseCalls, SpendMicroUSD: 100*400 + (LeaseCalls-100)*1000}); got != want {
		t.Errorf("before Close the ledger holds %+v, want %+v (the lease's rest counted)", got, want)
	}
	if err := g.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 100, SpendMicroUSD: 100 * 400}); got != want {
		t.Errorf("after Close the ledger holds %+v, want exactly the calls made: %+v", got, want)
	}
	if err := g.Close(t.Context()); err != nil { // nothing left: no write
		t.Fatal(err)
	}
	before := l.writes()
	for range 3 { // after Close, one call per write
		call(t, g, l, 1000, 400, leaseNoon)
	}
	if got := l.writes() - before; got != 3 {
		t.Errorf("after Close: %d writes for 3 calls, want 3", got)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 103, SpendMicroUSD: 103 * 400}); got != want {
		t.Errorf("after Close and 3 calls: %+v, want %+v", got, want)
	}
	l.assertClean(t)
}

// The first top-up's size under each ceiling: LeaseCalls at most, 1% of
// daily_requests, 1% of the money left, and never beyond the room left;
// always the claim itself.
func TestLeaseSize(t *testing.T) {
	for _, tt := range []struct {
		name        string
		cfg         Config
		st          GlobalState
		worst       int64
		calls, cost int64 // the top-up written
	}{
		{"generous", Config{DailyRequests: 1 << 40, DailyUSD: 1e9, MonthlyUSD: 1e9}, GlobalState{}, 1000, LeaseCalls, LeaseCalls * 1000},
		{"1% of daily_requests", Config{DailyRequests: 1000}, GlobalState{}, 1000, 10, 10_000},
		{"small daily_requests", Config{DailyRequests: 30}, GlobalState{}, 1000, 1, 1000},
		{"requests left", Config{DailyRequests: 1000}, GlobalState{Requests: 997}, 1000, 3, 3000},
		{"1% of daily_usd left", Config{DailyUSD: 1}, GlobalState{Spend: 600_000}, 1000, 4, 4000},
		{"1% of monthly_usd left", Config{MonthlyUSD: 10}, GlobalState{MonthSpend: 9_000_000}, 1000, 10, 10_000},
		{"less than a call in 1%", Config{DailyUSD: 0.002}, GlobalState{}, 808, 1, 808},
		{"the last call of the day", Config{DailyUSD: 1}, GlobalState{Spend: 999_000}, 1000, 1, 1000},
		{"ceilings near, the smallest wins", Config{DailyRequests: 100_000, DailyUSD: 100, MonthlyUSD: 100}, GlobalState{MonthSpend: 99_990_000}, 500, 1, 500},
		{"money off", Config{DailyRequests: 5000}, GlobalState{}, 2000, 50, 100_000},
		{"free claims", Config{DailyRequests: 5000, DailyUSD: 1}, GlobalState{}, 0, 50, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := newBook(tt.cfg)
			l.monthBase = tt.st.MonthSpend - tt.st.Spend
			tt.st.Day, tt.st.Month = leaseDay, "2026-11"
			l.days[leaseDay] = DayTotals{Requests: tt.st.Requests, SpendMicroUSD: tt.st.Spend}
			if tt.st.MonthSpend == 0 {
				tt.st.MonthSpend = tt.st.Spend
			}
			g := mustGlobal(t, tt.cfg, l, tt.st)
			r, err := g.Claim(tt.worst, leaseNoon)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Commit(t.Context(), &r); err != nil {
				t.Fatal(err)
			}
			if got, want := l.lastLease, [2]int64{tt.calls, tt.cost}; got != want {
				t.Errorf("top-up of %v (calls, µ$), want %v", got, want)
			}
			if got := MaxLease(tt.cfg); tt.calls > got {
				t.Errorf("MaxLease %d, below the lease of %d calls", got, tt.calls)
			}
			l.assertClean(t)
		})
	}
}

// Property: whatever the ceilings, worst cases, costs, concurrency and
// failed writes, no write ever leaves the ledger over a ceiling; every
// committed call is covered; and after Close a run without failures
// leaves the ledger holding exactly the calls claimed and their cost.
func TestLeaseNeverPassesACeiling(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 17))
			var cfg Config
			if rng.IntN(4) > 0 {
				cfg.DailyRequests = 1 + rng.Int64N(5000)
			}
			if rng.IntN(4) > 0 {
				cfg.DailyUSD = float64(1000+rng.Int64N(300_000)) / 1e6
			}
			if rng.IntN(4) > 0 {
				cfg.MonthlyUSD = float64(1000+rng.Int64N(600_000)) / 1e6
			}
			if cfg == (Config{}) {
				cfg.DailyRequests = 50
			}
			l := newBook(cfg)
			st := GlobalState{}
			if cfg.DailyRequests > 0 {
				st.Requests = rng.Int64N(cfg.DailyRequests)
			}
			if c := MicroUSD(cfg.DailyUSD); c > 0 {
				st.Spend = rng.Int64N(c)
			}
			st.MonthSpend = st.Spend
			if c := MicroUSD(cfg.MonthlyUSD); c > 0 {
				st.Spend = min(st.Spend, rng.Int64N(c))
				st.MonthSpend = st.Spend + rng.Int64N(c-st.Spend)
			}
			l.days[leaseDay] = DayTotals{Requests: st.Requests, SpendMicroUSD: st.Spend}
			l.monthBase = st.MonthSpend - st.Spend
			failures := seed%2 == 1
			var frng sync.Mutex
			if failures {
				l.fail = func() bool { frng.Lock(); defer frng.Unlock(); return rng.IntN(10) == 0 }
			}
			g := mustGlobal(t, cfg, l, st)

			workers := 1 + int(seed%8)
			var mu sync.Mutex
			var calls, cost int64 // claimed and settled, as expected in the ledger
			var wg sync.WaitGroup
			for w := range workers {
				wrng := rand.New(rand.NewPCG(seed, uint64(w)))
				wg.Go(func() {
					for range 60 {
						worst := 1 + wrng.Int64N(5000)
						r, err := g.Claim(worst, leaseNoon)
						if err != nil {
							continue // refused by a ceiling
						}
						actual := wrng.Int64N(worst + 1)
						if err := g.Commit(context.Background(), &r); err != nil {
							actual = 0 // refused: no call, cancelled
						}
						if r.Committed() {
							if got := l.day(leaseDay).Requests; got < 1 {
								t.Errorf("a committed call, and the ledger holds %d calls", got)
							}
						}
						if wrng.IntN(2) == 0 || !r.Committed() {
							_ = g.Settle(context.Background(), r, actual)
						} else if err := l.Settle(context.Background(), r.Settlement(actual)); err == nil {
							g.Settled(r, actual)
						} else {
							_ = g.Settle(context.Background(), r, actual)
						}
						mu.Lock()
						calls++
						cost += actual
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			l.fail = nil
			if err := g.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			l.assertClean(t)
			got := l.day(leaseDay)
			if failures {
				if got.Requests < st.Requests || got.Requests > st.Requests+calls+MaxLease(cfg) {
					t.Errorf("ledger %+v for %d calls from %d", got, calls, st.Requests)
				}
				return
			}
			if want := (DayTotals{Requests: st.Requests + calls, SpendMicroUSD: st.Spend + cost}); got != want {
				t.Errorf("after Close the ledger holds %+v, want %+v", got, want)
			}
		})
	}
}

// Committers that need a top-up at once share its write: 64 concurrent
// commits under generous ceilings take two writes, not 64.
func TestLeaseSharedTopUp(t *testing.T) {
	cfg := Config{DailyRequests: 1 << 40, DailyUSD: 1e9, MonthlyUSD: 1e9}
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	claims := make([]Reservation, 64)
	for i := range claims {
		var err error
		if claims[i], err = g.Claim(1000, leaseNoon); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range claims {
		wg.Go(func() {
			if err := g.Commit(context.Background(), &claims[i]); err != nil || !claims[i].Leased {
				t.Errorf("commit %+v: %v", claims[i], err)
			}
		})
	}
	wg.Wait()
	if got, want := l.writes(), (64+LeaseCalls-1)/LeaseCalls; got != want {
		t.Errorf("%d writes for 64 concurrent commits, want %d (LeaseCalls %d each)", got, want, LeaseCalls)
	}
	if err := g.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 64, SpendMicroUSD: 64_000}); got != want {
		t.Errorf("ledger %+v, want %+v", got, want)
	}
	l.assertClean(t)
}

// A top-up the ledger refuses refuses the claim as a failed reservation
// did (ErrLedger, the claim held in memory and not committed) and leases
// nothing; the claim, cancelled, reaches the ledger whole.
func TestLeaseFailedTopUp(t *testing.T) {
	cfg := Config{DailyRequests: 5000, DailyUSD: 10}
	l := newBook(cfg)
	failing := true
	l.fail = func() bool { return failing }
	g := mustGlobal(t, cfg, l, GlobalState{})
	r, err := g.Claim(1000, leaseNoon)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(t.Context(), &r); !errors.Is(err, ErrLedger) || r.Committed() {
		t.Fatalf("commit on a failing ledger: %+v %v, want ErrLedger and not committed", r, err)
	}
	g.mu.Lock()
	lease, back := g.lease, len(g.giveBack)
	g.mu.Unlock()
	if lease != (DayTotals{}) || back != 0 {
		t.Errorf("after the failed write: lease %+v, %d to give back; want nothing", lease, back)
	}
	if st := g.Status(leaseNoon); st.Requests != 1 || st.SpendMicroUSD != 1000 {
		t.Errorf("status %+v: the claim holds in memory", st)
	}
	failing = false
	if err := g.Settle(t.Context(), r, 0); err != nil { // Cancel: no call was made
		t.Fatal(err)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 1}); got != want {
		t.Errorf("ledger %+v, want %+v", got, want)
	}
	if err := g.Close(t.Context()); err != nil || l.writes() != 0 {
		t.Errorf("Close: %v after %d writes, want nothing to give back", err, l.writes())
	}
	l.assertClean(t)
}

// A failed settlement leaves the claim at its worst case in memory as in
// the ledger: the next top-up's estimate then still covers what the
// ledger holds.
func TestLeaseFailedSettleKeepsWorstCase(t *testing.T) {
	cfg := Config{DailyUSD: 0.01}
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	r, err := g.Claim(4000, leaseNoon)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(t.Context(), &r); err != nil {
		t.Fatal(err)
	}
	l.fail = func() bool { return true }
	if err := g.Settle(t.Context(), r, 100); err == nil {
		t.Fatal("a failed settlement reported no error")
	}
	l.fail = nil
	st := g.Status(leaseNoon)
	if got, want := st.SpendMicroUSD, l.day(leaseDay).SpendMicroUSD; got != want {
		t.Errorf("memory spend %d, ledger %d: want the worst case in both", got, want)
	}
	// 4000 spent of 10000: one more at 4000 fits, a third does not.
	call(t, g, l, 4000, 4000, leaseNoon)
	if _, err := g.Claim(4000, leaseNoon); err == nil {
		t.Error("a third call at 4000 µ$ fits under 10000 µ$")
	}
	l.assertClean(t)
}

// A new day gives the old day's rest back to the old day, in the new
// day's first write; a claim of the old day committed after the rollover
// is written alone to its own day.
func TestLeaseRollover(t *testing.T) {
	cfg := Config{DailyRequests: 5000, DailyUSD: 100, MonthlyUSD: 1000}
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	for range 5 {
		call(t, g, l, 1000, 300, leaseNoon)
	}
	late, err := g.Claim(1000, leaseNoon) // claimed before midnight, committed after
	if err != nil {
		t.Fatal(err)
	}
	tomorrow := leaseNoon.Add(24 * time.Hour)
	const next = "2026-12-01"
	call(t, g, l, 2000, 100, tomorrow)
	if got, want := l.lastGive, []LedgerDay{{Day: leaseDay, DayTotals: DayTotals{Requests: 45, SpendMicroUSD: 45_000}}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the new day's first write gave back %v, want %v", got, want)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 5, SpendMicroUSD: 1500}); got != want {
		t.Errorf("the old day holds %+v, want exactly its calls: %+v", got, want)
	}
	writes := l.writes()
	if err := g.Commit(t.Context(), &late); err != nil || !late.Leased {
		t.Fatalf("late commit %+v: %v", late, err)
	}
	if got := l.writes() - writes; got != 1 || l.lastLease != [2]int64{1, 1000} {
		t.Errorf("late commit: %d writes of %v, want one of one call", got, l.lastLease)
	}
	if err := g.Settle(t.Context(), late, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 6, SpendMicroUSD: 1500}); got != want {
		t.Errorf("old day %+v, want %+v", got, want)
	}
	if got, want := l.day(next), (DayTotals{Requests: 1, SpendMicroUSD: 100}); got != want {
		t.Errorf("new day %+v, want %+v", got, want)
	}
	l.assertClean(t)
}

// Ceilings changed by a reload give the lease back with the next write,
// so that the ledger does not keep headroom sized under the old ones.
func TestLeaseGivenBackWhenCeilingsChange(t *testing.T) {
	cfg := Config{DailyRequests: 10_000}
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	for range 3 {
		call(t, g, l, 10, 10, leaseNoon)
	}
	if got := l.day(leaseDay).Requests; got != 100 {
		t.Fatalf("ledger %d calls, want a lease of 100 (1%% of daily_requests)", got)
	}
	lower := Config{DailyRequests: 10}
	g.SetConfig(lower)
	l.mu.Lock()
	l.cfg = lower
	l.mu.Unlock()
	call(t, g, l, 10, 10, leaseNoon)
	if got := l.day(leaseDay).Requests; got != 4 {
		t.Errorf("after the reload's next write the ledger holds %d calls, want the 4 made", got)
	}
	l.assertClean(t)
}

// A Close whose write fails keeps the rest counted and says so; a later
// Close gives it back.
func TestLeaseCloseFails(t *testing.T) {
	cfg := Config{DailyRequests: 10_000}
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	call(t, g, l, 10, 10, leaseNoon)
	l.fail = func() bool { return true }
	if err := g.Close(t.Context()); !errors.Is(err, ErrLedger) {
		t.Errorf("Close on a failing ledger: %v, want ErrLedger", err)
	}
	if got := l.day(leaseDay).Requests; got != 100 {
		t.Errorf("ledger %d calls, want the lease of 100 still counted", got)
	}
	l.fail = nil
	if err := g.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 1, SpendMicroUSD: 10}); got != want {
		t.Errorf("ledger %+v, want %+v", got, want)
	}
	l.assertClean(t)
}

// Near a ceiling, a claim whose top-up fails takes the lease's rest, so
// that its settlement (which adds what the lease did not hold) cannot
// count a call beside an unused lease and pass the ceiling.
func TestLeaseFailedTopUpNearTheCeiling(t *testing.T) {
	cfg := Config{DailyRequests: 3200}
	l := newBook(cfg)
	l.days[leaseDay] = DayTotals{Requests: 3190}
	g := mustGlobal(t, cfg, l, GlobalState{Requests: 3190})
	call(t, g, l, 10, 10, leaseNoon) // leases the last 10 calls at 10 µ$
	if got := l.day(leaseDay); got != (DayTotals{Requests: 3200, SpendMicroUSD: 100}) {
		t.Fatalf("ledger %+v after the lease", got)
	}
	r, err := g.Claim(1000, leaseNoon) // more than the lease's 90 µ$
	if err != nil {
		t.Fatal(err)
	}
	l.fail = func() bool { return true }
	if err := g.Commit(t.Context(), &r); !errors.Is(err, ErrLedger) || r.Committed() {
		t.Fatalf("commit %+v: %v, want ErrLedger", r, err)
	}
	l.fail = nil
	if err := g.Settle(t.Context(), r, 0); err != nil { // cancelled
		t.Fatal(err)
	}
	for range 8 { // the rest of the day's calls
		call(t, g, l, 10, 10, leaseNoon)
	}
	if _, err := g.Claim(1, leaseNoon); err == nil {
		t.Error("a call past daily_requests was claimed")
	}
	if err := g.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := l.day(leaseDay), (DayTotals{Requests: 3200, SpendMicroUSD: 90}); got != want {
		t.Errorf("ledger %+v, want %+v", got, want)
	}
	l.assertClean(t)
}

// sharedBook is a SharedLedger in memory: the bookLedger's totals, which
// several Globals write, and a lease taken only under the ceilings.
type sharedBook struct{ *bookLedger }

func (s sharedBook) LeaseUnder(ctx context.Context, day string, calls, micro int64, lim Ceilings, give ...LedgerDay) (SharedTotals, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock() // the test and the lease are one step, as in one statement
	d := s.days[day]
	var month int64
	for k, v := range s.days {
		if monthOf(k) == monthOf(day) {
			month += v.SpendMicroUSD
		}
	}
	for _, g := range give {
		if g.Day == day {
			d.Requests -= g.Requests
			d.SpendMicroUSD -= g.SpendMicroUSD
		}
		if monthOf(g.Day) == monthOf(day) {
			month -= g.SpendMicroUSD
		}
	}
	fits := (lim.DailyRequests == 0 || d.Requests+calls <= lim.DailyRequests) &&
		(lim.DailyMicroUSD == 0 || d.SpendMicroUSD+micro <= lim.DailyMicroUSD) &&
		(lim.MonthlyMicroUSD == 0 || month+micro <= lim.MonthlyMicroUSD)
	if !fits {
		calls, micro = 0, 0
	}
	if err := s.lease(day, calls, micro, give...); err != nil {
		return SharedTotals{}, false, err
	}
	if fits {
		d.Requests += calls
		d.SpendMicroUSD += micro
		month += micro
	}
	return SharedTotals{DayTotals: d, MonthMicroUSD: month}, fits, nil
}

// Two instances on a shared ledger: the second one's view is stale, its
// first top-up (sized for an empty day) is refused, and the next one is
// sized from the ledger's fresh totals to what is left; past that, its
// claims are refused with the ceiling's PausedError and dropped.
func TestLeaseSharedShrinksToWhatIsLeft(t *testing.T) {
	cfg := Config{DailyRequests: 1000} // leases of 10 calls
	book := newBook(cfg)
	l := sharedBook{book}
	a, b := mustGlobal(t, cfg, l, GlobalState{}), mustGlobal(t, cfg, l, GlobalState{})
	for range 993 {
		call(t, a, l, 0, 0, leaseNoon)
	}
	if err := a.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := book.day(leaseDay); d.Requests != 993 {
		t.Fatalf("after A: %+v, want 993 calls", d)
	}
	call(t, b, l, 0, 0, leaseNoon)
	if book.lastLease[0] != 7 {
		t.Errorf("B's lease after the refusal: %d calls, want the 7 left", book.lastLease[0])
	}
	for range 6 {
		call(t, b, l, 0, 0, leaseNoon)
	}
	r, err := b.Claim(0, leaseNoon)
	if err == nil {
		err = b.Commit(t.Context(), &r)
	}
	var pe *PausedError
	if !errors.As(err, &pe) || pe.Ceiling != "daily_requests" || pe.Busy {
		t.Fatalf("B's 8th call: %v, want daily_requests", err)
	}
	if d := book.day(leaseDay); d.Requests != 1000 {
		t.Errorf("ledger %+v, want 1000 calls", d)
	}
	book.assertClean(t)
}

// maybeBook is a sharedBook whose next LeaseUnder, once armed, is written
// and then answered with an error wrapping ErrMaybeCommitted, as a shared
// store does when the connection fails after the commit.
type maybeBook struct {
	sharedBook
	armed bool
}

func (m *maybeBook) LeaseUnder(ctx context.Context, day string, calls, micro int64, lim Ceilings, give ...LedgerDay) (SharedTotals, bool, error) {
	tot, ok, err := m.sharedBook.LeaseUnder(ctx, day, calls, micro, lim, give...)
	if err == nil && m.armed {
		m.armed = false
		return SharedTotals{}, false, fmt.Errorf("lost connection: %w", ErrMaybeCommitted)
	}
	return tot, ok, err
}

func (m *maybeBook) Lease(ctx context.Context, day string, calls, micro int64, give ...LedgerDay) error {
	err := m.sharedBook.Lease(ctx, day, calls, micro, give...)
	if err == nil && m.armed {
		m.armed = false
		return fmt.Errorf("lost connection: %w", ErrMaybeCommitted)
	}
	return err
}

// What a write that may have committed gave back is not given back again:
// neither by the top-up that failed so, nor by the refresh after a
// refresh that failed so, nor by a Close after a Close that failed so. A
// day's totals then never fall below its calls.
func TestLeaseGiveBackMaybeCommittedIsNotSentAgain(t *testing.T) {
	cfg := Config{DailyRequests: 1000} // leases of 10 calls
	book := newBook(cfg)
	l := &maybeBook{sharedBook: sharedBook{book}}
	g := mustGlobal(t, cfg, l, GlobalState{})
	call(t, g, l, 0, 0, leaseNoon) // a lease of 10, one call made
	tomorrow := leaseNoon.Add(24 * time.Hour)
	l.armed = true // the first write of tomorrow gives back today's 9
	r, err := g.Claim(0, tomorrow)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(t.Context(), &r); !errors.Is(err, ErrMaybeCommitted) {
		t.Fatalf("Commit = %v, want the ledger's ErrMaybeCommitted", err)
	}
	if err := g.Refresh(t.Context(), tomorrow); err != nil {
		t.Fatal(err)
	}
	call(t, g, l, 0, 0, tomorrow)
	if d := book.day(leaseDay); d.Requests != 1 {
		t.Errorf("the first day after its give-back: %+v, want its 1 call", d)
	}
	call(t, g, l, 0, 0, tomorrow.Add(24*time.Hour))
	l.armed = true // a refresh gives back the second day's lease
	if err := g.Refresh(t.Context(), tomorrow.Add(48*time.Hour)); !errors.Is(err, ErrMaybeCommitted) {
		t.Fatalf("Refresh = %v, want the ledger's ErrMaybeCommitted", err)
	}
	if err := g.Refresh(t.Context(), tomorrow.Add(48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d := book.day("2026-12-02"); d.Requests != 1 {
		t.Errorf("the third day after its give-back: %+v, want its 1 call", d)
	}
	fourth := tomorrow.Add(48 * time.Hour)
	call(t, g, l, 0, 0, fourth)
	l.armed = true // Close gives back the fourth day's lease
	if err := g.Close(t.Context()); !errors.Is(err, ErrMaybeCommitted) {
		t.Fatalf("Close = %v, want the ledger's ErrMaybeCommitted", err)
	}
	call(t, g, l, 0, 0, fourth) // the brake still works after Close: a lease of one call
	if err := g.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := book.day("2026-12-03"); d.Requests != 2 {
		t.Errorf("the fourth day after Close: %+v, want its 2 calls", d)
	}
	book.assertClean(t)
}
