package detect

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeRunner records the days run and remembers the last, as storage does.
type fakeRunner struct {
	mu   sync.Mutex
	last string
	days []string
	at   []time.Time
	now  func() time.Time
	// prunedBefore makes RunDay refuse days before it, as the real runner
	// refuses days past retention.
	prunedBefore string
	digests      []int // how many days each Digest call covered
	// runFor is how long each day's run takes (in the bubble's time).
	runFor time.Duration
}

func (f *fakeRunner) LastRun() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, nil
}

func (f *fakeRunner) RunDay(_ context.Context, day string) (Report, error) {
	f.mu.Lock()
	runFor := f.runFor
	f.mu.Unlock()
	time.Sleep(runFor)
	f.mu.Lock()
	defer f.mu.Unlock()
	if day < f.prunedBefore {
		return Report{}, ErrPruned
	}
	f.days = append(f.days, day)
	f.at = append(f.at, f.now())
	f.last = max(f.last, day)
	return Report{Day: day}, nil
}

func (f *fakeRunner) Digest(reps []Report) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.digests = append(f.digests, len(reps))
	return true
}

func (f *fakeRunner) ran() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.days)
}

// schedule runs a Scheduler inside the current synctest bubble with a
// clock that starts at start, and returns the runner and a stop func.
func schedule(t *testing.T, start time.Time, runAt, last string, loc *time.Location) (*fakeRunner, func() time.Time, func()) {
	t.Helper()
	offset := start.Sub(time.Now())
	now := func() time.Time { return time.Now().Add(offset).In(loc) }
	r := &fakeRunner{last: last, now: now}
	s, err := NewScheduler(r, Config{RunAt: runAt}, loc, SchedulerOptions{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	return r, now, func() { cancel(); <-done }
}

// sleepUntil advances the bubble's clock to t.
func sleepUntil(now func() time.Time, t time.Time) {
	time.Sleep(t.Sub(now()))
	synctest.Wait()
}

func TestSchedulerRunsAtRunAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
		r, now, stop := schedule(t, start, "00:15", "2026-03-03", time.UTC)
		defer stop()
		synctest.Wait()
		if got := r.ran(); len(got) != 0 {
			t.Fatalf("ran %v at start with nothing due", got)
		}
		sleepUntil(now, time.Date(2026, 3, 5, 0, 14, 59, 0, time.UTC))
		if got := r.ran(); len(got) != 0 {
			t.Fatalf("ran %v before run_at", got)
		}
		sleepUntil(now, time.Date(2026, 3, 5, 0, 15, 1, 0, time.UTC))
		if got, want := r.ran(), []string{"2026-03-04"}; !slices.Equal(got, want) {
			t.Fatalf("ran %v, want %v", got, want)
		}
		r.mu.Lock()
		at := r.at[0]
		r.mu.Unlock()
		if !at.Equal(time.Date(2026, 3, 5, 0, 15, 0, 0, time.UTC)) {
			t.Errorf("ran at %v, want 00:15", at)
		}
		sleepUntil(now, time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC))
		if got, want := r.ran(), []string{"2026-03-04", "2026-03-05", "2026-03-06"}; !slices.Equal(got, want) {
			t.Fatalf("ran %v, want %v", got, want)
		}
	})
}

func TestSchedulerCatchesUpAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Down from the 28th's run until the 4th at 10:00: the 28th to
		// the 3rd are due, oldest first, each once.
		start := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
		r, _, stop := schedule(t, start, "00:15", "2026-02-27", time.UTC)
		synctest.Wait()
		stop()
		want := []string{"2026-02-28", "2026-03-01", "2026-03-02", "2026-03-03"}
		if got := r.ran(); !slices.Equal(got, want) {
			t.Fatalf("caught up %v, want %v", got, want)
		}
		r.mu.Lock()
		digests := slices.Clone(r.digests)
		r.mu.Unlock()
		if !slices.Equal(digests, []int{4}) {
			t.Fatalf("digests covering %v days, want one covering 4", digests)
		}
		// Restarted before run_at: yesterday's run is not due yet.
		start = time.Date(2026, 3, 5, 0, 10, 0, 0, time.UTC)
		r2, now, stop2 := schedule(t, start, "00:15", "2026-03-03", time.UTC)
		defer stop2()
		synctest.Wait()
		if got := r2.ran(); len(got) != 0 {
			t.Fatalf("ran %v before run_at", got)
		}
		sleepUntil(now, time.Date(2026, 3, 5, 0, 16, 0, 0, time.UTC))
		if got, want := r2.ran(), []string{"2026-03-04"}; !slices.Equal(got, want) {
			t.Fatalf("ran %v, want %v", got, want)
		}
	})
}

