package postgres_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/guard"
	"breakwater/storage/postgres"
)

// admitGuard is the OCR route's guard as the service wires it on postgres:
// the user's rate window shared in the database (layer 1), the daily
// line and the quotas; shadowed counts the rate refusals let through.
func admitGuard(t *testing.T, in *instance, cfg limiter.Config, shadowed *atomic.Int64) *guard.Guard {
	t.Helper()
	rate, err := limiter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rate.Share(in.db.Limits().Windows("user"), func(err error) { t.Errorf("the shared window failed: %v", err) })
	g, err := guard.New(guard.Layers{Rate: rate, Attempts: in.m.Attempts(), Quotas: in.m.Quotas(), Usage: in.m},
		guard.Hooks{Shadowed: func(_ guard.Request, r *guard.Refusal) {
			if shadowed != nil && r.Layer == guard.LayerRate {
				shadowed.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// admit runs a request through Admit and Reserve, as the OCR route does
// around the upload.
func admit(g *guard.Guard, req guard.Request, now time.Time) *guard.Refusal {
	tk, r := g.Admit(req, now)
	if r == nil {
		r = tk.Reserve(0, now)
	}
	return r
}

// An accepted request's admission is one round trip before its call: the
// rate window, the attempt and the quota slot in one group transaction,
// and no window decision of its own.
func TestAdmissionIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	in := openInstance(t, migratedDatabase(t))
	limits := in.db.Limits()
	g := admitGuard(t, in, limiter.Config{Rate: 5, Window: time.Minute}, nil)
	txs, trips := in.m.Transactions(), limits.WindowTrips()
	if r := admit(g, guard.Request{Key: "ana", DailyLine: 10, MonthlyQuota: 10}, testNow); r != nil {
		t.Fatalf("refused: %+v", r)
	}
	if n := in.m.Transactions() - txs; n != 1 {
		t.Fatalf("the admission committed %d transactions, want 1", n)
	}
	if n := limits.WindowTrips() - trips; n != 0 {
		t.Fatalf("the admission made %d window round trips of its own, want 0", n)
	}
	if n := in.m.Attempts().Count("ana", testNow); n != 1 {
		t.Fatalf("%d attempts counted, want 1", n)
	}
	if n := holds(t, in, "ana"); n != 1 {
		t.Fatalf("%d quota slots held, want 1", n)
	}
}

// rate = 5 a minute, 12 quick requests alternating between two
// instances: exactly 5 pass, and a request the window refuses takes no
// attempt and no slot; then 60 at once over both, for another user:
// exactly the rate passes; a burst of 3 a second likewise.
func TestAdmissionRateExactAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	cfg := limiter.Config{Rate: 5, Window: time.Minute}
	g := [2]*guard.Guard{admitGuard(t, in[0], cfg, nil), admitGuard(t, in[1], cfg, nil)}
	passed := 0
	for i := range 12 {
		r := admit(g[i%2], guard.Request{Key: "bo", DailyLine: 100, MonthlyQuota: 100}, testNow.Add(time.Duration(i)*time.Second))
		switch {
		case r == nil:
			passed++
		case r.Layer != guard.LayerRate || r.Reason != "rate":
			t.Fatalf("request %d refused by %s/%s, want rate", i, r.Layer, r.Reason)
		case r.RetryAfter != time.Minute-time.Duration(i)*time.Second:
			t.Fatalf("request %d: retry after %v, want %v", i, r.RetryAfter, time.Minute-time.Duration(i)*time.Second)
		}
	}
	if passed != 5 {
		t.Fatalf("%d of 12 passed, want 5", passed)
	}
	if n := in[1].m.Attempts().Count("bo", testNow); n != 5 {
		t.Fatalf("%d attempts counted, want 5: a refused request counts none", n)
	}
	if n := holds(t, in[0], "bo"); n != 5 {
		t.Fatalf("%d quota slots held, want 5", n)
	}

	for _, tc := range []struct {
		user string
		cfg  limiter.Config
		want int64
	}{
		{"cy", limiter.Config{Rate: 7, Window: time.Minute}, 7},
		{"di", limiter.Config{Burst: 3}, 3},
	} {
		g := [2]*guard.Guard{admitGuard(t, in[0], tc.cfg, nil), admitGuard(t, in[1], tc.cfg, nil)}
		var (
			ok sync.WaitGroup
			n  atomic.Int64
		)
		for i := range 60 {
			ok.Add(1)
			go func() {
				defer ok.Done()
				if admit(g[i%2], guard.Request{Key: tc.user, DailyLine: 100, MonthlyQuota: 100}, testNow) == nil {
					n.Add(1)
				}
			}()
		}
		ok.Wait()
		if n.Load() != tc.want {
			t.Fatalf("%s: %d of 60 at once passed, want %d", tc.user, n.Load(), tc.want)
		}
		if got := holds(t, in[0], tc.user); got != tc.want {
			t.Fatalf("%s: %d quota slots held, want %d", tc.user, got, tc.want)
		}
	}
}

// In shadow mode the window's refusals let the request through, reported
// once each, and the window counts as when enforcing (a refusal records
// nothing); the attempt and the slot are taken.
func TestAdmissionShadowedRate(t *testing.T) {
	t.Parallel()
	in := openInstance(t, migratedDatabase(t))
	var shadowed atomic.Int64
	g := admitGuard(t, in, limiter.Config{Rate: 3, Window: time.Minute}, &shadowed)
	if err := g.SetShadow(guard.LayerRate); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if r := admit(g, guard.Request{Key: "ed", DailyLine: 100, MonthlyQuota: 100}, testNow.Add(time.Duration(i)*time.Millisecond)); r != nil {
			t.Fatalf("request %d refused in shadow mode: %+v", i, r)
		}
	}
	if n := shadowed.Load(); n != 7 {
		t.Fatalf("%d shadowed rate refusals, want 7", n)
	}
	if n := in.m.Attempts().Count("ed", testNow); n != 10 {
		t.Fatalf("%d attempts, want 10", n)
	}
	if err := g.SetShadow(); err != nil {
		t.Fatal(err)
	}
	if r := admit(g, guard.Request{Key: "ed", DailyLine: 100, MonthlyQuota: 100}, testNow.Add(time.Second)); r == nil || r.Layer != guard.LayerRate {
		t.Fatalf("enforcing again: %+v, want the window's refusal (the shadowed ones recorded nothing, the first 3 are in it)", r)
	}
}

// Admissions of one user that arrive together are one call, decided in
// their order: the window admits the first rate of them; of those, the
// line takes the first line; of those, the quota holds what is left.
func TestAdmissionsTogetherDecideInOrder(t *testing.T) {
	t.Parallel()
	in := openInstance(t, migratedDatabase(t))
	w := in.db.Limits().Windows("user")
	cfg := limiter.Config{Rate: 6, Window: time.Minute}.WithDefaults()
	res, err := in.m.Quotas().AdmitTogether("fa", limiter.Joined{Store: w, Config: cfg, Enforce: true}, 10, 4, 3, testNow)
	if err != nil {
		t.Fatal(err)
	}
	var rate, line, quota, passed int
	for i, a := range res {
		switch {
		case a.Refused != nil:
			rate++
			if i < 6 {
				t.Fatalf("admission %d refused by the window, want the first 6 admitted", i)
			}
		case a.Take != nil:
			line++
		case a.Reserve != nil:
			quota++
		default:
			passed++
		}
	}
	if rate != 4 || line != 2 || quota != 1 || passed != 3 {
		t.Fatalf("rate %d, line %d, quota %d, passed %d; want 4, 2, 1, 3", rate, line, quota, passed)
	}
	if n := holds(t, in, "fa"); n != 3 {
		t.Fatalf("%d slots held, want 3", n)
	}
	if n := in.m.Attempts().Count("fa", testNow); n != 4 {
		t.Fatalf("%d attempts, want 4", n)
	}
}

var _ limiter.SharedWindows = (*postgres.Windows)(nil)

// Under the brake, a request is refused before anything reaches the
// database: the rate window is decided with the attempt and the slot,
// after the budget's look, so a flood under the brake makes no round
// trip at all.
func TestBrakeRefusesWithoutARoundTrip(t *testing.T) {
	t.Parallel()
	in := openInstance(t, migratedDatabase(t))
	limits := in.db.Limits()
	rate, err := limiter.New(limiter.Config{Rate: 1000, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rate.Share(limits.Windows("user"), nil)
	brake := newBrake(t, in, budget.Config{DailyRequests: 1000})
	brake.SetManual(true)
	g, err := guard.New(guard.Layers{Rate: rate, Attempts: in.m.Attempts(), Quotas: in.m.Quotas(), Brake: brake, Usage: in.m}, guard.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	txs, trips := in.m.Transactions(), limits.WindowTrips()
	for i := range 100 {
		if r := admit(g, guard.Request{Key: "gus", DailyLine: 100, MonthlyQuota: 100}, testNow); r == nil || r.Layer != guard.LayerBudget {
			t.Fatalf("request %d under the brake: %+v, want the budget's refusal", i, r)
		}
	}
	if n, w := in.m.Transactions()-txs, limits.WindowTrips()-trips; n != 0 || w != 0 {
		t.Fatalf("100 refusals under the brake made %d transactions and %d window round trips, want none", n, w)
	}
}

// An admission alone in its group is decided by bw_admit_one: one request
// at a time, every branch of it decides as bw_admit would. Rate 3 a
// minute, line 2, quota 1: the first request gets its slot; the second
// its attempt but no slot; the third is over the line (with the line
// enforced, no slot is asked for; with the line only reported, the quota
// refuses it); the fourth is refused by the window, and nothing else is
// taken for it (enforced) or everything is decided as if it passed (shadow).
func TestLoneAdmissionsDecideEveryLayer(t *testing.T) {
	t.Parallel()
	type outcome struct{ rate, line, quota, slot bool }
	for _, c := range []struct {
		name                     string
		enforceRate, enforceLine bool
		want                     []outcome
		attempts, held           int64
	}{
		{"enforced", true, true, []outcome{{slot: true}, {quota: true}, {line: true}, {rate: true}}, 2, 1},
		{"line reported", true, false, []outcome{{slot: true}, {quota: true}, {line: true, quota: true}, {rate: true}}, 2, 1},
		{"rate shadowed", false, true, []outcome{{slot: true}, {quota: true}, {line: true}, {rate: true, line: true}}, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := openInstance(t, migratedDatabase(t))
			q := in.m.Quotas()
			window := limiter.Joined{Store: in.db.Limits().Windows("user"),
				Config: limiter.Config{Rate: 3, Window: time.Minute}.WithDefaults(), Enforce: c.enforceRate}
			txs := in.m.Transactions()
			for i, want := range c.want {
				now := testNow.Add(time.Duration(i) * time.Second)
				slot, refused, take, reserve := q.TakeAndReserve("solo", window, 2, c.enforceLine, 1, now)
				var line *budget.LineError
				var quota *budget.QuotaError
				got := outcome{rate: refused != nil, line: errors.As(take, &line), quota: errors.As(reserve, &quota), slot: slot.User == "solo"}
				if got != want || (take != nil && !got.line) || (reserve != nil && !got.quota) {
					t.Fatalf("request %d: %+v (refused %v, take %v, reserve %v), want %+v", i+1, got, refused, take, reserve, want)
				}
				if refused != nil && (refused.Reason != "rate" || refused.RetryAfter <= 0) {
					t.Fatalf("request %d: window refusal %+v", i+1, refused)
				}
			}
			if n := in.m.Transactions() - txs; n != int64(len(c.want)) {
				t.Fatalf("%d requests in %d transactions: each was to be alone in its group", len(c.want), n)
			}
			if n := in.m.Attempts().Count("solo", testNow); n != c.attempts {
				t.Fatalf("%d attempts counted, want %d", n, c.attempts)
			}
			if n := holds(t, in, "solo"); n != c.held {
				t.Fatalf("%d quota slots held, want %d", n, c.held)
			}
		})
	}
}
