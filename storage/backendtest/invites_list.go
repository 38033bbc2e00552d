package backendtest

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"

	"breakwater/server/invites"
)

// listRevokeErrors: a second invite under an id or a hash already taken
// exists, an incomplete one is refused; Invites lists by creation time
// with every field as stored; a revoke keeps its first time; an unknown
// id is invites.ErrNotFound.
func listRevokeErrors(t *testing.T, kit Kit) {
	db := kit.Open(t)
	a, b := NewInvite("inv_a", 1), NewInvite("inv_b", 1)
	b.CreatedAt = t0.Add(-time.Hour)
	b.ExpiresAt = t0.Add(time.Hour)
	for _, inv := range []invites.Invite{a, b} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
	}
	for name, inv := range map[string]invites.Invite{
		"same id":   {ID: "inv_a", Hash: sha256.Sum256([]byte("other")), MaxUses: 1, CreatedAt: t0},
		"same hash": {ID: "inv_c", Hash: a.Hash, MaxUses: 1, CreatedAt: t0},
	} {
		if err := db.CreateInvite(inv); !errors.Is(err, kit.ErrExists) {
			t.Errorf("%s: CreateInvite = %v, want ErrExists", name, err)
		}
	}
	for name, inv := range map[string]invites.Invite{
		"nothing": {}, "no id": {Hash: a.Hash, MaxUses: 1, CreatedAt: t0}, "no hash": {ID: "x", MaxUses: 1, CreatedAt: t0},
		"no uses": {ID: "x", Hash: sha256.Sum256([]byte("x")), CreatedAt: t0}, "no time": {ID: "x", Hash: sha256.Sum256([]byte("x")), MaxUses: 1},
		"used": {ID: "x", Hash: sha256.Sum256([]byte("x")), MaxUses: 1, CreatedAt: t0, Used: 1},
	} {
		if err := db.CreateInvite(inv); !errors.Is(err, kit.ErrInvalid) {
			t.Errorf("%s: CreateInvite = %v, want ErrInvalid", name, err)
		}
	}
	list, err := db.Invites()
	if err != nil || len(list) != 2 || !sameInvite(list[0], b) || !sameInvite(list[1], a) {
		t.Fatalf("Invites() = %+v, %v; want b then a as stored", list, err)
	}
	at := t0.Add(time.Minute)
	if inv, err := db.RevokeInvite("inv_a", at); err != nil || !inv.RevokedAt.Equal(at) {
		t.Errorf("RevokeInvite = %+v, %v", inv, err)
	}
	if inv, err := db.RevokeInvite("inv_a", at.Add(time.Hour)); err != nil || !inv.RevokedAt.Equal(at) {
		t.Errorf("second RevokeInvite = %+v, %v; want the first time kept", inv, err)
	}
	if _, err := db.RevokeInvite("inv_none", at); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("RevokeInvite(unknown) = %v, want invites.ErrNotFound", err)
	}
}

// sameInvite compares two invites field by field, times by instant.
func sameInvite(a, b invites.Invite) bool {
	return a.ID == b.ID && a.Hash == b.Hash && a.MaxUses == b.MaxUses && a.Used == b.Used && a.Note == b.Note &&
		a.CreatedAt.Equal(b.CreatedAt) && a.ExpiresAt.Equal(b.ExpiresAt) && a.RevokedAt.Equal(b.RevokedAt)
}

// deleteInvite: a deleted invite is gone with its e-mails (another's
// stay); its code is unknown; deleting again is invites.ErrNotFound; the
// same code made again starts unused.
func deleteInvite(t *testing.T, kit Kit) {
	db := kit.Open(t)
	ctx := context.Background()
	inv, other := NewInvite("inv_del", 3), NewInvite("inv_keep", 3)
	for _, i := range []invites.Invite{inv, other} {
		if err := db.CreateInvite(i); err != nil {
			t.Fatal(err)
		}
		if _, err := db.RedeemInvite(ctx, i.Hash, "a@x", t0); err != nil {
			t.Fatal(err)
		}
	}
	if deleted, err := db.DeleteInvite("inv_del"); err != nil || deleted.ID != "inv_del" || deleted.Used != 1 {
		t.Errorf("DeleteInvite = %+v, %v", deleted, err)
	}
	if _, err := db.InviteByHash(inv.Hash); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("InviteByHash after delete: %v, want invites.ErrNotFound", err)
	}
	if o, err := db.RedeemInvite(ctx, inv.Hash, "b@x", t0); err != nil || o != invites.InviteUnknown {
		t.Errorf("redeem after delete: %v %v, want InviteUnknown", o, err)
	}
	if _, err := db.DeleteInvite("inv_del"); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("delete again: %v, want invites.ErrNotFound", err)
	}
	if reds, err := kit.Redemptions(db, other.Hash); err != nil || len(reds) != 1 {
		t.Errorf("the other invite's redemptions: %v, %v; want its one", reds, err)
	}
	recreated := NewInvite("inv_del", 3)
	recreated.CreatedAt = t0.Add(time.Minute)
	if err := db.CreateInvite(recreated); err != nil {
		t.Fatal(err)
	}
	if o, err := db.CheckInvite(inv.Hash, "a@x", t0); err != nil || o != invites.InviteRedeemed {
		t.Errorf("a@x on the re-created code: %v %v, want InviteRedeemed", o, err)
	}
	list, err := db.Invites()
	if ids := []string{}; err == nil {
		for _, i := range list {
			ids = append(ids, i.ID)
		}
		if !slices.Equal(ids, []string{"inv_keep", "inv_del"}) {
			t.Errorf("Invites() after delete and create = %v, want inv_keep, inv_del", ids)
		}
	} else {
		t.Error(err)
	}
}
