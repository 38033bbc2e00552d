package guard

import (
	"errors"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// The store answering again (StoreBack) lets the paused paid calls' probe
// through at once, not at the pause's end, and only one: the others wait
// for its record. Without a pause, StoreBack changes nothing.
func TestStoreBackProbesAtOnce(t *testing.T) {
	f := newFixture(t, limiter.Config{}, budget.Config{})
	f.g.StoreBack(now)
	if _, r := f.g.Admit(alice, now); r != nil {
		t.Fatalf("StoreBack without a pause: %+v", r)
	}
	f.usage.err = errors.New("database stopped")
	tk, _ := f.g.Admit(alice, now)
	tk.Reserve(10, now)
	tk.Commit(t.Context(), now)
	if _, err := tk.Record(t.Context(), budget.UsageRecord{}, 10, now); err == nil {
		t.Fatal("Record succeeded on a stopped database")
	}
	back := now.Add(time.Second)
	if _, r := f.g.Admit(alice, back); r == nil || r.Layer != LayerUsage {
		t.Fatalf("during the pause: %+v", r)
	}
	f.usage.err = nil
	f.g.StoreBack(back)
	probe, r := f.g.Admit(alice, back)
	if r != nil {
		t.Fatalf("the probe, once the store is back: %+v, want let through at once", r)
	}
	if _, r := f.g.Admit(alice, back); r == nil || r.Layer != LayerUsage {
		t.Fatalf("beside the probe: %+v, want still paused", r)
	}
	probe.Reserve(10, back)
	probe.Commit(t.Context(), back)
	if _, err := probe.Record(t.Context(), budget.UsageRecord{}, 10, back); err != nil {
		t.Fatal(err)
	}
	if _, r := f.g.Admit(alice, back); r != nil {
		t.Fatalf("after the probe's record: %+v", r)
	}
}
