package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
	"breakwater/server/invites"
	"breakwater/server/keys"
)

// The schema version 1 layout, written here by hand as that code wrote it,
// so the migration is tested on the old format and not on what today's
// code would make of it.
var bucketsV1 = []string{
	"meta", "users", "keys", "key_hashes", "quota", "usage", "events",
	"budget_days", "reservations", "defense", "invites",
	"aggregates", "findings", "detect_runs", "alerts",
}

// inviteV1 is an invite record as schema version 1 stored it: JSON (field
// names as keys), under the hash, with every redemption inside.
type inviteV1 struct {
	ID        string
	Hash      [32]byte
	MaxUses   int
	Note      string
	CreatedAt time.Time
	ExpiresAt time.Time
	RevokedAt time.Time
	Redeemed  []redemptionV1
}

type redemptionV1 struct {
	Email string
	At    time.Time
}

// writeV1 creates a schema version 1 database at path holding invites.
func writeV1(t *testing.T, path string, v1invites []inviteV1, extra func(tx *bbolt.Tx) error) {
	t.Helper()
	writeBolt(t, path, func(tx *bbolt.Tx) error {
		for _, name := range bucketsV1 {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		if err := tx.Bucket([]byte("meta")).Put([]byte("schema_version"), encodeUint64(1)); err != nil {
			return err
		}
		for _, inv := range v1invites {
			v, err := json.Marshal(inv)
			if err != nil {
				return err
			}
			if err := tx.Bucket([]byte("invites")).Put(inv.Hash[:], v); err != nil {
				return err
			}
		}
		if extra != nil {
			return extra(tx)
		}
		return nil
	})
}

// v1Invite returns an old-format invite with uses e-mails redeemed, one a
// minute from t0.
func v1Invite(id string, maxUses, uses int) inviteV1 {
	inv := inviteV1{ID: id, Hash: sha256.Sum256([]byte("code-" + id)), MaxUses: maxUses, Note: "v1 " + id, CreatedAt: t0}
	for i := range uses {
		inv.Redeemed = append(inv.Redeemed, redemptionV1{Email: fmt.Sprintf("%s-%d@example.com", id, i), At: t0.Add(time.Duration(i) * time.Minute)})
	}
	return inv
}

// dumpBuckets returns every key and value under the named top-level
// buckets, nested buckets included, as path -> value.
func dumpBuckets(t *testing.T, tx *bbolt.Tx, names ...[]byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(prefix string, b *bbolt.Bucket)
	walk = func(prefix string, b *bbolt.Bucket) {
		_ = b.ForEach(func(k, v []byte) error {
			p := prefix + "/" + fmt.Sprintf("%x", k)
			if v == nil {
				out[p] = "(bucket)"
				walk(p, b.Bucket(k))
				return nil
			}
			out[p] = string(v)
			return nil
		})
	}
	for _, n := range names {
		walk(string(n), tx.Bucket(n))
	}
	return out
}

// migratedV1 is a version 1 database, with the invites it was written
// with, after Open migrated it.
type migratedV1 struct {
	db                              *DB
	logs                            *bytes.Buffer // what Open logged
	user                            []byte        // the one user record, as written
	old                             []inviteV1    // every invite written
	full, part, none, revoked, beta inviteV1
}

// openMigratedV1 writes a version 1 database with five invites (used up,
// partly used, unused, revoked, and one with 1000 redemptions) and a
// user, then opens it, which migrates it.
func openMigratedV1(t *testing.T) migratedV1 {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v1.db")
	full, part, none, revoked, beta := v1Invite("inv_full", 3, 3), v1Invite("inv_part", 5, 2), v1Invite("inv_none", 1, 0), v1Invite("inv_rev", 4, 1), v1Invite("inv_beta", 10000, 1000)
	revoked.RevokedAt = t0.Add(time.Hour)
	part.ExpiresAt = t0.Add(48 * time.Hour)
	old := []inviteV1{full, part, none, revoked, beta}
	user := []byte(`{"ID":"u1","Plan":"pro"}`)
	writeV1(t, path, old, func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("users")).Put([]byte("u1"), user)
	})

	var logs bytes.Buffer
	db := mustOpenPath(t, path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	return migratedV1{db: db, logs: &logs, user: user, old: old, full: full, part: part, none: none, revoked: revoked, beta: beta}
}

