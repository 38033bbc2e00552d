package detect_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"breakwater/detect"
	"breakwater/storage"
)

func TestRecorderWritesBatchesToStorage(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "s.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := detect.NewRecorder(db, detect.RecorderOptions{BatchSize: 7})
	t0 := time.Now()
	for i := range 100 {
		r.Record(detect.Event{Time: t0.Add(time.Duration(i)), UserID: "u", Outcome: "ok"})
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
	r.Record(detect.Event{Time: t0, UserID: "late"}) // after Close: dropped, no panic
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
	lost    int64 // the counts of the rows of OutcomeDropped written
}

func (w *blockingWriter) AppendEvents(events []detect.Event) error {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail {
		return errors.New("disk full")
	}
	for _, e := range events {
		if e.Outcome == detect.OutcomeDropped {
			w.lost += e.Count
		} else {
			w.n++
		}
	}
	return nil
}

func TestRecorderDropsWhenFullWithoutBlocking(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	r := detect.NewRecorder(w, detect.RecorderOptions{QueueSize: 10, BatchSize: 1})
	done := make(chan struct{})
	go func() {
		for range 1000 {
			r.Record(detect.Event{UserID: "u"})
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
	if got, want := w.lost, int64(r.Dropped()); got != want {
		t.Errorf("rows of dropped events say %d, want %d", got, want)
	}
}

func TestRecorderCountsFailedWrites(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{}), fail: true}
	close(w.release)
	r := detect.NewRecorder(w, detect.RecorderOptions{BatchSize: 5})
	for range 20 {
		r.Record(detect.Event{UserID: "u"})
	}
	r.Close(context.Background())
	if r.Dropped() != 20 || r.Written() != 0 {
		t.Errorf("dropped %d written %d, want 20 and 0", r.Dropped(), r.Written())
	}
}

// TestRecorderTalliesInviteRefusals: a flood of 20,000 invite refusals
// from 2,000 IPs with as many e-mails becomes a bounded number of rows
// that still sum to every refusal, keeps the key under attack in a row
// of its own, and aggregates as the single events did. Checks that pass
// are stored one by one.
func TestRecorderTalliesInviteRefusals(t *testing.T) {
	db := mustOpen(t)
	const keys = 16
	at := time.Date(2026, 3, 8, 10, 0, 0, 0, time.UTC)
	const flood = 20_000
	r := detect.NewRecorder(db, detect.RecorderOptions{QueueSize: 2 * flood, TallyKeys: keys, Now: func() time.Time { return at }})
	for i := range flood {
		ip := fmt.Sprintf("10.0.%d.%d", i/250%8, i%250)
		email := fmt.Sprintf("guess%d@example.com", i)
		if i%1000 == 0 { // the e-mail under attack, five failures, one cooldown, at times
			email = "target@example.com"
		}
		r.Record(detect.Event{Time: at.Add(time.Duration(i) * time.Millisecond), Route: detect.RouteInvite, Outcome: "invalid", IP: ip, UserID: email})
		if i%1000 == 0 {
			r.Record(detect.Event{Time: at, Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted, UserID: "target@example.com"})
		}
		if i%100 == 0 {
			r.Record(detect.Event{Time: at, Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted, IP: ip})
		}
	}
	for range 3 {
		r.Record(detect.Event{Time: at, Route: detect.RouteInvite, Outcome: "ok", IP: "192.0.2.1", UserID: "ann@example.com"})
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.Dropped() != 0 {
		t.Fatalf("%d events dropped", r.Dropped())
	}
	events, err := db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if most := 4*(keys+1) + 1 + 3; len(events) > most {
		t.Errorf("%d rows stored for %d refusals, want at most %d", len(events), flood, most)
	}
	s := detect.Aggregate("2026-03-08", events, detect.Lines{})
	var ipFailures, ipCooldowns int64
	for _, d := range s.IPs {
		ipFailures += d.InviteFailures
		ipCooldowns += d.InviteCooldowns
	}
	if ipFailures != flood || ipCooldowns != flood/100 || s.Service.Invites != flood+3 {
		t.Errorf("IPs: %d failures, %d cooldowns; service: %d checks; want %d, %d, %d", ipFailures, ipCooldowns, s.Service.Invites, flood, flood/100, flood+3)
	}
	if got := s.Emails["target@example.com"]; got.InviteFailures != flood/1000 || got.InviteCooldowns != flood/1000 {
		t.Errorf("the e-mail under attack = %+v, want %d failures and cooldowns in its own row", got, flood/1000)
	}
	for _, e := range events {
		if !e.Time.Equal(at) {
			t.Errorf("row at %s, want the window's start %s", e.Time, at)
			break
		}
	}
}

// TestRecorderTallyWindows: refusals of a window are written once it has
// ended, by the clock or by a refusal of the next window, each window's
// rows at its start.
func TestRecorderTallyWindows(t *testing.T) {
	db := mustOpen(t)
	at := time.Date(2026, 3, 8, 10, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := at
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	r := detect.NewRecorder(db, detect.RecorderOptions{FlushInterval: time.Millisecond, Now: clock})
	defer r.Close(context.Background())
	refuse := func(t time.Time) {
		r.Record(detect.Event{Time: t, Route: detect.RouteInvite, Outcome: "invalid", IP: "192.0.2.9", UserID: "x@example.com"})
	}
	rows := func() []detect.Event {
		events, err := db.Events(time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return events
	}
	refuse(at.Add(time.Minute))
	refuse(at.Add(14 * time.Minute))
	refuse(at.Add(detect.DefaultTallyWindow + time.Minute)) // ends the first window
	waitFor(t, func() bool { return len(rows()) == 3 })
	for _, e := range rows() {
		if !e.Time.Equal(at) || e.N() != 2 {
			t.Errorf("row %+v, want a count of 2 at %s", e, at)
		}
	}
	mu.Lock()
	now = at.Add(2 * detect.DefaultTallyWindow) // the second window ends by the clock
	mu.Unlock()
	waitFor(t, func() bool { return len(rows()) == 6 })
	if last := rows()[5]; !last.Time.Equal(at.Add(detect.DefaultTallyWindow)) || last.N() != 1 {
		t.Errorf("row %+v, want a count of 1 at %s", last, at.Add(detect.DefaultTallyWindow))
	}
}

// waitFor polls cond for the background writer, at most five seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

// countingWriter counts the events written to it.
type countingWriter struct {
	mu sync.Mutex
	n  int
}

func (w *countingWriter) AppendEvents(events []detect.Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += len(events)
	return nil
}

func (w *countingWriter) written() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// An idle recorder sleeps: once its last batch is written, an hour
// without events never wakes it (its clock is not read), and the next
// event is still written within a flush interval; a tally waiting for its
// window's end keeps it awake until the tally is written. Fails with the
// timer reset after every flush (18,000 wake-ups an hour).
func TestRecorderSleepsWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &countingWriter{}
		var reads atomic.Int64
		now := func() time.Time { reads.Add(1); return time.Now() }
		r := detect.NewRecorder(w, detect.RecorderOptions{Now: now})
		defer r.Close(context.Background())
		settle := func(d time.Duration) {
			time.Sleep(d)
			synctest.Wait()
		}
		r.Record(detect.Event{Time: time.Now(), Route: "ocr", Outcome: "ok"})
		settle(time.Second)
		if got := w.written(); got != 1 {
			t.Fatalf("%d events written, want 1", got)
		}
		before := reads.Load()
		settle(time.Hour)
		if n := reads.Load() - before; n > 0 {
			t.Errorf("the idle recorder read its clock %d times in an hour, want none", n)
		}
		r.Record(detect.Event{Time: time.Now(), Route: "ocr", Outcome: "ok"})
		settle(time.Second)
		if got := w.written(); got != 2 {
			t.Fatalf("%d events written after an idle hour, want 2", got)
		}
		r.Record(detect.Event{Time: time.Now(), Route: detect.RouteInvite, Outcome: "invalid", IP: "192.0.2.7", UserID: "guess@example.com"})
		settle(time.Second)
		if got := w.written(); got != 2 {
			t.Fatalf("%d events written before the tally's window ended, want 2", got)
		}
		settle(detect.DefaultTallyWindow + time.Second)
		if got := w.written(); got <= 2 {
			t.Errorf("the tally was not written after its window: %d events", got)
		}
	})
}
