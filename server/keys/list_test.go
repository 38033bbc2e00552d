package keys_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/server/keys"
	"breakwater/storage"
)

// TestKeyringListReadsStorage: keys are listed from storage, oldest
// first, with what every change made of them at once (a revocation, a new
// plan), by the keyring that made the changes and by a new one on the same
// file (a restart, or an operator command while the server is stopped).
func TestKeyringListReadsStorage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bw.db")
	db, err := storage.Open(path, storage.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	plans := keys.NewPlans(map[string]budget.Plan{"free": {}, "pro": {}})
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	k, err := keys.NewKeyring(db, plans.Has, keys.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	create := func(user, plan string) (string, keys.KeyInfo) {
		t.Helper()
		secret, info, err := k.Create(user, plan)
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
		return secret, info
	}
	bobSecret, bob := create("bob", "pro")
	aliceSecret, alice := create("alice", "")
	revokedSecret, revoked := create("alice", "")
	if _, err := k.Revoke(revoked.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.SetPlan("alice", "pro"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.SetBanned("bob", true, false); err != nil {
		t.Fatal(err)
	}
	want := []keys.KeyInfo{
		{ID: bob.ID, UserID: "bob", Plan: "pro", CreatedAt: start},
		{ID: alice.ID, UserID: "alice", Plan: "pro", CreatedAt: start.Add(time.Minute)},
		{ID: revoked.ID, UserID: "alice", Plan: "pro", CreatedAt: start.Add(2 * time.Minute), RevokedAt: start.Add(3 * time.Minute)},
	}
	check := func(t *testing.T, k *keys.Keyring) {
		t.Helper()
		list, err := k.List()
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != len(want) {
			t.Fatalf("list %+v, want %+v", list, want)
		}
		for i := range want {
			if got := list[i]; got.ID != want[i].ID || got.UserID != want[i].UserID || got.Plan != want[i].Plan ||
				!got.CreatedAt.Equal(want[i].CreatedAt) || !got.RevokedAt.Equal(want[i].RevokedAt) {
				t.Errorf("key %d: %+v, want %+v", i, got, want[i])
			}
		}
		for _, tt := range []struct {
			name, secret string
			ok, banned   bool
		}{
			{"bob", bobSecret, true, true},
			{"alice", aliceSecret, true, false},
			{"revoked", revokedSecret, false, false},
		} {
			id, banned, ok := k.Authenticate(tt.secret)
			if ok != tt.ok || banned != tt.banned || (ok && id.Plan != "pro") {
				t.Errorf("%s: %+v banned %v ok %v, want ok %v banned %v on pro", tt.name, id, banned, ok, tt.ok, tt.banned)
			}
		}
	}
	t.Run("running", func(t *testing.T) { check(t, k) })
	t.Run("reloaded", func(t *testing.T) {
		k, err := keys.NewKeyring(db, plans.Has, keys.Options{Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		check(t, k)
	})
	t.Run("reopened", func(t *testing.T) {
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if db, err = storage.Open(path, storage.Options{Timeout: time.Second}); err != nil {
			t.Fatal(err)
		}
		k, err := keys.NewKeyring(db, plans.Has, keys.Options{Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		check(t, k)
	})
}

// TestKeyringListStorageFails: a listing that cannot read storage says so
// rather than listing nothing.
func TestKeyringListStorageFails(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	k, err := keys.NewKeyring(db, keys.NewPlans(map[string]budget.Plan{"free": {}}).Has, keys.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.Create("alice", ""); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if list, err := k.List(); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("list %+v, err %v, want %v", list, err, storage.ErrClosed)
	}
}

// TestKeyringUserChangesKeepTheRecord: memory holds no creation time, so a
// ban or a plan change rewrites the stored user from storage's record and
// keeps it; a second key keeps the user's ban.
func TestKeyringUserChangesKeepTheRecord(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	created := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	now := created
	k, err := keys.NewKeyring(db, keys.NewPlans(map[string]budget.Plan{"free": {}, "pro": {}}).Has, keys.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.Create("alice", ""); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if _, err := k.SetBanned("alice", true, false); err != nil {
		t.Fatal(err)
	}
	if _, err := k.SetPlan("alice", "pro"); err != nil {
		t.Fatal(err)
	}
	second, _, err := k.Create("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	u, err := db.User("alice")
	if err != nil {
		t.Fatal(err)
	}
	if u.Plan != "pro" || !u.Banned || !u.CreatedAt.Equal(created) {
		t.Errorf("stored user %+v, want pro, banned, created %v", u, created)
	}
	if id, banned, ok := k.Authenticate(second); !ok || !banned || id.Plan != "pro" {
		t.Errorf("second key: %+v banned %v ok %v, want banned on pro", id, banned, ok)
	}
	if got := k.Users(); len(got) != 1 || got[0] != (keys.UserInfo{ID: "alice", Plan: "pro", Banned: true}) {
		t.Errorf("users %+v", got)
	}
}