func TestMigrateV1InviteRedemptions(t *testing.T) {
	m := openMigratedV1(t)
	t.Run("schema version and log", func(t *testing.T) { checkMigratedSchemaAndLog(t, m) })
	t.Run("records and redemptions", func(t *testing.T) { checkMigratedRecords(t, m) })
	t.Run("redeeming after the migration", func(t *testing.T) { checkRedeemingAfterMigration(t, m) })
	t.Run("migrating again changes nothing", func(t *testing.T) { checkMigratingAgain(t, m) })
}

// checkMigratedSchemaAndLog: the schema version is the current one, the
// user record is untouched, and the log reports the redemptions moved.
func checkMigratedSchemaAndLog(t *testing.T, m migratedV1) {
	err := m.db.view(func(tx *bbolt.Tx) error {
		if got, want := tx.Bucket(bucketMeta).Get(keySchemaVersion), encodeUint64(SchemaVersion); !bytes.Equal(got, want) {
			t.Errorf("schema version %x, want %x", got, want)
		}
		if got := tx.Bucket(bucketUsers).Get([]byte("u1")); !bytes.Equal(got, m.user) {
			t.Errorf("user record changed to %s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.logs.String(), "database migrated") || !strings.Contains(m.logs.String(), "redemptions_moved=1006") {
		t.Errorf("log does not report the migration with 1006 redemptions:\n%s", m.logs.String())
	}
}

// checkMigratedRecords: every invite keeps its fields, its uses and its
// redemptions, which no longer live in the invite's record.
func checkMigratedRecords(t *testing.T, m migratedV1) {
	for _, o := range m.old {
		inv, err := m.db.InviteByHash(o.Hash)
		if err != nil {
			t.Fatalf("%s: %v", o.ID, err)
		}
		if inv.ID != o.ID || inv.MaxUses != o.MaxUses || inv.Note != o.Note || !inv.CreatedAt.Equal(o.CreatedAt) ||
			!inv.ExpiresAt.Equal(o.ExpiresAt) || !inv.RevokedAt.Equal(o.RevokedAt) {
			t.Errorf("%s: record %+v does not match the old one", o.ID, inv)
		}
		if got, want := inv.Used, len(o.Redeemed); got != want {
			t.Errorf("%s: %d uses, want %d", o.ID, got, want)
		}
		reds, err := m.db.Redemptions(o.Hash)
		if err != nil {
			t.Fatalf("%s: %v", o.ID, err)
		}
		want := make([]Redemption, 0, len(o.Redeemed))
		for _, r := range o.Redeemed {
			want = append(want, Redemption{Email: r.Email, At: r.At})
		}
		if got, want := fmt.Sprint(reds), fmt.Sprint(want); got != want {
			t.Errorf("%s: redemptions\n%.300s\nwant\n%.300s", o.ID, got, want)
		}
	}
	err := m.db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketInvites).ForEach(func(k, v []byte) error {
			if bytes.Contains(v, []byte("Redeemed")) {
				t.Errorf("invite %x still holds its list: %.200s", k, v)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkRedeemingAfterMigration: old e-mails are still in, the counts go
// on from the migrated uses, and a revoked invite stays revoked.
func checkRedeemingAfterMigration(t *testing.T, m migratedV1) {
	ctx := context.Background()
	steps := []struct {
		name  string
		inv   inviteV1
		email string
		want  invites.RedeemOutcome
	}{
		{"full: an old e-mail is still in", m.full, m.full.Redeemed[2].Email, invites.InviteAlreadyRedeemed},
		{"full: a new e-mail finds it used up", m.full, "new@example.com", invites.InviteUsedUp},
		{"part: an old e-mail is still in", m.part, m.part.Redeemed[0].Email, invites.InviteAlreadyRedeemed},
		{"part: third use", m.part, "c@example.com", invites.InviteRedeemed},
		{"part: fourth use", m.part, "d@example.com", invites.InviteRedeemed},
		{"part: fifth use", m.part, "e@example.com", invites.InviteRedeemed},
		{"part: no sixth", m.part, "f@example.com", invites.InviteUsedUp},
		{"none: first use", m.none, "a@example.com", invites.InviteRedeemed},
		{"revoked stays revoked", m.revoked, "a@example.com", invites.InviteRevoked},
		{"beta: an old e-mail", m.beta, m.beta.Redeemed[999].Email, invites.InviteAlreadyRedeemed},
		{"beta: a new one", m.beta, "new@example.com", invites.InviteRedeemed},
	}
	for _, s := range steps {
		got, err := m.db.RedeemInvite(ctx, s.inv.Hash, s.email, t0.Add(24*time.Hour))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got != s.want {
			t.Errorf("%s: %v, want %v", s.name, got, s.want)
		}
	}
	if inv, _ := m.db.InviteByHash(m.part.Hash); inv.Used != 5 {
		t.Errorf("part: %d uses, want 5", inv.Used)
	}
	if inv, _ := m.db.InviteByHash(m.beta.Hash); inv.Used != 1001 {
		t.Errorf("beta: %d uses, want 1001", inv.Used)
	}
}

// checkMigratingAgain: running the migration on migrated data changes
// nothing.
func checkMigratingAgain(t *testing.T, m migratedV1) {
	var before, after map[string]string
	_ = m.db.view(func(tx *bbolt.Tx) error {
		before = dumpBuckets(t, tx, bucketInvites, bucketRedemptions)
		return nil
	})
	err := m.db.update(func(tx *bbolt.Tx) error {
		_, err := migrateInviteRedemptions(tx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = m.db.view(func(tx *bbolt.Tx) error {
		after = dumpBuckets(t, tx, bucketInvites, bucketRedemptions)
		return nil
	})
	if len(before) < 1000 || !maps.Equal(before, after) {
		t.Errorf("a second migration changed the data: %d entries before, %d after", len(before), len(after))
		for _, k := range slices.Sorted(maps.Keys(before)) {
			if before[k] != after[k] {
				t.Errorf("%s: %.100q -> %.100q", k, before[k], after[k])
			}
		}
	}
}

// TestMigrateV1TwiceInOneRecord: an e-mail twice in an old list (version 1
// never wrote that, but a hand-edited file might) keeps its first
// redemption, and the use count stays the old list's length, so the code
// gains no use from the upgrade.
func TestMigrateV1TwiceInOneRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v1.db")
	inv := v1Invite("inv_dup", 3, 2)
	inv.Redeemed = append(inv.Redeemed, redemptionV1{Email: inv.Redeemed[0].Email, At: t0.Add(time.Hour)})
	writeV1(t, path, []inviteV1{inv}, nil)
	db := mustOpenPath(t, path, Options{})

	got, err := db.InviteByHash(inv.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if got.Used != 3 {
		t.Errorf("%d uses, want 3", got.Used)
	}
	reds, _ := db.Redemptions(inv.Hash)
	if len(reds) != 2 || !reds[0].At.Equal(t0) {
		t.Errorf("redemptions %v, want 2 with the first one at t0", reds)
	}
	if o, _ := db.RedeemInvite(context.Background(), inv.Hash, "new@example.com", t0); o != invites.InviteUsedUp {
		t.Errorf("new e-mail: %v, want InviteUsedUp", o)
	}
}

// TestMigrateV1FailureChangesNothing: when the migration fails (here on an
// undecodable invite), Open refuses the file and the database stays at
// version 1, as it was.
func TestMigrateV1FailureChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v1.db")
	good := v1Invite("inv_good", 2, 1)
	writeV1(t, path, []inviteV1{good}, func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("invites")).Put([]byte("broken"), []byte("{not json"))
	})
	var before map[string]string
	readBolt(t, path, func(tx *bbolt.Tx) { before = dumpAll(t, tx) })

	db, err := Open(path, Options{Timeout: 50 * time.Millisecond, Logger: quietLogger})
	if err == nil {
		db.Close()
		t.Fatal("Open succeeded on a database whose migration must fail")
	}
	if errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), "schema version 2") {
		t.Errorf("Open = %v, want a migration error naming schema version 2", err)
	}
	readBolt(t, path, func(tx *bbolt.Tx) {
		if after := dumpAll(t, tx); !maps.Equal(before, after) {
			t.Errorf("the failed migration changed the file: %d entries before, %d after", len(before), len(after))
		}
	})
}

// readBolt runs fn in a read transaction on the bbolt file at path.
func readBolt(t *testing.T, path string, fn func(tx *bbolt.Tx)) {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	_ = bdb.View(func(tx *bbolt.Tx) error { fn(tx); return nil })
}

// dumpAll dumps every top-level bucket of tx.
func dumpAll(t *testing.T, tx *bbolt.Tx) map[string]string {
	t.Helper()
	var names [][]byte
	_ = tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
		names = append(names, append([]byte(nil), name...))
		return nil
	})
	out := dumpBuckets(t, tx, names...)
	for _, n := range names {
		out[string(n)] = "(bucket)"
	}
	return out
}

// writeV2 creates a schema version 2 database at path: fill writes through
// today's code (the bucket layout is the same), then the version is set
// back to 2.
func writeV2(t *testing.T, path string, fill func(db *DB)) {
	t.Helper()
	db, err := Open(path, Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	fill(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	writeBolt(t, path, func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, encodeUint64(2))
	})
}

// TestMigrateV2JWTUsers: schema 3 gives JWT users ids of their own. A JWT
// user's ban and quota count move to jwt:SUB; an id that was both an
// API-key user and a token's sub keeps its own and the JWT side gets a
// copy, so no one gains quota or loses a ban; a sub that today's rules
// refuse is left alone.
func TestMigrateV2JWTUsers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v2.db")
	const month = "2026-03"
	ctx := context.Background()
	writeV2(t, path, func(db *DB) {
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(db.CreateKey(keys.Key{ID: "key_a", Hash: sha256.Sum256([]byte("a")), UserID: "alice", CreatedAt: t0}, keys.User{Plan: "pro"}))
		must(db.PutUser(keys.User{ID: "alice", Plan: "pro", Banned: true, CreatedAt: t0}))
		read := func(user, keyID string, n int) {
			for i := range n {
				must(db.RecordUsage(ctx, month, budget.UsageRecord{Time: t0.Add(time.Duration(i) * time.Second), UserID: user, KeyID: keyID}, budget.Settlement{}))
			}
		}
		read("alice", "key_a", 2)
		read("alice", "jwt", 1) // a token whose sub was "alice"
		read("user_2abc", "jwt", 3)
		must(db.PutUser(keys.User{ID: "user_2abc", Banned: true, CreatedAt: t0})) // users ban user_2abc
		read("bob", "", 1)
		read("bad\u200bsub", "jwt", 1)
	})

	var logs bytes.Buffer
	db := mustOpenPath(t, path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	used, err := db.QuotaUsed(month)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"alice": 3, "jwt:alice": 3, "jwt:user_2abc": 3, "jwt:bob": 1, "bad\u200bsub": 1}
	if !maps.Equal(used, want) {
		t.Errorf("quota counts %v, want %v", used, want)
	}
	users, err := db.Users()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, u := range users {
		got[u.ID] = fmt.Sprintf("plan=%q banned=%v", u.Plan, u.Banned)
	}
	wantUsers := map[string]string{
		"alice":         `plan="pro" banned=true`,
		"jwt:alice":     `plan="pro" banned=true`,
		"jwt:user_2abc": `plan="" banned=true`,
	}
	if !maps.Equal(got, wantUsers) {
		t.Errorf("users %v, want %v", got, wantUsers)
	}
	if !strings.Contains(logs.String(), "schema_version=3") || !strings.Contains(logs.String(), "jwt_users_moved=2 jwt_users_copied=1") ||
		!strings.Contains(logs.String(), "skipped=1") {
		t.Errorf("log does not report the migration:\n%s", logs.String())
	}

	var before, after map[string]string
	_ = db.view(func(tx *bbolt.Tx) error { before = dumpAll(t, tx); return nil })
	if err := db.update(func(tx *bbolt.Tx) error { _, err := migrateJWTUsers(tx); return err }); err != nil {
		t.Fatal(err)
	}
	_ = db.view(func(tx *bbolt.Tx) error { after = dumpAll(t, tx); return nil })
	if !maps.Equal(before, after) {
		t.Errorf("a second migration changed the data: %d entries before, %d after", len(before), len(after))
	}
}
