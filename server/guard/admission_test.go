package guard

import (
	"context"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// countingRate is layer 1 that counts its decisions: in memory (Allow) and,
// when joined, in a backend's write (the quotas' TakeAndReserve with a
// window).
type countingRate struct {
	joined  bool
	allowed int // Allow calls
	inWrite int // windows decided in the reservation's write
}

func (c *countingRate) Allow(string, time.Time) error { c.allowed++; return nil }
func (c *countingRate) Joined() (limiter.Joined, bool) {
	return limiter.Joined{Store: windows{}}, c.joined
}
func (c *countingRate) Admitted(string, time.Time) {}
func (c *countingRate) counted() int               { return c.allowed + c.inWrite }

type windows struct{}

func (windows) Take(string, limiter.Config, time.Time) (*limiter.Refusal, error) { return nil, nil }

// joinedQuotas is a backend that takes the attempt and the slot in one
// write, and decides layer 1's window there too (as storage/postgres does).
type joinedQuotas struct {
	*budget.Quotas
	attempts *budget.Attempts
	rate     *countingRate
}

func (q joinedQuotas) SharesCommit(a any) bool                 { return a == any(q.attempts) }
func (q joinedQuotas) JoinsWindows(limiter.SharedWindows) bool { return true }
func (q joinedQuotas) TakeAndReserve(user string, window limiter.Joined, line int64, _ bool, limit int64,
	now time.Time) (budget.Slot, *limiter.Refusal, error, error) {
	if window.Store != nil {
		q.rate.inWrite++
	}
	take := q.attempts.Take(user, line, now)
	slot, err := q.Quotas.Reserve(user, limit, now)
	return slot, nil, take, err
}

// rateGuard is a guard whose layer 1 counts; joined: the backend decides
// it in the reservation's write.
func rateGuard(t *testing.T, joined bool) (*Guard, *countingRate) {
	t.Helper()
	rate := &countingRate{joined: joined}
	attempts := budget.NewAttempts(time.UTC, "2026-11-30", nil)
	var quotas Quotas = budget.NewQuotas(time.UTC, "2026-11", nil)
	if joined {
		quotas = joinedQuotas{Quotas: quotas.(*budget.Quotas), attempts: attempts, rate: rate}
	}
	g, err := New(Layers{Rate: rate, Attempts: attempts, Quotas: quotas, Usage: &usage{}}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := g.joinedRate(); ok != joined {
		t.Fatalf("joined = %v, want %v", ok, joined)
	}
	return g, rate
}

// admissionPaths are the ways a request goes through the guard, as the
// admission table of docs/DESIGN.md lists them: each ends at its last
// step, and layer 1 counts it exactly once.
var admissionPaths = []struct {
	name string
	run  func(t *testing.T, g *Guard)
}{
	{"read", func(t *testing.T, g *Guard) {
		a := admit(t, g, false)
		step(t, a.Reserve(10, now), a.Commit(t.Context(), now))
		if _, r := a.Record(t.Context(), budget.UsageRecord{}, 10, now); r != nil {
			t.Fatal(r)
		}
	}},
	{"bad upload", func(t *testing.T, g *Guard) { step(t, admit(t, g, false).End(now)) }},
	{"cached answer", func(t *testing.T, g *Guard) { step(t, admit(t, g, false).End(now)) }},
	{"client gone while waiting", func(t *testing.T, g *Guard) { admit(t, g, false).Gone(t.Context(), now) }},
	{"client gone before the call", func(t *testing.T, g *Guard) {
		a := admit(t, g, false)
		step(t, a.Reserve(10, now), a.Commit(t.Context(), now))
		a.Gone(t.Context(), now)
	}},
	{"call failed", func(t *testing.T, g *Guard) {
		a := admit(t, g, false)
		step(t, a.Reserve(10, now), a.Commit(t.Context(), now))
		a.Fail(t.Context(), 10)
	}},
	{"keyed bad upload", func(t *testing.T, g *Guard) { step(t, admit(t, g, true).End(now)) }},
	{"keyed repeat", func(t *testing.T, g *Guard) { step(t, admit(t, g, true).End(now)) }},
	{"keyed first request", func(t *testing.T, g *Guard) {
		a := admit(t, g, true)
		step(t, a.Look(now), a.Reserve(10, now), a.Commit(t.Context(), now))
		if _, r := a.Record(t.Context(), budget.UsageRecord{}, 10, now); r != nil {
			t.Fatal(r)
		}
	}},
	{"keyed first request, cached", func(t *testing.T, g *Guard) {
		a := admit(t, g, true)
		step(t, a.Look(now), a.End(now))
	}},
	{"keyed client gone", func(t *testing.T, g *Guard) {
		a := admit(t, g, true)
		step(t, a.Look(now))
		a.Gone(t.Context(), now)
	}},
}

func admit(t *testing.T, g *Guard, keyed bool) *Admission {
	t.Helper()
	admit := g.Admit
	if keyed {
		admit = g.AdmitKeyed
	}
	a, r := admit(alice, now)
	if r != nil {
		t.Fatal(r)
	}
	return a
}

// step fails t on the first refusal of steps that must pass. The steps
// are evaluated in order as arguments are.
func step(t *testing.T, refusals ...*Refusal) {
	t.Helper()
	for i, r := range refusals {
		if r != nil {
			t.Fatalf("step %d refused: %+v", i+1, r)
		}
	}
}

// Layer 1 counts every request once, whichever way it ends, on a guard
// that counts it before the body (bolt) and on one whose backend decides
// it in the reservation's write (PostgreSQL); and where the table says:
// before the body, or in the write, or at the step that ends it.
func TestRateCountedOncePerPath(t *testing.T) {
	for _, joined := range []bool{false, true} {
		for _, p := range admissionPaths {
			name := p.name + map[bool]string{false: " (counted before the body)", true: " (joined)"}[joined]
			t.Run(name, func(t *testing.T) {
				g, rate := rateGuard(t, joined)
				p.run(t, g)
				if n := rate.counted(); n != 1 {
					t.Fatalf("layer 1 counted %d times (%d in memory, %d in the write), want once", n, rate.allowed, rate.inWrite)
				}
				reserved := rate.inWrite > 0
				if joined && !reserved && rate.allowed != 1 {
					t.Errorf("a joined request that ends without a reservation was not counted at its end")
				}
				if !joined && rate.inWrite != 0 {
					t.Errorf("counted in a write on a guard that is not joined")
				}
			})
		}
	}
}

// On a joined guard, a request Admit's looks refuse before the body is
// not counted (it cost no round trip and no upload); on one that counts
// before the body it was counted before the looks.
func TestRefusedBeforeTheBody(t *testing.T) {
	for _, joined := range []bool{false, true} {
		g, rate := rateGuard(t, joined)
		full := Request{Key: "bob", DailyLine: 1, MonthlyQuota: 10}
		a, r := g.Admit(full, now)
		step(t, r, a.Reserve(10, now), a.Commit(t.Context(), now))
		a.Fail(t.Context(), 10)
		before := rate.counted()
		if _, r := g.Admit(full, now); r == nil || r.Kind() != KindLimit {
			t.Fatalf("joined=%v: past the daily line: %+v, want a limit", joined, r)
		}
		want := map[bool]int{false: 1, true: 0}[joined]
		if got := rate.counted() - before; got != want {
			t.Errorf("joined=%v: a request refused by the looks before the body counted %d times, want %d", joined, got, want)
		}
	}
}

// A step out of order panics rather than counting money wrong. Each case
// has a guard of its own: on one guard alice's attempts of the cases that
// reserve reached her daily line of 3, and the case that came fourth (the
// map's order) was refused before its step.
func TestStepOutOfOrderPanics(t *testing.T) {
	for name, run := range map[string]func(a *Admission){
		"Commit before Reserve": func(a *Admission) { a.Commit(context.Background(), now) },
		"Record before Commit": func(a *Admission) {
			a.Reserve(10, now)
			a.Record(context.Background(), budget.UsageRecord{}, 10, now)
		},
		"End after Reserve": func(a *Admission) { a.Reserve(10, now); a.End(now) },
		"Reserve twice":     func(a *Admission) { a.Reserve(10, now); a.Reserve(10, now) },
	} {
		t.Run(name, func(t *testing.T) {
			g, _ := rateGuard(t, false)
			a := admit(t, g, false)
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
				a.Release()
			}()
			run(a)
		})
	}
}
