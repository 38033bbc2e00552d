package postgres_test

import (
	"context"
	"testing"
	"time"

	"breakwater/server/keys"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

type change struct{ kind, id string }

// listen runs db.Listen until t ends and returns the changes it hears.
func listen(t *testing.T, db *postgres.DB) <-chan change {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan change, 64)
	done := make(chan error, 1)
	go func() { done <- db.Listen(ctx, func(kind, id string) { ch <- change{kind, id} }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Listen returned %v, want context.Canceled", err)
		}
	})
	return ch
}

// await waits until limit after start for want among the changes heard,
// skipping others, and returns how long after start it came.
func await(t *testing.T, ch <-chan change, want change, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	deadline := start.Add(limit)
	for {
		select {
		case c := <-ch:
			if c == want {
				return time.Since(start)
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("no %v within %v", want, limit)
		}
	}
}

// A key created and revoked, a user banned and a flag set through one
// instance reach a listener of another within a second.
func TestChangesReachOtherInstanceWithinASecond(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	heard := listen(t, b)
	await(t, heard, change{postgres.KindResync, ""}, time.Now(), 10*time.Second)

	steps := []struct {
		name string
		do   func() error
		want change
	}{
		{"key created", func() error { return a.CreateKey(newKey("k1", "alice", t0), keys.User{Plan: "free"}) }, change{postgres.KindKey, "k1"}},
		{"key revoked", func() error { _, err := a.RevokeKey("k1", t0.Add(time.Minute)); return err }, change{postgres.KindKey, "k1"}},
		{"user banned", func() error { return a.PutUser(keys.User{ID: "jwt:bob", Banned: true, CreatedAt: t0}) }, change{postgres.KindUser, "jwt:bob"}},
		{"brake on", func() error { return a.SetFlag("brake", true) }, change{postgres.KindFlag, "brake"}},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		took := await(t, heard, s.want, start, time.Second)
		t.Logf("%s: heard by the other instance %v after the call began", s.name, took)
	}
	// A change that fails notifies nothing: the notification is part of
	// the transaction.
	if err := a.CreateKey(newKey("k1", "alice", t0), keys.User{}); err == nil {
		t.Fatal("a duplicate key was stored")
	}
	if err := a.Notify(context.Background(), "marker", "m"); err != nil {
		t.Fatal(err)
	}
	for c := range heard {
		if c == (change{"marker", "m"}) {
			break
		}
		if c.kind == postgres.KindKey {
			t.Fatalf("a failed CreateKey notified %v", c)
		}
	}
}

// A listener whose server restarts reconnects and is told to resync, and
// then hears changes again.
func TestListenerResyncsAfterServerRestart(t *testing.T) {
	t.Parallel()
	cluster := pgtest.NewCluster(t)
	db := open(t, cluster.URL("postgres"))
	heard := listen(t, db)
	await(t, heard, change{postgres.KindResync, ""}, time.Now(), 10*time.Second)

	cluster.Stop()
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	took := await(t, heard, change{postgres.KindResync, ""}, back, 15*time.Second)
	t.Logf("resync %v after the server was back", took)
	// Another instance, started after the restart, changes a flag.
	other := open(t, cluster.URL("postgres"))
	start := time.Now()
	if err := other.SetFlag("brake", true); err != nil {
		t.Fatal(err)
	}
	await(t, heard, change{postgres.KindFlag, "brake"}, start, time.Second)
}
