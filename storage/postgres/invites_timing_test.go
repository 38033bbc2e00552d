package postgres_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"breakwater/server/invites"
)

// A code that finds no invite costs the client what one that finds an
// invite costs, in every state a hit can find, so that the time of the
// answer does not tell a guesser that a code exists: the work is counted
// by allocations, exact where time is noisy (decoding an invite's text
// columns for a hit and NULLs for a miss would differ). The server's part
// is two index probes either way.
func TestCheckInviteMissDoesTheWorkOfAHit(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	now := t0.Add(time.Hour)
	var hits [][32]byte
	for i := range 12 { // every state a hit can find
		inv := newInvite(fmt.Sprintf("inv_%02d", i), 1+i%2)
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
			if _, err := db.RedeemInvite(ctx, inv.Hash, "ann@example.com", t0); err != nil {
				t.Fatal(err)
			}
		}
		if i%5 == 4 {
			if _, err := db.RevokeInvite(inv.ID, t0); err != nil {
				t.Fatal(err)
			}
		}
		hits = append(hits, inv.Hash)
	}
	allocs := func(hash [32]byte, email string) (float64, invites.RedeemOutcome) {
		var out invites.RedeemOutcome
		var err error
		n := testing.AllocsPerRun(50, func() { out, err = db.CheckInvite(hash, email, now) })
		if err != nil {
			t.Fatal(err)
		}
		return n, out
	}
	miss, out := allocs(sha256.Sum256([]byte("unknown code")), "ann@example.com")
	if out != invites.InviteUnknown {
		t.Fatalf("miss: outcome %v, want unknown", out)
	}
	outcomes := map[invites.RedeemOutcome]bool{}
	for _, hash := range hits {
		for _, email := range []string{"ann@example.com", "bob@example.com"} {
			hit, out := allocs(hash, email)
			outcomes[out] = true
			if hit != miss {
				t.Errorf("hit %x (%v) by %s: %v allocations; a miss: %v", hash[:4], out, email, hit, miss)
			}
		}
	}
	if len(outcomes) != 5 {
		t.Errorf("the hits gave %d outcomes (%v), want all 5 a known code can give", len(outcomes), outcomes)
	}
}
