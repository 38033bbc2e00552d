package detect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Counters count what layer 4 does and what goes wrong in it, for the
// metrics. Share one among the Runner, the Alerter and the Mailer.
type Counters struct {
	Runs          atomic.Uint64 // detection runs finished, one per day run
	RunFailures   atomic.Uint64 // detection runs that failed
	AlertsSent    atomic.Uint64 // e-mails delivered (alerts and digests)
	AlertFailures atomic.Uint64 // failed deliveries, and mail or alerts dropped by a full queue
	// Webhooks: notices delivered, failed attempts, and notices dropped
	// (a full queue, or given up after their attempts).
	WebhooksSent    atomic.Uint64
	WebhookFailures atomic.Uint64
	WebhookDropped  atomic.Uint64
}

// Sender queues a plain-text e-mail without waiting: the Mailer. It
// reports false when the message was dropped.
type Sender interface {
	Send(subject, body string) bool
}

// PersonalPruner is what a storage backend may also offer the Runner:
// deleting, past retention, the personal data kept outside the raw
// events (client IPs and e-mails in aggregates and findings, e-mails of
// invites that can no longer be redeemed). Days before beforeDay and
// redemptions before before go; now says which invites are spent.
type PersonalPruner interface {
	PrunePersonal(beforeDay string, before, now time.Time) (int, error)
}

// Store is what the Runner needs from a storage backend.
type Store interface {
	// EachEvent streams the events with from <= Time < to, in time order.
	EachEvent(from, to time.Time, fn func(Event) error) error
	PruneEvents(before time.Time) (int, error)
	DayStats(from, to string) ([]DayStats, error)
	// StartDetectRun records that a run of day starts and returns how
	// many earlier runs of it started and never finished.
	StartDetectRun(day string) (unfinished int, err error)
	// EndDetectRun clears that count after a run that returned an error.
	EndDetectRun(day string) error
	// SaveDetection stores a finished run; SaveDetectRun a day given up.
	// Both clear the count.
	SaveDetection(stats DayStats, findings []Finding, run RunRecord) error
	SaveDetectRun(run RunRecord, findings []Finding) error
	// LastDetectRun returns the run of the latest day run, or an error
	// wrapping ErrNoRun when detection never ran.
	LastDetectRun() (RunRecord, error)
	Findings(from, to string) ([]Finding, error)
}

// MaxUnfinishedRuns is how many runs of one day may start and never
// finish (each one a crash or a kill of the process) before the
// Scheduler gives the day up: the first run and one retry. Without it, a
// day whose run crashes the process would run again at every start.
const MaxUnfinishedRuns = 2

// DetectorGaveUp names the finding that the Scheduler gave a day up.
const DetectorGaveUp = "detection_gave_up"

// ErrGaveUp means the Scheduler gave a day up: MaxUnfinishedRuns runs of
// it started and never finished. The day has no aggregate; a manual run
// (breakwater detect run --day) still runs it.
var ErrGaveUp = errors.New("detect: day given up after runs that never finished")

// RunnerOptions are the Runner's settings and optional parts.
type RunnerOptions struct {
	Config   Config
	Location *time.Location // budget.timezone; required
	// RetentionDays is how many days of raw events are kept
	// (storage.stats_retention_days); 0 keeps them all.
	RetentionDays int
	// Lines gives the daily abuse lines in force, for the grey zone; nil:
	// none.
	Lines func() Lines
	// Ceilings gives the global budget's ceilings in force; nil: none.
	Ceilings func() Ceilings
	// Mail sends the digest; nil means mail is off and findings are logged
	// at WARN instead.
	Mail     Sender
	Counters *Counters
	Logger   *slog.Logger
	Now      func() time.Time
}

// Runner aggregates one day, runs the detectors, stores the findings,
// prunes old events and sends the digest. Runs are serialised.
type Runner struct {
	store Store
	o     RunnerOptions
	log   *slog.Logger
	cfg   atomic.Pointer[Config] // the thresholds; SetConfig swaps them
	mu    sync.Mutex
}

