package storage

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/server/invites"
)

func newInvite(id string, uses int) invites.Invite {
	return invites.Invite{ID: id, Hash: sha256.Sum256([]byte("code-" + id)), MaxUses: uses, CreatedAt: t0, Note: "for " + id}
}

func TestInviteRedemptionOutcomes(t *testing.T) {
	db := mustOpen(t)
	ctx := context.Background()
	one, two, exp, rev := newInvite("inv_one", 1), newInvite("inv_two", 2), newInvite("inv_exp", 5), newInvite("inv_rev", 5)
	exp.ExpiresAt = t0.Add(time.Hour)
	for _, inv := range []invites.Invite{one, two, exp, rev} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.RevokeInvite("inv_rev", t0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		hash  [32]byte
		email string
		at    time.Time
		want  invites.RedeemOutcome
	}{
		{"unknown", sha256.Sum256([]byte("nope")), "a@x", t0, invites.InviteUnknown},
		{"first use", one.Hash, "a@x", t0, invites.InviteRedeemed},
		{"same e-mail again", one.Hash, "a@x", t0.Add(time.Minute), invites.InviteAlreadyRedeemed},
		{"used up", one.Hash, "b@x", t0, invites.InviteUsedUp},
		{"two uses: first", two.Hash, "a@x", t0, invites.InviteRedeemed},
		{"two uses: second", two.Hash, "b@x", t0, invites.InviteRedeemed},
		{"two uses: third", two.Hash, "c@x", t0, invites.InviteUsedUp},
		{"before expiry", exp.Hash, "a@x", t0.Add(time.Hour - 1), invites.InviteRedeemed},
		{"at expiry", exp.Hash, "b@x", t0.Add(time.Hour), invites.InviteExpired},
		{"revoked", rev.Hash, "a@x", t0, invites.InviteRevoked},
	}
	for _, c := range cases {
		got, err := db.RedeemInvite(ctx, c.hash, c.email, c.at)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	inv, err := db.InviteByHash(two.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := inv.Used, 2; got != want {
		t.Errorf("two: %d uses, want %d", got, want)
	}
	reds, err := db.Redemptions(two.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(reds), fmt.Sprint([]Redemption{{"a@x", t0}, {"b@x", t0}}); got != want {
		t.Errorf("two: redemptions %s, want %s", got, want)
	}
	reds, _ = db.Redemptions(one.Hash)
	if len(reds) != 1 || reds[0].Email != "a@x" || !reds[0].At.Equal(t0) {
		t.Errorf("one: redemptions %v, want only a@x at t0 (a second try changes nothing)", reds)
	}
	if _, err := db.InviteByHash(sha256.Sum256([]byte("nope"))); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown hash: %v, want ErrNotFound", err)
	}
}

func TestInviteParallelRedemptionOfOneUse(t *testing.T) {
	db := mustOpen(t)
	inv := newInvite("inv_race", 1)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[invites.RedeemOutcome]int{}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			o, err := db.RedeemInvite(context.Background(), inv.Hash, fmt.Sprintf("user%d@example.com", i), t0)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			got[o]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if got[invites.InviteRedeemed] != 1 || got[invites.InviteUsedUp] != 9 {
		t.Errorf("outcomes %v, want 1 redeemed and 9 used up", got)
	}
	stored, _ := db.InviteByHash(inv.Hash)
	if stored.Used != 1 {
		t.Errorf("stored uses %d, want 1", stored.Used)
	}
}

func TestInviteListRevokeAndErrors(t *testing.T) {
	db := mustOpen(t)
	a, b := newInvite("inv_a", 1), newInvite("inv_b", 1)
	b.CreatedAt = t0.Add(-time.Hour)
	for _, inv := range []invites.Invite{a, b} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.CreateInvite(a); !errors.Is(err, ErrExists) {
		t.Errorf("same hash again: %v, want ErrExists", err)
	}
	dupID := newInvite("inv_c", 1)
	dupID.ID = "inv_a"
	if err := db.CreateInvite(dupID); !errors.Is(err, ErrExists) {
		t.Errorf("same id again: %v, want ErrExists", err)
	}
	for _, bad := range []invites.Invite{{}, {ID: "x"}, {ID: "x", Hash: a.Hash}, {ID: "x", Hash: [32]byte{1}, MaxUses: 1},
		{ID: "x", Hash: [32]byte{1}, MaxUses: 1, CreatedAt: t0, Used: 1}} {
		if err := db.CreateInvite(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
	list, err := db.Invites()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "inv_b" || list[1].Note != "for inv_a" {
		t.Errorf("list %+v", list)
	}
	r1, err := db.RevokeInvite("inv_a", t0.Add(time.Minute))
	if err != nil || !r1.RevokedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("revoke: %+v %v", r1, err)
	}
	r2, _ := db.RevokeInvite("inv_a", t0.Add(time.Hour))
	if !r2.RevokedAt.Equal(r1.RevokedAt) {
		t.Errorf("second revoke moved RevokedAt to %v", r2.RevokedAt)
	}
	if _, err := db.RevokeInvite("inv_nope", t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoke unknown: %v, want ErrNotFound", err)
	}
	if _, err := db.Redemptions(sha256.Sum256([]byte("nope"))); !errors.Is(err, ErrNotFound) {
		t.Errorf("redemptions of unknown: %v, want ErrNotFound", err)
	}
}

// TestCheckInviteAgreesWithRedeem: the read-only check gives what a
// redemption would, and writes nothing.
func TestCheckInviteAgreesWithRedeem(t *testing.T) {
	db := mustOpen(t)
	ctx := context.Background()
	two, exp := newInvite("inv_two", 2), newInvite("inv_exp", 5)
	exp.ExpiresAt = t0.Add(time.Hour)
	for _, inv := range []invites.Invite{two, exp} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name  string
		hash  [32]byte
		email string
		at    time.Time
		want  invites.RedeemOutcome
	}{
		{"unknown", sha256.Sum256([]byte("nope")), "a@x", t0, invites.InviteUnknown},
		{"first", two.Hash, "a@x", t0, invites.InviteRedeemed},
		{"same e-mail", two.Hash, "a@x", t0, invites.InviteAlreadyRedeemed},
		{"second", two.Hash, "b@x", t0, invites.InviteRedeemed},
		{"used up", two.Hash, "c@x", t0, invites.InviteUsedUp},
		{"used up, but redeemed before", two.Hash, "b@x", t0, invites.InviteAlreadyRedeemed},
		{"expired", exp.Hash, "a@x", t0.Add(time.Hour), invites.InviteExpired},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			before, _ := db.InviteByHash(s.hash)
			checked, err := db.CheckInvite(s.hash, s.email, s.at)
			if err != nil {
				t.Fatal(err)
			}
			if after, _ := db.InviteByHash(s.hash); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("check changed the invite: %+v -> %+v", before, after)
			}
			if got, want := checked, s.want; got != want {
				t.Errorf("CheckInvite = %v, want %v", got, want)
			}
			redeemed, err := db.RedeemInvite(ctx, s.hash, s.email, s.at)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := redeemed, checked; got != want {
				t.Errorf("RedeemInvite = %v, CheckInvite said %v", got, want)
			}
		})
	}
}

