package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"breakwater/detect"
)

func routes(events []detect.Event) string {
	list := []string{}
	for _, e := range events {
		list = append(list, e.Route)
	}
	return fmt.Sprint(list)
}

// A batch of events costs one transaction, whatever its size: its rows
// were all written by one (they have one xmin). The server's write ids
// are no measure: other tests' databases on the server take theirs.
func TestAppendEventsIsOneTransactionPerBatch(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	batch := make([]detect.Event, 512)
	for i := range batch {
		batch[i] = detect.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), Route: "r", UserID: fmt.Sprint("u", i%7)}
	}
	start := time.Now()
	if err := db.AppendEvents(batch); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	var rows, txs int64
	if err := db.Pool().QueryRow(ctx, "SELECT count(*), count(DISTINCT xmin::text) FROM events").Scan(&rows, &txs); err != nil {
		t.Fatal(err)
	}
	if rows != int64(len(batch)) || txs != 1 {
		t.Errorf("a batch of %d events wrote %d rows in %d transactions, want every row in 1", len(batch), rows, txs)
	}
	t.Logf("%d events in one COPY: %v", len(batch), took)
}

// The service's refusals by layer: what every instance recorded today,
// per-minute rows by their count, shadow apart, other days, outcomes and
// unlayered rows left out.
func TestLayerRefusalsSumsEveryInstance(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	day := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	at := day.Add(9 * time.Hour)
	ev := func(layer, outcome string, count int64, t time.Time) detect.Event {
		return detect.Event{Time: t, UserID: "u", Route: "/v1/ocr", Layer: layer, Outcome: outcome, Count: count}
	}
	if err := a.AppendEvents([]detect.Event{
		ev("rate", detect.OutcomeLayerRefused, 5, at),
		ev("budget", detect.OutcomeLayerRefused, 0, at), // one
		ev("rate", detect.OutcomeShadowRefused, 2, at),
		ev("", "ok", 0, at),
		ev("rate", detect.OutcomeLayerRefused, 100, day.Add(-time.Second)), // yesterday
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.AppendEvents([]detect.Event{
		ev("rate", detect.OutcomeLayerRefused, 7, at.Add(time.Hour)),
		ev("route:checkout", detect.OutcomeLayerRefused, 3, at),
		ev("rate", detect.OutcomeLayerRefused, 100, day.Add(24*time.Hour)), // tomorrow
	}); err != nil {
		t.Fatal(err)
	}
	got, err := b.LayerRefusals(day, day.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []detect.LayerRefusals{
		{Layer: "budget", Count: 1},
		{Layer: "rate", Count: 12},
		{Layer: "rate", Shadow: true, Count: 2},
		{Layer: "route:checkout", Count: 3},
	}
	if !slices.Equal(got, want) {
		t.Errorf("LayerRefusals = %+v, want %+v", got, want)
	}
}
