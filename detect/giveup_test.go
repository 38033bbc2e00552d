package detect_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage"
)

// dyingStore is the database with runs that end the way a crash does
// (crash: the goroutine stops inside the scan and nothing after it runs,
// as when the kernel kills the process for memory) or fail with an error
// (fail).
type dyingStore struct {
	*storage.DB
	mu          sync.Mutex
	crash, fail bool
	scans       int
}

func (d *dyingStore) EachEvent(from, to time.Time, fn func(detect.Event) error) error {
	d.mu.Lock()
	d.scans++
	crash, fail := d.crash, d.fail
	d.mu.Unlock()
	if crash {
		runtime.Goexit()
	}
	if fail {
		return errors.New("disk on fire")
	}
	return d.DB.EachEvent(from, to, fn)
}

func (d *dyingStore) scanned() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.scans
}

// start plays one start of the server: a fresh Runner and Scheduler over
// store catch up the days due, in a goroutine that a crash may end.
func start(t *testing.T, store detect.Store, now time.Time, mail detect.Sender, logs *bytes.Buffer, mu *sync.Mutex) {
	t.Helper()
	log := detect.NewTestLogger(logs, mu)
	r, err := detect.NewRunner(store, detect.RunnerOptions{Location: time.UTC, Mail: mail, Logger: log, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := detect.NewScheduler(r, detect.Config{}, time.UTC, detect.SchedulerOptions{Logger: log, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); detect.RunDue(s, context.Background()) }()
	<-done
}

// TestCrashingDayIsGivenUp: a day whose run ends the process is run at
// the next start once more, then given up: logged at ERROR, mailed as a
// finding, recorded as the last run, and never run again by a start. A
// run by hand still runs it.
func TestCrashingDayIsGivenUp(t *testing.T) {
	db := mustOpen(t)
	now := time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)
	if err := db.AppendEvents([]detect.Event{{Time: now.Add(-20 * time.Hour), UserID: "alice", Route: "/v1/ocr", Outcome: "ok"}}); err != nil {
		t.Fatal(err)
	}
	store := &dyingStore{DB: db, crash: true}
	mail := &fakeSender{}
	var logs bytes.Buffer
	var mu sync.Mutex
	for i := range 5 {
		start(t, store, now, mail, &logs, &mu)
		if got, want := store.scanned(), min(i+1, detect.MaxUnfinishedRuns); got != want {
			t.Fatalf("start %d: the day was run %d times, want %d", i+1, got, want)
		}
	}
	mu.Lock()
	text := logs.String()
	mu.Unlock()
	if n := strings.Count(text, "level=ERROR msg=\"daily detection gave a day up"); n != 1 {
		t.Errorf("%d ERROR lines about giving the day up, want 1:\n%s", n, text)
	}
	if mail.count() != 1 || !strings.Contains(mail.bodies[0], detect.DetectorGaveUp) {
		t.Errorf("%d mails %q, want one digest naming %s", mail.count(), mail.bodies, detect.DetectorGaveUp)
	}
	run, err := db.LastDetectRun()
	if err != nil || run.Day != "2026-03-08" || !run.GaveUp {
		t.Errorf("last run %+v, %v; want 2026-03-08 given up", run, err)
	}
	if f, _ := db.Findings("2026-03-08", "2026-03-08"); len(f) != 1 || f[0].Detector != detect.DetectorGaveUp {
		t.Errorf("stored findings %+v, want the one %s", f, detect.DetectorGaveUp)
	}

	// By hand, once the cause is fixed, the day runs.
	store.mu.Lock()
	store.crash = false
	store.mu.Unlock()
	r, err := detect.NewRunner(store, detect.RunnerOptions{Location: time.UTC, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(context.Background(), "2026-03-08", false)
	if err != nil || rep.Service.Attempts != 1 {
		t.Errorf("run by hand: %+v, %v; want 1 attempt", rep.Service, err)
	}
}

// TestCrashOnceRetried: one crash is retried at the next start, which
// finishes the day; a run that fails with an error is no crash and is
// tried again at every start, as before.
func TestCrashOnceRetried(t *testing.T) {
	now := time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	var mu sync.Mutex

	db := mustOpen(t)
	store := &dyingStore{DB: db, crash: true}
	start(t, store, now, nil, &logs, &mu)
	store.mu.Lock()
	store.crash = false
	store.mu.Unlock()
	start(t, store, now, nil, &logs, &mu)
	if run, err := db.LastDetectRun(); err != nil || run.Day != "2026-03-08" || run.GaveUp {
		t.Errorf("after a crash and a retry: last run %+v, %v; want 2026-03-08 finished", run, err)
	}
	if got := store.scanned(); got != 2 {
		t.Errorf("the day was run %d times, want 2", got)
	}

	failing := &dyingStore{DB: mustOpen(t), fail: true}
	for range detect.MaxUnfinishedRuns + 2 {
		start(t, failing, now, nil, &logs, &mu)
	}
	if got, want := failing.scanned(), detect.MaxUnfinishedRuns+2; got != want {
		t.Errorf("a failing day was run %d times in %d starts, want %d: an error is no crash", got, want, want)
	}
	if _, err := failing.LastDetectRun(); !errors.Is(err, detect.ErrNoRun) {
		t.Errorf("a failing day left a run record: %v", err)
	}
}
