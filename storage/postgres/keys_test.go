package postgres_test

import (
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"

	"breakwater/server/keys"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newDB opens a fresh database of t's own.
func newDB(t *testing.T) *postgres.DB {
	t.Helper()
	return open(t, pgtest.NewDatabase(t))
}

// newKey returns a key for user with a hash derived from id.
func newKey(id, user string, created time.Time) keys.Key {
	return keys.Key{ID: id, Hash: sha256.Sum256([]byte("secret-" + id)), UserID: user, CreatedAt: created}
}

func TestCreateKey(t *testing.T) {
	db := newDB(t)
	if err := db.CreateKey(newKey("k1", "alice", t0), keys.User{Plan: "free"}); err != nil {
		t.Fatalf("CreateKey k1: %v", err)
	}
	alice, err := db.User("alice")
	if err != nil {
		t.Fatal(err)
	}
	if alice.Plan != "free" || !alice.CreatedAt.Equal(t0) {
		t.Errorf("new user = %+v, want plan free created at the key's %v", alice, t0)
	}
	// A second key keeps the user's ban and CreatedAt but may change the plan.
	alice.Banned = true
	if err := db.PutUser(alice); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(time.Hour)
	if err := db.CreateKey(newKey("k2", "alice", later), keys.User{ID: "alice", Plan: "pro", CreatedAt: later}); err != nil {
		t.Fatalf("CreateKey k2: %v", err)
	}
	if alice, err = db.User("alice"); err != nil || alice.Plan != "pro" || !alice.CreatedAt.Equal(t0) || !alice.Banned {
		t.Errorf("user after second key = %+v, %v; want plan pro, created %v, banned", alice, err, t0)
	}
	// An empty plan keeps the stored one.
	if err := db.CreateKey(newKey("k3", "alice", later), keys.User{}); err != nil {
		t.Fatalf("CreateKey k3: %v", err)
	}
	if alice, err = db.User("alice"); err != nil || alice.Plan != "pro" {
		t.Errorf("User after key with empty plan = %+v, %v; want plan pro", alice, err)
	}
	tests := []struct {
		name    string
		key     keys.Key
		user    keys.User
		wantErr error
	}{
		{name: "same id", key: newKey("k1", "bob", t0), wantErr: postgres.ErrExists},
		{name: "same hash", key: keys.Key{ID: "k9", Hash: newKey("k1", "", t0).Hash, UserID: "bob", CreatedAt: t0}, wantErr: postgres.ErrExists},
		{name: "no id", key: newKey("", "bob", t0), wantErr: postgres.ErrInvalid},
		{name: "no user", key: newKey("k9", "", t0), wantErr: postgres.ErrInvalid},
		{name: "other user", key: newKey("k9", "bob", t0), user: keys.User{ID: "carol"}, wantErr: postgres.ErrInvalid},
		{name: "no hash", key: keys.Key{ID: "k9", UserID: "bob", CreatedAt: t0}, wantErr: postgres.ErrInvalid},
		{name: "no time", key: newKey("k9", "bob", time.Time{}), wantErr: postgres.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := db.CreateKey(tt.key, tt.user); !errors.Is(err, tt.wantErr) {
				t.Errorf("CreateKey = %v, want %v", err, tt.wantErr)
			}
		})
	}
	// None of the refused keys created bob (the transaction rolled back).
	if _, err := db.User("bob"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("User(bob) = %v, want keys.ErrNotFound", err)
	}
}

func TestKeysSortedAndRoundTrip(t *testing.T) {
	db := newDB(t)
	for _, k := range []keys.Key{
		newKey("kb", "u", t0.Add(time.Minute)),
		newKey("kc", "u", t0),
		newKey("ka", "u", t0.Add(time.Minute)),
		newKey("kd", "u", t0.Add(-time.Minute)),
	} {
		if err := db.CreateKey(k, keys.User{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := db.Keys()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, k := range list {
		ids = append(ids, k.ID)
	}
	if want := []string{"kd", "kc", "ka", "kb"}; !slices.Equal(ids, want) {
		t.Errorf("Keys() order = %v, want %v", ids, want)
	}
	if want := newKey("kd", "u", t0.Add(-time.Minute)); list[0] != want {
		t.Errorf("key round trip = %+v, want %+v", list[0], want)
	}
}

func TestRevokeKey(t *testing.T) {
	db := newDB(t)
	if err := db.CreateKey(newKey("k1", "alice", t0), keys.User{}); err != nil {
		t.Fatal(err)
	}
	first := t0.Add(time.Hour)
	k, err := db.RevokeKey("k1", first)
	if err != nil || k.Active() || !k.RevokedAt.Equal(first) {
		t.Fatalf("RevokeKey = %+v, %v; want revoked at %v", k, err, first)
	}
	k, err = db.RevokeKey("k1", first.Add(time.Hour))
	if err != nil || !k.RevokedAt.Equal(first) {
		t.Errorf("second RevokeKey = %+v, %v; want the first time %v", k, err, first)
	}
	list, err := db.Keys()
	if err != nil || len(list) != 1 || !list[0].RevokedAt.Equal(first) {
		t.Errorf("Keys() = %+v, %v; want k1 revoked at %v", list, err, first)
	}
	if _, err := db.RevokeKey("nope", first); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want keys.ErrNotFound", err)
	}
	if _, err := db.RevokeKey("k1", time.Time{}); !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("RevokeKey(zero time) = %v, want ErrInvalid", err)
	}
}

func TestUsers(t *testing.T) {
	db := newDB(t)
	if _, err := db.User("nobody"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("User(unknown) = %v, want keys.ErrNotFound", err)
	}
	if err := db.PutUser(keys.User{}); !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("PutUser(no id) = %v, want ErrInvalid", err)
	}
	for _, u := range []keys.User{
		{ID: "carol", Plan: "free", CreatedAt: t0},
		{ID: "alice", Plan: "pro", Banned: true, CreatedAt: t0},
		{ID: "bob", CreatedAt: t0},
		{ID: "Bob", CreatedAt: t0},
	} {
		if err := db.PutUser(u); err != nil {
			t.Fatal(err)
		}
	}
	// PutUser replaces.
	if err := db.PutUser(keys.User{ID: "alice", Plan: "free", CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	users, err := db.Users()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range users {
		ids = append(ids, u.ID)
	}
	// Byte order, as bolt sorts: upper case first.
	if want := []string{"Bob", "alice", "bob", "carol"}; !slices.Equal(ids, want) {
		t.Errorf("Users() = %v, want %v", ids, want)
	}
	if want := (keys.User{ID: "alice", Plan: "free", CreatedAt: t0}); users[1] != want {
		t.Errorf("alice after replace = %+v, want %+v", users[1], want)
	}
}

// Keys and users written through one instance are read by another: what
// two binaries on one database see.
func TestKeysAcrossInstances(t *testing.T) {
	url := pgtest.NewDatabase(t)
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
