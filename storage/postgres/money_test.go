package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/server/api"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

var (
	_ guard.Quotas         = (*postgres.Quotas)(nil)
	_ api.CommitCounter    = (*postgres.Money)(nil)
	_ guard.AttemptCounter = (*postgres.Attempts)(nil)
	_ state.AttemptCounter = (*postgres.Attempts)(nil)
	_ guard.UsageRecorder  = (*postgres.Money)(nil)
	_ budget.SharedLedger  = (*postgres.Money)(nil)
)

// testNow is the clock of the money tests: the middle of a month, so that
// no test crosses a day or a month.
var testNow = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// instance is one "instance" of the service: its own pool on the shared
// database, and its money path.
type instance struct {
	db *postgres.DB
	m  *postgres.Money
}

// openInstance opens an instance on url, closed (cleanly) when t ends
// unless the test crashes it. Its group transactions time out after 3 s.
func openInstance(t testing.TB, url string) *instance {
	t.Helper()
	return openInstanceAt(t, url, func() time.Time { return testNow })
}

// twoInstances opens two instances on one fresh database.
func twoInstances(t testing.TB) [2]*instance {
	url := migratedDatabase(t)
	return [2]*instance{openInstance(t, url), openInstance(t, url)}
}

func usageRecord(user string) budget.UsageRecord {
	return budget.UsageRecord{Time: testNow, UserID: user, KeyID: "k1", RequestID: "r1", Model: "m", Outcome: "ok", CostMicroUSD: 100}
}

// One quota slot left and 20 parallel reservations spread over two
// instances: exactly one gets it, and the others are refused with the
// quota's typed refusal.
func TestQuotaOneSlotLeftAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	const limit = 3
	for range limit - 1 {
		if err := in[0].m.RecordUsage(ctx, "2026-12", usageRecord("alice"), budget.Settlement{}); err != nil {
			t.Fatal(err)
		}
	}
	var won, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := in[i%2].m.Quotas().Reserve("alice", limit, testNow)
			var qe *budget.QuotaError
			switch {
			case err == nil:
				won.Add(1)
			case errors.As(err, &qe) && qe.RetryAfter > 0 && qe.Limit == limit:
				refused.Add(1)
			default:
				t.Errorf("Reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	if won.Load() != 1 || refused.Load() != 19 {
		t.Fatalf("%d reservations won and %d refused, want exactly 1 and 19", won.Load(), refused.Load())
	}
}

// A reserved slot becomes a used read with its usage record, in the same
// transaction: the next reservation sees it used and no longer held, on
// either instance; a released slot is free again.
func TestQuotaRecordAndReleaseAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	q0, q1 := in[0].m.Quotas(), in[1].m.Quotas()
	s, err := q0.Reserve("bob", 2, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := in[0].m.RecordUsage(ctx, s.Month, usageRecord("bob"), budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	if used := q0.Confirm(s); used != 1 {
		t.Fatalf("Confirm = %d, want 1", used)
	}
	s2, err := q1.Reserve("bob", 2, testNow)
	if err != nil {
		t.Fatalf("the second slot on the other instance: %v", err)
	}
	if _, err := q0.Reserve("bob", 2, testNow); !errors.Is(err, budget.ErrQuotaExhausted) {
		t.Fatalf("a third read of two: %v, want the quota's refusal", err)
	}
	q1.Release(s2)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := q0.Reserve("bob", 2, testNow)
		if err == nil {
			break
		}
		if !errors.Is(err, budget.ErrQuotaExhausted) || time.Now().After(deadline) {
			t.Fatalf("after the release: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the release is written behind
	}
	if used := q1.Used("bob", testNow); used != 1 {
		t.Fatalf("Used = %d, want 1", used)
	}
}

// A crashed instance's holds stop counting HoldTTL after its last
// heartbeat (by the reserving request's clock), and not before.
func TestQuotaHoldOfCrashedInstanceExpires(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	if _, err := in[0].m.Quotas().Reserve("carol", 1, testNow); err != nil {
		t.Fatal(err)
	}
	in[0].db.Pool().Close() // the crash: no Close, the heartbeat fails from now on
	q := in[1].m.Quotas()
	if _, err := q.Reserve("carol", 1, testNow.Add(postgres.HoldTTL/2)); !errors.Is(err, budget.ErrQuotaExhausted) {
		t.Fatalf("within the TTL: %v, want the quota's refusal (the crashed read may still be recorded)", err)
	}
	if _, err := q.Reserve("carol", 1, testNow.Add(postgres.HoldTTL+time.Second)); err != nil {
		t.Fatalf("after the TTL: %v, want the slot", err)
	}
}

// The daily line across instances: of 40 parallel attempts over two
// instances, exactly the line's number pass, and the shared count is the
// line.
func TestDailyLineAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	const line = 7
	var passed, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := in[i%2].m.Attempts().Take("dave", line, testNow)
			var le *budget.LineError
			switch {
			case err == nil:
				passed.Add(1)
			case errors.As(err, &le) && le.RetryAfter == 12*time.Hour:
				refused.Add(1)
			default:
				t.Errorf("Take: %v", err)
			}
		}()
	}
	wg.Wait()
	if passed.Load() != line || refused.Load() != 40-line {
		t.Fatalf("%d attempts passed, %d refused; want %d and %d", passed.Load(), refused.Load(), line, 40-line)
	}
	var count int64
	if err := in[0].db.Pool().QueryRow(context.Background(), "SELECT count FROM attempt_counts WHERE user_id = 'dave'").Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != line {
		t.Fatalf("the shared count is %d, want %d", count, line)
	}
	if err := in[1].m.Attempts().Check("dave", line, testNow); !errors.Is(err, budget.ErrDailyLine) {
		t.Fatalf("Check after the line: %v", err)
	}
}

