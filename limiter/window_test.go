package limiter

import (
	"math/rand"
	"slices"
	"testing"
	"testing/quick"
	"time"
)

// stored returns w's stored times, oldest first.
func (w *window) stored() []int64 {
	out := make([]int64, w.n)
	for i := range out {
		out[i] = w.at(i)
	}
	return out
}

// TestWindowInvariants pushes random times, some going backwards and some
// far apart, and checks what the decisions rely on: stored times are
// non-decreasing, never earlier than the request they record, less than
// 1µs later while the clock runs forward; at most capacity are kept, and
// nothing still inside the horizon is lost to a rebase.
func TestWindowInvariants(t *testing.T) {
	prop := func(seed int64, capacity uint8, backwards bool) bool {
		r := rand.New(rand.NewSource(seed))
		capacity = 1 + capacity%20
		horizon := int64(time.Second) + r.Int63n(int64(MaxWindow))
		var (
			w        window
			recorded []int64 // each request's time, never before the newest
			now      = r.Int63n(int64(time.Hour))
		)
		for i := range 200 {
			switch p := r.Intn(20); {
			case p == 0:
				now += r.Int63n(3 * maxSpan) // far ahead: rebase
			case p == 1 && backwards:
				now -= r.Int63n(int64(time.Hour))
			default:
				now += r.Int63n(int64(2 * time.Second))
			}
			w.push(now, int(capacity), horizon)
			rec := now
			if len(recorded) > 0 {
				rec = max(rec, recorded[len(recorded)-1])
			}
			recorded = append(recorded, rec)

			got := w.stored()
			if len(got) == 0 || len(got) > int(capacity) {
				t.Logf("step %d: %d stored, capacity %d", i, len(got), capacity)
				return false
			}
			if !slices.IsSorted(got) {
				t.Logf("step %d: stored times not sorted: %v", i, got)
				return false
			}
			if newest := got[len(got)-1]; newest < rec || (!backwards && newest-rec >= tick) {
				t.Logf("step %d: newest stored %d for a request at %d", i, newest, rec)
				return false
			}
			// Live means inside the horizon of the recorded timeline,
			// which never runs backwards.
			live := 0
			for _, x := range recorded {
				if x > rec-horizon {
					live++
				}
			}
			kept := 0
			for _, x := range got {
				if x > rec-horizon {
					kept++
				}
			}
			if kept < min(live, int(capacity)) {
				t.Logf("step %d: kept %d live entries, want %d", i, kept, min(live, int(capacity)))
				return false
			}
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 500}); err != nil {
		t.Error(err)
	}
}

// TestEncodeDecode checks that Dirty's encoding round-trips exactly.
func TestEncodeDecode(t *testing.T) {
	prop := func(start int64, gaps []uint32) bool {
		var w window
		tm := start % (int64(1) << 60)
		for _, g := range gaps {
			tm += int64(g % uint32(10*time.Second/time.Microsecond) * 1000)
			w.push(tm, 64, int64(time.Hour))
		}
		if w.n == 0 {
			return encode(&w, 0, 0) == nil
		}
		const wall = int64(1_700_000_000_000_000_000)
		b := encode(&w, -maxT, wall)
		got, ok := decode(b, -maxT, wall, 64)
		return ok && slices.Equal(got.stored(), w.stored())
	}
	if err := quick.Check(prop, nil); err != nil {
		t.Error(err)
	}
}
