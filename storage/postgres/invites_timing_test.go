package postgres_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"breakwater/server/invites"
	"breakwater/storage/backendtest"
)

// A code that finds no invite costs the client what one that finds an
// invite costs, in every state a hit can find, so that the time of the
// answer does not tell a guesser that a code exists: the work is counted
// by allocations, exact where time is noisy (decoding an invite's text
// columns for a hit and NULLs for a miss would differ). The server's part
// is two index probes either way.
func TestCheckInviteMissDoesTheWorkOfAHit(t *testing.T) {
	db := newDB(t)
	now := t0.Add(time.Hour)
	hits := backendtest.InvitesInEveryState(t, db, now)
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
