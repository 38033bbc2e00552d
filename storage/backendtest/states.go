package backendtest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// InvitesInEveryState stores 12 invites (ids inv_00 to inv_11) in every
// state a check at now can find: one or two uses, expired, expiring
// later or never, redeemed by ann@example.com or not, revoked or not,
// notes of several lengths; it returns their hashes. A backend's test of
// its answer's cost (a miss costs what a hit costs) checks it against
// these.
func InvitesInEveryState(t *testing.T, db Backend, now time.Time) [][32]byte {
	t.Helper()
	var hashes [][32]byte
	for i := range 12 {
		inv := NewInvite(fmt.Sprintf("inv_%02d", i), 1+i%2)
		inv.CreatedAt = now.Add(-time.Hour)
		inv.Note = fmt.Sprintf("a note of some length %0*d", i*10, i)
		switch i % 4 {
		case 1:
			inv.ExpiresAt = now.Add(-time.Minute)
		case 2:
			inv.ExpiresAt = now.Add(time.Hour)
		}
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if _, err := db.RedeemInvite(context.Background(), inv.Hash, "ann@example.com", inv.CreatedAt); err != nil {
				t.Fatal(err)
			}
		}
		if i%5 == 4 {
			if _, err := db.RevokeInvite(inv.ID, inv.CreatedAt); err != nil {
				t.Fatal(err)
			}
		}
		hashes = append(hashes, inv.Hash)
	}
	return hashes
}
