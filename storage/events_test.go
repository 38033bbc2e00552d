package storage

import (
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/detect"
)

// TestAppendEventsSharesGroupCommit holds the writer while a batch of
// events and a usage record queue up: both land in one transaction, so
// statistics cost the paid path no transaction (and no fsync) of their own.
func TestAppendEventsSharesGroupCommit(t *testing.T) {
	db := mustOpen(t)
	release := holdWriter(t, db)
	var wg sync.WaitGroup
	wg.Go(func() {
		events := []detect.Event{{Time: t0, UserID: "u", Outcome: "ok"}, {Time: t0, UserID: "v", Outcome: "ok"}}
		if err := db.AppendEvents(events); err != nil {
			t.Errorf("AppendEvents: %v", err)
		}
	})
	wg.Go(func() {
		if err := db.RecordUsage(t.Context(), month, usageAt("u", t0), budget.Settlement{}); err != nil {
			t.Errorf("RecordUsage: %v", err)
		}
	})
	waitQueued(t, db, 2)
	before := db.txs.Load()
	release()
	wg.Wait()
	// The holder's transaction, then one for both writes.
	if got := db.txs.Load() - before; got != 2 {
		t.Errorf("%d transactions after release, want 2: the events took one of their own", got)
	}
	var n int
	if err := db.EachEvent(time.Time{}, time.Time{}, func(detect.Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d events stored, want 2", n)
	}
}
