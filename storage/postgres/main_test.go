package postgres_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// TestMain runs the tests eight at a time: nearly all are parallel, each
// on a database of its own, and wait on the server more than they use
// this process's CPU (91 s alone at go test's default of two, 81-93 s at
// four, 71 s at eight).
func TestMain(m *testing.M) {
	pgtest.Parallel(8)
	os.Exit(pgtest.Main(m))
}

// migratedDatabase is a new database at the current schema, for t: a copy
// of one that postgres.Open migrated once for this test binary, so that
// a test does not run the migrations again. The tests of the migrations
// themselves start from an empty one (pgtest.NewDatabase).
func migratedDatabase(t testing.TB) string {
	t.Helper()
	return pgtest.NewDatabaseFrom(t, "migrated", func(url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		db, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		db.Close()
		return nil
	})
}
