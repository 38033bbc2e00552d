package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// Through PgBouncer in session mode Open connects (it once sent
// synchronous_commit in the start-up message, which PgBouncer refuses
// with "unsupported startup parameter"), every session still commits
// synchronously though the database's default says otherwise, and carries
// Breakwater's application_name; Probe, connecting the same way, finds the
// same.
func TestOpenThroughPgBouncerSessionMode(t *testing.T) {
	t.Parallel()
	direct := pgtest.NewDatabase(t)
	setup := open(t, direct)
	name := setup.Pool().Config().ConnConfig.Database
	if _, err := setup.Pool().Exec(context.Background(), "ALTER DATABASE "+name+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	b := pgtest.NewBouncer(t, direct, pgtest.BouncerOptions{Mode: "session"})
	db := open(t, b.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Several sessions at once, each its own server session.
	var conns []interface{ Release() }
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for i := range 3 {
		c, err := db.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var sync, app string
		if err := c.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('application_name')").Scan(&sync, &app); err != nil {
			t.Fatal(err)
		}
		if sync != "on" || app != "breakwater" {
			t.Errorf("session %d through PgBouncer: synchronous_commit = %q, application_name = %q; want on, breakwater", i, sync, app)
		}
	}
	f, err := postgres.Probe(ctx, b.URL())
	if err != nil {
		t.Fatalf("Probe through PgBouncer in session mode: %v\n%s", err, b.Log())
	}
	if f.SynchronousCommit != "off" || f.Schema != postgres.LatestSchema() {
		t.Errorf("Probe found synchronous_commit %q and schema %d, want the database's own (off) and %d", f.SynchronousCommit, f.Schema, postgres.LatestSchema())
	}
}

// Through PgBouncer in transaction or statement mode, with one server
// connection or many, Open and Probe refuse with ErrPooledTransactions
// (LISTEN, session locks and settings would not hold), and create nothing;
// in session mode, with one server connection per client, both pass.
func TestOpenRefusesTransactionPooling(t *testing.T) {
	t.Parallel()
	type pooler struct {
		mode     string
		size     int
		settings []string
	}
	// PgBouncer gives the last server connection released first: the
	// NOTIFY then runs on the listening session itself. In turn (with a
	// few server connections open before) it runs on another, and the
	// listener waits for a notification that cannot reach it.
	roundRobin := []string{"server_round_robin = 1", "min_pool_size = 4"}
	cases := []pooler{
		{"transaction", 1, nil}, {"transaction", 2, nil}, {"transaction", 20, nil}, {"transaction", 20, roundRobin},
		{"statement", 1, nil}, {"statement", 20, nil}, {"statement", 20, roundRobin},
		{"session", 2, nil}, {"session", 20, nil}, {"session", 20, roundRobin},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s, %d server connections %v", c.mode, c.size, c.settings), func(t *testing.T) {
			t.Parallel() // a database and a PgBouncer of its own; the round-robin cases wait out the probe twice
			direct := pgtest.NewDatabase(t)
			b := pgtest.NewBouncer(t, direct, pgtest.BouncerOptions{Mode: c.mode, PoolSize: c.size, Settings: c.settings})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c.settings != nil { // let PgBouncer open its min_pool_size
				if _, err := postgres.Probe(ctx, direct); err != nil {
					t.Fatal(err)
				}
				conn, err := pgx.Connect(ctx, b.URL())
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(1500 * time.Millisecond)
				conn.Close(ctx)
			}
			start := time.Now()
			_, perr := postgres.Probe(ctx, b.URL())
			probed := time.Since(start)
			db, oerr := postgres.Open(ctx, b.URL(), postgres.Options{Logger: slog.New(slog.DiscardHandler)})
			if oerr == nil {
				db.Close()
			}
			t.Logf("Probe: %v after %v; Open: %v", perr, probed.Round(time.Millisecond), oerr)
			if c.mode == "session" {
				if perr != nil || oerr != nil {
					t.Fatalf("session mode: Probe %v, Open %v, want both to pass\n%s", perr, oerr, b.Log())
				}
				return
			}
			if !errors.Is(perr, postgres.ErrPooledTransactions) || !errors.Is(oerr, postgres.ErrPooledTransactions) {
				t.Fatalf("%s mode: Probe %v, Open %v, want both %v\n%s", c.mode, perr, oerr, postgres.ErrPooledTransactions, b.Log())
			}
			// Refused before the migrations: the database is as it was.
			if f, err := postgres.Probe(ctx, direct); err != nil || f.Schema != 0 {
				t.Errorf("after the refusals the database is at schema %d (%v), want 0 (untouched)", f.Schema, err)
			}
		})
	}
}

// Behind PgBouncer in session mode a usage record whose commit outlasts
// the instance's timeout (a synchronous standby that never answers) is
// read back as on a direct connection: the session that sent it is found
// (by its server pid, not the pooler's ids) and ended, the token read,
// and the record counted once, with no error to undo it.
func TestStalledCommitIsReadBackBehindPgBouncer(t *testing.T) {
	t.Parallel()
	c, admin, _ := stalledCluster(t)
	b := pgtest.NewBouncer(t, c.URL("money"), pgtest.BouncerOptions{Mode: "session", PoolSize: 30})
	in := openInstance(t, b.URL())
	slot := alicesReads(t, in)
	standby(t, admin, true)
	read := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: 100, Leased: true, LeasedMicroUSD: 1000}
	if err := in.m.RecordUsage(context.Background(), slot.Month, usageRecord("alice"), read); err != nil {
		t.Fatalf("RecordUsage whose commit outlasted the timeout, behind PgBouncer: %v, want no error (it committed)\n%s", err, b.Log())
	}
	standbyOff(t, admin)
	for query, want := range map[string]int64{
		"SELECT count(*) FROM usage_rows":                                    1,
		"SELECT used FROM quota_counts WHERE user_id = 'alice'":              1,
		"SELECT settled_calls FROM ledger_days WHERE day = '2026-12-03'":     1,
		"SELECT micro_usd FROM ledger_days WHERE day = '2026-12-03'":         100 + 2000, // settled, and the rest still leased
		"SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'": 0,
	} {
		if got := count(t, in, query); got != want {
			t.Errorf("%s: %d, want %d", query, got, want)
		}
	}
	if used := in.m.Quotas().Confirm(slot); used != 1 {
		t.Errorf("Confirm after the record: %d reads used, want 1", used)
	}
}
