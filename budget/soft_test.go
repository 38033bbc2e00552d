package budget

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Soft at 5 calls, hard at 10: the day is below the soft line for the
// first five claims and above it from the sixth; the hard ceiling still
// refuses the eleventh. A brake started from the ledger's totals (a
// restart, clean or not) is on the same side, and raising the soft
// ceiling brings the day back below it.
func TestGlobalSoftCeilings(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cfg := Config{DailyRequests: 10, SoftDailyRequests: 5}
	g, err := NewGlobal(cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Month: "2026-12"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		side := g.Soft(now)
		if want := map[bool]string{true: "", false: "soft_daily_requests"}[i <= 5]; side != want {
			t.Fatalf("before call %d: Soft = %q, want %q", i, side, want)
		}
		r, err := g.Claim(100, now)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		g.Settled(r, 50)
	}
	if _, err := g.Claim(100, now); err == nil {
		t.Fatal("the 11th call passed the hard ceiling")
	}
	if st := g.Status(now); st.Degraded != "soft_daily_requests" {
		t.Errorf("Status.Degraded = %q, want soft_daily_requests", st.Degraded)
	}

	// A restart after three calls: the ledger says 3, the day is below.
	again, err := NewGlobal(cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Requests: 3, Month: "2026-12"})
	if err != nil {
		t.Fatal(err)
	}
	if side := again.Soft(now); side != "" {
		t.Errorf("restarted at 3 calls: Soft = %q, want below", side)
	}
	again, _ = NewGlobal(cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Requests: 5, Month: "2026-12"})
	if side := again.Soft(now); side != "soft_daily_requests" {
		t.Errorf("restarted at 5 calls: Soft = %q, want above", side)
	}

	g.SetConfig(Config{DailyRequests: 20, SoftDailyRequests: 15})
	if side := g.Soft(now); side != "" {
		t.Errorf("after raising the soft ceiling: Soft = %q, want below", side)
	}
	if side := g.Soft(now.Add(24 * time.Hour)); side != "" {
		t.Errorf("a new day: Soft = %q, want below", side)
	}
}

func TestGlobalSoftMoney(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	g, err := NewGlobal(Config{SoftDailyUSD: 0.001, SoftMonthlyUSD: 0.005}, time.UTC, &memLedger{},
		GlobalState{Day: "2026-12-03", Month: "2026-12", MonthSpend: 4000})
	if err != nil {
		t.Fatal(err)
	}
	if side := g.Soft(now); side != "" {
		t.Fatalf("Soft = %q at 0 of 1000 today, 4000 of 5000 this month", side)
	}
	r, _ := g.Claim(1000, now)
	if side := g.Soft(now); side != "soft_daily_usd" {
		t.Errorf("a call in flight at its worst case fills the day: Soft = %q", side)
	}
	g.Settled(r, 600)
	if side := g.Soft(now); side != "" {
		t.Errorf("settled at 600: Soft = %q, want below", side)
	}
	g.Claim(400, now)
	if side := g.Soft(now.Add(24 * time.Hour)); side != "soft_monthly_usd" {
		t.Errorf("the next day, 5000 spent this month: Soft = %q, want soft_monthly_usd", side)
	}
}

func TestSoftCeilingValidation(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{DailyRequests: 10, SoftDailyRequests: 10}, "budget.soft_daily_requests: must be below"},
		{Config{DailyUSD: 5, SoftDailyUSD: 6}, "budget.soft_daily_usd: must be below"},
		{Config{MonthlyUSD: 50, SoftMonthlyUSD: 50}, "budget.soft_monthly_usd: must be below"},
		{Config{SoftDailyRequests: -1}, "budget.soft_daily_requests: must not be negative"},
		{Config{SoftDailyUSD: -1}, "budget.soft_daily_usd: must be between"},
		{Config{DailyRequests: 10, SoftDailyRequests: 9, DailyUSD: 0, SoftDailyUSD: 3}, ""},
	} {
		err := tt.cfg.Validate()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%+v: %v, want %q", tt.cfg, err, tt.want)
		}
	}
	if err := ValidatePlans(map[string]Plan{"free": {MonthlyQuota: 1, Model: "cheap"}}); err == nil ||
		!strings.Contains(err.Error(), "plans.free.model") {
		t.Errorf("plan model \"cheap\": %v", err)
	}
	for _, m := range []string{"", "auto", "primary", "fallback"} {
		if err := ValidatePlans(map[string]Plan{"free": {MonthlyQuota: 1, Model: m}}); err != nil {
			t.Errorf("plan model %q: %v", m, err)
		}
	}
}

// softRun is what a burst of reads through ClaimSoft came to.
type softRun struct {
	primary, fallback, newSide, refused int
	primaryWorst                        int64 // the primary claims' worst cases, summed
}