// The usage record is one transaction: the quota count, the usage row
// (with its whole record) and the settlement of its leased call.
func TestRecordUsageWritesRowQuotaAndSettlement(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	m := in[0].m
	if _, ok, err := m.LeaseUnder(ctx, "2026-12-03", 1, 1000, budget.Ceilings{}); err != nil || !ok {
		t.Fatalf("LeaseUnder: %v %v", ok, err)
	}
	rec := usageRecord("erin")
	rec.PromptTokens, rec.CandidatesTokens, rec.LatencyMS = 10, 20, 345
	s := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: 300, Leased: true, LeasedMicroUSD: 1000}
	if err := m.RecordUsage(ctx, "2026-12", rec, s); err != nil {
		t.Fatal(err)
	}
	d, settled, err := m.LedgerDay(ctx, "2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	if d.Requests != 1 || d.SpendMicroUSD != 300 || settled != 300 {
		t.Fatalf("ledger day %+v settled %d, want 1 call, 300 µ$, 300 settled", d, settled)
	}
	st, err := in[1].m.GlobalState(ctx, testNow)
	if err != nil || st.MonthSpend != 300 || st.Requests != 1 {
		t.Fatalf("GlobalState = %+v, %v", st, err)
	}
	used, err := in[1].m.QuotaUsed(ctx, "2026-12")
	if err != nil || used["erin"] != 1 {
		t.Fatalf("QuotaUsed = %v, %v", used, err)
	}
	var body []byte
	var in0, out int64
	if err := in[1].db.Pool().QueryRow(ctx, "SELECT input_tokens, output_tokens, body FROM usage_rows WHERE user_id = 'erin'").Scan(&in0, &out, &body); err != nil {
		t.Fatal(err)
	}
	back, err := postgres.UsageBody(body)
	if err != nil || in0 != 10 || out != 20 || back.LatencyMS != 345 || !back.Time.Equal(rec.Time) {
		t.Fatalf("usage row: in %d out %d %+v %v", in0, out, back, err)
	}
}

// newBrake is budget.Global over an instance's shared ledger.
func newBrake(t testing.TB, in *instance, cfg budget.Config) *budget.Global {
	t.Helper()
	st, err := in.m.GlobalState(context.Background(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	g, err := budget.NewGlobal(cfg, time.UTC, in.m, st)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// cycles runs n parallel claim→commit→settle cycles spread over brakes,
// each call settled at actual, and returns how many calls were made.
func cycles(t *testing.T, brakes []*budget.Global, n int, worst, actual int64) int64 {
	var made atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := brakes[i%len(brakes)]
			r, err := g.Claim(worst, testNow)
			if errors.Is(err, budget.ErrPaused) {
				return
			} else if err != nil {
				t.Errorf("Claim: %v", err)
				return
			}
			if err := g.Commit(context.Background(), &r); errors.Is(err, budget.ErrPaused) {
				if r.Day != "" {
					t.Errorf("a refused claim keeps its day %q: its settlement would write", r.Day)
				}
				return
			} else if err != nil {
				t.Errorf("Commit: %v", err)
				return
			}
			made.Add(1) // the upstream call
			if err := g.Settle(context.Background(), r, actual); err != nil {
				t.Errorf("Settle: %v", err)
			}
		}()
	}
	wg.Wait()
	return made.Load()
}

// 300 parallel cycles over two instances with daily_requests = 30: never
// more than 30 calls, in the cycles and in the ledger, and nearly all of
// the 30 made.
func TestBudgetDailyRequestsAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	cfg := budget.Config{DailyRequests: 30}
	brakes := []*budget.Global{newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)}
	made := cycles(t, brakes, 300, 1000, 400)
	for _, g := range brakes {
		if err := g.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	d, settled, err := in[0].m.LedgerDay(context.Background(), "2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	if made > 30 || d.Requests > 30 {
		t.Fatalf("%d calls made, %d in the ledger: the ceiling of 30 was passed", made, d.Requests)
	}
	if made < 25 || d.Requests != made || settled != made*400 {
		t.Fatalf("%d calls made, ledger %+v settled %d: want at least 25, and the ledger to hold exactly them", made, d, settled)
	}
}

