package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/guard"
)

// State names under which the defense layers' memory is written behind.
const (
	stateUserWindows    = "windows/user"
	stateAttemptsPrefix = "attempts/"
)

// AttemptsState names the stored attempt counts of day.
func AttemptsState(day string) string { return stateAttemptsPrefix + day }

// StateStore is what the write-behind needs from storage.
type StateStore interface {
	SaveState(name string, entries map[string][]byte) error
	DropStates(prefix, keep string) error
}

// WriteBehind copies the defense layers' in-memory state (rate windows,
// daily attempt counts, and the invite guard's windows and fail limits) to
// storage every interval, so that a restart neither resets a daily line nor
// lifts a rate limit or a cooldown. Only what changed is written, at most
// once per interval: a request refused by the rate limits changes nothing,
// and a failed invite guess only updates the fail limiter's entry for its
// keys, so an attack costs at most one small write a second. A failed write
// is a fail-open event of the layer.
type WriteBehind struct {
	store    StateStore
	windows  *limiter.Limiter
	attempts *budget.Attempts
	invites  *InviteGuard
	failOpen func(layer string, err error)
	log      *slog.Logger
	now      func() time.Time

	lastDay   string
	lastEvict time.Time
}

// DefaultWriteBehindInterval is how often defense state reaches the disk.
const DefaultWriteBehindInterval = time.Second

// evictEvery is how often idle rate-limit keys are dropped from memory.
const evictEvery = 30 * time.Second

// NewWriteBehind returns the writer; s supplies the fail-open accounting
// and its invite guard.
func (s *Server) NewWriteBehind(store StateStore, windows *limiter.Limiter, attempts *budget.Attempts) *WriteBehind {
	return &WriteBehind{store: store, windows: windows, attempts: attempts, invites: s.guard, failOpen: s.failOpen.note, log: s.log, now: s.now}
}

// Run flushes every interval until ctx ends, then once more.
func (w *WriteBehind) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.Flush()
			return
		case <-t.C:
			w.Flush()
		}
	}
}

// Flush writes what changed since the last flush.
func (w *WriteBehind) Flush() {
	now := w.now()
	if now.Sub(w.lastEvict) >= evictEvery {
		w.windows.Evict(now)
		w.invites.Windows.Evict(now)
		w.invites.Fails.Evict(now)
		w.lastEvict = now
	}
	w.save(stateUserWindows, w.windows.Dirty(now), guard.LayerRate)
	w.save(stateInviteWindows, w.invites.Windows.Dirty(now), layerInvites)
	fails, global := w.invites.Fails.Dirty()
	w.save(stateInviteFails, fails, layerInvites)
	if global != nil {
		if err := w.store.SaveState(stateInviteGlobal, map[string][]byte{globalStateKey: global}); err != nil {
			w.failOpen(layerInvites, err)
		}
	}
	day, counts := w.attempts.Dirty()
	if len(counts) > 0 {
		if err := w.store.SaveState(AttemptsState(day), counts); err != nil {
			w.failOpen(guard.LayerAttempts, err)
		}
	}
	if day != w.lastDay {
		if err := w.store.DropStates(stateAttemptsPrefix, AttemptsState(day)); err != nil {
			w.log.Warn("old attempt counts not pruned", "err", err)
		}
		w.lastDay = day
	}
}

// save writes limiter entries into the named state; a failure is a
// fail-open event of layer.
func (w *WriteBehind) save(name string, dirty []limiter.Entry, layer string) {
	if len(dirty) == 0 {
		return
	}
	entries := make(map[string][]byte, len(dirty))
	for _, e := range dirty {
		entries[e.Key] = e.State
	}
	if err := w.store.SaveState(name, entries); err != nil {
		w.failOpen(layer, err)
	}
}

// LayerStore is what LoadLayers reads: the written-behind defense state,
// this month's quota counts and the budget ledger.
type LayerStore interface {
	LoadState(name string) (map[string][]byte, error)
	QuotaUsed(month string) (map[string]int64, error)
	Budget(day string) (budget.DayTotals, error)
	BudgetMonth(month string) (int64, error)
	LatestBudgetDay() (string, error)
	budget.Ledger
}

// Layers are the in-memory state of layers 1 to 3.
type Layers struct {
	Windows  *limiter.Limiter // layer 1, per user
	Attempts *budget.Attempts // layer 2
	Quotas   *budget.Quotas   // layer 2b
	Brake    *budget.Global   // layer 3
}

// LoadLayers rebuilds the layers' memory from storage at start: rate
// windows and today's attempts (written behind), this month's quota
// counts, and today's and this month's budget, in which every reservation
// left unsettled by a crash counts at its worst case.
//
// If the ledger already holds the day after now's (the clock went back,
// say a VM restored before its clock synced), the daily line and the
// budget start on that day: days only move forward, so its spend and
// attempts keep counting until the clock catches up, rather than being
// zeroed by the rollover then. A ledger day further ahead is not believed
// (one wrong clock reading must not pin the service to a far day); the
// quotas always start on now's month, since they fail closed.
func LoadLayers(store LayerStore, limits limiter.Config, cfg budget.Config, loc *time.Location, now time.Time, log *slog.Logger) (Layers, error) {
	if log == nil {
		log = slog.Default()
	}
	day, month := budget.DayKey(now, loc), budget.MonthKey(now, loc)
	quotaMonth := month
	var l Layers
	latest, err := store.LatestBudgetDay()
	if err != nil {
		return l, fmt.Errorf("load budget: %w", err)
	}
	switch tomorrow := budget.DayKey(now.AddDate(0, 0, 1), loc); {
	case latest > tomorrow:
		log.Error("the budget ledger holds a day far after the clock's; counting from the clock's day: check the system clock",
			"clock_day", day, "ledger_day", latest)
	case latest > day:
		log.Warn("the clock is behind the budget ledger: counting into the ledger's newest day until it catches up",
			"clock_day", day, "ledger_day", latest)
		day, month = latest, latest[:len("2006-01")]
	}
	if l.Windows, err = limiter.New(limits); err != nil {
		return l, err
	}
	windows, err := store.LoadState(stateUserWindows)
	if err != nil {
		return l, err
	}
	entries := make([]limiter.Entry, 0, len(windows))
	for k, v := range windows {
		entries = append(entries, limiter.Entry{Key: k, State: v})
	}
	l.Windows.Load(entries, now)

	counts, err := store.LoadState(AttemptsState(day))
	if err != nil {
		return l, err
	}
	l.Attempts = budget.NewAttempts(loc, day, budget.DecodeCounts(counts))

	used, err := store.QuotaUsed(quotaMonth)
	if err != nil {
		return l, fmt.Errorf("load quotas: %w", err)
	}
	l.Quotas = budget.NewQuotas(loc, quotaMonth, used)

	today, err := store.Budget(day)
	if err != nil {
		return l, fmt.Errorf("load budget: %w", err)
	}
	monthSpend, err := store.BudgetMonth(month)
	if err != nil {
		return l, fmt.Errorf("load budget: %w", err)
	}
	l.Brake, err = budget.NewGlobal(cfg, loc, store, budget.GlobalState{
		Day: day, Requests: today.Requests, Spend: today.SpendMicroUSD, Month: month, MonthSpend: monthSpend,
	})
	return l, err
}
