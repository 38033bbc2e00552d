package postgres

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
)

// An owed give-back deletes only the claim it is owed for: a claim of the
// same key made after it was owed (a retry once the database is back,
// which then reads) is left alone, and the owed one, still there, goes.
func TestOwedGiveBackSparesALaterClaim(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	ctx := context.Background()
	db, err := Open(ctx, pgtest.NewDatabase(t), Options{Logger: slog.New(slog.DiscardHandler), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const ttl = time.Minute
	holder := func(key string) (exists bool) {
		t.Helper()
		if err := db.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM answer_claims WHERE user_id = 'ann' AND key = $1)", key).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		return exists
	}
	for _, key := range []string{"retried", "stale"} {
		if won, err := db.ClaimAnswer(ctx, "ann", key, ttl); err != nil || !won {
			t.Fatalf("claim %s: %v %v", key, won, err)
		}
	}
	// Both releases fail (the database away) and are owed.
	db.oweClaim("ann", "retried", now().Add(db.claimTTL()))
	db.oweClaim("ann", "stale", now().Add(db.claimTTL()))
	// "retried": the claim lapsed meanwhile, and a retry claims the key
	// anew a second later, before the owed give-back is written.
	clock.Add(int64(ttl + time.Second))
	if won, err := db.ClaimAnswer(ctx, "ann", "retried", ttl); err != nil || !won {
		t.Fatalf("the retry's claim: %v %v", won, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for holder("stale") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if holder("stale") {
		t.Error("the owed give-back of the old claim was not written")
	}
	if !holder("retried") {
		t.Error("the owed give-back deleted the retry's claim, made after it was owed: another instance may now read the key too")
	}
}