// The same with daily_usd as the only ceiling: the ledger's money never
// passes it, calls in flight held at their worst case.
func TestBudgetDailyUSDAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	cfg := budget.Config{DailyUSD: 0.03} // 30 calls at their worst case of 1000 µ$
	brakes := []*budget.Global{newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)}
	made := cycles(t, brakes, 300, 1000, 1000)
	for _, g := range brakes {
		if err := g.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	d, _, err := in[0].m.LedgerDay(context.Background(), "2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	if made*1000 > 30000 || d.SpendMicroUSD > 30000 {
		t.Fatalf("%d calls made, %d µ$ in the ledger: daily_usd of 30000 µ$ was passed", made, d.SpendMicroUSD)
	}
	if made < 25 || d.SpendMicroUSD != made*1000 {
		t.Fatalf("%d calls made, %d µ$ in the ledger: want at least 25 calls, and the ledger to hold exactly them", made, d.SpendMicroUSD)
	}
}

// A refused top-up is a budget refusal that says which ceiling and when
// it resets: instance A takes the whole day, B's claim passes its own
// view and is refused by the ledger.
func TestBudgetRefusalFromTheSharedLedger(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	cfg := budget.Config{DailyRequests: 2}
	a, b := newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)
	for range 2 {
		r, err := a.Claim(10, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(context.Background(), &r); err != nil {
			t.Fatal(err)
		}
	}
	r, err := b.Claim(10, testNow) // B has not seen A's calls
	if err != nil {
		t.Fatalf("B's claim from its own view: %v", err)
	}
	err = b.Commit(context.Background(), &r)
	var pe *budget.PausedError
	if !errors.As(err, &pe) || pe.Ceiling != "daily_requests" || pe.Busy || pe.RetryAfter != 12*time.Hour {
		t.Fatalf("B's commit: %v, want daily_requests paused until midnight", err)
	}
	// A's 2 calls fill the ledger: the brake is engaged. The figures
	// shown count the calls made (settled): none yet.
	if st := b.Status(testNow); st.Requests != 0 || !st.Engaged || st.EngagedBy != "daily_requests" {
		t.Fatalf("B's view after the refusal: %+v, want no call made yet and the brake engaged by daily_requests", st)
	}
	if _, err := b.Claim(10, testNow); !errors.As(err, &pe) {
		t.Fatalf("B's next claim: %v, want refused from its refreshed view", err)
	}
}

// A lease outlives a crash (the pool dropped without Close); a clean
// Close gives the rest back, so that the ledger holds exactly the calls
// made.
func TestBudgetLeaseCrashAndClose(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	cfg := budget.Config{DailyRequests: 10000} // a lease of 100 calls
	crashed, clean := newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)
	for _, g := range []*budget.Global{crashed, clean} {
		r, err := g.Claim(10, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Commit(ctx, &r); err != nil {
			t.Fatal(err)
		}
		if err := g.Settle(ctx, r, 10); err != nil {
			t.Fatal(err)
		}
	}
	d, _, err := in[1].m.LedgerDay(ctx, "2026-12-03")
	if err != nil || d.Requests != 2*budget.MaxLease(cfg) {
		t.Fatalf("ledger %+v, %v: want two leases of %d", d, err, budget.MaxLease(cfg))
	}
	in[0].db.Pool().Close() // the crash: no Global.Close
	if err := clean.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d, _, err = in[1].m.LedgerDay(ctx, "2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	if want := budget.MaxLease(cfg) + 1; d.Requests != want || d.SpendMicroUSD != 100*10+10 {
		t.Fatalf("after the crash and a clean close: %+v, want the crashed lease (%d calls, 1000 µ$) and the clean call", d, want-1)
	}
}

