package storage

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"breakwater/server/invites"
)

// RekeyInvites moves every invite and its redemptions to the keyed hash
// once, in one transaction; again with the same mark it does nothing, and
// with another mark it refuses and moves nothing.
func TestRekeyInvites(t *testing.T) {
	db := mustOpen(t)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := sha256.Sum256([]byte("CODE"))
	if err := db.CreateInvite(invites.Invite{ID: "inv_a", Hash: old, MaxUses: 3, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(context.Background(), old, "a@example.com", now); err != nil {
		t.Fatal(err)
	}
	rekey := func(d [32]byte) [32]byte { return sha256.Sum256(append([]byte("k:"), d[:]...)) }
	keyed := rekey(old)
	for i, want := range []int{1, 0} {
		if n, err := db.RekeyInvites([]byte("mark-1"), rekey); err != nil || n != want {
			t.Fatalf("RekeyInvites #%d = %d, %v; want %d", i+1, n, err, want)
		}
	}
	if _, err := db.InviteByHash(old); !errors.Is(err, ErrNotFound) {
		t.Errorf("the unkeyed hash still finds the invite: %v", err)
	}
	inv, err := db.InviteByHash(keyed)
	if err != nil || inv.ID != "inv_a" || inv.Hash != keyed || inv.Used != 1 {
		t.Errorf("InviteByHash(keyed) = %+v, %v", inv, err)
	}
	if out, err := db.CheckInvite(keyed, "a@example.com", now); err != nil || out != invites.InviteAlreadyRedeemed {
		t.Errorf("the redemption did not move with it: %v %v", out, err)
	}
	if _, err := db.RekeyInvites([]byte("mark-2"), rekey); !errors.Is(err, ErrInviteKeyChanged) {
		t.Errorf("another mark: %v, want ErrInviteKeyChanged", err)
	}
	if _, err := db.InviteByHash(keyed); err != nil {
		t.Errorf("another mark moved the invite: %v", err)
	}
}
