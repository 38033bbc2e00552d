package storage

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/server/invites"
	"breakwater/storage/backendtest"
)

// TestCheckInviteMissDoesTheWorkOfAHit: a code that finds no invite costs
// what a code that finds one costs, so that the time of the answer does
// not tell a guesser that a code exists. A miss reads a stored invite in
// its stead, the next in key order (the first past the last): it must
// cost exactly what a check of that invite's own code costs. The work is
// counted by allocations, which are exact where time is noisy: decoding a
// record and opening a redemptions bucket allocate, and a miss that
// skipped them allocates less than half as much.
func TestCheckInviteMissDoesTheWorkOfAHit(t *testing.T) {
	db := mustOpen(t)
	now := t0.Add(time.Hour)
	if got, err := db.CheckInvite(sha256.Sum256([]byte("x")), "ann@example.com", now); err != nil || got != invites.InviteUnknown {
		t.Fatalf("no invites stored: %v %v, want unknown", got, err)
	}
	backendtest.InvitesInEveryState(t, db, now)
	var first, last [32]byte
	for i := range last {
		last[i] = 0xff
	}
	misses := [][32]byte{first, last}
	for i := range 30 {
		misses = append(misses, sha256.Sum256(fmt.Appendf(nil, "unknown code %d", i)))
	}
	allocs := func(t *testing.T, hash [32]byte, email string) (float64, invites.RedeemOutcome) {
		var out invites.RedeemOutcome
		var err error
		n := testing.AllocsPerRun(50, func() { out, err = db.CheckInvite(hash, email, now) })
		if err != nil {
			t.Fatal(err)
		}
		return n, out
	}
	for i, miss := range misses {
		for _, email := range []string{"ann@example.com", "bob@example.com"} {
			t.Run(fmt.Sprintf("%d %s", i, email), func(t *testing.T) {
				standIn := nextInviteKey(t, db, miss)
				missAllocs, out := allocs(t, miss, email)
				if out != invites.InviteUnknown {
					t.Fatalf("miss: outcome %v, want unknown", out)
				}
				hitAllocs, out := allocs(t, standIn, email)
				if out == invites.InviteUnknown {
					t.Fatalf("stand-in %x: unknown", standIn)
				}
				if missAllocs != hitAllocs {
					t.Errorf("miss %x: %v allocations; a hit on the invite standing in for it (%v): %v",
						miss[:4], missAllocs, out, hitAllocs)
				}
			})
		}
	}
}

// nextInviteKey is the key of the invite stored after key, or the first
// one if none is.
func nextInviteKey(t *testing.T, db *DB, key [32]byte) (next [32]byte) {
	t.Helper()
	err := db.view(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketInvites).Cursor()
		k, _ := c.Seek(key[:])
		if bytes.Equal(k, key[:]) {
			return fmt.Errorf("%x is stored", key)
		}
		if k == nil {
			k, _ = c.First()
		}
		copy(next[:], k)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return next
}
