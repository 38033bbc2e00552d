package backendtest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"breakwater/server/invites"
)

// NewInvite returns an invite with uses uses, created at the suite's
// fixed time (2026-03-01 12:00 UTC), its hash derived from id; the
// backends' own tests make theirs with it too.
func NewInvite(id string, uses int) invites.Invite {
	return invites.Invite{ID: id, Hash: sha256.Sum256([]byte("code-" + id)), MaxUses: uses, CreatedAt: t0, Note: "for " + id}
}

// Invites checks invites.Store and invites.Redeemer: the outcomes of a
// redemption, the read-only check agreeing with it, one use per e-mail
// and no use too many under concurrent redemptions (through two
// instances), listing, revoking and deleting.
func Invites(t *testing.T, kit Kit) {
	t.Run("RedemptionOutcomes", func(t *testing.T) { redemptionOutcomes(t, kit) })
	t.Run("CheckAgreesWithRedeem", func(t *testing.T) { checkAgreesWithRedeem(t, kit) })
	t.Run("OneUseInParallel", func(t *testing.T) { oneUseInParallel(t, kit) })
	t.Run("SameEmailInParallel", func(t *testing.T) { sameEmailInParallel(t, kit) })
	t.Run("ManyUsesInParallel", func(t *testing.T) { manyUsesInParallel(t, kit) })
	t.Run("ListRevokeErrors", func(t *testing.T) { listRevokeErrors(t, kit) })
	t.Run("DeleteInvite", func(t *testing.T) { deleteInvite(t, kit) })
}

// redemptionOutcomes: each outcome, by CheckInvite and by RedeemInvite;
// the uses and e-mails stored.
func redemptionOutcomes(t *testing.T, kit Kit) {
	db := kit.Open(t)
	ctx := context.Background()
	one, two, exp, rev := NewInvite("inv_one", 1), NewInvite("inv_two", 2), NewInvite("inv_exp", 5), NewInvite("inv_rev", 5)
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
		if checked, err := db.CheckInvite(c.hash, c.email, c.at); err != nil || checked != c.want {
			t.Errorf("%s: CheckInvite = %v, %v; want %v", c.name, checked, err, c.want)
		}
		if got, err := db.RedeemInvite(ctx, c.hash, c.email, c.at); err != nil || got != c.want {
			t.Errorf("%s: RedeemInvite = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if inv, err := db.InviteByHash(two.Hash); err != nil || inv.Used != 2 {
		t.Errorf("two: %+v, %v; want 2 uses", inv, err)
	}
	reds, err := kit.Redemptions(db, two.Hash)
	if got, want := fmt.Sprint(reds), fmt.Sprint([]Redemption{{"a@x", t0}, {"b@x", t0}}); err != nil || got != want {
		t.Errorf("two: redemptions %s, %v; want %s", got, err, want)
	}
	if reds, _ = kit.Redemptions(db, one.Hash); len(reds) != 1 || reds[0].Email != "a@x" || !reds[0].At.Equal(t0) {
		t.Errorf("one: redemptions %v, want only a@x at t0 (a second try changes nothing)", reds)
	}
	if _, err := db.InviteByHash(sha256.Sum256([]byte("nope"))); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("unknown hash: %v, want invites.ErrNotFound", err)
	}
	if _, err := db.RedeemInvite(ctx, one.Hash, "", t0); !errors.Is(err, kit.ErrInvalid) {
		t.Errorf("redeem without e-mail: %v, want ErrInvalid", err)
	}
}

// checkAgreesWithRedeem: the read-only check gives what a redemption
// would, and writes nothing.
func checkAgreesWithRedeem(t *testing.T, kit Kit) {
	db := kit.Open(t)
	two, exp := NewInvite("inv_two", 2), NewInvite("inv_exp", 5)
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
			if checked != s.want {
				t.Errorf("CheckInvite = %v, want %v", checked, s.want)
			}
			redeemed, err := db.RedeemInvite(context.Background(), s.hash, s.email, s.at)
			if err != nil || redeemed != checked {
				t.Errorf("RedeemInvite = %v, %v; CheckInvite said %v", redeemed, err, checked)
			}
		})
	}
}
