package postgres_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"breakwater/server/invites"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// RekeyInvites moves every invite and its redemptions to the keyed hash
// once, in one transaction; again with the same mark (another instance
// starting) it does nothing, and with another mark it refuses and moves
// nothing.
func TestRekeyInvites(t *testing.T) {
	url := pgtest.NewDatabase(t)
	db, other := open(t, url), open(t, url)
	old := sha256.Sum256([]byte("CODE"))
	if err := db.CreateInvite(invites.Invite{ID: "inv_a", Hash: old, MaxUses: 3, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(context.Background(), old, "a@example.com", t0); err != nil {
		t.Fatal(err)
	}
	rekey := func(d [32]byte) [32]byte { return sha256.Sum256(append([]byte("k:"), d[:]...)) }
	keyed := rekey(old)
	for i, inst := range []*postgres.DB{db, other} {
		want := 1 - i
		if n, err := inst.RekeyInvites([]byte("mark-1"), rekey); err != nil || n != want {
			t.Fatalf("RekeyInvites #%d = %d, %v; want %d", i+1, n, err, want)
		}
	}
	if _, err := db.InviteByHash(old); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("the unkeyed hash still finds the invite: %v", err)
	}
	inv, err := db.InviteByHash(keyed)
	if err != nil || inv.ID != "inv_a" || inv.Hash != keyed || inv.Used != 1 {
		t.Errorf("InviteByHash(keyed) = %+v, %v", inv, err)
	}
	if out, err := db.CheckInvite(keyed, "a@example.com", t0); err != nil || out != invites.InviteAlreadyRedeemed {
		t.Errorf("the redemption did not move with it: %v %v", out, err)
	}
	if _, err := other.RekeyInvites([]byte("mark-2"), rekey); !errors.Is(err, postgres.ErrInviteKeyChanged) {
		t.Errorf("another mark: %v, want ErrInviteKeyChanged", err)
	}
	if _, err := db.InviteByHash(keyed); err != nil {
		t.Errorf("another mark moved the invite: %v", err)
	}
}
