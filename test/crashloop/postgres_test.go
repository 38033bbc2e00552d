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
	runShortLoop(t, 120*time.Second, Options{Backend: backendPostgres, PostgresURL: pgtest.NewDatabase(t)})
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
