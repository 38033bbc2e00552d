// Package state keeps the defense layers' in-memory state across
// restarts: LoadLayers and LoadBrake rebuild the rate windows, the daily
// attempt counts, the quotas and the global budget from storage at start,
// and WriteBehind copies what changed back every second, from a list of
// snapshots that each limiter registers. It decides nothing about a
// request and knows neither HTTP nor the database file: storage implements
// the small interfaces it declares.
package state

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

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

// Layers are the in-memory state of layers 1 to 3, as LoadLayers rebuilds
// it from storage. Its fields are what the guard, the operator, the reload
// and the write-behind call, so that another backend's layers could stand
// in for the in-memory ones. Each interface spells out the methods of the
// guard's own (server/guard's Layers) that the wiring hands it, so that
// state does not import the guard it lies under.
type Layers struct {
	Windows  RateWindows    // layer 1, per user: limiter.Limiter
	Attempts AttemptCounter // layer 2: budget.Attempts
	Quotas   Quotas         // layer 2b: budget.Quotas
	Brake    Brake          // layer 3: budget.Global
}

// RateWindows is layer 1 as Layers holds it: the guard's check (Allow),
// the reload's config swap and the write-behind's snapshot.
type RateWindows interface {
	Allow(key string, now time.Time) error
	SetConfig(cfg limiter.Config)
	WindowSource
}

// AttemptCounter is layer 2 as Layers holds it: the guard's check and
// count (Check, Take), the operator's figures and the write-behind's
// snapshot.
type AttemptCounter interface {
	Check(key string, line int64, now time.Time) error
	Take(key string, line int64, now time.Time) error
	Count(user string, now time.Time) int64
	Top(n int, now time.Time) []budget.UserCount
	DailySource
}

// Quotas is layer 2b as Layers holds it: the guard's check, reservation
// and confirmation, and the operator's figures (Used).
type Quotas interface {
	Check(user string, limit int64, now time.Time) error
	Reserve(user string, limit int64, now time.Time) (budget.Slot, error)
	Confirm(s budget.Slot) (used int64)
	Release(s budget.Slot)
	Used(user string, now time.Time) int64
}

// Brake is layer 3 as Layers holds it: the guard's claims (Check to
// Settled), and the status and the soft ceilings' side, the operator's manual switch, the reload's
// config swap, and Close, which gives the unused budget lease back at
// shutdown; the early warnings read the figures it decides on (Counted)
// and are told when they reach a share (OnShare).
type Brake interface {
	Check(now time.Time) error
	Claim(worst int64, now time.Time) (budget.Reservation, error)
	ClaimSoft(primary, fallback int64, now time.Time) (budget.Reservation, error)
	Commit(ctx context.Context, r *budget.Reservation) error
	Settle(ctx context.Context, r budget.Reservation, actual int64) error
	Settled(r budget.Reservation, actual int64)
	Status(now time.Time) budget.Status
	Soft(now time.Time) string
	SetManual(on bool)
	SetConfig(cfg budget.Config)
	Close(ctx context.Context) error
	Counted(now time.Time) budget.Counted
	OnShare(percents []int64, fn func(budget.Counted))
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
	windows, err := limiter.New(limits)
	if err != nil {
		return l, err
	}
	if err := LoadWindows(store, StateUserWindows, windows, now); err != nil {
		return l, err
	}
	l.Windows = windows

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
	brake, err := budget.NewGlobal(cfg, loc, store, budget.GlobalState{
		Day: day, Requests: today.Requests, Spend: today.SpendMicroUSD, Month: month, MonthSpend: monthSpend,
	})
	if err != nil {
		return l, err
	}
	l.Brake = brake
	return l, nil
}

// LoadBrake restores the operator's kill switch (BrakeFlag) from storage
// at start.
func LoadBrake(b interface{ SetManual(on bool) }, flag func(name string) (bool, error)) error {
	on, err := flag(BrakeFlag)
	if err != nil {
		return err
	}
	b.SetManual(on)
	return nil
}
