package limiter_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"breakwater/limiter"
)

// fakeWindows is a SharedWindows whose answer the test sets.
type fakeWindows struct {
	take func(key string, cfg limiter.Config, now time.Time) (*limiter.Refusal, error)
}

func (f fakeWindows) Take(key string, cfg limiter.Config, now time.Time) (*limiter.Refusal, error) {
	return f.take(key, cfg, now)
}

var errStoreDown = errors.New("store down")

// With a store, the store's answer stands; when it fails, memory decides
// (from what this process admitted meanwhile) and the fault is reported.
func TestSharedLimiterFallsBackToMemory(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	l, err := limiter.New(limiter.Config{Rate: 2, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	down := false
	var faults int
	l.Share(fakeWindows{take: func(key string, cfg limiter.Config, now time.Time) (*limiter.Refusal, error) {
		if down {
			return nil, errStoreDown
		}
		if key == "refused" {
			return &limiter.Refusal{RetryAfter: 7 * time.Second, Reason: limiter.ReasonRate}, nil
		}
		return nil, nil
	}}, func(err error) {
		if !errors.Is(err, errStoreDown) {
			t.Errorf("fault %v, want the store's error", err)
		}
		faults++
	})
	var r *limiter.Refusal
	if err := l.Allow("refused", t0); !errors.As(err, &r) || r.RetryAfter != 7*time.Second {
		t.Fatalf("the store's refusal came back as %v", err)
	}
	for range 3 { // the store admits beyond memory's rate: the store decides
		if err := l.Allow("alice", t0); err != nil {
			t.Fatalf("the store admitted, Allow = %v", err)
		}
	}
	down = true
	if err := l.Allow("alice", t0.Add(time.Second)); err == nil {
		t.Error("store down: alice admitted, want refused from memory (2 admitted already on this process)")
	}
	if err := l.Allow("bob", t0.Add(time.Second)); err != nil {
		t.Errorf("store down: a new key refused: %v", err)
	}
	if faults != 2 {
		t.Errorf("faults reported %d, want 2 (one per decision made in memory)", faults)
	}
}

// fakeFails is a SharedFails that records what it is told.
type fakeFails struct {
	down     bool
	begun    []time.Time
	outcomes []limiter.FailOutcome
}

func (f *fakeFails) Begin(keys []string, cfg limiter.FailConfig, now time.Time) (*limiter.Refusal, error) {
	if f.down {
		return nil, errStoreDown
	}
	return nil, nil
}

func (f *fakeFails) Finish(keys []string, outcome limiter.FailOutcome, cfg limiter.FailConfig, begun, now time.Time) ([]string, bool, error) {
	if f.down {
		return nil, false, errStoreDown
	}
	f.begun, f.outcomes = append(f.begun, begun), append(f.outcomes, outcome)
	return []string{"from-store"}, true, nil
}

func (f *fakeFails) Cooling(now time.Time) ([]limiter.Cooldown, error) { return nil, errStoreDown }
func (f *fakeFails) Clear(key string) (bool, error)                    { return false, errStoreDown }
func (f *fakeFails) GlobalFailures(now time.Time) (int, error)         { return 0, errStoreDown }

// A shared attempt's outcome goes to the store with its start time; if
// the store cannot take it, memory's outcome stands.
func TestSharedFailLimiterFinishesInTheStore(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	f, err := limiter.NewFail(limiter.FailConfig{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	store := &fakeFails{}
	faults := 0
	f.Share(store, func(error) { faults++ })
	a, err := f.Begin([]string{"ip:1"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if tripped := a.Fail(t0.Add(time.Second)); !tripped || !slices.Equal(a.CooldownsStarted(), []string{"from-store"}) {
		t.Errorf("Fail = %v, started %q; want the store's answer", tripped, a.CooldownsStarted())
	}
	if !slices.Equal(store.begun, []time.Time{t0}) || !slices.Equal(store.outcomes, []limiter.FailOutcome{limiter.OutcomeFail}) {
		t.Errorf("the store was told %v %v", store.begun, store.outcomes)
	}
	b, err := f.Begin([]string{"ip:2"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	store.down = true
	b.Fail(t0.Add(time.Second))
	if !slices.Equal(b.CooldownsStarted(), []string{"ip:2"}) {
		t.Errorf("store down at Fail: started %q, want memory's (ip:2)", b.CooldownsStarted())
	}
	if _, err := f.Begin([]string{"ip:2"}, t0.Add(2*time.Second)); err == nil {
		t.Error("store down: ip:2 in memory's cooldown begun, want refused")
	}
	if got := f.Cooling(t0.Add(2 * time.Second)); len(got) != 2 {
		t.Errorf("Cooling with the store down = %v, want memory's two cooldowns", got)
	}
	if faults != 3 {
		t.Errorf("faults %d, want 3 (Fail, Begin, Cooling)", faults)
	}
}

// EndRefused changes nothing: in memory no key's run, cooldown or
// write-behind entry; with a store, it has the store end an attempt that
// holds nothing (a release with a zero start), and a store that cannot is
// a fault like any other.
func TestEndRefusedChangesNothing(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	f, err := limiter.NewFail(limiter.FailConfig{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"ip:1", "email:x"}
	a, err := f.Begin(keys, t0)
	if err != nil {
		t.Fatal(err)
	}
	a.Fail(t0)
	f.Dirty() // the failure's changes, taken by the write-behind
	for range 5 {
		f.EndRefused(append(keys, "ip:never-seen"), t0.Add(time.Second))
	}
	if entries, _ := f.Dirty(); len(entries) != 0 {
		t.Errorf("EndRefused left %d changes for the write-behind, want none", len(entries))
	}
	if n := f.Len(); n != 2 {
		t.Errorf("%d keys held after EndRefused, want 2", n)
	}
	if got := f.GlobalFailures(t0.Add(time.Second)); got != 1 {
		t.Errorf("global failures %d, want 1", got)
	}
	b, err := f.Begin(keys, t0.Add(2*time.Second)) // the run of one is kept: one more failure cools
	if err != nil {
		t.Fatal(err)
	}
	b.Fail(t0.Add(2 * time.Second))
	if !slices.Equal(b.CooldownsStarted(), keys) {
		t.Errorf("second failure started %q, want %q", b.CooldownsStarted(), keys)
	}

	store := &fakeFails{}
	faults := 0
	f.Share(store, func(error) { faults++ })
	f.EndRefused(keys, t0.Add(3*time.Second))
	if !slices.Equal(store.begun, []time.Time{{}}) || !slices.Equal(store.outcomes, []limiter.FailOutcome{limiter.OutcomeRelease}) {
		t.Errorf("the store was told %v %v, want one release with a zero start", store.begun, store.outcomes)
	}
	store.down = true
	f.EndRefused(keys, t0.Add(3*time.Second))
	if faults != 1 {
		t.Errorf("faults %d with the store down, want 1", faults)
	}
}