// softBurst sends n reads at once over the brakes gs (read k to gs[k%len]),
// each claimed at primary or fallback micro-dollars by ClaimSoft,
// committed and settled at its worst case, while each brake refreshes its
// view from a shared ledger now and then. l settles them.
func softBurst(t *testing.T, gs []*Global, l Ledger, n int, primary, fallback int64) softRun {
	t.Helper()
	var (
		mu  sync.Mutex
		run softRun
		wg  sync.WaitGroup
	)
	start, done := make(chan struct{}), make(chan struct{})
	for _, g := range gs {
		go func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := g.Refresh(t.Context(), leaseNoon); err != nil {
					t.Error(err)
				}
				runtime.Gosched()
			}
		}()
	}
	for k := range n {
		wg.Go(func() {
			<-start
			g := gs[k%len(gs)]
			r, err := g.ClaimSoft(primary, fallback, leaseNoon)
			if err == nil {
				err = g.Commit(t.Context(), &r)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				run.refused++
				return
			}
			if !r.Soft || (r.Degraded == "") != (r.Worst == primary) {
				t.Errorf("claim %+v: its side and its worst case disagree", r)
			}
			if r.Degraded == "" {
				run.primary++
				run.primaryWorst += r.Worst
			} else {
				run.fallback++
			}
			if r.NewSide {
				run.newSide++
			}
			if err := l.Settle(t.Context(), r.Settlement(r.Worst)); err != nil {
				t.Error(err)
			}
			g.Settled(r, r.Worst)
		})
	}
	close(start)
	wg.Wait()
	close(done)
	return run
}

// softShortfall is how far short of a soft_daily_requests line the
// primary reads of a burst may land with brakes sharing a ledger (none
// with one brake, where memory decides): each brake's lease headroom it
// has not used when the burst ends counts in the day's calls the line is
// checked against, its primary lease (1% of the room under the line, at
// least one call) and its lease for fallback reads (1% of
// daily_requests, at least one call). docs/INSTANCES.md says it.
func softShortfall(instances int, cfg Config) int {
	if instances == 1 {
		return 0
	}
	per := max(1, cfg.SoftDailyRequests/LeaseShare)
	if cfg.DailyRequests > 0 {
		per += max(1, cfg.DailyRequests/LeaseShare)
	}
	return instances * int(per)
}

// 150 reads at once, soft_daily_requests = 100 under daily_requests =
// 200: exactly 100 go to the primary model and 50 to the fallback, on one
// brake (the count in memory decides) and on three brakes sharing a
// ledger (the ledger decides, every instance's calls counted), and with
// no hard ceiling on at all. The day then holds the 150 calls, and the
// first read on the fallback side is marked as new on it, once per brake
// that saw one. Fails with the side read before the claim (Soft, then
// Claim): a burst all sees "below".
func TestClaimSoftCallsExact(t *testing.T) {
	for _, tt := range []struct {
		name      string
		instances int
		cfg       Config
		large     bool // leases of more than one call
	}{
		{"one brake", 1, Config{DailyRequests: 200, SoftDailyRequests: 100}, false},
		{"three brakes, one shared ledger", 3, Config{DailyRequests: 200, SoftDailyRequests: 100}, false},
		{"shared, no hard ceiling", 3, Config{SoftDailyRequests: 100}, false},
		{"shared, a large line", 3, Config{DailyRequests: 20000, SoftDailyRequests: 10000}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			book := newBook(tt.cfg)
			var l Ledger = book
			if tt.instances > 1 {
				l = sharedBook{book}
			}
			var gs []*Global
			for range tt.instances {
				gs = append(gs, mustGlobal(t, tt.cfg, l, GlobalState{}))
			}
			n := 150
			if tt.large {
				n = int(tt.cfg.SoftDailyRequests) + 300
			}
			run := softBurst(t, gs, l, n, 1000, 100)
			for _, g := range gs {
				if err := g.Close(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			want := int(tt.cfg.SoftDailyRequests)
			low := want - softShortfall(tt.instances, tt.cfg)
			if tt.large {
				t.Logf("a line of %d: %+v", want, run)
			}
			if run.primary < low || run.primary > want || run.primary+run.fallback != n || run.refused != 0 {
				t.Errorf("%+v; want %d primary (at least %d), the rest of %d on the fallback, none refused", run, want, low, n)
			}
			if run.newSide < 1 || run.newSide > tt.instances {
				t.Errorf("%d reads marked new on their side, want 1 to %d", run.newSide, tt.instances)
			}
			if d := book.day(leaseDay); d.Requests != int64(n) {
				t.Errorf("the ledger's day: %+v, want %d calls", d, n)
			}
			book.assertClean(t)
		})
	}
}

// The same with soft_daily_usd at 10.5 primary claims' worth, the calls
// settled at their worst case: exactly 10 go to the primary model (their
// worst cases within one of the line, never past it), the rest to the
// fallback, whose spend counts toward the line as any other.
func TestClaimSoftMoneyExact(t *testing.T) {
	for _, instances := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d brakes", instances), func(t *testing.T) {
			cfg := Config{DailyUSD: 1, SoftDailyUSD: 0.0105}
			book := newBook(cfg)
			var l Ledger = book
			if instances > 1 {
				l = sharedBook{book}
			}
			var gs []*Global
			for range instances {
				gs = append(gs, mustGlobal(t, cfg, l, GlobalState{}))
			}
			run := softBurst(t, gs, l, 60, 1000, 100)
			if run.primary != 10 || run.fallback != 50 || run.refused != 0 {
				t.Errorf("%+v; want 10 primary, 50 fallback", run)
			}
			if line := MicroUSD(cfg.SoftDailyUSD); run.primaryWorst > line || run.primaryWorst <= line-1000 {
				t.Errorf("the primary claims' worst cases sum to %d, want within one (1000) of the line %d", run.primaryWorst, line)
			}
			book.assertClean(t)
		})
	}
}

