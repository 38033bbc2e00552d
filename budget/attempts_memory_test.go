package budget

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestAttemptsDirtyGivesBackABurst: after a burst of many users' attempts
// is drained by Dirty (the write-behind), the map that tracked them is
// freed, not kept at its peak for the rest of the day.
func TestAttemptsDirtyGivesBackABurst(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	a := NewAttempts(time.UTC, DayKey(now, time.UTC), nil)
	const users = 100_000
	for i := range users {
		if err := a.Take(fmt.Sprintf("user-%06d", i), 0, now); err != nil {
			t.Fatal(err)
		}
	}
	before := liveHeap()
	if _, entries := a.Dirty(); len(entries) != users {
		t.Fatalf("Dirty gave %d entries, want %d", len(entries), users)
	}
	after := liveHeap()
	// The dirty map of 100,000 string keys holds a few MB; the counts
	// themselves stay (they are the day's state).
	if freed := before - after; freed < 1<<20 {
		t.Errorf("Dirty freed %d bytes of live heap after a burst of %d users, want at least 1 MiB", freed, users)
	}
	if got := a.Count("user-000007", now); got != 1 {
		t.Errorf("count after Dirty = %d, want 1", got)
	}
	if err := a.Take("user-000007", 0, now); err != nil {
		t.Fatal(err)
	}
	if _, entries := a.Dirty(); len(entries) != 1 {
		t.Errorf("the next Dirty gave %d entries, want the 1 changed since", len(entries))
	}
	runtime.KeepAlive(a)
}

func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