// NewRunner returns a Runner over store.
func NewRunner(store Store, o RunnerOptions) (*Runner, error) {
	if store == nil || o.Location == nil {
		return nil, errors.New("detect: the runner needs a store and a time zone")
	}
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	o.Config = o.Config.WithDefaults()
	if o.Counters == nil {
		o.Counters = &Counters{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Runner{store: store, o: o, log: o.Logger.With("component", "detect")}
	r.cfg.Store(&o.Config)
	return r, nil
}

// SetConfig replaces the detectors' thresholds, for a config reload; the
// next run uses them. run_at is the Scheduler's and changes only on a
// restart. An invalid cfg is refused and the thresholds in force kept.
func (r *Runner) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	r.cfg.Store(&cfg)
	return nil
}

// Report is the outcome of one run.
type Report struct {
	Day      string     `json:"day"`
	Service  ServiceDay `json:"service"`
	Findings []Finding  `json:"findings"`
	Pruned   int        `json:"pruned"` // raw events deleted
	Mailed   bool       `json:"mailed"` // a digest was queued
}

// Yesterday is the day before now's, in the runner's time zone.
func (r *Runner) Yesterday(now time.Time) string {
	l := now.In(r.o.Location)
	return time.Date(l.Year(), l.Month(), l.Day()-1, 12, 0, 0, 0, r.o.Location).Format("2006-01-02")
}

// Run aggregates day ("2006-01-02" in budget.timezone), replacing what an
// earlier run of that day stored, runs the detectors, stores the findings
// and, if mail is set and there are findings, queues the digest. It runs
// even a day the Scheduler gave up.
func (r *Runner) Run(ctx context.Context, day string, mail bool) (Report, error) {
	return r.runLocked(ctx, day, mail, false)
}

func (r *Runner) runLocked(ctx context.Context, day string, mail, scheduled bool) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep, err := r.run(ctx, day, mail, scheduled)
	if err != nil {
		r.o.Counters.RunFailures.Add(1)
		return rep, fmt.Errorf("detect %s: %w", day, err)
	}
	r.o.Counters.Runs.Add(1)
	return rep, nil
}

// RunDay is Run without the digest, for the Scheduler, and gives up a day
// that MaxUnfinishedRuns runs started and never finished: it logs that at
// ERROR and returns ErrGaveUp with a report holding one DetectorGaveUp
// finding, which the digest carries.
func (r *Runner) RunDay(ctx context.Context, day string) (Report, error) {
	rep, err := r.runLocked(ctx, day, false, true)
	if errors.Is(err, ErrGaveUp) {
		r.log.Error("daily detection gave a day up: its runs never finished, each one ended the process; run it by hand with breakwater detect run --day", "day", day, "unfinished_runs", MaxUnfinishedRuns)
		return rep, err
	}
	if err != nil {
		r.log.Error("daily detection failed", "day", day, "err", err)
		return Report{}, err
	}
	r.log.Info("daily detection done", "day", day, "findings", len(rep.Findings), "attempts", rep.Service.Attempts, "pruned_events", rep.Pruned)
	return rep, nil
}

// Digest sends one digest for the findings of reps, however many days they
// cover, so catching up after a downtime sends one mail rather than one a
// day; with mail off, it logs each finding at WARN. It does nothing when
// there is no finding and returns whether a mail was queued.
func (r *Runner) Digest(reps []Report) bool {
	var days []Report
	n := 0
	for _, rep := range reps {
		if len(rep.Findings) > 0 {
			days = append(days, rep)
			n += len(rep.Findings)
		}
	}
	if n == 0 {
		return false
	}
	if r.o.Mail == nil {
		for _, rep := range days {
			for _, f := range rep.Findings {
				r.log.Warn("detection finding", "day", f.Day, "detector", f.Detector, "subject", f.Subject, "figures", FiguresText(f.Figures))
			}
		}
		return false
	}
	subject := fmt.Sprintf("detection digest for %s: %s", days[0].Day, plural(n, "finding"))
	if len(days) > 1 {
		subject = fmt.Sprintf("detection digest for %s to %s: %s", days[0].Day, days[len(days)-1].Day, plural(n, "finding"))
	}
	bodies := make([]string, len(days))
	for i, rep := range days {
		bodies[i] = DigestBody(rep)
	}
	return r.o.Mail.Send(subject, strings.Join(bodies, "\n"))
}

