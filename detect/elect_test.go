package detect

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeElector is one lead for the service, as an advisory lock is.
type fakeElector struct {
	mu   sync.Mutex
	held bool
}

func (e *fakeElector) LeadDetection(context.Context) (func(), bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.held {
		return nil, false, nil
	}
	e.held = true
	return e.release, true, nil
}

func (e *fakeElector) release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.held = false
}

// startScheduler runs a Scheduler of r with elector e in the current
// bubble until the returned func stops it.
func startScheduler(t *testing.T, r DayRunner, e Elector, now func() time.Time) func() {
	t.Helper()
	s, err := NewScheduler(r, Config{RunAt: "03:00"}, time.UTC, SchedulerOptions{Elector: e, Now: now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// Two instances' Schedulers on one store, each day's run taking a
// minute: at run_at one runs the day and mails its digest, the other
// skips it, and, checking again later, finds it done.
func TestSchedulersElectOneRunPerDay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 3, 4, 2, 0, 0, 0, time.UTC)
		offset := start.Sub(time.Now())
		now := func() time.Time { return time.Now().Add(offset) }
		r := &fakeRunner{last: "2026-03-02", now: now, runFor: time.Minute}
		e := &fakeElector{}
		stopA := startScheduler(t, r, e, now)
		defer stopA()
		stopB := startScheduler(t, r, e, now)
		defer stopB()
		sleepUntil(now, time.Date(2026, 3, 5, 4, 0, 0, 0, time.UTC))
		if got, want := r.ran(), []string{"2026-03-03", "2026-03-04"}; !slices.Equal(got, want) {
			t.Fatalf("two instances ran %v, want each day once: %v", got, want)
		}
		r.mu.Lock()
		var mailed []int
		for _, n := range r.digests {
			if n > 0 {
				mailed = append(mailed, n)
			}
		}
		r.mu.Unlock()
		if !slices.Equal(mailed, []int{1, 1}) {
			t.Errorf("digests of %v days, want one digest per day", mailed)
		}
	})
}

// The instance that led died mid-run (its lock went with its session,
// the day's run record was never written): another instance runs the day
// at its next check, not a day later.
func TestSchedulerRunsADayItsLeaderLeftUnfinished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 3, 4, 2, 59, 0, 0, time.UTC)
		offset := start.Sub(time.Now())
		now := func() time.Time { return time.Now().Add(offset) }
		r := &fakeRunner{last: "2026-03-02", now: now}
		e := &fakeElector{held: true} // the other instance leads: it started the catch-up
		stop := startScheduler(t, r, e, now)
		defer stop()
		sleepUntil(now, time.Date(2026, 3, 4, 3, 5, 0, 0, time.UTC))
		if got := r.ran(); len(got) != 0 {
			t.Fatalf("ran %v while the other instance led", got)
		}
		e.release() // the leader died: its session, and the lock, ended
		sleepUntil(now, time.Date(2026, 3, 4, 3, 30, 0, 0, time.UTC))
		if got, want := r.ran(), []string{"2026-03-03"}; !slices.Equal(got, want) {
			t.Fatalf("ran %v, want %v", got, want)
		}
		r.mu.Lock()
		at := r.at[0]
		r.mu.Unlock()
		// Skipped at 03:00 (run_at) too: the recheck comes 10 minutes on.
		if want := time.Date(2026, 3, 4, 3, 0, 0, 0, time.UTC).Add(DefaultRecheck); !at.Equal(want) {
			t.Errorf("ran at %v, want %v: at the recheck after the skip", at, want)
		}
	})
}