// TestInviteParallelRedemptionOfManyUses: a code with N uses raced by many
// e-mails, each of them several times at once, is redeemed by exactly N
// e-mails, and the stored count, the stored e-mails and the outcomes agree.
func TestInviteParallelRedemptionOfManyUses(t *testing.T) {
	const uses, emails, tries = 5, 40, 3
	db := mustOpen(t)
	inv := newInvite("inv_race_many", uses)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[invites.RedeemOutcome]int{}
	winners := map[string]bool{}
	var wg sync.WaitGroup
	for i := range emails * tries {
		email := fmt.Sprintf("user%d@example.com", i%emails)
		wg.Go(func() {
			o, err := db.RedeemInvite(context.Background(), inv.Hash, email, t0)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			got[o]++
			if o == invites.InviteRedeemed {
				if winners[email] {
					t.Errorf("%s redeemed twice", email)
				}
				winners[email] = true
			}
		})
	}
	wg.Wait()
	if got[invites.InviteRedeemed] != uses || got[invites.InviteRedeemed]+got[invites.InviteAlreadyRedeemed]+got[invites.InviteUsedUp] != emails*tries {
		t.Errorf("outcomes %v, want %d redeemed and the rest already redeemed or used up", got, uses)
	}
	if got, want := got[invites.InviteAlreadyRedeemed], uses*(tries-1); got != want {
		t.Errorf("%d already redeemed, want %d (the winners' other tries)", got, want)
	}
	stored, err := db.InviteByHash(inv.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stored.Used, uses; got != want {
		t.Errorf("stored uses %d, want %d", got, want)
	}
	reds, err := db.Redemptions(inv.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if len(reds) != uses {
		t.Fatalf("%d stored redemptions, want %d", len(reds), uses)
	}
	for _, r := range reds {
		if !winners[r.Email] {
			t.Errorf("stored redemption by %s, who was not told redeemed", r.Email)
		}
	}
}

// TestInviteRedemptionFailsClosed: an invite whose redemptions bucket is
// missing is an error for both the check and the redemption, never "not
// redeemed yet", and nothing is written.
func TestInviteRedemptionFailsClosed(t *testing.T) {
	db := mustOpen(t)
	inv := newInvite("inv_damaged", 3)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	if err := db.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketRedemptions).DeleteBucket(inv.Hash[:])
	}); err != nil {
		t.Fatal(err)
	}
	if o, err := db.CheckInvite(inv.Hash, "a@x", t0); err == nil {
		t.Errorf("CheckInvite = %v, nil; want an error", o)
	}
	if o, err := db.RedeemInvite(context.Background(), inv.Hash, "a@x", t0); err == nil || o != invites.InviteUnknown {
		t.Errorf("RedeemInvite = %v, %v; want InviteUnknown and an error", o, err)
	}
	if stored, _ := db.InviteByHash(inv.Hash); stored.Used != 0 {
		t.Errorf("uses %d after a failed redemption, want 0", stored.Used)
	}
	if _, err := db.Redemptions(inv.Hash); err == nil {
		t.Error("Redemptions: nil error, want one")
	}
}