// LastRun is the latest day detection ran for, "" if it never ran.
func (r *Runner) LastRun() (string, error) {
	run, err := r.store.LastDetectRun()
	if errors.Is(err, ErrNoRun) {
		return "", nil
	}
	return run.Day, err
}

// Recent returns the findings of the days from..to inclusive.
func (r *Runner) Recent(from, to string) ([]Finding, error) {
	return r.store.Findings(from, to)
}

func (r *Runner) run(ctx context.Context, day string, mail, scheduled bool) (Report, error) {
	from, to, err := DayBounds(day, r.o.Location)
	if err != nil {
		return Report{}, fmt.Errorf("day %q is not YYYY-MM-DD", day)
	}
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	if cut := r.retentionCut(); !cut.IsZero() && !to.After(cut) {
		return Report{}, fmt.Errorf("%w: its events are older than stats_retention_days (%d)", ErrPruned, r.o.RetentionDays)
	}
	unfinished, err := r.store.StartDetectRun(day)
	if err != nil {
		return Report{}, err
	}
	if scheduled && unfinished >= MaxUnfinishedRuns {
		return r.giveUp(day, unfinished)
	}
	rep, err := r.detect(ctx, day, from, to, mail)
	if err != nil {
		if endErr := r.store.EndDetectRun(day); endErr != nil {
			r.log.Warn("detection run not marked ended: it counts as unfinished", "day", day, "err", endErr)
		}
		return Report{}, err
	}
	return rep, nil
}

// giveUp records day as given up, with one finding that says so.
func (r *Runner) giveUp(day string, unfinished int) (Report, error) {
	f := Finding{Day: day, Detector: DetectorGaveUp, Subject: "service", Figures: map[string]float64{"unfinished_runs": float64(unfinished)}}
	run := RunRecord{Day: day, RanAt: r.o.Now(), Findings: 1, GaveUp: true}
	if err := r.store.SaveDetectRun(run, []Finding{f}); err != nil {
		return Report{}, err
	}
	return Report{Day: day, Findings: []Finding{f}}, ErrGaveUp
}

// detect aggregates the day's events as they stream from the store, runs
// the detectors and stores the outcome.
func (r *Runner) detect(ctx context.Context, day string, from, to time.Time, mail bool) (Report, error) {
	cfg := r.cfg.Load()
	var lines Lines
	if r.o.Lines != nil {
		lines = r.o.Lines()
	}
	agg := NewAggregator(day, lines, cfg.MaxKeys)
	n := 0
	err := r.store.EachEvent(from, to, func(e Event) error {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		agg.Add(e)
		return nil
	})
	if err != nil {
		return Report{}, err
	}
	today := agg.Done()
	monthStart := day[:8] + "01"
	histFrom := min(monthStart, addDays(day, -7))
	before, err := r.store.DayStats(histFrom, addDays(day, -1))
	if err != nil {
		return Report{}, err
	}
	h := History{Today: today, MonthCostMicroUSD: today.Service.CostMicroUSD}
	for _, d := range before {
		if d.Day >= addDays(day, -7) {
			h.Before = append(h.Before, d)
		}
		if d.Day >= monthStart {
			h.MonthCostMicroUSD += d.Service.CostMicroUSD
		}
	}
	if r.o.Ceilings != nil {
		h.Ceilings = r.o.Ceilings()
	}
	findings := Detect(*cfg, h)

	rep := Report{Day: day, Service: today.Service, Findings: findings}
	if cut := r.retentionCut(); !cut.IsZero() {
		if rep.Pruned, err = r.store.PruneEvents(cut); err != nil {
			return Report{}, err
		}
		if p, ok := r.store.(PersonalPruner); ok {
			n, err := p.PrunePersonal(cut.Format("2006-01-02"), cut, r.o.Now())
			if err != nil {
				return Report{}, err
			}
			if n > 0 {
				r.log.Info("personal data past retention deleted", "before", cut.Format("2006-01-02"), "records", n)
			}
		}
	}
	run := RunRecord{Day: day, RanAt: r.o.Now(), Findings: len(findings), Pruned: rep.Pruned}
	if err := r.store.SaveDetection(today, findings, run); err != nil {
		return Report{}, err
	}
	if mail {
		rep.Mailed = r.Digest([]Report{rep})
	}
	return rep, nil
}

