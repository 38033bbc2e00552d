package state_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/guard/state"
	"breakwater/storage"
)

func mustOpen(t *testing.T) *storage.DB {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestWriteBehindSnapshots: each registered snapshot reaches storage, a
// limiter restores from it, and the attempt counts of a day gone by are
// dropped once the day turns.
func TestWriteBehindSnapshots(t *testing.T) {
	db := mustOpen(t)
	now := time.Date(2026, 3, 10, 23, 59, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	windows, err := limiter.New(limiter.Config{Rate: 5, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	attempts := budget.NewAttempts(time.UTC, "2026-03-10", nil)
	wb, err := state.NewWriteBehind(db, []state.Snapshot{
		state.Windows(state.StateUserWindows, "rate", windows),
		state.Attempts("attempts", attempts),
	}, state.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := windows.Allow("alice", now); err != nil {
			t.Fatal(err)
		}
		if err := attempts.Take("alice", 10, now); err != nil {
			t.Fatal(err)
		}
	}
	wb.Flush()

	restored, err := limiter.New(limiter.Config{Rate: 5, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := state.LoadWindows(db, state.StateUserWindows, restored, now); err != nil {
		t.Fatal(err)
	}
	if got, want := restored.Len(), 1; got != want {
		t.Errorf("%d windows restored, want %d", got, want)
	}
	counts, err := db.LoadState(state.AttemptsState("2026-03-10"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := budget.DecodeCounts(counts)["alice"], int64(2); got != want {
		t.Errorf("stored attempts %d, want %d", got, want)
	}

	now = now.Add(2 * time.Minute) // the next day
	if err := attempts.Take("alice", 10, now); err != nil {
		t.Fatal(err)
	}
	wb.Flush()
	if old, err := db.LoadState(state.AttemptsState("2026-03-10")); err != nil || len(old) != 0 {
		t.Errorf("yesterday's counts still stored: %v, %v", old, err)
	}
	counts, err = db.LoadState(state.AttemptsState("2026-03-11"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := budget.DecodeCounts(counts)["alice"], int64(1); got != want {
		t.Errorf("today's attempts %d, want %d", got, want)
	}
}

// failingStore refuses every write.
type failingStore struct{}

func (failingStore) SaveState(string, map[string][]byte) error { return errors.New("read-only") }
func (failingStore) DropStates(string, string) error           { return nil }

// TestWriteBehindFailureNamesTheLayer: a lost write is a fail-open event
// of the snapshot's layer, once per state that changed.
func TestWriteBehindFailureNamesTheLayer(t *testing.T) {
	got, wb := flushFailing(t, 1)
	wb.Flush()
	if got["invites"] != 2 {
		t.Errorf("fail-open events %v after a flush with nothing new, want still 2", got)
	}
}

// recordingStore passes writes on to a real store and keeps the keys of
// each SaveState call, in call order.
type recordingStore struct {
	state.StateStore
	names []string
	calls [][]string
}

func (s *recordingStore) SaveState(name string, entries map[string][]byte) error {
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s.names, s.calls = append(s.names, name), append(s.calls, keys)
	return s.StateStore.SaveState(name, entries)
}

// TestWriteBehindWritesInChunks: a flood's worth of dirty keys (more than
// two chunks) is written in transactions of at most state.MaxChunk entries, in
// key order, and all of it is restored: no single transaction holds a
// second of a flood.
func TestWriteBehindWritesInChunks(t *testing.T) {
	db := mustOpen(t)
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	fails, err := limiter.NewFail(limiter.FailConfig{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	windows, err := limiter.New(limiter.Config{Rate: 50, Window: 10 * time.Minute, Burst: 3})
	if err != nil {
		t.Fatal(err)
	}
	windows.Dirty(now) // start tracking, as the first flush does
	const ips = state.MaxChunk + state.MaxChunk/2 + 3
	for i := range ips {
		ip := fmt.Sprintf("ip:10.0.%d.%d", i>>8, i&255)
		if err := windows.Allow(ip, now); err != nil {
			t.Fatal(err)
		}
		a, err := fails.Begin([]string{ip, fmt.Sprintf("email:guess%d@example.com", i)}, now)
		if err != nil {
			t.Fatal(err)
		}
		a.Fail(now)
	}
	store := &recordingStore{StateStore: db}
	wb, err := state.NewWriteBehind(store, []state.Snapshot{
		state.Windows("w", "invites", windows),
		state.Fails("f", "g", "invites", fails),
	}, state.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	wb.Flush()

	written := 0
	for i, keys := range store.calls {
		if len(keys) > state.MaxChunk {
			t.Errorf("write %d holds %d entries, want at most %d", i, len(keys), state.MaxChunk)
		}
		if i > 0 && store.names[i-1] == store.names[i] {
			if prev := store.calls[i-1]; keys[0] <= prev[len(prev)-1] {
				t.Errorf("write %d of %s starts at %q, not after the last key of the write before it, %q", i, store.names[i], keys[0], prev[len(prev)-1])
			}
		}
		written += len(keys)
	}
	if want := 3*ips + 1; written != want { // windows, fail keys, the service-wide count
		t.Errorf("%d entries written, want %d", written, want)
	}

	restored, err := limiter.NewFail(limiter.FailConfig{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	if err := state.LoadFails(db, "f", "g", restored); err != nil {
		t.Fatal(err)
	}
	if got, want := restored.Len(), 2*ips; got != want {
		t.Errorf("%d fail keys restored, want %d", got, want)
	}
	if got, want := restored.GlobalFailures(now), ips; got != want {
		t.Errorf("service-wide failures restored %d, want %d", got, want)
	}
	rw, err := limiter.New(limiter.Config{Rate: 50, Window: 10 * time.Minute, Burst: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := state.LoadWindows(db, "w", rw, now); err != nil {
		t.Fatal(err)
	}
	if got, want := rw.Len(), ips; got != want {
		t.Errorf("%d windows restored, want %d", got, want)
	}
}

// TestWriteBehindChunkFailureOncePerState: when a chunk cannot be written,
// the layer fails open once for that state, and the rest of it is not
// tried.
func TestWriteBehindChunkFailureOncePerState(t *testing.T) {
	flushFailing(t, 3*state.MaxChunk)
}

// flushFailing fails n keys of a fail limiter once each, flushes them to
// a store that refuses every write, and checks that the invites layer
// failed open once per state (the keys and the service-wide count). It
// returns the fail-open events by layer (later flushes add to them) and
// the write-behind.
func flushFailing(t *testing.T, n int) (map[string]int, *state.WriteBehind) {
	t.Helper()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	fails, err := limiter.NewFail(limiter.FailConfig{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		a, err := fails.Begin([]string{fmt.Sprintf("ip:%d", i)}, now)
		if err != nil {
			t.Fatal(err)
		}
		a.Fail(now)
	}
	got := map[string]int{}
	wb, err := state.NewWriteBehind(failingStore{}, []state.Snapshot{state.Fails("f", "g", "invites", fails)},
		state.Options{Now: func() time.Time { return now }, FailedOpen: func(layer string, _ error) { got[layer]++ }})
	if err != nil {
		t.Fatal(err)
	}
	wb.Flush()
	if got["invites"] != 2 {
		t.Errorf("fail-open events %v, want 2 of invites (the keys and the service-wide count)", got)
	}
	return got, wb
}

// heapStore passes writes on to a real store and records the most live
// heap seen as a write begins.
type heapStore struct {
	state.StateStore
	peak int64
}

func (s *heapStore) SaveState(name string, entries map[string][]byte) error {
	s.peak = max(s.peak, liveHeap())
	return s.StateStore.SaveState(name, entries)
}

func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// flushBudget is the most live heap a flush may hold over the state
// itself, per dirty fail key, as each chunk is written: a flood's second
// (50,000 client IPs are 100,000 fail keys) must not cost the collector a
// copy of every changed key's encoding at once.
const flushBudget = 16

// TestWriteBehindFlushHeap: flushing 100,000 changed fail keys holds at
// most flushBudget bytes of live heap per key besides the limiter.
func TestWriteBehindFlushHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 keys")
	}
	db := mustOpen(t)
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	fails, err := limiter.NewFail(limiter.FailConfig{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	store := &heapStore{StateStore: db}
	wb, err := state.NewWriteBehind(store, []state.Snapshot{state.Fails("f", "g", "invites", fails)}, state.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	wb.Flush() // the reused chunk map exists from here on
	const ips = 50_000
	for i := range ips {
		a, err := fails.Begin([]string{fmt.Sprintf("ip:10.%d.%d.%d", i>>16&255, i>>8&255, i&255), fmt.Sprintf("email:guess%d@example.com", i)}, now)
		if err != nil {
			t.Fatal(err)
		}
		a.Fail(now)
	}
	before := liveHeap()
	store.peak = 0
	wb.Flush()
	per := float64(store.peak-before) / (2 * ips)
	t.Logf("flush of %d fail keys: %.1f bytes of live heap each at its peak", 2*ips, per)
	if per > flushBudget {
		t.Errorf("a flush holds %.1f bytes of live heap per changed key, want at most %d", per, flushBudget)
	}
	runtime.KeepAlive(fails)
}
