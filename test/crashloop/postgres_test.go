package main

import (
	"context"
	"os"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
)

// TestMain stops the PostgreSQL cluster pgtest started, if any.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestCrashLoopPostgres is the crash loop's short form on backend
// "postgres": the same five rounds (a kill at each failpoint, one at a
// random moment, two at the budget ceiling) against a fresh database,
// with zero violations.
func TestCrashLoopPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	rep, err := Run(ctx, Options{Rounds: 5, Dir: t.TempDir(), Log: t.Logf, Backend: backendPostgres, PostgresURL: pgtest.NewDatabase(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Summary())
	if len(rep.Violations) > 0 {
		t.Fatalf("%d violations", len(rep.Violations))
	}
	for _, k := range []string{killReserved, killRecorded, killRandom, killCeiling} {
		if rep.Kills[k] == 0 {
			t.Errorf("no kill of kind %s: %v", k, rep.Kills)
		}
	}
	if !rep.CeilingReached {
		t.Errorf("the loop did not reach daily_requests %d (ledger %d)", rep.DailyRequests, rep.Ledger)
	}
	if rep.OK == 0 || rep.Calls == 0 || rep.UsageRows == 0 {
		t.Errorf("%d 200s, %d upstream calls, %d usage rows: the load did not run", rep.OK, rep.Calls, rep.UsageRows)
	}
}

// TestRunRefusesABadBackend: a backend the loop does not know, postgres
// without its URL, or a power cut on postgres stop the run before it
// starts anything.
func TestRunRefusesABadBackend(t *testing.T) {
	for _, o := range []Options{
		{Backend: "sqlite"},
		{Backend: backendPostgres},
		{Backend: backendPostgres, PostgresURL: "postgres://127.0.0.1/x", PowerCut: true},
	} {
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v) ran", o)
		}
	}
}