// PostgreSQL stopped: Reserve, Take, RecordUsage and a lease fail (closed),
// and once it is back they work again on the same pools.
func TestMoneyFailsClosedWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	ctx := context.Background()
	admin := openInstance(t, c.URL("postgres"))
	if _, err := admin.db.Pool().Exec(ctx, "CREATE DATABASE money"); err != nil {
		t.Fatal(err)
	}
	in := openInstance(t, c.URL("money"))
	g := newBrake(t, in, budget.Config{DailyRequests: 1000})
	q := in.m.Quotas()
	c.Stop()
	if _, err := q.Reserve("frank", 5, testNow); err == nil || errors.Is(err, budget.ErrQuotaExhausted) {
		t.Fatalf("Reserve with the database down: %v, want a failure", err)
	}
	if err := in.m.Attempts().Take("frank", 5, testNow); err == nil || errors.Is(err, budget.ErrDailyLine) {
		t.Fatalf("Take with the database down: %v, want a failure", err)
	}
	if err := in.m.RecordUsage(ctx, "2026-12", usageRecord("frank"), budget.Settlement{}); err == nil {
		t.Fatal("RecordUsage with the database down succeeded")
	}
	r, err := g.Claim(10, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(ctx, &r); !errors.Is(err, budget.ErrLedger) {
		t.Fatalf("Commit with the database down: %v, want ErrLedger", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	s, err := q.Reserve("frank", 5, testNow)
	if err != nil {
		t.Fatalf("Reserve after the restart: %v", err)
	}
	if err := in.m.RecordUsage(ctx, s.Month, usageRecord("frank"), budget.Settlement{}); err != nil {
		t.Fatalf("RecordUsage after the restart: %v", err)
	}
	r, err = g.Claim(10, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(ctx, &r); err != nil {
		t.Fatalf("Commit after the restart: %v", err)
	}
}

// Refresh brings the other instances' calls into an instance's view, so
// that its Status (the dashboard's figures) and Check are the service's.
func TestBudgetRefreshSeesTheOtherInstance(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	cfg := budget.Config{DailyRequests: 5}
	a, b := newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)
	for range 5 {
		r, err := a.Claim(10, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(ctx, &r); err != nil {
			t.Fatal(err)
		}
		if err := a.Settle(ctx, r, 7); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Check(testNow); err != nil {
		t.Fatalf("B before a refresh: %v (its view is its own)", err)
	}
	if err := b.Refresh(ctx, testNow); err != nil {
		t.Fatal(err)
	}
	st := b.Status(testNow)
	if st.Requests != 5 || st.SpendMicroUSD != 35 || st.MonthMicroUSD != 35 || !st.Engaged || st.EngagedBy != "daily_requests" {
		t.Fatalf("B's status after a refresh: %+v, want A's 5 calls and 35 µ$, engaged by daily_requests", st)
	}
	if err := b.Check(testNow); !errors.Is(err, budget.ErrPaused) {
		t.Fatalf("B's Check after a refresh: %v, want paused", err)
	}
}

// The month's spend shown (budget, the dashboard, /metrics) is its settled
// costs, as the day's is: not the ledger's month, which also holds every
// live instance's unused lease.
func TestMonthFigureIsSettled(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	// An earlier day of the month, settled at 500 µ$, its leases given back.
	if _, err := in[0].db.Pool().Exec(ctx, `INSERT INTO ledger_days (day, calls, micro_usd, settled_micro_usd, settled_calls)
		VALUES ('2026-12-01', 1, 500, 500, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := in[0].db.Pool().Exec(ctx, `INSERT INTO ledger_months (month, micro_usd) VALUES ('2026-12', 500)`); err != nil {
		t.Fatal(err)
	}
	cfg := budget.Config{DailyRequests: 1000, DailyUSD: 100, MonthlyUSD: 1000} // leases of 10 calls
	a := newBrake(t, in[0], cfg)
	r, err := a.Claim(1000, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(ctx, &r); err != nil {
		t.Fatal(err)
	}
	if err := a.Settle(ctx, r, 378); err != nil {
		t.Fatal(err)
	}
	var ledgerMonth int64
	if err := in[0].db.Pool().QueryRow(ctx, "SELECT micro_usd FROM ledger_months WHERE month = '2026-12'").Scan(&ledgerMonth); err != nil || ledgerMonth < 5000 {
		t.Fatalf("the ledger's month: %d, %v; want A's lease in it", ledgerMonth, err)
	}
	if st := a.Status(testNow); st.SpendMicroUSD != 378 || st.MonthMicroUSD != 878 {
		t.Errorf("A's status: day %d, month %d µ$; want 378 and 878, as settled", st.SpendMicroUSD, st.MonthMicroUSD)
	}
	b := newBrake(t, in[1], cfg)
	if st := b.Status(testNow); st.SpendMicroUSD != 378 || st.MonthMicroUSD != 878 {
		t.Errorf("B's status at its start: day %d, month %d µ$; want 378 and 878", st.SpendMicroUSD, st.MonthMicroUSD)
	}
	if err := a.Refresh(ctx, testNow); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(testNow); st.MonthMicroUSD != 878 {
		t.Errorf("A's month after a refresh: %d µ$, want 878", st.MonthMicroUSD)
	}
}

// The operator's figures of the daily line are every instance's.
func TestAttemptsCountAndTopAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	for i, user := range []string{"gina", "gina", "gina", "hank", "hank", "ivan"} {
		if err := in[i%2].m.Attempts().Take(user, 0, testNow); err != nil {
			t.Fatal(err)
		}
	}
	if n := in[0].m.Attempts().Count("hank", testNow); n != 2 {
		t.Fatalf("Count(hank) = %d, want 2", n)
	}
	top := in[1].m.Attempts().Top(2, testNow)
	want := []budget.UserCount{{User: "gina", Count: 3}, {User: "hank", Count: 2}}
	if len(top) != 2 || top[0] != want[0] || top[1] != want[1] {
		t.Fatalf("Top(2) = %+v, want %+v", top, want)
	}
	if day, dirty := in[0].m.Attempts().Dirty(); day != "2026-12-03" || len(dirty) != 0 {
		t.Fatalf("Dirty = %q %v, want today and nothing to write behind", day, dirty)
	}
}

// A daily_usd refusal from the shared ledger is busy (a short wait) while
// only the worst cases of calls in flight on another instance fill the
// day, and paused until midnight once settled money does.
func TestBudgetDailyUSDRefusalBusyThenPaused(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	cfg := budget.Config{DailyUSD: 0.01} // 10000 µ$: two calls at their worst case of 5000
	a, b := newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)
	var flying []budget.Reservation
	for range 2 {
		r, err := a.Claim(5000, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(ctx, &r); err != nil {
			t.Fatal(err)
		}
		flying = append(flying, r)
	}
	commitB := func() error {
		r, err := b.Claim(5000, testNow)
		if err != nil {
			return err
		}
		return b.Commit(ctx, &r)
	}
	var pe *budget.PausedError
	if err := commitB(); !errors.As(err, &pe) || pe.Ceiling != "daily_usd" || !pe.Busy || pe.RetryAfter != budget.BusyRetryAfter {
		t.Fatalf("B with A's two calls in flight: %v, want daily_usd busy", err)
	}
	for _, r := range flying {
		if err := a.Settle(ctx, r, 1000); err != nil {
			t.Fatal(err)
		}
	}
	rb, err := b.Claim(5000, testNow)
	if err != nil {
		t.Fatalf("B once A's calls settled at 1000 µ$ each: %v", err)
	}
	if err := b.Commit(ctx, &rb); err != nil {
		t.Fatalf("B once A's calls settled at 1000 µ$ each: %v", err)
	}
	// The day holds 2000 settled and B's 5000 in flight: A is busy.
	commitA := func() error {
		r, err := a.Claim(5000, testNow)
		if err != nil {
			return err
		}
		return a.Commit(ctx, &r)
	}
	if err := commitA(); !errors.As(err, &pe) || pe.Ceiling != "daily_usd" || !pe.Busy {
		t.Fatalf("A with B's call in flight: %v, want daily_usd busy", err)
	}
	// B's call settles at its worst: 7000 spent, a call of 5000 does not
	// fit today, whatever settles.
	if err := b.Settle(ctx, rb, 5000); err != nil {
		t.Fatal(err)
	}
	if err := commitA(); !errors.As(err, &pe) || pe.Ceiling != "daily_usd" || pe.Busy || pe.RetryAfter != 12*time.Hour {
		t.Fatalf("A once 7000 are settled: %v, want daily_usd paused until midnight", err)
	}
	d, settled, err := in[0].m.LedgerDay(ctx, "2026-12-03")
	if err != nil || d.SpendMicroUSD != 7000 || settled != 7000 {
		t.Fatalf("ledger %+v settled %d (%v), want 7000 and 7000", d, settled, err)
	}
}

// 300 whole reads over two instances and five users who contend for the
// same rows: Take, Reserve, Claim, Commit, then a usage record, or for
// every seventh read a failure that gives the slot back. No write fails
// (the group transactions lock in one order), and every count is exact:
// each user's quota holds the reads recorded and never passes its limit,
// the daily line the attempts, the ledger the calls.
func TestWholeReadsAcrossInstancesStayExact(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	cfg := budget.Config{DailyRequests: 1000, DailyUSD: 100}
	brakes := [2]*budget.Global{newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)}
	const quota, line = 40, 55
	users := []string{"u0", "u1", "u2", "u3", "u4"}
	var recorded [5]atomic.Int64
	var calls atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, u := i%2, i%len(users)
			m, g := in[k].m, brakes[k]
			if err := m.Attempts().Take(users[u], line, testNow); errors.Is(err, budget.ErrDailyLine) {
				return
			} else if err != nil {
				t.Errorf("Take: %v", err)
				return
			}
			slot, err := m.Quotas().Reserve(users[u], quota, testNow)
			if errors.Is(err, budget.ErrQuotaExhausted) {
				return
			} else if err != nil {
				t.Errorf("Reserve: %v", err)
				return
			}
			r, err := g.Claim(1000, testNow)
			if err == nil {
				err = g.Commit(ctx, &r)
			}
			if err != nil {
				t.Errorf("Claim or Commit: %v", err)
				m.Quotas().Release(slot)
				return
			}
			calls.Add(1)
			if i%7 == 3 { // the upstream call failed
				if err := g.Settle(ctx, r, 1000); err != nil {
					t.Errorf("Settle: %v", err)
				}
				m.Quotas().Release(slot)
				return
			}
			if err := m.RecordUsage(ctx, slot.Month, usageRecord(users[u]), r.Settlement(300)); err != nil {
				t.Errorf("RecordUsage: %v", err)
				return
			}
			g.Settled(r, 300)
			m.Quotas().Confirm(slot)
			recorded[u].Add(1)
		}()
	}
	wg.Wait()
	for _, g := range brakes {
		if err := g.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	used, err := in[0].m.QuotaUsed(ctx, "2026-12")
	if err != nil {
		t.Fatal(err)
	}
	var rows, total int64
	for u, user := range users {
		total += recorded[u].Load()
		if used[user] != recorded[u].Load() || used[user] > quota {
			t.Errorf("%s: quota count %d, %d reads recorded, limit %d", user, used[user], recorded[u].Load(), quota)
		}
		if n := in[1].m.Attempts().Count(user, testNow); n != min(60, line) {
			t.Errorf("%s: %d attempts counted, want %d", user, n, min(60, line))
		}
	}
	if err := in[0].db.Pool().QueryRow(ctx, "SELECT count(*) FROM usage_rows").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	d, settled, err := in[0].m.LedgerDay(ctx, "2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	failed := calls.Load() - total
	if rows != total || d.Requests != calls.Load() || settled != total*300+failed*1000 || d.SpendMicroUSD != settled {
		t.Fatalf("%d usage rows, %d recorded; ledger %+v settled %d, for %d calls (%d failed)", rows, total, d, settled, calls.Load(), failed)
	}
}

// A clean Close gives this instance's holds back at once.
func TestQuotaHoldsGivenBackOnClose(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	if _, err := in[0].m.Quotas().Reserve("judy", 1, testNow); err != nil {
		t.Fatal(err)
	}
	if _, err := in[1].m.Quotas().Reserve("judy", 1, testNow); !errors.Is(err, budget.ErrQuotaExhausted) {
		t.Fatalf("while A holds the slot: %v, want the quota's refusal", err)
	}
	if err := in[0].m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := in[1].m.Quotas().Reserve("judy", 1, testNow); err != nil {
		t.Fatalf("after A's Close: %v, want the slot", err)
	}
	if _, err := in[0].m.Quotas().Reserve("judy", 5, testNow); !errors.Is(err, postgres.ErrClosed) {
		t.Fatalf("Reserve on a closed money path: %v, want ErrClosed", err)
	}
}

// MoneyOptions.KeepAnswer's statements run in the usage record's
// transaction: a kept answer and its read are one commit, and a failing
// one fails the record whole.
func TestKeepAnswerInTheUsageTransaction(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	ctx := context.Background()
	db := open(t, url)
	if _, err := db.Pool().Exec(ctx, "CREATE TABLE kept (request_id text PRIMARY KEY, body bytea NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	m, err := postgres.NewMoney(ctx, db, postgres.MoneyOptions{Location: time.UTC, KeepAnswer: func(b *pgx.Batch, rec budget.UsageRecord) error {
		b.Queue("INSERT INTO kept (request_id, body) VALUES ($1, $2)", rec.RequestID, rec.Answer.Body)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	rec := usageRecord("kate")
	rec.Answer = &budget.Answer{Status: 200, Body: []byte(`{"serials":["A1"]}`)}
	if err := m.RecordUsage(ctx, "2026-12", rec, budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	if err := m.RecordUsage(ctx, "2026-12", rec, budget.Settlement{}); err == nil {
		t.Fatal("a record whose kept answer fails (the same request id) was committed")
	}
	var kept, rows, used int64
	err = db.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM kept), (SELECT count(*) FROM usage_rows),
		(SELECT used FROM quota_counts WHERE user_id = 'kate')`).Scan(&kept, &rows, &used)
	if err != nil || kept != 1 || rows != 1 || used != 1 {
		t.Fatalf("kept %d, usage rows %d, quota used %d (%v): want one of each", kept, rows, used, err)
	}
}

// monthly_usd is checked on the month's row: a lease that fits the day
// but not the month is refused whole (the day keeps nothing of it).
func TestBudgetMonthlyUSDAcrossDays(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	if err := in[0].m.Lease(ctx, "2026-12-01", 3, 8000); err != nil { // spent earlier this month
		t.Fatal(err)
	}
	g := newBrake(t, in[1], budget.Config{MonthlyUSD: 0.01})
	r, err := g.Claim(1500, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(ctx, &r); err != nil {
		t.Fatalf("a call of 1500 with 2000 left this month: %v", err)
	}
	r, err = g.Claim(1500, testNow)
	if err == nil {
		err = g.Commit(ctx, &r)
	}
	var pe *budget.PausedError
	if !errors.As(err, &pe) || pe.Ceiling != "monthly_usd" {
		t.Fatalf("a second call of 1500: %v, want monthly_usd", err)
	}
	d, _, err := in[0].m.LedgerDay(ctx, "2026-12-03")
	if err != nil || d.Requests != 1 || d.SpendMicroUSD != 1500 {
		t.Fatalf("today %+v (%v), want the one call of 1500", d, err)
	}
	st, err := in[0].m.GlobalState(ctx, testNow)
	if err != nil || st.MonthSpend != 9500 {
		t.Fatalf("month %+v (%v), want 9500", st, err)
	}
	tot, ok, err := in[0].m.LeaseUnder(ctx, "2026-12-03", 1, 1500, budget.Ceilings{DailyMicroUSD: 100000, MonthlyMicroUSD: 10000})
	if err != nil || ok || tot.Requests != 1 || tot.SpendMicroUSD != 1500 || tot.MonthMicroUSD != 9500 {
		t.Fatalf("LeaseUnder past the month: %+v %v %v, want refused with the day as it was", tot, ok, err)
	}
}

// openInstanceAt is openInstance with the clock now (of its lease's
// dead-instance cutoff and its heartbeat).
func openInstanceAt(t testing.TB, url string, now func() time.Time) *instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler), MaxConns: 8})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	m, err := postgres.NewMoney(ctx, db, postgres.MoneyOptions{Location: time.UTC, Now: now, OpTimeout: 3 * time.Second})
	if err != nil {
		db.Close()
		t.Fatalf("NewMoney: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.Close(ctx)
		db.Close()
	})
	return &instance{db: db, m: m}
}

// TestBudgetDeadInstanceRestIsSpent: an instance crashes holding the rest
// of daily_usd (two calls in flight at their worst case, never settled).
// While it may still be alive (within HoldTTL of its last heartbeat) the
// other instance is busy (the calls may settle); once it is dead its rest
// counts as spent: the ceiling is reached, paused until midnight, and
// Status says the brake is engaged. Before ledger_rests the other instance
// stayed busy for the rest of the day.
func TestBudgetDeadInstanceRestIsSpent(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	crashed := openInstance(t, url)
	var clock atomic.Int64
	clock.Store(testNow.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	survivor := openInstanceAt(t, url, now)
	ctx := context.Background()
	cfg := budget.Config{DailyUSD: 0.01} // 10000 µ$: two calls at their worst case of 5000
	a, b := newBrake(t, crashed, cfg), newBrake(t, survivor, cfg)
	for range 2 {
		r, err := a.Claim(5000, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(ctx, &r); err != nil {
			t.Fatal(err)
		}
	}
	crashed.db.Pool().Close() // the crash: its calls never settle
	commitB := func(at time.Time) error {
		clock.Store(at.UnixNano())
		r, err := b.Claim(5000, at)
		if err != nil {
			return err
		}
		return b.Commit(ctx, &r)
	}
	var pe *budget.PausedError
	if err := commitB(testNow.Add(postgres.HoldTTL / 2)); !errors.As(err, &pe) || pe.Ceiling != "daily_usd" || !pe.Busy {
		t.Fatalf("within the TTL of the crashed instance's heartbeat: %v, want daily_usd busy", err)
	}
	late := testNow.Add(postgres.HoldTTL + time.Second)
	if err := commitB(late); !errors.As(err, &pe) || pe.Ceiling != "daily_usd" || pe.Busy || pe.RetryAfter != 12*time.Hour-postgres.HoldTTL-time.Second {
		t.Fatalf("once the crashed instance is dead: %v, want daily_usd paused until midnight", err)
	}
	if st := b.Status(late); !st.Engaged || st.EngagedBy != "daily_usd" {
		t.Fatalf("Status once the crashed instance is dead: %+v, want engaged by daily_usd", st)
	}
}

// TestBudgetFiguresAreTheCallsMade: the figures shown (Status on any
// instance, BudgetDays) are the calls settled and their cost, every
// instance's, while the ledger's totals also hold both instances' unused
// leases.
func TestBudgetFiguresAreTheCallsMade(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	cfg := budget.Config{DailyRequests: 10000} // a lease of 100 calls
	a, b := newBrake(t, in[0], cfg), newBrake(t, in[1], cfg)
	for i, g := range []*budget.Global{a, a, a, b} {
		r, err := g.Claim(500, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Commit(ctx, &r); err != nil {
			t.Fatal(err)
		}
		if err := g.Settle(ctx, r, int64(100*(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	d, _, err := in[0].m.LedgerDay(ctx, "2026-12-03")
	if err != nil || d.Requests != 2*budget.MaxLease(cfg) {
		t.Fatalf("ledger %+v, %v: want two leases of %d", d, err, budget.MaxLease(cfg))
	}
	if err := a.Refresh(ctx, testNow); err != nil {
		t.Fatal(err)
	}
	for name, g := range map[string]*budget.Global{"A": a, "B": b} {
		if st := g.Status(testNow); st.Requests != 4 || st.SpendMicroUSD != 1000 {
			t.Errorf("%s's Status: %d calls, %d µ$; want the service's 4 calls, 1000 µ$", name, st.Requests, st.SpendMicroUSD)
		}
	}
	days, err := in[1].db.BudgetDays("2026-12-01", "2026-12-31")
	if want := []budget.LedgerDay{{Day: "2026-12-03", DayTotals: budget.DayTotals{Requests: 4, SpendMicroUSD: 1000}}}; err != nil || !reflect.DeepEqual(days, want) {
		t.Errorf("BudgetDays = %+v, %v; want %+v", days, err, want)
	}
}

// Takes of one row that share a group transaction are one statement
// (rows.go), and grant exactly what one statement each would have: in
// the callers' order, as many as fit under the line or the limit, with
// another instance's holds counted.
func TestMergedTakesGrantWhatFits(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	a := in[0].m.Attempts()
	for range 2 {
		if err := a.Take("erin", 5, testNow); err != nil {
			t.Fatal(err)
		}
	}
	taken, counts, err := a.TakeTogether("erin", 5, 6, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if taken != 3 || counts[0] != 5 || counts[5] != 5 {
		t.Fatalf("6 attempts together at 2 of 5: %d taken, counts %v; want 3, and 5 for each", taken, counts)
	}
	if taken, _, err := a.TakeTogether("erin", 0, 4, testNow); err != nil || taken != 4 {
		t.Fatalf("4 attempts without a line: %d taken (%v), want 4", taken, err)
	}
	if n := in[1].m.Attempts().Count("erin", testNow); n != 9 {
		t.Fatalf("the shared count is %d, want 9", n)
	}

	ctx := context.Background()
	if err := in[0].m.RecordUsage(ctx, "2026-12", usageRecord("frank"), budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	if _, err := in[1].m.Quotas().Reserve("frank", 4, testNow); err != nil { // the other instance holds one
		t.Fatal(err)
	}
	held, err := in[0].m.Quotas().ReserveTogether("frank", 4, 5, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if held != 2 {
		t.Fatalf("5 reservations together with 1 used and 1 held of 4: %d held, want 2", held)
	}
	if _, err := in[1].m.Quotas().Reserve("frank", 4, testNow); !errors.Is(err, budget.ErrQuotaExhausted) {
		t.Fatalf("after them: %v, want the quota's refusal", err)
	}
}

// The counters (attempts, quota holds) commit without waiting for the
// disk, the usage records with it; the session's own setting stays on,
// whatever transaction last ran on the connection.
func TestCountersCommitWithoutWaitingForTheDisk(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	pool := in[0].db.Pool()
	unflushed := func() bool {
		var ahead bool
		if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()").Scan(&ahead); err != nil {
			t.Fatal(err)
		}
		return ahead
	}
	var lagged int
	for i := range 20 {
		if err := in[0].m.Attempts().Take(fmt.Sprintf("user%d", i), 0, testNow); err != nil {
			t.Fatal(err)
		}
		if unflushed() {
			lagged++
		}
	}
	if lagged == 0 {
		t.Error("no attempt's commit was left for PostgreSQL to write: the counters waited for the disk")
	}
	for range 5 {
		if err := in[0].m.RecordUsage(ctx, "2026-12", usageRecord("gina"), budget.Settlement{}); err != nil {
			t.Fatal(err)
		}
	}
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		var v string
		if err := c.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil || v != "on" {
			t.Fatalf("a connection's synchronous_commit = %q (%v), want on", v, err)
		}
	}
}
