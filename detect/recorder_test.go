package detect

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"breakwater/storage"
)

func TestRecorderWritesBatchesToStorage(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "s.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := NewRecorder(db, RecorderOptions{BatchSize: 7})
	t0 := time.Now()
	for i := range 100 {
		r.Record(storage.Event{Time: t0.Add(time.Duration(i)), UserID: "u", Outcome: "ok"})
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	events, err := db.Events(t0.Add(-time.Second), t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 100 || r.Written() != 100 || r.Dropped() != 0 {
		t.Errorf("%d events stored, written %d, dropped %d; want 100, 100, 0", len(events), r.Written(), r.Dropped())
	}
	r.Record(storage.Event{Time: t0, UserID: "late"}) // after Close: dropped, no panic
	if r.Dropped() != 1 {
		t.Errorf("dropped %d after close, want 1", r.Dropped())
	}
}

// blockingWriter holds every write until released, to fill the queue.
type blockingWriter struct {
	release chan struct{}
	mu      sync.Mutex
	n       int
	fail    bool
}

func (w *blockingWriter) AppendEvents(events []storage.Event) error {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail {
		return errors.New("disk full")
	}
	w.n += len(events)
	return nil
}

func TestRecorderDropsWhenFullWithoutBlocking(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	r := NewRecorder(w, RecorderOptions{QueueSize: 10, BatchSize: 1})
	done := make(chan struct{})
	go func() {
		for range 1000 {
			r.Record(storage.Event{UserID: "u"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Record blocked on a full queue")
	}
	close(w.release)
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := int(r.Dropped()) + w.n; got != 1000 {
		t.Errorf("dropped %d + written %d = %d, want 1000", r.Dropped(), w.n, got)
	}
	if r.Dropped() < 900 {
		t.Errorf("dropped only %d of 1000 with a queue of 10", r.Dropped())
	}
}

func TestRecorderCountsFailedWrites(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{}), fail: true}
	close(w.release)
	r := NewRecorder(w, RecorderOptions{BatchSize: 5})
	for range 20 {
		r.Record(storage.Event{UserID: "u"})
	}
	r.Close(context.Background())
	if r.Dropped() != 20 || r.Written() != 0 {
		t.Errorf("dropped %d written %d, want 20 and 0", r.Dropped(), r.Written())
	}
}
