package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

func routes(events []detect.Event) string {
	list := []string{}
	for _, e := range events {
		list = append(list, e.Route)
	}
	return fmt.Sprint(list)
}

func TestAppendEvents(t *testing.T) {
	url := pgtest.NewDatabase(t)
	db, other := open(t, url), open(t, url)
	// Two batches, through two instances; equal times within and across.
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
		events, err := db.Events(tt.from, tt.to)
		if err != nil || routes(events) != tt.want {
			t.Errorf("%s: Events routes = %s, %v; want %s", tt.name, routes(events), err, tt.want)
		}
	}
	events, err := db.Events(t0, t0.Add(1))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := events[2], batches[1][0]; got != want {
		t.Errorf("event round trip = %+v, want %+v", got, want)
	}
}

func TestAppendEventsInvalidWritesNothing(t *testing.T) {
	db := newDB(t)
	err := db.AppendEvents([]detect.Event{{Time: t0, Route: "ok"}, {Route: "no time"}})
	if !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("AppendEvents with a zero time = %v, want ErrInvalid", err)
	}
	if events, err := db.Events(time.Time{}, time.Time{}); err != nil || len(events) != 0 {
		t.Errorf("Events after refused batch = %d events, %v; want none", len(events), err)
	}
}

// More events than one page holds, equal times across the page boundary
// included: each comes once, in order; fn may write between pages; an
// error from fn stops the scan.
func TestEachEventPages(t *testing.T) {
	db := newDB(t)
	const page = 1024 // EachEvent's page
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

func TestPruneEvents(t *testing.T) {
	db := newDB(t)
	var events []detect.Event
	for i := range 5 {
		events = append(events, detect.Event{Time: t0.Add(time.Duration(i) * time.Hour), Status: i})
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	n, err := db.PruneEvents(t0.Add(2 * time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("PruneEvents = %d, %v; want 2", n, err)
	}
	left, err := db.Events(time.Time{}, time.Time{})
	if err != nil || len(left) != 3 || left[0].Status != 2 {
		t.Errorf("events left = %+v, %v; want from the third on", left, err)
	}
	if n, err := db.PruneEvents(t0); err != nil || n != 0 {
		t.Errorf("PruneEvents again = %d, %v; want 0", n, err)
	}
}

// A batch of events costs one transaction, whatever its size: the write
// ids the server hands out before and after it are two apart (the second
// look takes one of its own).
func TestAppendEventsIsOneTransactionPerBatch(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	xid := func() int64 {
		t.Helper()
		var x int64
		if err := db.Pool().QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	batch := make([]detect.Event, 512)
	for i := range batch {
		batch[i] = detect.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), Route: "r", UserID: fmt.Sprint("u", i%7)}
	}
	before := xid()
	start := time.Now()
	if err := db.AppendEvents(batch); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if got := xid() - before; got != 2 {
		t.Errorf("a batch of %d events took %d transactions, want 1", len(batch), got-1)
	}
	t.Logf("%d events in one COPY: %v", len(batch), took)
}
