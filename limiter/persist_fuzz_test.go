package limiter

import (
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzDecodeState feeds the write-behind state decoder bytes from disk and
// checks that it rejects garbage without panicking, that what it accepts
// is a sound window, and that it round-trips what the encoder wrote:
//   - an accepted state holds at most capacity entries, in order, all
//     after the cutoff and within a uint32 span of ticks;
//   - encoding an accepted state and decoding it again gives the same
//     times, and encodes to the same bytes;
//   - a window built by push from the fuzzed gaps decodes from its own
//     encoding to exactly its live entries (the newest capacity of them).
func FuzzDecodeState(f *testing.F) {
	wall := int64(1_767_225_600_000_000_000) // 2026-01-01T00:00:00Z
	state := func(first int64, gaps ...uint64) []byte {
		b := binary.AppendVarint([]byte{stateVersion}, first)
		b = binary.AppendUvarint(b, uint64(len(gaps)+1))
		for _, g := range gaps {
			b = binary.AppendUvarint(b, g)
		}
		return b
	}
	f.Add(state(wall+5e9, 1_000_000, 1_000_000), int64(0), wall, uint8(3))
	f.Add(state(wall, 0, 0, 0, 0), int64(-1), wall, uint8(2))
	f.Add(state(wall-61e9, 60_000_000, 1), int64(0), wall, uint8(60))
	f.Add(state(1<<62, 1), int64(0), int64(0), uint8(5))
	f.Add(state(wall, 1<<32), int64(0), wall, uint8(5))
	f.Add([]byte{stateVersion, 0x80}, int64(0), wall, uint8(1))
	f.Add([]byte{2, 0, 1}, int64(0), wall, uint8(1))
	f.Add([]byte{stateVersion, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, int64(0), wall, uint8(1))
	f.Add([]byte{}, int64(0), wall, uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, cutoff, wall int64, cap8 uint8) {
		capacity := int(cap8) + 1
		// Cutoffs and walls as the Limiter makes them: times are within
		// ±maxT of the epoch, and the epoch is a real Unix time.
		cutoff = max(min(cutoff, maxT), -maxT)
		wall = max(wall%(1<<61), -wall%(1<<61))

		w, ok := decode(b, cutoff, wall, capacity)
		if ok {
			times := checkWindow(t, w, cutoff, capacity)
			if len(times) > 0 {
				enc := encode(w, cutoff, wall)
				w2, ok := decode(enc, cutoff, wall, capacity)
				if !ok {
					t.Fatalf("decode refuses encode's %x of %v", enc, times)
				}
				if again := timesOf(w2); !slices.Equal(again, times) {
					t.Fatalf("round trip %v -> %x -> %v", times, enc, again)
				}
				if enc2 := encode(w2, cutoff, wall); string(enc2) != string(enc) {
					t.Fatalf("encoding not stable: %x, then %x", enc, enc2)
				}
			}
		}

		// The fuzzed bytes as gaps between requests, pushed as Allow does.
		var p window
		at := cutoff
		var pushed []int64
		for i := 0; i+1 < len(b) && len(pushed) < 300; i += 2 {
			gap := int64(binary.LittleEndian.Uint16(b[i:])) * 997 // ns: not tick-aligned
			if gap&1 == 1 {
				gap <<= 20 // up to hours: beyond a uint32 of ticks
			}
			at += gap
			if at > maxT {
				break
			}
			p.push(at, capacity, maxT)
			pushed = append(pushed, at)
		}
		live := timesOf(&p)
		enc := encode(&p, cutoff, wall)
		if len(live) == 0 || live[len(live)-1] <= cutoff {
			return
		}
		w3, ok := decode(enc, cutoff, wall, capacity)
		if !ok {
			t.Fatalf("decode refuses encode's %x of %v", enc, live)
		}
		var want []int64
		for _, x := range live {
			if x > cutoff {
				want = append(want, x)
			}
		}
		if got := checkWindow(t, w3, cutoff, capacity); !slices.Equal(got, want) {
			t.Fatalf("pushed %v, live %v, decoded %v", pushed, want, got)
		}
	})
}

// checkWindow fails unless w is sound for the decoder's promises, and
// returns its times.
func checkWindow(t *testing.T, w *window, cutoff int64, capacity int) []int64 {
	t.Helper()
	// A window of one entry has no ring: the entry is at base.
	if int(w.n) > capacity || (w.n > 1 && int(w.n) > len(w.slots())) {
		t.Fatalf("window holds %d entries, ring %d, capacity %d", w.n, len(w.slots()), capacity)
	}
	times := timesOf(w)
	for i, x := range times {
		if x <= cutoff || x > maxT {
			t.Fatalf("entry %d at %d is not in (cutoff %d, maxT]", i, x, cutoff)
		}
		if i > 0 && x < times[i-1] {
			t.Fatalf("entries out of order: %v", times)
		}
	}
	if len(times) > 0 && times[len(times)-1]-times[0] > maxSpan {
		t.Fatalf("span %d over %d", times[len(times)-1]-times[0], maxSpan)
	}
	return times
}

func timesOf(w *window) []int64 {
	out := make([]int64, 0, w.n)
	for i := range int(w.n) {
		out = append(out, w.at(i))
	}
	return out
}
