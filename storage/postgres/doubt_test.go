package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// The money path across a stop of PostgreSQL (pg_ctl stop -m fast: every
// session ended) on a cluster of the test's own.

// logBuffer is a log that tests read while the instance writes it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// loggedInstance is openInstance with its log kept, on a cluster c with a
// database "money".
func loggedInstance(t *testing.T, c *pgtest.Cluster) (*instance, *instance, *logBuffer) {
	t.Helper()
	admin := openInstance(t, c.URL("postgres"))
	if _, err := admin.db.Pool().Exec(context.Background(), "CREATE DATABASE money"); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, c.URL("money"), postgres.Options{Logger: log, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	m, err := postgres.NewMoney(ctx, db, postgres.MoneyOptions{Location: time.UTC, Now: func() time.Time { return testNow }, OpTimeout: 3 * time.Second})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.Close(ctx)
		db.Close()
	})
	return admin, &instance{db: db, m: m}, logs
}

// Stopped with no read in flight, the database meets only the budget's
// refresh (budget.Global.Refresh, every second: a lease of nothing, no
// give-back), which writes nothing: its failure is a failed read, not a
// money transaction whose commit may have been sent (the ERROR line
// before). The refresh answers again once the database is back.
func TestStopWithNothingInFlightIsNoDoubt(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	_, in, logs := loggedInstance(t, c)
	ctx := context.Background()
	var (
		mu   sync.Mutex
		last error
	)
	stop := make(chan struct{})
	var refreshing sync.WaitGroup
	refreshing.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _, err := in.m.LeaseUnder(ctx, "2026-12-03", 0, 0, budget.Ceilings{})
			mu.Lock()
			last = err
			mu.Unlock()
		}
	})
	time.Sleep(200 * time.Millisecond)
	c.Stop()
	time.Sleep(500 * time.Millisecond)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	answered := func() bool { mu.Lock(); defer mu.Unlock(); return last == nil }
	for deadline := time.Now().Add(10 * time.Second); !answered(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the refresh did not answer again within 10 s of the restart: %v", last)
		}
	}
	close(stop)
	refreshing.Wait()
	if out := logs.String(); strings.Contains(out, "commit was sent") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a refresh that writes nothing was logged as a money transaction in doubt:\n%s", out)
	}
}

// A usage record and a give-back whose transactions were cut off by the
// stop while they waited for a row lock (they never committed), with the
// database gone before they could be read back: their callers are told
// they may have committed, and once the database is back they are read
// back without a restart of the instance: the record's quota hold is
// given back and its call settled, the give-back is written by the next
// lease.
func TestDoubtIsReadBackWhenTheDatabaseReturns(t *testing.T) {
	t.Parallel()
	c := pgtest.NewClusterWith(t, pgtest.Options{Settings: []string{"max_prepared_transactions=1"}})
	admin, in, logs := loggedInstance(t, c)
	slot := alicesReads(t, in)
	ctx := context.Background()
	// The rows the record and the give-back write, locked by a prepared
	// transaction, which outlives the stop: locked from a session, they
	// were freed as the stop ended that session, and a waiter the stop
	// had not reached yet took them and committed (1 run in 10 or so).
	blocker, err := pgx.Connect(ctx, c.URL("money"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"BEGIN", "SELECT * FROM quota_counts WHERE user_id = 'alice' FOR UPDATE",
		"SELECT * FROM ledger_days WHERE day = '2026-12-03' FOR UPDATE", "PREPARE TRANSACTION 'blocker'"} {
		if _, err := blocker.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	blocker.Close(ctx)
	results := make(chan error, 2)
	go func() {
		read := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: 100, Leased: true, LeasedMicroUSD: 1000}
		results <- in.m.RecordUsage(ctx, slot.Month, usageRecord("alice"), read)
	}()
	go func() {
		back := budget.LedgerDay{Day: "2026-12-03", DayTotals: budget.DayTotals{Requests: 1, SpendMicroUSD: 1000}}
		_, _, err := in.m.LeaseUnder(ctx, "", 0, 0, budget.Ceilings{}, back)
		results <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); count(t, admin, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = 'money' AND wait_event_type = 'Lock'`) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the record and the give-back never waited for the locks")
		}
	}
	c.Stop()
	for range 2 {
		if err := <-results; !errors.Is(err, budget.ErrMaybeCommitted) {
			t.Fatalf("a write cut off by the stop, unread: %v, want ErrMaybeCommitted", err)
		}
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if blocker, err = pgx.Connect(ctx, c.URL("money")); err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	if _, err := blocker.Exec(ctx, "ROLLBACK PREPARED 'blocker'"); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, in, logs)
}

// checkReadBack waits (10 s at most: the heartbeat reads the doubts back
// every 5 s) for the record's hold to be given back and for a refresh to
// write the give-back owed, then checks the books after one more refresh,
// which has nothing left to write. The give-back's doubt may be read back
// after the record's: a refresh before that reads (nothing is owed yet).
func checkReadBack(t *testing.T, in *instance, logs *logBuffer) {
	t.Helper()
	ctx := context.Background()
	held := func() int64 {
		var n int64
		if err := in.db.Pool().QueryRow(ctx, "SELECT coalesce(sum(n), 0) FROM quota_holds WHERE user_id = 'alice'").Scan(&n); err != nil {
			return -1
		}
		return n
	}
	refresh := func() {
		if _, _, err := in.m.LeaseUnder(ctx, "2026-12-03", 0, 0, budget.Ceilings{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for ; held() != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("alice's holds are %d 10 s after the database returned, want 1 (the record's given back)\n%s", held(), logs.String())
		}
	}
	for refresh(); count(t, in, "SELECT calls FROM ledger_days WHERE day = '2026-12-03'") == 3; refresh() {
		if time.Now().After(deadline) {
			t.Fatalf("the give-back is not written 10 s after the database returned\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	refresh()
	for query, want := range map[string]int64{
		"SELECT count(*) FROM usage_rows":                                0,
		"SELECT calls FROM ledger_days WHERE day = '2026-12-03'":         2, // 3 leased, 1 given back
		"SELECT settled_calls FROM ledger_days WHERE day = '2026-12-03'": 1, // the record's call, settled apart
		"SELECT micro_usd FROM ledger_days WHERE day = '2026-12-03'":     1100,
	} {
		if got := count(t, in, query); got != want {
			t.Errorf("%s: %d, want %d\n%s", query, got, want, logs.String())
		}
	}
	if out := logs.String(); strings.Count(out, "in doubt is read back") != 2 || strings.Contains(out, "level=ERROR") {
		t.Errorf("the log does not say that both were read back:\n%s", out)
	}
}
