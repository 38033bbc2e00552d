package budget

import (
	"encoding/binary"
	"math"
	"testing"
	"time"
)

// FuzzDecodeCounts feeds layer 2's stored counts (what the write-behind
// put on disk, or a damaged copy) to DecodeCounts and a restarted
// Attempts, and checks:
//   - a value is taken only if it is what Dirty writes: 8 bytes holding a
//     count of 0 or more; anything else is skipped, so the user starts the
//     day at 0 (the layer fails open) and never below it;
//   - what was taken, counted on and written behind again, decodes to the
//     count plus the attempts taken.
func FuzzDecodeCounts(f *testing.F) {
	count := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	f.Add("alice", count(3), "bob", count(0), uint8(2))
	f.Add("alice", count(49), "jwt:user_2Nf", count(1<<40), uint8(1))
	f.Add("alice", []byte{0, 0, 0, 5}, "bob", count(7), uint8(0))
	f.Add("", []byte{}, "bob", []byte("12345678"), uint8(3))
	f.Fuzz(func(t *testing.T, u1 string, v1 []byte, u2 string, v2 []byte, takes uint8) {
		if u1 == u2 {
			u2 += "'"
		}
		stored := map[string][]byte{u1: v1, u2: v2}
		counts := DecodeCounts(stored)
		for u, v := range stored {
			n, ok := counts[u]
			valid := len(v) == 8 && int64(binary.BigEndian.Uint64(v)) >= 0
			if ok != valid || ok && n != int64(binary.BigEndian.Uint64(v)) {
				t.Fatalf("stored %q = %x decoded as %d (%v)", u, v, n, ok)
			}
		}
		if len(counts) > len(stored) {
			t.Fatalf("decoded %d counts of %d stored", len(counts), len(stored))
		}

		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		day := now.Format(time.DateOnly)
		a := NewAttempts(time.UTC, day, counts)
		for u := range stored {
			if n := a.Count(u, now); n < 0 || n != counts[u] {
				t.Fatalf("%q starts the day at %d, decoded %d", u, n, counts[u])
			}
		}
		for range takes {
			if err := a.Take(u1, 0, now); err != nil {
				t.Fatal(err)
			}
		}
		gotDay, entries := a.Dirty()
		if gotDay != day {
			t.Fatalf("Dirty() day %q, want %q", gotDay, day)
		}
		again := DecodeCounts(entries)
		if counts[u1] > math.MaxInt64-int64(takes) {
			return // a count no day reaches: counting on would wrap
		}
		if want := counts[u1] + int64(takes); takes > 0 && again[u1] != want {
			t.Fatalf("%q: %d + %d taken, written behind as %d", u1, counts[u1], takes, again[u1])
		}
	})
}
