package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// ledger is a budget.Ledger in memory that counts its writes.
type ledger struct {
	mu       sync.Mutex
	reserved int // lease writes
	settled  []budget.Settlement
	err      error // what Lease answers; nil: success
}

func (l *ledger) Lease(context.Context, string, int64, int64, ...budget.LedgerDay) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	l.reserved++
	return nil
}

func (l *ledger) Settle(_ context.Context, s budget.Settlement) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settled = append(l.settled, s)
	return nil
}

// usage is a UsageRecorder whose answer the test sets.
type usage struct {
	err     error
	records int
	last    budget.Settlement
}

func (u *usage) RecordUsage(_ context.Context, _ string, _ budget.UsageRecord, s budget.Settlement) error {
	if u.err != nil {
		return u.err
	}
	u.records++
	u.last = s
	return nil
}

type fixture struct {
	g        *Guard
	quotas   *budget.Quotas
	brake    *budget.Global
	ledger   *ledger
	usage    *usage
	refused  []*Refusal
	failOpen []string
	shadowed []*Refusal
}

func newFixture(t *testing.T, rate limiter.Config, cfg budget.Config) *fixture {
	t.Helper()
	f := &fixture{ledger: &ledger{}, usage: &usage{}}
	lim, err := limiter.New(rate)
	if err != nil {
		t.Fatal(err)
	}
	f.quotas = budget.NewQuotas(time.UTC, "2026-11", nil)
	f.brake, err = budget.NewGlobal(cfg, time.UTC, f.ledger, budget.GlobalState{Day: "2026-11-30", Month: "2026-11"})
	if err != nil {
		t.Fatal(err)
	}
	f.g, err = New(Layers{
		Rate: lim, Attempts: budget.NewAttempts(time.UTC, "2026-11-30", nil), Quotas: f.quotas, Brake: f.brake, Usage: f.usage,
	}, Hooks{
		Refused:    func(r *Refusal) { f.refused = append(f.refused, r) },
		FailedOpen: func(layer string, err error) { f.failOpen = append(f.failOpen, layer) },
		Shadowed:   func(_ Request, r *Refusal) { f.shadowed = append(f.shadowed, r) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

var alice = Request{Key: "alice", DailyLine: 3, MonthlyQuota: 2}

// One request through every step: the slot is confirmed, the claim
// settled at the cost in the usage record's own transaction.
func TestAdmissionRecords(t *testing.T) {
	f := newFixture(t, limiter.Config{Rate: 10, Window: time.Minute}, budget.Config{DailyUSD: 1})
	tk, r := f.g.Admit(alice, now)
	if r != nil {
		t.Fatal(r)
	}
	defer tk.Release()
	if r := tk.Reserve(1000, now); r != nil {
		t.Fatal(r)
	}
	if r := tk.Commit(t.Context(), now); r != nil {
		t.Fatal(r)
	}
	used, r := tk.Record(t.Context(), budget.UsageRecord{UserID: "alice"}, 40, now)
	if r != nil || used != 1 || tk.Step() != StepRecorded {
		t.Fatalf("Record = %d, %v (step %s); want 1 read, recorded", used, r, tk.Step())
	}
	if got, want := f.usage.last, (budget.Settlement{Day: "2026-11-30", ActualMicroUSD: 40, Leased: true, LeasedMicroUSD: 1000}); got != want {
		t.Errorf("settlement %+v, want %+v", got, want)
	}
	if st := f.brake.Status(now); st.SpendMicroUSD != 40 || st.Requests != 1 {
		t.Errorf("brake %+v, want one call at 40", st)
	}
	tk.Release() // after Record: nothing to give back
	if got := f.quotas.Used("alice", now); got != 1 {
		t.Errorf("quota used %d after a late Release, want 1", got)
	}
}

// Each layer's refusal comes back with its layer, reason and wait, is
// reported once, and leaves nothing reserved.
func TestRefusals(t *testing.T) {
	t.Run("rate", func(t *testing.T) {
		f := newFixture(t, limiter.Config{Rate: 1, Window: time.Minute}, budget.Config{})
		f.g.Admit(alice, now)
		_, r := f.g.Admit(alice, now)
		if r == nil || r.Layer != LayerRate || r.Reason != limiter.ReasonRate || r.RetryAfter <= 0 {
			t.Fatalf("second request: %+v, want a rate refusal", r)
		}
		if len(f.refused) != 1 {
			t.Errorf("reported %d refusals, want 1", len(f.refused))
		}
	})
	t.Run("quota", func(t *testing.T) {
		f := newFixture(t, limiter.Config{}, budget.Config{})
		for range 2 {
			tk, _ := f.g.Admit(alice, now)
			tk.Reserve(1, now)
			tk.Commit(t.Context(), now)
			if _, err := tk.Record(t.Context(), budget.UsageRecord{}, 1, now); err != nil {
				t.Fatal(err)
			}
		}
		_, r := f.g.Admit(alice, now)
		if r == nil || r.Layer != LayerQuota || r.Reason != "monthly_quota" {
			t.Fatalf("third read: %+v, want the quota", r)
		}
	})
	t.Run("budget releases the slot", func(t *testing.T) {
		f := newFixture(t, limiter.Config{}, budget.Config{DailyUSD: 0.001}) // 1000 micro-dollars
		tk, _ := f.g.Admit(alice, now)
		r := tk.Reserve(2000, now)
		if r == nil || r.Layer != LayerBudget || r.Reason != "daily_usd" || r.Busy {
			t.Fatalf("a call past the ceiling: %+v", r)
		}
		tk.Release()
		if _, r := f.g.Admit(alice, now); r != nil {
			t.Fatalf("next request: %+v", r)
		}
		if slot, err := f.quotas.Reserve("alice", 1, now); err != nil {
			t.Errorf("the refused request kept its quota slot: %v (%+v)", err, slot)
		}
	})
}

type brokenRate struct{ panics bool }

func (b brokenRate) Allow(string, time.Time) error {
	if b.panics {
		panic("limiter bug")
	}
	return errors.New("limiter: state lost")
}

// A defense layer whose machinery fails lets the request through and says
// so; it is never taken for a refusal.
func TestDefenseLayersFailOpen(t *testing.T) {
	for _, panics := range []bool{false, true} {
		var failed []string
		g, err := New(Layers{Rate: brokenRate{panics}}, Hooks{FailedOpen: func(layer string, _ error) { failed = append(failed, layer) }})
		if err != nil {
			t.Fatal(err)
		}
		if _, r := g.Admit(alice, now); r != nil {
			t.Errorf("panics=%v: refused %+v, want let through", panics, r)
		}
		if len(failed) != 1 || failed[0] != LayerRate {
			t.Errorf("panics=%v: reported %v, want one rate fault", panics, failed)
		}
	}
}

// A usage record that fails withholds the result, gives the slot back and
// pauses paid calls; after the pause one probe goes through alone, and its
// record ends the pause.
func TestFailedRecordPausesPaidCalls(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{})
	f.usage.err = errors.New("disk full")
	tk, _ := f.g.Admit(alice, now)
	tk.Reserve(10, now)
	tk.Commit(t.Context(), now)
	if _, r := tk.Record(t.Context(), budget.UsageRecord{}, 10, now); r == nil || r.Kind() != KindStorage || r.Fault == nil {
		t.Fatalf("Record on a failing disk: %+v, want a storage refusal with its fault", r)
	}
	if got := f.quotas.Used("alice", now); got != 0 {
		t.Errorf("quota used %d after a failed record, want 0", got)
	}
	_, r := f.g.Admit(alice, now.Add(time.Second))
	if r == nil || r.Layer != LayerUsage || r.RetryAfter != UsagePause-time.Second {
		t.Fatalf("during the pause: %+v", r)
	}
	later := now.Add(UsagePause)
	probe, r := f.g.Admit(alice, later)
	if r != nil {
		t.Fatalf("the probe: %+v", r)
	}
	if _, r := f.g.Admit(alice, later); r == nil || r.Layer != LayerUsage {
		t.Fatalf("beside the probe: %+v, want still paused", r)
	}
	f.usage.err = nil
	probe.Reserve(10, later)
	probe.Commit(t.Context(), later)
	if _, err := probe.Record(t.Context(), budget.UsageRecord{}, 10, later); err != nil {
		t.Fatal(err)
	}
	if _, r := f.g.Admit(alice, later); r != nil {
		t.Fatalf("after the probe's record: %+v", r)
	}
}

// A record that may have committed (its connection failed after the
// commit was sent, and the store could not read back whether it did) is
// not undone: no second settlement gives the lease's rest back again, the
// quota slot stays taken, the claim counts at its worst case, and the
// result is still withheld with paid calls paused.
func TestMaybeCommittedRecordIsNotUndone(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{DailyUSD: 1})
	f.usage.err = fmt.Errorf("postgres: usage record of alice: %w", budget.ErrMaybeCommitted)
	tk, _ := f.g.Admit(alice, now)
	tk.Reserve(1000, now)
	tk.Commit(t.Context(), now)
	if _, r := tk.Record(t.Context(), budget.UsageRecord{UserID: "alice"}, 40, now); r == nil || !errors.Is(r.Fault, budget.ErrMaybeCommitted) {
		t.Fatalf("Record = %+v, want a refusal with the store's ErrMaybeCommitted", r)
	}
	tk.Release() // as the handler does after every read
	if len(f.ledger.settled) != 0 {
		t.Errorf("settled %+v after a record that may have committed, want nothing", f.ledger.settled)
	}
	if st := f.brake.Status(now); st.SpendMicroUSD != 1000 || st.Requests != 1 {
		t.Errorf("brake %+v, want the call at its worst case (1000)", st)
	}
	if _, err := f.quotas.Reserve("alice", 1, now); err == nil {
		t.Error("a slot of a quota of 1 was free after a record that may have used it")
	}
	if _, r := f.g.Admit(alice, now.Add(time.Second)); r == nil || r.Layer != LayerUsage {
		t.Fatalf("after it: %+v, want paid calls paused", r)
	}
}

// A retry is claimed like the call: with room it is taken and committed,
// the busy first call keeps its worst case and the retry is the one
// settled at the cost; without room it is refused and nothing is taken.
func TestClaimRetry(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{DailyRequests: 3})
	tk, _ := f.g.Admit(alice, now)
	tk.Reserve(100, now)
	tk.Commit(t.Context(), now)
	if !tk.ClaimRetry(t.Context(), 100, now) {
		t.Fatal("no retry with room for it")
	}
	if f.ledger.reserved != 2 {
		t.Errorf("ledger has %d reservations, want the call and its retry", f.ledger.reserved)
	}
	tk.Fail(t.Context(), 7)
	want := []budget.Settlement{
		{Day: "2026-11-30", ActualMicroUSD: 100, Leased: true, LeasedMicroUSD: 100},
		{Day: "2026-11-30", ActualMicroUSD: 7, Leased: true, LeasedMicroUSD: 100},
	}
	if len(f.ledger.settled) != 2 || f.ledger.settled[0] != want[0] || f.ledger.settled[1] != want[1] {
		t.Errorf("settled %+v, want %+v", f.ledger.settled, want)
	}

	tk, _ = f.g.Admit(alice, now)
	tk.Reserve(100, now) // the third call of the day
	tk.Commit(t.Context(), now)
	if tk.ClaimRetry(t.Context(), 100, now) {
		t.Error("a retry past daily_requests was claimed")
	}
	if st := f.brake.Status(now); st.Requests != 3 {
		t.Errorf("brake counts %d calls, want 3", st.Requests)
	}
	if len(f.refused) != 0 {
		t.Errorf("a skipped retry was reported as a refusal: %+v", f.refused)
	}
}

// A client gone before the call spends nothing: its claim, covered by the
// lease, is settled at zero through the ledger as a committed claim is.
func TestCancelSpendsNothing(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{DailyUSD: 1})
	for range 2 { // the first call leases headroom, the second takes from it
		tk, _ := f.g.Admit(alice, now)
		tk.Reserve(5000, now)
		if r := tk.Commit(t.Context(), now); r != nil {
			t.Fatal(r)
		}
		if r := tk.Gone(t.Context(), now); r == nil || r.Kind() != KindGone {
			t.Fatalf("Gone: %+v, want a refusal of KindGone", r)
		}
		tk.Release()
	}
	if f.ledger.reserved != 1 {
		t.Errorf("%d lease writes for two calls, want 1", f.ledger.reserved)
	}
	want := budget.Settlement{Day: "2026-11-30", Leased: true, LeasedMicroUSD: 5000}
	if len(f.ledger.settled) != 2 || f.ledger.settled[0] != want || f.ledger.settled[1] != want {
		t.Errorf("settled %+v, want twice %+v", f.ledger.settled, want)
	}
	if st := f.brake.Status(now); st.SpendMicroUSD != 0 {
		t.Errorf("spend %d after a cancelled request, want 0", st.SpendMicroUSD)
	}
	if got := f.quotas.Used("alice", now); got != 0 {
		t.Errorf("quota used %d, want 0", got)
	}
}

