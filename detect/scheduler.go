package detect

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// DefaultMaxCatchUp is the most missed days a Scheduler catches up at
// once.
const DefaultMaxCatchUp = 31

// DefaultRecheck is how long after a skipped run (another instance was
// running it, or the election failed) a Scheduler tries again, rather
// than at the next run_at: if the instance that ran it died mid-run, the
// day is run here within this long.
const DefaultRecheck = 10 * time.Minute

// Elector elects the one instance of a service that runs the daily
// detection, when several instances share one database: a storage
// backend.
type Elector interface {
	// LeadDetection makes this instance the one that runs detection,
	// until release, unless another instance is running it (ok false).
	// The lead ends with the process, however it ends.
	LeadDetection(ctx context.Context) (release func(), ok bool, err error)
}

// DayRunner runs detection for one day and knows the last day it ran:
// the Runner.
type DayRunner interface {
	LastRun() (string, error)
	// RunDay runs one day without mailing; Digest then mails the
	// findings of every day run, in one digest.
	RunDay(ctx context.Context, day string) (Report, error)
	Digest(reps []Report) bool
}

var _ DayRunner = (*Runner)(nil)

// SchedulerOptions are the Scheduler's optional parts.
type SchedulerOptions struct {
	MaxCatchUp int // default DefaultMaxCatchUp
	// NoCatchUp runs no day at start, only the days that come due while
	// the scheduler runs: for a throwaway database, whose missed days are
	// none.
	NoCatchUp bool
	// Elector elects the instance that runs the detection of the
	// service; nil: this one always does (the only instance).
	Elector Elector
	// Recheck is how long after a skipped run the Scheduler tries again;
	// default DefaultRecheck.
	Recheck time.Duration
	Logger  *slog.Logger
	Now     func() time.Time
}

// Scheduler runs the daily detection at [detect] run_at, in the budget's
// time zone, for the day before. Days are named, not counted in hours, so
// a day of 23 or 25 hours is run once; a day missed while the process was
// down is run at start, from the day after the last run (persisted) up to
// yesterday, at most MaxCatchUp days.
type Scheduler struct {
	r            DayRunner
	hour, minute int
	loc          *time.Location
	o            SchedulerOptions
	log          *slog.Logger
}

// NewScheduler returns a Scheduler of r at cfg.RunAt in loc.
func NewScheduler(r DayRunner, cfg Config, loc *time.Location, o SchedulerOptions) (*Scheduler, error) {
	if r == nil || loc == nil {
		return nil, errors.New("detect: the scheduler needs a runner and a time zone")
	}
	hour, minute, err := parseClock(cfg.WithDefaults().RunAt)
	if err != nil {
		return nil, err
	}
	if o.MaxCatchUp <= 0 {
		o.MaxCatchUp = DefaultMaxCatchUp
	}
	if o.Recheck <= 0 {
		o.Recheck = DefaultRecheck
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Scheduler{r: r, hour: hour, minute: minute, loc: loc, o: o, log: o.Logger.With("component", "detect")}, nil
}

// Run catches up, then runs each day at run_at until ctx ends. A run it
// skipped (another instance held the lead) is tried again Recheck later.
func (s *Scheduler) Run(ctx context.Context) {
	for first := true; ; first = false {
		skipped := false
		if !first || !s.o.NoCatchUp {
			skipped = s.runElected(ctx)
		}
		now := s.o.Now()
		wait := s.next(now).Sub(now)
		if skipped {
			wait = min(wait, s.o.Recheck)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// runAt is run_at on the calendar day of t. In a spring-forward gap it is
// the instant the clock jumps to; in a fall-back hour, the first.
func (s *Scheduler) runAt(t time.Time) time.Time {
	l := t.In(s.loc)
	return time.Date(l.Year(), l.Month(), l.Day(), s.hour, s.minute, 0, 0, s.loc)
}

// next is the first run_at after now.
func (s *Scheduler) next(now time.Time) time.Time {
	t := s.runAt(now)
	if t.After(now) {
		return t
	}
	l := now.In(s.loc)
	return s.runAt(time.Date(l.Year(), l.Month(), l.Day()+1, 12, 0, 0, 0, s.loc))
}

// latestDue is the latest day whose run is due at now: yesterday once
// today's run_at has passed, else the day before.
func (s *Scheduler) latestDue(now time.Time) string {
	l := now.In(s.loc)
	back := 1
	if now.Before(s.runAt(now)) {
		back = 2
	}
	return time.Date(l.Year(), l.Month(), l.Day()-back, 12, 0, 0, 0, s.loc).Format("2006-01-02")
}

// runElected runs the due days if this instance leads the service's
// detection, and reports whether it skipped them: another instance leads
// (it runs them; what it stores and mails is the service's), or the
// election failed. The days run are read after the election, so a run
// another instance finished meanwhile is not run again.
func (s *Scheduler) runElected(ctx context.Context) (skipped bool) {
	if s.o.Elector == nil {
		s.runDue(ctx)
		return false
	}
	release, ok, err := s.o.Elector.LeadDetection(ctx)
	switch {
	case err != nil:
		s.log.Error("daily detection skipped: the instance to run it could not be elected", "err", err, "retry_in", s.o.Recheck)
		return true
	case !ok:
		s.log.Info("daily detection skipped here: another instance is running it", "retry_in", s.o.Recheck)
		return true
	}
	defer release()
	if ran := s.runDue(ctx); ran == 0 && ctx.Err() == nil {
		s.log.Info("daily detection: nothing due here, every day is run")
	}
	return false
}

// runDue runs every due day after the last run, oldest first, and mails
// their findings in one digest. It stops at the first failure; the next
// run_at tries again from there. A day whose raw events are already past
// retention can never run, so it is skipped, or a long downtime would
// stop detection for good; so is a day the runner gave up (its runs kept
// ending the process), or every start would crash again. It returns how
// many days it tried.
func (s *Scheduler) runDue(ctx context.Context) (ran int) {
	latest := s.latestDue(s.o.Now())
	last, err := s.r.LastRun()
	if err != nil {
		s.log.Error("last detection run unknown: running the latest day only", "err", err)
		last = ""
	}
	first := latest
	if last != "" {
		first = addDays(last, 1)
		if oldest := addDays(latest, 1-s.o.MaxCatchUp); first < oldest {
			s.log.Warn("detection missed more days than it catches up", "last_run", last, "from", oldest)
			first = oldest
		}
	}
	var reps []Report
	defer func() { s.r.Digest(reps) }() // one mail for a catch-up, even one cut short
	for day := first; day <= latest; day = addDays(day, 1) {
		if ctx.Err() != nil {
			return ran
		}
		ran++
		rep, err := s.r.RunDay(ctx, day)
		if errors.Is(err, ErrPruned) {
			s.log.Warn("detection skips a day whose events are past retention", "day", day)
			continue
		} else if errors.Is(err, ErrGaveUp) {
			reps = append(reps, rep) // logged by the runner; the digest says so
			continue
		} else if err != nil {
			return ran // logged by the runner
		}
		reps = append(reps, rep)
	}
	return ran
}
