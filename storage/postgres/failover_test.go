package postgres_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// A cooldown is a security decision: a failover to a synchronous standby
// keeps it (migration 0014), with its length for the backoff, though the
// defense layers' other state (rate windows, runs of failures) is in
// UNLOGGED tables, which a standby never receives, and starts empty. The
// primary is killed (kill -9) once the standby has replayed what it wrote.
// Before 0014 the key was admitted after the failover, and the operator's
// list of cooldowns was empty.
func TestCooldownSurvivesFailover(t *testing.T) {
	t.Parallel()
	r := pgtest.NewReplicated(t, true)
	r.CreateDatabase(t, "bw")
	url := r.MultiHostURL("bw")
	db := openFailover(t, url)
	f := db.Limits().Fails("invites")
	cfg := limiter.FailConfig{Limit: 2, Cooldown: time.Hour, Backoff: true}.WithDefaults()
	now := lt0
	keys := []string{"ip:192.0.2.7", "email:guess@example.com"}
	for i := range cfg.Limit {
		if r, err := f.Begin(keys, cfg, now); r != nil || err != nil {
			t.Fatalf("attempt %d: Begin = %v, %v", i, r, err)
		}
		started, _, err := f.Finish(keys, limiter.OutcomeFail, cfg, now, now)
		if err != nil {
			t.Fatal(err)
		}
		if i == cfg.Limit-1 && len(started) != 2 {
			t.Fatalf("the last failure started cooldowns on %v, want both keys", started)
		}
	}
	// A window on the same primary, to show what a failover does reset.
	w := db.Limits().Windows("user")
	wcfg := limiter.Config{Rate: 1, Window: time.Hour}
	if r, err := w.Take("alice", wcfg, now); r != nil || err != nil {
		t.Fatalf("the window's first request: %v, %v", r, err)
	}
	if r, err := w.Take("alice", wcfg, now); r == nil || err != nil {
		t.Fatalf("the window's second request: %v, %v; want refused", r, err)
	}
	if err := r.CaughtUp(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	db.Close()
	r.Primary.Kill()
	if err := r.Promote(); err != nil {
		t.Fatal(err)
	}

	after := openFailover(t, url)
	later := now.Add(time.Minute)
	cooling, err := after.Limits().Fails("invites").Cooling(later)
	if err != nil || len(cooling) != 2 {
		t.Errorf("after the failover the operator sees cooldowns %v (%v), want both keys'", cooling, err)
	}
	f = after.Limits().Fails("invites")
	for _, k := range keys {
		rf, err := f.Begin([]string{k}, cfg, later)
		if err != nil || rf == nil || rf.Reason != limiter.ReasonCooldown || rf.RetryAfter != time.Hour-time.Minute {
			t.Errorf("after the failover, Begin(%s) = %v, %v; want its cooldown, 59m left", k, rf, err)
		}
	}
	// The backoff remembers the cooldown's length: the next one, right
	// after it ends, is doubled.
	end := now.Add(time.Hour)
	for range cfg.Limit {
		if rf, err := f.Begin(keys[:1], cfg, end); rf != nil || err != nil {
			t.Fatalf("after the cooldown: Begin = %v, %v", rf, err)
		}
		if _, _, err := f.Finish(keys[:1], limiter.OutcomeFail, cfg, end, end); err != nil {
			t.Fatal(err)
		}
	}
	if rf, err := f.Begin(keys[:1], cfg, end); err != nil || rf == nil || rf.RetryAfter != 2*time.Hour {
		t.Errorf("the next cooldown after the failover: %v, %v; want 2h (the backoff's double)", rf, err)
	}
	// What a failover resets: the rate window starts empty.
	if rf, err := after.Limits().Windows("user").Take("alice", wcfg, now); rf != nil || err != nil {
		t.Errorf("the rate window after the failover: %v, %v; want it empty (UNLOGGED)", rf, err)
	}
	// The operator's clear lifts it on the logged copy too.
	if ok, err := f.Clear(keys[1]); !ok || err != nil {
		t.Fatalf("Clear = %v, %v", ok, err)
	}
	if cooling, err := f.Cooling(later); err != nil || len(cooling) != 1 || cooling[0].Key != keys[0] {
		t.Errorf("after the clear the cooldowns are %v (%v), want only %s's", cooling, err, keys[0])
	}
	// Once the backoff no longer remembers it, the prune deletes the
	// logged copy too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.PruneFails(ctx, cfg, end.Add(3*time.Hour+limiter.BackoffMemory)); err != nil {
		t.Fatal(err)
	}
	var logged int
	if err := after.Pool().QueryRow(ctx, "SELECT count(*) FROM limit_fail_cooldowns").Scan(&logged); err != nil || logged != 0 {
		t.Errorf("after the prune %d logged cooldowns are left (%v), want none", logged, err)
	}
}

// openFailover opens url with a short limit timeout's patience for a
// server that has just been promoted.
func openFailover(t *testing.T, url string) *postgres.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		db  *postgres.DB
		err error
	)
	for {
		db, err = postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler), LimitTimeout: 10 * time.Second})
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
