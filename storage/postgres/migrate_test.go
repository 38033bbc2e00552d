package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

func open(t *testing.T, url string) *postgres.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The shared limits' tests check exact decisions: a loaded machine
	// must not send them to memory after the production bound.
	db, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler), LimitTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Instances starting together on an empty database: the advisory lock lets
// one migrate, the others find the schema done; each migration is recorded
// once.
func TestOpenMigratesOnceWhenInstancesStartTogether(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	var wg sync.WaitGroup
	dbs := make([]*postgres.DB, 4)
	errs := make([]error, 4)
	for i := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dbs[i], errs[i] = postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		defer dbs[i].Close()
		if got := dbs[i].Schema(); got != postgres.LatestSchema() {
			t.Errorf("instance %d at schema %d, want %d", i, got, postgres.LatestSchema())
		}
	}
	var rows, distinct int
	if err := dbs[0].Pool().QueryRow(context.Background(), "SELECT count(*), count(DISTINCT version) FROM breakwater_schema").Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	// Counted from the files: parts of the backend developed side by side
	// number theirs apart (odd, even), so the versions may have gaps.
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if rows != len(files) || distinct != rows {
		t.Errorf("breakwater_schema holds %d rows (%d versions), want one per migration (%d)", rows, distinct, len(files))
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	db := open(t, url)
	newer := postgres.LatestSchema() + 1
	if _, err := db.Pool().Exec(context.Background(), "INSERT INTO breakwater_schema (version, name) VALUES ($1, 'from_the_future')", newer); err != nil {
		t.Fatal(err)
	}
	_, err := postgres.Open(context.Background(), url, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, postgres.ErrNewerSchema) {
		t.Fatalf("Open of a newer schema: %v, want ErrNewerSchema", err)
	}
}

func TestOpenWithoutURLSaysWhereItIsRead(t *testing.T) {
	t.Parallel()
	_, err := postgres.Open(context.Background(), "", postgres.Options{})
	if !errors.Is(err, postgres.ErrNoURL) {
		t.Fatalf("Open(\"\"): %v, want ErrNoURL", err)
	}
}

// A mistyped URL's error must not echo the password it holds.
func TestOpenBadURLDoesNotEchoPassword(t *testing.T) {
	t.Parallel()
	_, err := postgres.Open(context.Background(), "postgres://u:s3cret@127.0.0.1:notaport/db", postgres.Options{})
	if err == nil {
		t.Fatal("Open accepted a URL with a bad port")
	}
	if got := err.Error(); strings.Contains(got, "s3cret") {
		t.Fatalf("error echoes the password: %s", got)
	}
}

// Every session commits synchronously, whatever the server's default.
func TestSessionsCommitSynchronously(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	db := open(t, url)
	// The database's own default says off; the session must still say on.
	name := db.Pool().Config().ConnConfig.Database
	if _, err := db.Pool().Exec(context.Background(), "ALTER DATABASE "+name+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = open(t, url)
	var v string
	if err := db.Pool().QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "on" {
		t.Fatalf("synchronous_commit = %q, want on", v)
	}
}
