package limiter_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"breakwater/limiter"
)

// liveHeap is the heap still reachable after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// checkEvictedMemory feeds rounds of n fresh keys to add, evicting
// between rounds with evict at the round's end plus idle, and asserts what
// each key costs while held and that memory after eviction does not
// accumulate: the server meets a new client IP or user with every
// request and forgets it once its window is idle, so its memory must
// follow the keys of the last window, not every key ever seen. A map does
// not give back its table when emptied, so the bound on the rounds is
// the first round's peak, not the empty heap.
func checkEvictedMemory(t *testing.T, n int, perKey int64, add func(round, i int, at time.Time), evict func(at time.Time) int, held func() int) {
	t.Helper()
	const idle = 24 * time.Hour // longer than any window or cooldown in the tests
	base := liveHeap()
	var peak int64
	at := t0
	for round := range 3 {
		for i := range n {
			add(round, i, at)
		}
		if got := held(); got != n {
			t.Fatalf("round %d: %d keys held, want %d", round, got, n)
		}
		full := liveHeap()
		grew := full - base
		t.Logf("round %d: %d keys hold %d bytes of live heap, %d per key", round, n, grew, grew/int64(n))
		if round == 0 {
			peak = full
			if grew > perKey*int64(n) {
				t.Errorf("%d keys hold %d bytes, %d per key, want at most %d per key", n, grew, grew/int64(n), perKey)
			}
		} else if limit := peak + peak/10; full > limit {
			t.Errorf("round %d: live heap %d with %d keys held, over the first round's %d: evicted keys still cost memory", round, full, n, peak)
		}
		at = at.Add(idle)
		if got := evict(at); got != n {
			t.Errorf("round %d: Evict dropped %d keys after %v idle, want %d", round, got, idle, n)
		}
		if got := held(); got != 0 {
			t.Errorf("round %d: %d keys held after Evict, want 0", round, got)
		}
		after := liveHeap()
		t.Logf("round %d: after Evict, %d bytes over the empty heap", round, after-base)
		if after-base > grew/2 {
			t.Errorf("round %d: after Evict the heap is still %d bytes over empty, more than half of the %d the keys took", round, after-base, grew)
		}
	}
}

// windowPerKey is the most live heap a key with one request may hold in
// a Limiter: its map slot, its key and a 32-byte window without a ring
// (a flood brings many such keys, one request from each address).
const windowPerKey = 90

// TestEvictedWindowsFreeMemory: the rate windows of idle keys (one per
// user, or per client IP on the invite route) are freed by Evict, so
// memory follows the keys active within a window, and each key with one
// request holds at most windowPerKey bytes.
func TestEvictedWindowsFreeMemory(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 50, Window: 10 * time.Minute, Burst: 3})
	checkEvictedMemory(t, 50_000, windowPerKey,
		func(round, i int, at time.Time) {
			if err := l.Allow(fmt.Sprintf("ip:%d-%d", round, i), at); err != nil {
				t.Fatal(err)
			}
		},
		l.Evict, l.Len)
}

// failPerKey is the most live heap a key with one failure may hold in a
// FailLimiter: its map slot, its key and a 16-byte run, no cooldown.
const failPerKey = 140

// TestEvictedFailKeysFreeMemory: the same for the fail limiter's entries
// (per client IP and per e-mail on the invite route), after each key's
// failure and the write-behind's Dirty; a key with one failure holds at
// most failPerKey bytes.
func TestEvictedFailKeysFreeMemory(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 5})
	checkEvictedMemory(t, 50_000, failPerKey,
		func(round, i int, at time.Time) {
			a, err := f.Begin([]string{fmt.Sprintf("email:guess-%d-%d@example.com", round, i)}, at)
			if err != nil {
				t.Fatal(err)
			}
			a.Fail(at)
		},
		func(at time.Time) int {
			n := f.Evict(at)
			f.Dirty() // as the write-behind does after each Evict
			return n
		},
		f.Len)
}

// TestEvictedCooldownsFreeMemory: keys whose failure started a cooldown
// (kept apart from their runs) are dropped by Evict once idle, cooldown
// and all: rounds of fresh keys do not accumulate memory. (Two emptied
// maps keep their tables, so the bound is the first round's heap.)
func TestEvictedCooldownsFreeMemory(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 1})
	const n = 20_000
	at := t0
	var first int64
	for round := range 4 {
		for i := range n {
			a, err := f.Begin([]string{fmt.Sprintf("ip:%d-%d", round, i)}, at)
			if err != nil {
				t.Fatal(err)
			}
			a.Fail(at)
			if len(a.CooldownsStarted()) != 1 {
				t.Fatal("no cooldown started")
			}
		}
		if got := len(f.Cooling(at)); got != n {
			t.Fatalf("round %d: %d keys cooling, want %d", round, got, n)
		}
		at = at.Add(48 * time.Hour) // past the cooldown and the backoff's memory
		if got := f.Evict(at); got != n {
			t.Errorf("round %d: Evict dropped %d keys, want %d", round, got, n)
		}
		f.Dirty()
		heap := liveHeap()
		t.Logf("round %d: %d bytes of live heap after Evict", round, heap)
		if round == 0 {
			first = heap
		} else if heap > first+first/10 {
			t.Errorf("round %d: live heap %d after Evict, over the first round's %d: evicted cooldowns still cost memory", round, heap, first)
		}
	}
}
