package backendtest

import (
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"

	"breakwater/server/keys"
)

// newKey returns a key for user with a hash derived from id.
func newKey(id, user string, created time.Time) keys.Key {
	return keys.Key{ID: id, Hash: sha256.Sum256([]byte("secret-" + id)), UserID: user, CreatedAt: created}
}

// Keys checks keys.KeyStore: creating keys and their users, the order and
// round trip of Keys, revoking, and users.
func Keys(t *testing.T, kit Kit) {
	t.Run("CreateKey", func(t *testing.T) { createKey(t, kit) })
	t.Run("KeysSorted", func(t *testing.T) { keysSorted(t, kit) })
	t.Run("RevokeKey", func(t *testing.T) { revokeKey(t, kit) })
	t.Run("Users", func(t *testing.T) { users(t, kit) })
}

// createKey: a key creates its user; a second key keeps the user's ban
// and CreatedAt but may change the plan, an empty plan keeps it; a
// refused key creates nothing.
func createKey(t *testing.T, kit Kit) {
	db := kit.Open(t)
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
		{name: "same id", key: newKey("k1", "bob", t0), wantErr: kit.ErrExists},
		{name: "same hash", key: keys.Key{ID: "k9", Hash: newKey("k1", "", t0).Hash, UserID: "bob", CreatedAt: t0}, wantErr: kit.ErrExists},
		{name: "no id", key: newKey("", "bob", t0), wantErr: kit.ErrInvalid},
		{name: "no user", key: newKey("k9", "", t0), wantErr: kit.ErrInvalid},
		{name: "other user", key: newKey("k9", "bob", t0), user: keys.User{ID: "carol"}, wantErr: kit.ErrInvalid},
		{name: "no hash", key: keys.Key{ID: "k9", UserID: "bob", CreatedAt: t0}, wantErr: kit.ErrInvalid},
		{name: "no time", key: newKey("k9", "bob", time.Time{}), wantErr: kit.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := db.CreateKey(tt.key, tt.user); !errors.Is(err, tt.wantErr) {
				t.Errorf("CreateKey = %v, want %v", err, tt.wantErr)
			}
		})
	}
	if _, err := db.User("bob"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("User(bob) = %v, want keys.ErrNotFound: a refused key created its user", err)
	}
}

// keysSorted: Keys lists by creation time, then id, and gives back every
// field as stored.
func keysSorted(t *testing.T, kit Kit) {
	db := kit.Open(t)
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
		t.Fatalf("Keys() order = %v, want %v", ids, want)
	}
	if want := newKey("kd", "u", t0.Add(-time.Minute)); !sameKey(list[0], want) {
		t.Errorf("key round trip = %+v, want %+v", list[0], want)
	}
}

// sameKey compares two keys field by field, times by instant.
func sameKey(a, b keys.Key) bool {
	return a.ID == b.ID && a.Hash == b.Hash && a.UserID == b.UserID && a.CreatedAt.Equal(b.CreatedAt) && a.RevokedAt.Equal(b.RevokedAt)
}

// revokeKey: a revoke keeps its first time; an unknown key is
// keys.ErrNotFound, a zero time refused.
func revokeKey(t *testing.T, kit Kit) {
	db := kit.Open(t)
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
	if _, err := db.RevokeKey("k1", time.Time{}); !errors.Is(err, kit.ErrInvalid) {
		t.Errorf("RevokeKey(zero time) = %v, want ErrInvalid", err)
	}
}

// users: PutUser refuses a user without id and replaces; Users lists by
// id in byte order (upper case first).
func users(t *testing.T, kit Kit) {
	db := kit.Open(t)
	if _, err := db.User("nobody"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("User(unknown) = %v, want keys.ErrNotFound", err)
	}
	if err := db.PutUser(keys.User{}); !errors.Is(err, kit.ErrInvalid) {
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
	if err := db.PutUser(keys.User{ID: "alice", Plan: "free", CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	list, err := db.Users()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range list {
		ids = append(ids, u.ID)
	}
	if want := []string{"Bob", "alice", "bob", "carol"}; !slices.Equal(ids, want) {
		t.Fatalf("Users() = %v, want %v", ids, want)
	}
	if u := list[1]; u.ID != "alice" || u.Plan != "free" || u.Banned || !u.CreatedAt.Equal(t0) {
		t.Errorf("alice after replace = %+v, want unbanned on free, created %v", u, t0)
	}
}