// ErrPruned refuses to run a day whose raw events are past retention:
// its stored aggregate is kept rather than replaced by an empty one.
var ErrPruned = errors.New("detect: day already pruned")

// retentionCut is the first instant whose events are kept; zero when all
// are kept.
func (r *Runner) retentionCut() time.Time {
	if r.o.RetentionDays <= 0 {
		return time.Time{}
	}
	l := r.o.Now().In(r.o.Location)
	return time.Date(l.Year(), l.Month(), l.Day()-r.o.RetentionDays, 0, 0, 0, 0, r.o.Location)
}

// DigestBody is the plain-text digest of a run: a one-line summary, then
// the numbers. User-controlled values (user ids, IPs, e-mails) are
// escaped.
func DigestBody(rep Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Breakwater detection for %s: %s.\n\n", rep.Day, plural(len(rep.Findings), "finding"))
	s := rep.Service
	fmt.Fprintf(&b, "service: %s, %d ok, %d failed, %s, %s, $%.6f, %s\n\n",
		plural(s.Attempts, "attempt"), s.Successes, s.Failures, plural(s.Users, "user"), plural(s.IPs, "IP"),
		float64(s.CostMicroUSD)/1e6, plural(s.Invites, "invite check"))
	for _, f := range rep.Findings {
		fmt.Fprintf(&b, "%s  %s  %s\n", f.Detector, Escape(f.Subject), FiguresText(f.Figures))
		if len(f.Users) > 0 {
			fmt.Fprintf(&b, "    users: %s\n", namesText(f.Users, int64(f.Figures["users"])))
		}
	}
	return b.String()
}

// plural is n and noun, with an s unless n is 1: "1 finding", "2 findings".
func plural[N int | int64](n N, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// namesText lists names, escaped, and how many of total it leaves out,
// wrapped after about 72 columns onto lines indented like the first
// (users' ids may be 128 bytes each: one line could pass the 998 bytes a
// mail line may hold).
func namesText(names []string, total int64) string {
	const indent = "\n           "
	var b strings.Builder
	col := 0
	for i, n := range names {
		item := Escape(n)
		if i < len(names)-1 {
			item += ","
		}
		if col > 0 && col+1+len(item) > 60 {
			b.WriteString(indent)
			col = 0
		} else if col > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(item)
		col += len(item)
	}
	if more := total - int64(len(names)); more > 0 {
		fmt.Fprintf(&b, " and %d more", more)
	}
	return b.String()
}

// FiguresText formats a finding's figures as "key=value ..." in key order.
func FiguresText(figures map[string]float64) string {
	keys := slices.Sorted(maps.Keys(figures))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%s", k, trimFloat(figures[k]))
	}
	return strings.Join(parts, " ")
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.4f", v)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// Escape makes a user-controlled value safe for one line of a plain-text
// e-mail body: CR, LF, every other control character and the Unicode line
// and paragraph separators become visible \uXXXX escapes, so no value can
// start a new line, let alone a header.
func Escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029 || r == 0x85 {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
