package storage

import (
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"

	"breakwater/server/keys"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newKey returns a key for user with a hash derived from id.
func newKey(id, user string, created time.Time) keys.Key {
	return keys.Key{ID: id, Hash: sha256.Sum256([]byte("secret-" + id)), UserID: user, CreatedAt: created}
}

func TestCreateKey(t *testing.T) {
	db := mustOpen(t)

	if err := db.CreateKey(newKey("k1", "alice", t0), keys.User{Plan: "free"}); err != nil {
		t.Fatalf("CreateKey k1: %v", err)
	}
	alice, err := db.User("alice")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := alice.Plan, "free"; got != want {
		t.Errorf("new user plan = %q, want %q", got, want)
	}
	if got, want := alice.CreatedAt, t0; !got.Equal(want) {
		t.Errorf("new user CreatedAt = %v, want the key's %v", got, want)
	}

	// Ban alice, then a second key must keep her ban and CreatedAt but may
	// change her plan.
	alice.Banned = true
	if err := db.PutUser(alice); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(time.Hour)
	if err := db.CreateKey(newKey("k2", "alice", later), keys.User{ID: "alice", Plan: "pro", CreatedAt: later}); err != nil {
		t.Fatalf("CreateKey k2: %v", err)
	}
	alice, err = db.User("alice")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := alice.Plan, "pro"; got != want {
		t.Errorf("plan after second key = %q, want %q", got, want)
	}
	if got, want := alice.CreatedAt, t0; !got.Equal(want) {
		t.Errorf("CreatedAt after second key = %v, want the first %v", got, want)
	}
	if !alice.Banned {
		t.Error("second key unbanned the user")
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
		{name: "same id", key: newKey("k1", "bob", t0), wantErr: ErrExists},
		{name: "same hash", key: keys.Key{ID: "k9", Hash: newKey("k1", "", t0).Hash, UserID: "bob", CreatedAt: t0}, wantErr: ErrExists},
		{name: "no id", key: newKey("", "bob", t0), wantErr: ErrInvalid},
		{name: "no user", key: newKey("k9", "", t0), wantErr: ErrInvalid},
		{name: "other user", key: newKey("k9", "bob", t0), user: keys.User{ID: "carol"}, wantErr: ErrInvalid},
		{name: "no hash", key: keys.Key{ID: "k9", UserID: "bob", CreatedAt: t0}, wantErr: ErrInvalid},
		{name: "no time", key: newKey("k9", "bob", time.Time{}), wantErr: ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := db.CreateKey(tt.key, tt.user); !errors.Is(err, tt.wantErr) {
				t.Errorf("CreateKey = %v, want %v", err, tt.wantErr)
			}
		})
	}
	// None of the refused keys created bob.
	if _, err := db.User("bob"); !errors.Is(err, ErrNotFound) {
		t.Errorf("User(bob) = %v, want ErrNotFound", err)
	}
}

func TestKeysSorted(t *testing.T) {
	db := mustOpen(t)
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
	keys, err := db.Keys()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, k := range keys {
		ids = append(ids, k.ID)
	}
	if got, want := ids, []string{"kd", "kc", "ka", "kb"}; !slices.Equal(got, want) {
		t.Errorf("Keys() order = %v, want %v", got, want)
	}
	if got, want := keys[0].Hash, newKey("kd", "", t0).Hash; got != want {
		t.Errorf("hash round trip = %x, want %x", got, want)
	}
}

func TestRevokeKey(t *testing.T) {
	db := mustOpen(t)
	if err := db.CreateKey(newKey("k1", "alice", t0), keys.User{}); err != nil {
		t.Fatal(err)
	}

	first := t0.Add(time.Hour)
	k, err := db.RevokeKey("k1", first)
	if err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	if k.Active() || !k.RevokedAt.Equal(first) {
		t.Errorf("RevokeKey returned RevokedAt %v, want %v", k.RevokedAt, first)
	}

	k, err = db.RevokeKey("k1", first.Add(time.Hour))
	if err != nil {
		t.Fatalf("second RevokeKey: %v", err)
	}
	if !k.RevokedAt.Equal(first) {
		t.Errorf("second RevokeKey returned RevokedAt %v, want the first %v", k.RevokedAt, first)
	}
	keys, err := db.Keys()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(keys), 1; got != want {
		t.Fatalf("len(Keys()) = %d, want %d", got, want)
	}
	if !keys[0].RevokedAt.Equal(first) {
		t.Errorf("stored RevokedAt = %v, want %v", keys[0].RevokedAt, first)
	}

	if _, err := db.RevokeKey("nope", first); !errors.Is(err, ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := db.RevokeKey("k1", time.Time{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("RevokeKey(zero time) = %v, want ErrInvalid", err)
	}
}

func TestUsers(t *testing.T) {
	db := mustOpen(t)
	if _, err := db.User("nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("User(unknown) = %v, want ErrNotFound", err)
	}
	if err := db.PutUser(keys.User{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutUser(no id) = %v, want ErrInvalid", err)
	}
	for _, u := range []keys.User{
		{ID: "carol", Plan: "free", CreatedAt: t0},
		{ID: "alice", Plan: "pro", Banned: true, CreatedAt: t0},
		{ID: "bob", CreatedAt: t0},
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
	if got, want := ids, []string{"alice", "bob", "carol"}; !slices.Equal(got, want) {
		t.Errorf("Users() = %v, want %v", got, want)
	}
	if users[0].Banned || users[0].Plan != "free" {
		t.Errorf("alice after replace = %+v, want unbanned on free", users[0])
	}
}