func TestSchedulerOncePerDayAcrossDST(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		runAt string
		start time.Time
		last  string
		want  []string
	}{
		// 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist.
		{"spring forward, run_at in the gap", "02:30", time.Date(2026, 3, 6, 12, 0, 0, 0, ny), "2026-03-05",
			[]string{"2026-03-06", "2026-03-07", "2026-03-08", "2026-03-09", "2026-03-10"}},
		{"spring forward", "00:15", time.Date(2026, 3, 6, 12, 0, 0, 0, ny), "2026-03-05",
			[]string{"2026-03-06", "2026-03-07", "2026-03-08", "2026-03-09", "2026-03-10"}},
		// 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
		{"fall back, run_at in the repeated hour", "01:30", time.Date(2026, 10, 30, 12, 0, 0, 0, ny), "2026-10-29",
			[]string{"2026-10-30", "2026-10-31", "2026-11-01", "2026-11-02", "2026-11-03"}},
		{"fall back", "00:15", time.Date(2026, 10, 30, 12, 0, 0, 0, ny), "2026-10-29",
			[]string{"2026-10-30", "2026-10-31", "2026-11-01", "2026-11-02", "2026-11-03"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, now, stop := schedule(t, tt.start, tt.runAt, tt.last, ny)
				defer stop()
				sleepUntil(now, tt.start.AddDate(0, 0, 5))
				if got := r.ran(); !slices.Equal(got, tt.want) {
					t.Fatalf("ran %v, want %v (each day once)", got, tt.want)
				}
			})
		})
	}
}

func TestDayBoundsAcrossDST(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	for day, want := range map[string]time.Duration{"2026-03-08": 23 * time.Hour, "2026-11-01": 25 * time.Hour, "2026-06-01": 24 * time.Hour} {
		from, to, err := DayBounds(day, ny)
		if err != nil {
			t.Fatal(err)
		}
		if got := to.Sub(from); got != want {
			t.Errorf("%s lasts %s, want %s", day, got, want)
		}
	}
}

// TestSchedulerSkipsPrunedDays: after a downtime longer than retention,
// the days whose events are gone are skipped and detection goes on with
// the rest, instead of stopping at the first for good.
func TestSchedulerSkipsPrunedDays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 3, 10, 10, 0, 0, 0, time.UTC)
		offset := start.Sub(time.Now())
		now := func() time.Time { return time.Now().Add(offset) }
		r := &fakeRunner{last: "2026-03-01", now: now, prunedBefore: "2026-03-07"}
		s, err := NewScheduler(r, Config{RunAt: "00:15"}, time.UTC, SchedulerOptions{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		synctest.Wait()
		cancel()
		<-done
		if got, want := r.ran(), []string{"2026-03-07", "2026-03-08", "2026-03-09"}; !slices.Equal(got, want) {
			t.Fatalf("ran %v, want %v", got, want)
		}
	})
}

// NoCatchUp runs no day at start, however many are due, and still runs
// the days that come due while it runs.
func TestSchedulerNoCatchUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
		offset := start.Sub(time.Now())
		now := func() time.Time { return time.Now().Add(offset) }
		r := &fakeRunner{now: now}
		s, err := NewScheduler(r, Config{RunAt: "00:15"}, time.UTC, SchedulerOptions{Now: now, NoCatchUp: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		synctest.Wait()
		if got := r.ran(); len(got) != 0 {
			t.Fatalf("ran %v at start with NoCatchUp", got)
		}
		sleepUntil(now, time.Date(2026, 3, 5, 0, 16, 0, 0, time.UTC))
		if got, want := r.ran(), []string{"2026-03-04"}; !slices.Equal(got, want) {
			t.Fatalf("ran %v, want %v", got, want)
		}
	})
}
