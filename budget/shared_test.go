package budget_test

import (
	"errors"
	"testing"
	"time"

	"breakwater/budget"
)

// fakeDaily is a SharedDaily whose answers the test sets.
type fakeDaily struct {
	taken bool
	err   error
	calls int
}

func (f *fakeDaily) Take(key, day string, line int64) (bool, error) {
	f.calls++
	return f.taken, f.err
}

// With a store the store's count decides the line; memory keeps this
// process's attempts and the store's refusals (Check refuses from memory),
// and decides alone, reporting the fault, when the store cannot. Without
// a line nothing is asked of the store.
func TestSharedAttemptsFallBackToMemory(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	a := budget.NewAttempts(time.UTC, "2026-12-03", nil)
	store := &fakeDaily{taken: true}
	faults := 0
	a.Share(store, func(error) { faults++ })
	for range 3 { // the store counts beyond the line of memory: it decides
		if err := a.Take("ip:1", 2, now); err != nil {
			t.Fatalf("the store took the attempt, Take = %v", err)
		}
	}
	store.taken = false
	var le *budget.LineError
	if err := a.Take("ip:2", 2, now); !errors.As(err, &le) || le.RetryAfter != 12*time.Hour {
		t.Fatalf("the store refused, Take = %v; want a LineError until midnight (12h)", err)
	}
	if err := a.Check("ip:2", 2, now); err == nil {
		t.Error("Check of a key the store refused passes, want refused from memory")
	}
	calls := store.calls
	if err := a.Take("ip:3", 0, now); err != nil || store.calls != calls {
		t.Errorf("no line: Take = %v with %d calls to the store, want admitted in memory alone", err, store.calls-calls)
	}
	store.err = errors.New("down")
	if err := a.Take("ip:4", 1, now); err != nil {
		t.Errorf("store down, a new key: %v, want admitted in memory", err)
	}
	if err := a.Take("ip:4", 1, now); err == nil {
		t.Error("store down, the key again: admitted past memory's line")
	}
	if faults != 2 {
		t.Errorf("faults %d, want 2", faults)
	}
}
