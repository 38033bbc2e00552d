package storage

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/detect"
)

func TestAppendEvents(t *testing.T) {
	db := mustOpen(t)

	// Two batches; equal times within and across batches.
	batches := [][]detect.Event{
		{
			{Time: t0.Add(time.Second), Route: "a", IP: "192.0.2.1", Status: 200},
			{Time: t0, Route: "b", Status: 429},
			{Time: t0, Route: "c", Status: 401},
		},
		{
			{Time: t0, Route: "d", UserID: "u1", Status: 200, CostMicroUSD: 7},
			{Time: t0.Add(2 * time.Second), Route: "e"},
		},
	}
	for _, batch := range batches {
		if err := db.AppendEvents(batch); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.AppendEvents(nil); err != nil {
		t.Errorf("AppendEvents(nil) = %v, want nil", err)
	}

	tests := []struct {
		name     string
		from, to time.Time
		want     string // routes in order
	}{
		{name: "all", want: "[b c d a e]"},
		{name: "one instant", from: t0, to: t0.Add(1), want: "[b c d]"},
		{name: "to exclusive", from: t0, to: t0.Add(time.Second), want: "[b c d]"},
		{name: "from inclusive", from: t0.Add(time.Second), want: "[a e]"},
		{name: "none", to: t0, want: "[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, err := db.Events(tt.from, tt.to)
			if err != nil {
				t.Fatal(err)
			}
			routes := []string{}
			for _, e := range events {
				routes = append(routes, e.Route)
			}
			if got := fmt.Sprint(routes); got != tt.want {
				t.Errorf("Events routes = %s, want %s", got, tt.want)
			}
		})
	}

	events, err := db.Events(t0, t0.Add(1))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := events[2], batches[1][0]; !got.Time.Equal(want.Time) || got.UserID != want.UserID || got.CostMicroUSD != want.CostMicroUSD {
		t.Errorf("event round trip = %+v, want %+v", got, want)
	}
}

func TestAppendEventsInvalidWritesNothing(t *testing.T) {
	db := mustOpen(t)
	err := db.AppendEvents([]detect.Event{{Time: t0, Route: "ok"}, {Route: "no time"}})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("AppendEvents with a zero time = %v, want ErrInvalid", err)
	}
	events, err := db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 0 {
		t.Errorf("Events after refused batch = %d events, want none", len(events))
	}
}

// TestEachEventPages streams more events than one page holds, equal
// times across the page boundary included, and checks each comes once, in
// order; an error from fn stops the scan, and fn may write (it runs
// outside any transaction).
func TestEachEventPages(t *testing.T) {
	db := mustOpen(t)
	n := 2*eventPage + 3
	events := make([]detect.Event, n)
	for i := range events {
		// Pairs of equal times, so a page may end between two of them.
		events[i] = detect.Event{Time: t0.Add(time.Duration(i/2) * time.Millisecond), Status: i}
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	next := 0
	err := db.EachEvent(time.Time{}, t0.Add(time.Hour), func(e detect.Event) error {
		if e.Status != next {
			return fmt.Errorf("event %d came as number %d", e.Status, next)
		}
		next++
		if next == eventPage { // a write between two pages
			return db.AppendEvents([]detect.Event{{Time: t0.Add(2 * time.Hour), Status: -1}})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if next != n {
		t.Errorf("EachEvent saw %d events, want %d", next, n)
	}

	stop := errors.New("stop")
	seen := 0
	err = db.EachEvent(time.Time{}, time.Time{}, func(detect.Event) error {
		seen++
		if seen == eventPage+1 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || seen != eventPage+1 {
		t.Errorf("EachEvent after fn's error: %v after %d events, want stop after %d", err, seen, eventPage+1)
	}
}

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