// A reservation the ledger cannot take refuses the call and pauses paid
// calls: the usage record shares the disk, so the read would be paid for
// and withheld. Commit says it is a fault (KindStorage, with the write's
// error) and gives the slot back itself.
func TestLedgerFailureRefusesTheCall(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{DailyUSD: 1})
	f.ledger.err = errors.New("disk full")
	tk, _ := f.g.Admit(alice, now)
	tk.Reserve(100, now)
	r := tk.Commit(t.Context(), now)
	if r == nil || r.Layer != LayerUsage || r.Reason != "ledger_failing" || r.Kind() != KindStorage || !errors.Is(r.Fault, budget.ErrLedger) {
		t.Fatalf("Commit on a failing ledger: %+v; want a storage refusal with the ledger's error", r)
	}
	if got := f.quotas.Used("alice", now); got != 0 {
		t.Errorf("quota used %d, want the slot given back", got)
	}
	if _, r := f.g.Admit(alice, now.Add(time.Second)); r == nil || r.Layer != LayerUsage {
		t.Errorf("the next request: %+v, want paused", r)
	}
	if len(f.failOpen) != 0 {
		t.Errorf("reported as failing open: %v", f.failOpen)
	}
}

// In shadow mode a request the rate limit would refuse passes, the
// would-be refusal is reported once, and the window advances exactly as
// when enforcing (a refusal counts nothing): switching to enforce then
// refuses at once, as the shadow predicted.
func TestShadowRate(t *testing.T) {
	f := newFixture(t, limiter.Config{Rate: 2, Window: time.Minute}, budget.Config{})
	if err := f.g.SetShadow(LayerRate); err != nil {
		t.Fatal(err)
	}
	req := Request{Key: "alice", MonthlyQuota: 100}
	for i := range 10 {
		tk, r := f.g.Admit(req, now.Add(time.Duration(i)*time.Second))
		if r != nil {
			t.Fatalf("request %d refused in shadow mode: %+v", i, r)
		}
		tk.Release()
	}
	if got, want := len(f.shadowed), 8; got != want {
		t.Fatalf("shadowed refusals = %d, want %d", got, want)
	}
	if len(f.refused) != 0 {
		t.Fatalf("refused = %v, want none", f.refused)
	}
	for _, r := range f.shadowed {
		if r.Layer != LayerRate || r.Reason != limiter.ReasonRate {
			t.Fatalf("shadowed %+v, want layer rate, reason rate", r)
		}
	}
	if err := f.g.SetShadow(); err != nil {
		t.Fatal(err)
	}
	if _, r := f.g.Admit(req, now.Add(10*time.Second)); r == nil || r.Layer != LayerRate {
		t.Fatalf("after switching to enforce: %+v, want a rate refusal", r)
	}
	// The window held only the two admitted requests: a minute after the
	// first, one slot is free again.
	tk, r := f.g.Admit(req, now.Add(time.Minute))
	if r != nil {
		t.Fatalf("a minute after the first request: %+v, want admitted", r)
	}
	tk.Release()
}

