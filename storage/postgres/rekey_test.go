package postgres_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"breakwater/server/invites"
	"breakwater/storage/backendtest"
	"breakwater/storage/postgres"
)

// Another instance starting with the same mark after the first re-keyed
// finds nothing to move; with another mark it refuses and moves nothing.
// (What one instance does is the suite's backendtest.Rekey.)
func TestRekeyInvitesAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	db, other := open(t, url), open(t, url)
	old := sha256.Sum256([]byte("CODE"))
	if err := db.CreateInvite(invites.Invite{ID: "inv_a", Hash: old, MaxUses: 3, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(context.Background(), old, "a@example.com", t0); err != nil {
		t.Fatal(err)
	}
	keyed := backendtest.RekeyForTest(old)
	for i, inst := range []*postgres.DB{db, other} {
		if n, err := inst.RekeyInvites([]byte("mark-1"), backendtest.RekeyForTest); err != nil || n != 1-i {
			t.Fatalf("RekeyInvites by instance %d = %d, %v; want %d", i+1, n, err, 1-i)
		}
	}
	if out, err := other.CheckInvite(keyed, "a@example.com", t0); err != nil || out != invites.InviteAlreadyRedeemed {
		t.Errorf("the other instance does not see the moved redemption: %v %v", out, err)
	}
	if _, err := other.RekeyInvites([]byte("mark-2"), backendtest.RekeyForTest); !errors.Is(err, postgres.ErrInviteKeyChanged) {
		t.Errorf("another mark: %v, want ErrInviteKeyChanged", err)
	}
	if _, err := db.InviteByHash(keyed); err != nil {
		t.Errorf("another mark moved the invite: %v", err)
	}
}
