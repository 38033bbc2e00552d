package postgres_test

import (
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"breakwater/server/keys"
	"breakwater/storage/postgres"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newDB opens a fresh database of t's own.
func newDB(t *testing.T) *postgres.DB {
	t.Helper()
	return open(t, migratedDatabase(t))
}

// newKey returns a key for user with a hash derived from id.
func newKey(id, user string, created time.Time) keys.Key {
	return keys.Key{ID: id, Hash: sha256.Sum256([]byte("secret-" + id)), UserID: user, CreatedAt: created}
}

// Keys and users written through one instance are read by another: what
// two binaries on one database see.
func TestKeysAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	if err := a.CreateKey(newKey("k1", "alice", t0), keys.User{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RevokeKey("k1", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	list, err := a.Keys()
	if err != nil || len(list) != 1 || list[0].Active() {
		t.Fatalf("A's Keys() after B's revoke = %+v, %v", list, err)
	}
	if k, err := a.Key("k1"); err != nil || k != list[0] {
		t.Errorf("A's Key(k1) = %+v, %v; want %+v", k, err, list[0])
	}
	if _, err := a.Key("nope"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("Key(unknown) = %v, want keys.ErrNotFound", err)
	}
	u, err := b.User("alice")
	if err != nil || u.Plan != "pro" {
		t.Fatalf("B's User(alice) = %+v, %v", u, err)
	}
}
