package guard

import (
	"fmt"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// counted wraps the layers and counts how often each is asked: a refusal
// answered from the deny cache asks none.
type counted struct {
	rate     *limiter.Limiter
	attempts *budget.Attempts
	quotas   *budget.Quotas
	calls    int
}

func (c *counted) Allow(key string, now time.Time) error {
	c.calls++
	return c.rate.Allow(key, now)
}

func (c *counted) Check(key string, line int64, now time.Time) error {
	c.calls++
	return c.attempts.Check(key, line, now)
}

func (c *counted) Take(key string, line int64, now time.Time) error {
	c.calls++
	return c.attempts.Take(key, line, now)
}

// denyFixture is a guard with a deny cache over counted layers (the
// quota's Check counted too) and a brake of 100 calls a day.
type denyFixture struct {
	g       *Guard
	deny    *Deny
	layers  *counted
	brake   *budget.Global
	refused int
}

type countedQuotas struct {
	*budget.Quotas
	c *counted
}

func (q countedQuotas) Check(user string, limit int64, now time.Time) error {
	q.c.calls++
	return q.Quotas.Check(user, limit, now)
}

func newDenyFixture(t *testing.T, rate limiter.Config, max int) *denyFixture {
	t.Helper()
	lim, err := limiter.New(rate)
	if err != nil {
		t.Fatal(err)
	}
	f := &denyFixture{deny: NewDeny(max), layers: &counted{rate: lim, attempts: budget.NewAttempts(time.UTC, "2026-11-30", nil),
		quotas: budget.NewQuotas(time.UTC, "2026-11", nil)}}
	f.brake, err = budget.NewGlobal(budget.Config{DailyRequests: 100}, time.UTC, &ledger{}, budget.GlobalState{Day: "2026-11-30", Month: "2026-11"})
	if err != nil {
		t.Fatal(err)
	}
	f.g, err = New(Layers{Rate: f.layers, Attempts: f.layers, Quotas: countedQuotas{f.layers.quotas, f.layers}, Brake: f.brake,
		Usage: &usage{}, Deny: f.deny}, Hooks{Refused: func(*Refusal) { f.refused++ }})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// read admits, reserves and records one read of req at at; it fails t
// unless it passes.
func (f *denyFixture) read(t *testing.T, req Request, at time.Time) {
	t.Helper()
	tk, r := f.g.Admit(req, at)
	if r == nil {
		r = tk.Reserve(10, at)
	}
	if r == nil {
		r = tk.Commit(t.Context(), at)
	}
	if r != nil {
		t.Fatalf("read at %v refused: %+v", at, r)
	}
	if _, err := tk.Record(t.Context(), budget.UsageRecord{UserID: req.Key}, 10, at); err != nil {
		t.Fatal(err)
	}
}

var wide = limiter.Config{Rate: 1000, Window: time.Minute}

// A user at the daily line is refused from memory until midnight: no
// layer is asked again, the refusal is reported each time, and its
// RetryAfter counts down. At midnight the layers decide again.
func TestDenyKeepsTheDailyLineUntilMidnight(t *testing.T) {
	f := newDenyFixture(t, wide, 0)
	req := Request{Key: "alice", Plan: "free", DailyLine: 1, MonthlyQuota: 100}
	f.read(t, req, now)
	_, r := f.g.Admit(req, now.Add(time.Second))
	if r == nil || r.Reason != "daily_line" {
		t.Fatalf("over the line: %+v, want daily_line", r)
	}
	asked, first := f.layers.calls, r.RetryAfter
	for i := 1; i <= 1000; i++ {
		at := now.Add(time.Second + time.Duration(i)*time.Second)
		_, r := f.g.Admit(req, at)
		if r == nil || r.Layer != LayerAttempts || r.Reason != "daily_line" {
			t.Fatalf("repeat %d: %+v, want the daily line from memory", i, r)
		}
		if got, want := r.RetryAfter, first-time.Duration(i)*time.Second; got != want {
			t.Fatalf("repeat %d: RetryAfter %v, want %v (counting down)", i, got, want)
		}
	}
	if got := f.layers.calls - asked; got != 0 {
		t.Errorf("the layers were asked %d times for 1000 remembered refusals, want 0", got)
	}
	if got, want := f.refused, 1001; got != want {
		t.Errorf("%d refusals reported, want %d (every one, from memory or not)", got, want)
	}
	if _, r := f.g.Admit(Request{Key: "bob", Plan: "free", DailyLine: 1, MonthlyQuota: 100}, now.Add(time.Hour)); r != nil {
		t.Errorf("another user: %+v, want admitted", r)
	}
	if _, r := f.g.Admit(req, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); r != nil {
		t.Errorf("at midnight: %+v, want admitted (the line's new day)", r)
	}
}

// A rate refusal is remembered until the window reopens, and a repeat
// counts nothing: after RetryAfter the request passes.
func TestDenyKeepsTheRateWindow(t *testing.T) {
	f := newDenyFixture(t, limiter.Config{Rate: 2, Window: time.Minute}, 0)
	req := Request{Key: "alice", DailyLine: 100, MonthlyQuota: 100}
	for range 2 {
		if r := f.g.count(req, now); r != nil {
			t.Fatal(r)
		}
	}
	r := f.g.count(req, now.Add(10*time.Second))
	if r == nil || r.Layer != LayerRate {
		t.Fatalf("third in the window: %+v, want a rate refusal", r)
	}
	asked := f.layers.calls
	at := now.Add(30 * time.Second)
	if _, r := f.g.Admit(req, at); r == nil || r.Layer != LayerRate || r.RetryAfter != 30*time.Second {
		t.Fatalf("Admit 20 s later: %+v, want rate with 30s left", r)
	}
	if f.layers.calls != asked {
		t.Errorf("the layers were asked for a remembered rate refusal")
	}
	if r := f.g.count(req, now.Add(time.Minute)); r != nil {
		t.Errorf("once the window reopened: %+v, want admitted", r)
	}
}

// A quota held by a read in flight may reopen (the read can fail): that
// refusal is not remembered. Once the recorded reads reach it, it is.
func TestDenyKeepsOnlyARecordedQuota(t *testing.T) {
	f := newDenyFixture(t, wide, 0)
	req := Request{Key: "alice", DailyLine: 100, MonthlyQuota: 1}
	tk, r := f.g.Admit(req, now)
	if r == nil {
		r = tk.Reserve(10, now)
	}
	if r != nil {
		t.Fatal(r)
	}
	if _, r := f.g.Admit(req, now); r == nil || r.Reason != "monthly_quota" {
		t.Fatalf("with the last read in flight: %+v, want monthly_quota", r)
	}
	if n := f.deny.Len(); n != 0 {
		t.Errorf("%d refusals remembered while the quota is held in flight, want 0", n)
	}
	tk.Release() // the read failed: its slot comes back
	f.read(t, req, now.Add(time.Second))
	if _, r := f.g.Admit(req, now.Add(2*time.Second)); r == nil || r.Reason != "monthly_quota" {
		t.Fatalf("with the quota recorded: %+v, want monthly_quota", r)
	}
	if n := f.deny.Len(); n != 1 {
		t.Errorf("%d refusals remembered with the quota recorded, want 1", n)
	}
}

// The brake's refusals are not remembered: the operator's switch has no
// reopening time.
func TestDenyLeavesTheBrake(t *testing.T) {
	f := newDenyFixture(t, wide, 0)
	f.brake.SetManual(true)
	req := Request{Key: "alice", DailyLine: 100, MonthlyQuota: 100}
	if _, r := f.g.Admit(req, now); r == nil || r.Layer != LayerBudget {
		t.Fatalf("brake on: %+v, want a budget refusal", r)
	}
	f.brake.SetManual(false)
	if _, r := f.g.Admit(req, now); r != nil {
		t.Errorf("brake off: %+v, want admitted", r)
	}
}

// A line refusal answers only a request under the plan and lines it was
// decided with: another plan, or a raised line, is decided again.
func TestDenyMatchesThePlanAndLines(t *testing.T) {
	f := newDenyFixture(t, wide, 0)
	req := Request{Key: "alice", Plan: "free", DailyLine: 1, MonthlyQuota: 100}
	f.read(t, req, now)
	if _, r := f.g.Admit(req, now); r == nil {
		t.Fatal("over the line: admitted")
	}
	raised := req
	raised.DailyLine = 2
	if _, r := f.g.Admit(raised, now); r != nil {
		t.Errorf("under a raised line: %+v, want admitted", r)
	}
	other := req
	other.Plan, other.DailyLine = "pro", 5
	if _, r := f.g.Admit(other, now); r != nil {
		t.Errorf("under another plan: %+v, want admitted", r)
	}
	shadow := req
	shadow.ShadowDaily = true
	if _, r := f.g.Admit(shadow, now); r != nil {
		t.Errorf("with the line in shadow mode: %+v, want admitted", r)
	}
}

// Clear forgets every refusal, and one decided while a Clear happened is
// not kept.
func TestDenyClear(t *testing.T) {
	d := NewDeny(0)
	r := &Refusal{Layer: LayerAttempts, Reason: "daily_line", RetryAfter: time.Hour}
	req := Request{Key: "alice", DailyLine: 1}
	d.remember(req, r, d.generation(), now)
	if d.lookup(req, false, now) == nil {
		t.Fatal("not remembered")
	}
	d.Clear()
	if d.lookup(req, false, now) != nil || d.Len() != 0 {
		t.Fatal("remembered after Clear")
	}
	gen := d.generation()
	d.Clear() // an operator's change while the refusal was decided
	d.remember(req, r, gen, now)
	if d.Len() != 0 {
		t.Error("a refusal decided across a Clear was kept")
	}
	var none *Deny // a guard without a deny cache
	none.Clear()
	if none.lookup(req, false, now) != nil || none.Len() != 0 {
		t.Error("a nil deny cache answered")
	}
}

// Full, the cache evicts the refusal that expires soonest, and does not
// take one that would expire before all it holds; an expired one goes
// first.
func TestDenyBound(t *testing.T) {
	d := NewDeny(3)
	keep := func(user string, retry time.Duration, at time.Time) {
		d.remember(Request{Key: user}, &Refusal{Layer: LayerRate, Reason: "rate", RetryAfter: retry}, d.generation(), at)
	}
	has := func(user string, at time.Time) bool { return d.lookup(Request{Key: user}, true, at) != nil }
	keep("a", 3*time.Minute, now)
	keep("b", time.Minute, now)
	keep("c", 2*time.Minute, now)
	keep("d", 4*time.Minute, now) // evicts b
	if has("b", now) || !has("a", now) || !has("c", now) || !has("d", now) {
		t.Fatalf("after d: b should be gone, a, c, d kept")
	}
	keep("e", time.Second, now) // sooner than all: not kept
	if has("e", now) || d.Len() != 3 {
		t.Errorf("e kept over longer refusals (len %d)", d.Len())
	}
	later := now.Add(150 * time.Second) // c has expired
	keep("f", time.Second, later)
	if !has("f", later) || has("c", later) || !has("a", later) || !has("d", later) {
		t.Errorf("at +150s: want f, a, d; c expired")
	}
	for i := range 1000 { // many users: never past the bound
		keep(string(rune('A'+i%50))+string(rune(i)), time.Duration(i+1)*time.Second, later)
	}
	if n := d.Len(); n != 3 {
		t.Errorf("%d entries after 1000 refusals, want the bound 3", n)
	}
}

// Switching the rate limit to shadow mode forgets its remembered
// refusals: the layer no longer refuses.
func TestDenyShadowClears(t *testing.T) {
	f := newDenyFixture(t, limiter.Config{Rate: 1, Window: time.Minute}, 0)
	req := Request{Key: "alice", DailyLine: 100, MonthlyQuota: 100}
	_ = f.g.count(req, now)
	if r := f.g.count(req, now); r == nil {
		t.Fatal("second in the window admitted")
	}
	if err := f.g.SetShadow(LayerRate); err != nil {
		t.Fatal(err)
	}
	if r := f.g.count(req, now); r != nil {
		t.Errorf("in shadow mode: %+v, want admitted", r)
	}
}

// A limiter's exact refusal kept under a scope answers with what is left
// of its retry-after until it expires, then nothing; another key or scope
// is not answered.
func TestDenyKeepsAScopedRefusalUntilItsRetryAfter(t *testing.T) {
	d := NewDeny(0)
	r := &Refusal{Layer: "route:login", Reason: limiter.ReasonCooldown, RetryAfter: 10 * time.Minute}
	if !d.Keep("route:login/fail", "ip:198.51.100.1", r, d.Generation(), now) {
		t.Fatal("a cooldown was not kept")
	}
	for _, left := range []time.Duration{10 * time.Minute, 9 * time.Minute, time.Nanosecond} {
		at := now.Add(10*time.Minute - left)
		got := d.Lookup("route:login/fail", "ip:198.51.100.1", at)
		if got == nil || got.Layer != r.Layer || got.Reason != r.Reason || got.RetryAfter != left {
			t.Fatalf("at +%v: %+v, want %s %s with %v left", 10*time.Minute-left, got, r.Layer, r.Reason, left)
		}
	}
	if got := d.Lookup("route:login/fail", "ip:198.51.100.2", now); got != nil {
		t.Errorf("another key: %+v, want none", got)
	}
	if got := d.Lookup("route:signup/fail", "ip:198.51.100.1", now); got != nil {
		t.Errorf("another scope: %+v, want none", got)
	}
	if got := d.lookup(Request{Key: "ip:198.51.100.1", Route: "route:login/fail"}, false, now); got != nil {
		t.Errorf("a guard's request of the same key: %+v, want none", got)
	}
	if got := d.Lookup("route:login/fail", "ip:198.51.100.1", now.Add(10*time.Minute)); got != nil {
		t.Errorf("at its retry-after: %+v, want none (expired)", got)
	}
	if n := d.Len(); n != 0 {
		t.Errorf("%d entries after the expired one was looked up, want 0", n)
	}
	if got := d.Answered(); got != 3 {
		t.Errorf("Answered %d, want 3", got)
	}
}

// Only a limiter's exact refusals are kept: the rate, the burst and a
// cooldown. Attempts in flight, the service-wide net, a full fail limit,
// a busy budget and a refusal without a wait are not.
func TestDenyKeepsOnlyExactLimits(t *testing.T) {
	d := NewDeny(0)
	for _, c := range []struct {
		r    *Refusal
		kept bool
	}{
		{&Refusal{Reason: limiter.ReasonRate, RetryAfter: time.Second}, true},
		{&Refusal{Reason: limiter.ReasonBurst, RetryAfter: time.Second}, true},
		{&Refusal{Reason: limiter.ReasonCooldown, RetryAfter: time.Second}, true},
		{&Refusal{Reason: limiter.ReasonInFlight, RetryAfter: time.Second}, false},
		{&Refusal{Reason: limiter.ReasonGlobal, RetryAfter: time.Minute}, false},
		{&Refusal{Reason: limiter.ReasonCapacity, RetryAfter: time.Minute}, false},
		{&Refusal{Reason: limiter.ReasonCooldown, RetryAfter: time.Second, Busy: true}, false},
		{&Refusal{Reason: limiter.ReasonCooldown}, false},
		{nil, false},
	} {
		key := "k"
		if c.r != nil {
			key = c.r.Reason
		}
		if got := d.Keep("invites", key, c.r, d.Generation(), now); got != c.kept {
			t.Errorf("Keep(%+v) = %v, want %v", c.r, got, c.kept)
		}
		if got := d.Lookup("invites", key, now) != nil; got != c.kept {
			t.Errorf("%+v remembered: %v, want %v", c.r, got, c.kept)
		}
		d.Clear()
	}
	var none *Deny
	if none.Keep("invites", "k", &Refusal{Reason: limiter.ReasonRate, RetryAfter: time.Second}, 0, now) ||
		none.Lookup("invites", "k", now) != nil {
		t.Error("a nil deny cache kept a refusal")
	}
}

// A scoped refusal is forgotten by Clear, and one decided across a Clear
// is not kept.
func TestDenyClearsScopedRefusals(t *testing.T) {
	d := NewDeny(0)
	r := &Refusal{Reason: limiter.ReasonRate, RetryAfter: time.Minute}
	d.Keep("invites", "ip:198.51.100.1", r, d.Generation(), now)
	d.Clear()
	if d.Lookup("invites", "ip:198.51.100.1", now) != nil {
		t.Fatal("remembered after Clear")
	}
	gen := d.Generation()
	d.Clear()
	if d.Keep("invites", "ip:198.51.100.1", r, gen, now) || d.Len() != 0 {
		t.Error("a refusal decided across a Clear was kept")
	}
}

// A cache made Beside another is cleared with it, and keeps its own
// bound: a flood that fills it evicts nothing from the other.
func TestDenyBeside(t *testing.T) {
	ocr := NewDeny(0)
	floods := ocr.Beside(2)
	r := &Refusal{Reason: limiter.ReasonCooldown, RetryAfter: time.Hour}
	ocr.remember(Request{Key: "alice"}, &Refusal{Layer: LayerRate, Reason: "rate", RetryAfter: time.Minute}, ocr.generation(), now)
	for i := range 100 {
		floods.Keep("invites/fail", fmt.Sprint("ip:10.0.0.", i), r, floods.Generation(), now.Add(time.Duration(i)))
	}
	if floods.Len() != 2 || ocr.Len() != 1 {
		t.Fatalf("after a flood of 100 addresses: %d beside (want its bound 2), %d in the OCR cache (want 1)", floods.Len(), ocr.Len())
	}
	floods.Clear() // its own Clear leaves the other
	if ocr.Len() != 1 {
		t.Error("a Clear of the cache beside cleared the other")
	}
	floods.Keep("invites/fail", "ip:10.0.0.1", r, floods.Generation(), now)
	gen := floods.Generation()
	ocr.Clear()
	if floods.Len() != 0 || floods.Lookup("invites/fail", "ip:10.0.0.1", now) != nil {
		t.Error("the cache beside kept a refusal across the other's Clear")
	}
	if floods.Keep("invites/fail", "ip:10.0.0.2", r, gen, now) {
		t.Error("a refusal decided across the other's Clear was kept beside it")
	}
	var none *Deny
	if none.Beside(0) != nil {
		t.Error("beside a nil cache: want nil")
	}
}

// Two routes' guards sharing one cache: a key refused on one route is
// not refused from memory on the other.
func TestDenyKeepsRoutesApart(t *testing.T) {
	f := newDenyFixture(t, limiter.Config{Rate: 1, Window: time.Minute}, 0)
	login := Request{Key: "ip:198.51.100.1", Route: "route:login"}
	_ = f.g.count(login, now)
	if r := f.g.count(login, now); r == nil || f.deny.Len() != 1 {
		t.Fatalf("second in the window: %+v with %d remembered, want a rate refusal remembered", r, f.deny.Len())
	}
	signup := login
	signup.Route = "route:signup"
	if got := f.deny.lookup(signup, true, now); got != nil {
		t.Errorf("the same key on another route: %+v from memory, want none", got)
	}
}

// After a Refresh the first request that meets a refusal decides it
// again while the others are answered from it; renewed, it answers all
// again; not renewed within recheckFor, it is dropped. A refusal decided
// across a Refresh is kept, and the caches beside are refreshed too.
func TestDenyRefresh(t *testing.T) {
	d := NewDeny(0)
	floods := d.Beside(0)
	r := &Refusal{Layer: "route:login", Reason: limiter.ReasonRate, RetryAfter: time.Hour}
	floods.Keep("route:login", "ip:1", r, floods.Generation(), now)
	floods.Keep("route:login", "ip:2", r, floods.Generation(), now)
	gen := floods.Generation()
	d.Refresh()
	if got := floods.Lookup("route:login", "ip:1", now); got != nil {
		t.Fatalf("the first request after a Refresh: %+v from memory, want none (it decides again)", got)
	}
	if got := floods.Lookup("route:login", "ip:1", now.Add(recheckFor-1)); got == nil || got.RetryAfter != time.Hour-recheckFor+1 {
		t.Fatalf("another while the first decides: %+v, want the refusal from memory", got)
	}
	if !floods.Keep("route:login", "ip:1", r, gen, now.Add(time.Millisecond)) { // decided again, across the Refresh
		t.Fatal("a refusal decided across a Refresh was not kept")
	}
	if got := floods.Lookup("route:login", "ip:1", now.Add(time.Minute)); got == nil {
		t.Error("renewed: not answered from memory")
	}
	// ip:2's first request after the Refresh is let through (admitted,
	// say) and its refusal not renewed: dropped after recheckFor.
	if floods.Lookup("route:login", "ip:2", now) != nil {
		t.Fatal("ip:2's first request after the Refresh was answered from memory")
	}
	if floods.Lookup("route:login", "ip:2", now.Add(recheckFor)) != nil || floods.Len() != 1 {
		t.Errorf("ip:2 not renewed within %v: still answered (%d entries)", recheckFor, floods.Len())
	}
	var none *Deny
	none.Refresh()
}