func TestDeleteInvite(t *testing.T) {
	db := mustOpen(t)
	ctx := context.Background()
	inv, other := newInvite("inv_del", 3), newInvite("inv_keep", 3)
	for _, i := range []invites.Invite{inv, other} {
		if err := db.CreateInvite(i); err != nil {
			t.Fatal(err)
		}
		if _, err := db.RedeemInvite(ctx, i.Hash, "a@x", t0); err != nil {
			t.Fatal(err)
		}
	}
	deleted, err := db.DeleteInvite("inv_del")
	if err != nil {
		t.Fatal(err)
	}
	if deleted.ID != "inv_del" || deleted.Used != 1 {
		t.Errorf("deleted %+v", deleted)
	}
	err = db.view(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketRedemptions).Bucket(inv.Hash[:]) != nil {
			t.Error("redemptions bucket of the deleted invite is still there")
		}
		if tx.Bucket(bucketRedemptions).Bucket(other.Hash[:]) == nil {
			t.Error("redemptions bucket of the other invite is gone")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.InviteByHash(inv.Hash); !errors.Is(err, ErrNotFound) {
		t.Errorf("InviteByHash after delete: %v, want ErrNotFound", err)
	}
	if o, err := db.RedeemInvite(ctx, inv.Hash, "b@x", t0); err != nil || o != invites.InviteUnknown {
		t.Errorf("redeem after delete: %v %v, want InviteUnknown", o, err)
	}
	if _, err := db.DeleteInvite("inv_del"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete again: %v, want ErrNotFound", err)
	}
	// The same code made again starts unused: nothing of the old one remains.
	if err := db.CreateInvite(newInvite("inv_del", 3)); err != nil {
		t.Fatal(err)
	}
	if o, err := db.CheckInvite(inv.Hash, "a@x", t0); err != nil || o != invites.InviteRedeemed {
		t.Errorf("a@x on the re-created code: %v %v, want InviteRedeemed", o, err)
	}
	if list, _ := db.Invites(); len(list) != 2 {
		t.Errorf("%d invites, want 2", len(list))
	}
}

// TestBackupKeepsRedemptions: a backup is a whole database, redemptions
// buckets included, so a restored copy knows who redeemed what.
func TestBackupKeepsRedemptions(t *testing.T) {
	db := mustOpen(t)
	ctx := context.Background()
	inv := newInvite("inv_backup", 3)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	for _, email := range []string{"a@x", "b@x"} {
		if _, err := db.RedeemInvite(ctx, inv.Hash, email, t0); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "copy.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Backup(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	restored := mustOpenPath(t, path, Options{})
	if got, _ := restored.InviteByHash(inv.Hash); got.Used != 2 {
		t.Errorf("restored uses %d, want 2", got.Used)
	}
	if o, err := restored.CheckInvite(inv.Hash, "b@x", t0); err != nil || o != invites.InviteAlreadyRedeemed {
		t.Errorf("b@x on the restored copy: %v %v, want InviteAlreadyRedeemed", o, err)
	}
	if reds, err := restored.Redemptions(inv.Hash); err != nil || len(reds) != 2 {
		t.Errorf("restored redemptions %v %v, want 2", reds, err)
	}
}
