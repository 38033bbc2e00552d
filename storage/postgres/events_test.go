package postgres_test

import (
	"context"
	"fmt"
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
