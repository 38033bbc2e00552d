package backendtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"breakwater/detect"
)

// Events checks detect.EventWriter and the event reads of detect.Store:
// appending batches (through two instances), the bounds of a read, a
// refused batch writing nothing, reading page by page, pruning.
func Events(t *testing.T, kit Kit) {
	t.Run("AppendEvents", func(t *testing.T) { appendEvents(t, kit) })
	t.Run("InvalidWritesNothing", func(t *testing.T) { appendInvalid(t, kit) })
	t.Run("EachEventPages", func(t *testing.T) { eachEventPages(t, kit) })
	t.Run("PruneEvents", func(t *testing.T) { pruneEvents(t, kit) })
}

// routes lists the events' routes, in order.
func routes(events []detect.Event) string {
	list := []string{}
	for _, e := range events {
		list = append(list, e.Route)
	}
	return fmt.Sprint(list)
}

// appendEvents: two batches with equal times within and across them read
// back by time, then in the order appended; every field round-trips.
func appendEvents(t *testing.T, kit Kit) {
	db := kit.Open(t)
	other := kit.Another(t, db)
	batches := [][]detect.Event{
		{
			{Time: t0.Add(time.Second), Route: "a", IP: "192.0.2.1", Status: 200},
			{Time: t0, Route: "b", Status: 429},
			{Time: t0, Route: "c", Status: 401},
		},
		{
			{Time: t0, Route: "d", UserID: "u1", KeyID: "k1", Plan: "pro", Layer: "quota", Outcome: "ok", Status: 200,
				Bytes: 10, LatencyMS: 20, PromptTokens: 30, OutputTokens: 40, CostMicroUSD: 7, Count: 3},
			{Time: t0.Add(2 * time.Second), Route: "e"},
		},
	}
	if err := db.AppendEvents(batches[0]); err != nil {
		t.Fatal(err)
	}
	if err := other.AppendEvents(batches[1]); err != nil {
		t.Fatal(err)
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
			if events, err := db.Events(tt.from, tt.to); err != nil || routes(events) != tt.want {
				t.Errorf("Events routes = %s, %v; want %s", routes(events), err, tt.want)
			}
		})
	}
	events, err := db.Events(t0, t0.Add(1))
	if err != nil || len(events) != 3 {
		t.Fatalf("Events = %v, %v", events, err)
	}
	got, want := events[2], batches[1][0]
	if got.Time.Equal(want.Time) {
		got.Time = want.Time // the same instant; the location may differ
	}
	if got != want {
		t.Errorf("event round trip = %+v, want %+v", got, want)
	}
}

// appendInvalid: a batch with an event without time writes none of it.
func appendInvalid(t *testing.T, kit Kit) {
	db := kit.Open(t)
	err := db.AppendEvents([]detect.Event{{Time: t0, Route: "ok"}, {Route: "no time"}})
	if !errors.Is(err, kit.ErrInvalid) {
		t.Errorf("AppendEvents with a zero time = %v, want ErrInvalid", err)
	}
	if events, err := db.Events(time.Time{}, time.Time{}); err != nil || len(events) != 0 {
		t.Errorf("Events after refused batch = %d events, %v; want none", len(events), err)
	}
}

// eachEventPages streams more events than one page holds, equal times
// across the page boundary included: each comes once, in order; fn may
// write between pages (it runs outside any transaction); an error from
// fn stops the scan.
func eachEventPages(t *testing.T, kit Kit) {
	db := kit.Open(t)
	page := kit.EventPage
	n := 2*page + 3
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
		if next == page { // a write between two pages
			return db.AppendEvents([]detect.Event{{Time: t0.Add(2 * time.Hour), Status: -1}})
		}
		return nil
	})
	if err != nil || next != n {
		t.Errorf("EachEvent saw %d events (%v), want %d", next, err, n)
	}
	stop := errors.New("stop")
	seen := 0
	err = db.EachEvent(time.Time{}, time.Time{}, func(detect.Event) error {
		if seen++; seen == page+1 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || seen != page+1 {
		t.Errorf("EachEvent after fn's error: %v after %d events, want stop after %d", err, seen, page+1)
	}
}

// pruneEvents: PruneEvents deletes what is before the cut, and more than
// one transaction's worth; again it finds nothing.
func pruneEvents(t *testing.T, kit Kit) {
	db := kit.Open(t)
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var events []detect.Event
	for i := range 10 {
		events = append(events, detect.Event{Time: base.Add(time.Duration(i) * time.Hour), Route: "/v1/ocr", Status: i})
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	n, err := db.PruneEvents(base.Add(4 * time.Hour))
	if err != nil || n != 4 {
		t.Fatalf("PruneEvents = %d, %v; want 4", n, err)
	}
	left, err := db.Events(time.Time{}, time.Time{})
	if err != nil || len(left) != 6 || !left[0].Time.Equal(base.Add(4*time.Hour)) || left[0].Status != 4 {
		t.Fatalf("events left = %d (%v), want 6 from 04:00", len(left), err)
	}
	if n, err := db.PruneEvents(base); err != nil || n != 0 {
		t.Errorf("PruneEvents again = %d, %v; want 0", n, err)
	}
	many := make([]detect.Event, 2*kit.PrunePage+5)
	for i := range many {
		many[i] = detect.Event{Time: base.Add(-time.Duration(i+1) * time.Second), Route: "/v1/ocr"}
	}
	if err := db.AppendEvents(many); err != nil {
		t.Fatal(err)
	}
	if n, err := db.PruneEvents(base.Add(5 * time.Hour)); err != nil || n != len(many)+1 {
		t.Fatalf("PruneEvents = %d, %v; want %d", n, err, len(many)+1)
	}
}