// A plan's daily line in shadow mode reports a would-be refusal once per
// request though Admit looks and Reserve takes, and counts nothing more
// than enforcing would.
func TestShadowDailyLine(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{})
	req := Request{Key: "bob", DailyLine: 2, MonthlyQuota: 100, ShadowDaily: true}
	for i := range 5 {
		tk, r := f.g.Admit(req, now)
		if r != nil {
			t.Fatalf("request %d: Admit refused %+v", i, r)
		}
		if r := tk.Reserve(0, now); r != nil {
			t.Fatalf("request %d: Reserve refused %+v", i, r)
		}
		tk.Release()
	}
	if got, want := len(f.shadowed), 3; got != want {
		t.Fatalf("shadowed = %d, want %d (one per request over the line)", got, want)
	}
	req.ShadowDaily = false
	if _, r := f.g.Admit(req, now); r == nil || r.Layer != LayerAttempts {
		t.Fatalf("enforcing: %+v, want the daily line", r)
	}
}

func TestShadowRefusesMoney(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{})
	for _, layer := range []string{LayerQuota, LayerBudget, LayerUsage} {
		if err := f.g.SetShadow(layer); !errors.Is(err, ErrNotShadowable) {
			t.Errorf("SetShadow(%s) = %v, want ErrNotShadowable", layer, err)
		}
	}
}