// Each read is marked as the first on its side when the brake's previous
// one was on the other: entering degraded mode once, and leaving it once
// when a reload raises the line. A plain Claim (a plan with its own
// model, a retry) counts toward the line and marks nothing.
func TestClaimSoftNewSide(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	g, err := NewGlobal(Config{DailyRequests: 10, SoftDailyRequests: 3}, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Month: "2026-12"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	read := func() {
		t.Helper()
		got = append(got, sideOf(t, g, 100, 10, now).side)
	}
	read()
	if _, err := g.Claim(100, now); err != nil {
		t.Fatal(err)
	}
	read()
	read()
	read()
	g.SetConfig(Config{DailyRequests: 10, SoftDailyRequests: 6})
	read()
	want := []string{"primary", "primary", "fallback*", "fallback", "primary*"}
	if !slices.Equal(got, want) {
		t.Errorf("sides %v, want %v", got, want)
	}
}

// On a shared ledger, three reads claimed at once against a line of two
// calls, the third one committed and settled first (a quick fallback
// call): two still go to the primary model. Fails when the third is sent
// to the fallback at once because of the first two, which the ledger has
// not yet decided: its call reaches the ledger before them and takes a
// primary slot.
func TestUndecidedClaimsKeepTheirPrimarySlots(t *testing.T) {
	cfg := Config{SoftDailyRequests: 2}
	book := newBook(cfg)
	g := mustGlobal(t, cfg, sharedBook{book}, GlobalState{})
	var rs [3]Reservation
	for i := range rs {
		r, err := g.ClaimSoft(1000, 100, leaseNoon)
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	primary := 0
	for _, i := range []int{2, 0, 1} {
		if err := g.Commit(t.Context(), &rs[i]); err != nil {
			t.Fatal(err)
		}
		if err := g.Settle(t.Context(), rs[i], rs[i].Worst); err != nil {
			t.Fatal(err)
		}
		if rs[i].Degraded == "" {
			primary++
		}
	}
	if primary != 2 {
		t.Errorf("%d of 3 reads on the primary model under a line of 2, want 2: %+v", primary, rs)
	}
	if d := book.day(leaseDay); d.Requests != 3 {
		t.Errorf("the ledger's day: %+v, want 3 calls", d)
	}
	if g.undecided != (DayTotals{}) {
		t.Errorf("undecided claims left: %+v", g.undecided)
	}
}

// Near a soft_daily_usd line on one brake, money in flight at its worst
// case sends a read to the fallback (degraded mode entered, once); the
// call settling below its worst case lets the next read go to the
// primary model again, without leaving degraded mode: no alert each way
// per read near the line. The next day leaves it.
func TestDegradedModeEndsWithTheDayNotWithOneRead(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	g, err := NewGlobal(Config{SoftDailyUSD: 0.001}, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Month: "2026-12"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	read := func(at time.Time) Reservation {
		t.Helper()
		c := sideOf(t, g, 600, 10, at)
		got = append(got, c.side)
		return c.r
	}
	first := read(now)
	second := read(now) // 600 in flight + 600 > 1000
	g.Settled(first, 100)
	g.Settled(second, 10)
	read(now) // 110 + 600 <= 1000: primary, still degraded
	read(now) // 710 + 600 > 1000
	read(now.Add(24 * time.Hour))
	want := []string{"primary", "fallback*", "primary", "fallback", "primary*"}
	if !slices.Equal(got, want) {
		t.Errorf("sides %v, want %v", got, want)
	}
}

// sideClaim is a claim of ClaimSoft and its side as the tests write it:
// "primary" or "fallback", with a "*" when it enters or leaves degraded
// mode.
type sideClaim struct {
	r    Reservation
	side string
}

func sideOf(t *testing.T, g *Global, primary, fallback int64, now time.Time) sideClaim {
	t.Helper()
	r, err := g.ClaimSoft(primary, fallback, now)
	if err != nil {
		t.Fatal(err)
	}
	side := map[bool]string{true: "primary", false: "fallback"}[r.Degraded == ""]
	if r.NewSide {
		side += "*"
	}
	return sideClaim{r, side}
}