// A layer run on its own (the invite limits, a route's fail limit) fails
// open as the pipeline's layers do: a refusal comes back under the
// runner's layer, a broken check or a panic is reported and let through.
func TestFailOpenCheck(t *testing.T) {
	fails, err := limiter.NewFail(limiter.FailConfig{Limit: 1, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, err := fails.Begin([]string{"ip:192.0.2.1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	a.Fail(now) // one failure starts the cooldown
	for _, tt := range []struct {
		name       string
		check      func() error
		wantReason string // "": let through
		wantFaults int
	}{
		{"passes", func() error { return nil }, "", 0},
		{"refuses", func() error { _, err := fails.Begin([]string{"ip:192.0.2.1"}, now); return err }, limiter.ReasonCooldown, 0},
		{"breaks", func() error { return errors.New("limiter: state lost") }, "", 1},
		{"panics", func() error { panic("limiter: corrupt") }, "", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var faults []string
			f := NewFailOpen("route:login", Hooks{FailedOpen: func(layer string, _ error) { faults = append(faults, layer) }})
			r := f.Check(tt.check)
			switch {
			case tt.wantReason == "" && r != nil:
				t.Errorf("refused %+v, want let through", r)
			case tt.wantReason != "" && r == nil:
				t.Errorf("let through, want refused for %s", tt.wantReason)
			case r != nil && (r.Layer != "route:login" || r.Reason != tt.wantReason || r.RetryAfter <= 0):
				t.Errorf("refusal %+v, want layer route:login, reason %s and a retry-after", r, tt.wantReason)
			}
			if got, want := len(faults), tt.wantFaults; got != want {
				t.Errorf("reported %d faults (%v), want %d", got, faults, want)
			}
			for _, l := range faults {
				if l != "route:login" {
					t.Errorf("fault reported under %q, want route:login", l)
				}
			}
		})
	}
}

// fullLedger is a shared ledger (budget.SharedLedger) that other
// instances have filled: it refuses every lease.
type fullLedger struct {
	ledger
	calls  int64 // the day's calls, every instance's
	grants int   // leases granted before it is full
}

func (l *fullLedger) LeaseUnder(context.Context, string, int64, int64, budget.Ceilings, ...budget.LedgerDay) (budget.SharedTotals, bool, error) {
	if l.grants > 0 {
		l.grants--
		return budget.SharedTotals{}, true, nil
	}
	return budget.SharedTotals{DayTotals: budget.DayTotals{Requests: l.calls}}, false, nil
}

// A claim a shared ledger refuses (other instances took the day) is a
// budget refusal with its ceiling and retry-after, not a failing ledger:
// paid calls do not pause, and the claim settles to nothing.
func TestSharedLedgerRefusalIsABudgetRefusal(t *testing.T) {
	l := &fullLedger{calls: 10}
	brake, err := budget.NewGlobal(budget.Config{DailyRequests: 10}, time.UTC, l, budget.GlobalState{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Layers{Brake: brake}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	tk, r := g.Admit(alice, now)
	if r != nil {
		t.Fatalf("Admit: %+v", r)
	}
	if r := tk.Reserve(100, now); r != nil {
		t.Fatalf("Reserve: %+v (this instance's view has room)", r)
	}
	r = tk.Commit(t.Context(), now)
	if r != nil && (r.Fault != nil || r.Kind() != KindBrake) {
		t.Fatalf("Commit: %+v (kind %s), want the brake's refusal alone: a ceiling reached is not a fault", r, r.Kind())
	}
	if r == nil || r.Layer != LayerBudget || r.Reason != "daily_requests" || r.RetryAfter != 12*time.Hour {
		t.Fatalf("Commit: %+v, want the budget's daily_requests refusal until midnight", r)
	}
	if len(l.settled) != 0 {
		t.Errorf("the refused claim was settled in the ledger: %+v", l.settled)
	}
	if _, r := g.Admit(alice, now.Add(time.Second)); r == nil || r.Layer != LayerBudget {
		t.Errorf("the next request: %+v, want the brake engaged from the refreshed view, not a usage pause", r)
	}
}

// A retry a shared ledger refuses is not made, and leaves the ticket as it
// was: the first call is settled at its own cost.
func TestSharedLedgerRefusedRetryLeavesTheFirstCall(t *testing.T) {
	l := &fullLedger{calls: 2, grants: 1} // the first call's lease, then full
	brake, err := budget.NewGlobal(budget.Config{DailyRequests: 2}, time.UTC, l, budget.GlobalState{Day: "2026-11-30", Month: "2026-11"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Layers{Brake: brake}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	tk, _ := g.Admit(alice, now)
	tk.Reserve(100, now)
	if r := tk.Commit(t.Context(), now); r != nil {
		t.Fatalf("the first call's claim: %+v", r)
	}
	if tk.ClaimRetry(t.Context(), 100, now) {
		t.Fatal("a retry the shared ledger refuses was allowed")
	}
	tk.Fail(t.Context(), 40)
	if len(l.settled) != 1 || l.settled[0].ActualMicroUSD != 40 {
		t.Fatalf("settled %+v, want the first call once, at its cost of 40", l.settled)
	}
}
