package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/guard/state"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/storage/postgres"
)

// postgresOpenTimeout bounds connecting to PostgreSQL and migrating its
// schema at start.
const postgresOpenTimeout = 30 * time.Second

// openPostgres opens the PostgreSQL database the instances share (its URL
// from BREAKWATER_POSTGRES_URL) and builds the layers on it: the money
// path (the attempt line, the plan quotas, the budget's ledger and the
// usage records) decides in the database, exact across instances; the
// rate windows stay in this instance's memory.
func (a *App) openPostgres(cfg Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), postgresOpenTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, a.opts.Getenv(postgres.EnvURL), postgres.Options{Logger: a.log, Now: a.opts.Now})
	if err != nil {
		return err
	}
	a.db = db
	a.onClose(func() {
		if err := db.Close(); err != nil {
			a.log.Error("close database", "err", err)
		}
	})
	loc, _ := cfg.Budget.Location() // checked by Load
	money, err := postgres.NewMoney(ctx, db, postgres.MoneyOptions{Location: loc, Now: a.opts.Now, Logger: a.log, KeepAnswer: db.QueueAnswers})
	if err != nil {
		return err
	}
	a.usage, a.commits = money, money
	a.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := money.Close(ctx); err != nil {
			a.log.Warn("money path not closed cleanly", "err", err)
		}
	})
	now := a.opts.Now()
	windows, err := limiter.New(cfg.Limits.User)
	if err != nil {
		return err
	}
	if err := state.LoadWindows(db, state.StateUserWindows, windows, now); err != nil {
		return err
	}
	shared, err := money.GlobalState(ctx, now)
	if err != nil {
		return fmt.Errorf("load budget: %w", err)
	}
	brake, err := budget.NewGlobal(cfg.Budget, loc, money, shared)
	if err != nil {
		return err
	}
	a.layers = state.Layers{Windows: windows, Attempts: money.Attempts(), Quotas: money.Quotas(), Brake: brake}
	return nil
}

// resyncEvery is how often an instance on PostgreSQL reads every key, user
// and the brake again even without a notification: the fallback should a
// notification be lost without the listener's connection failing.
const resyncEvery = 30 * time.Second

// refreshEvery is how often an instance reads the budget's shared totals
// between its own leases, so that its checks, the dashboard and /metrics
// see every instance's calls and spend.
const refreshEvery = time.Second

// followChanges applies, until ctx ends, what other instances and the
// operator's commands change in the shared database: a key created or
// revoked, a user banned or moved to another plan, the brake (by
// notification, within milliseconds, and every resyncEvery besides), and
// the budget's totals (every refreshEvery).
func (a *App) followChanges(ctx context.Context, db *postgres.DB) {
	var ticking sync.WaitGroup
	defer ticking.Wait()
	ticking.Add(1)
	go func() {
		defer ticking.Done()
		a.refreshShared(ctx, db)
	}()
	_ = db.Listen(ctx, func(kind, id string) { a.applyChange(db, kind, id) })
}

// refreshShared reads the budget's totals every refreshEvery and
// everything every resyncEvery, until ctx ends.
func (a *App) refreshShared(ctx context.Context, db *postgres.DB) {
	brake, _ := a.layers.Brake.(interface {
		Refresh(ctx context.Context, now time.Time) error
	})
	t := time.NewTicker(refreshEvery)
	defer t.Stop()
	lastResync := a.opts.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := a.opts.Now()
		if brake != nil {
			if err := brake.Refresh(ctx, now); err != nil && ctx.Err() == nil {
				a.log.Debug("budget totals not refreshed", "err", err)
			}
		}
		if now.Sub(lastResync) >= resyncEvery {
			lastResync = now
			a.applyChange(db, postgres.KindResync, "")
		}
	}
}

// applyChange brings this instance's memory up to one change.
// Changes are applied one at a time (a.changes): each reads the record
// after the change's commit and applies it, so a resync whose read came
// before a change cannot apply its older view after the change's own
// notification did (the brake would stay off on this instance until the
// next resync).
func (a *App) applyChange(db *postgres.DB, kind, id string) {
	a.changes.Lock()
	defer a.changes.Unlock()
	var err error
	switch kind {
	case postgres.KindResync:
		if err = a.keys.Reload(); err == nil {
			err = state.LoadBrake(a.layers.Brake, db.Flag)
		}
	case postgres.KindKey:
		var k keys.Key
		if k, err = db.Key(id); err == nil {
			a.keys.Refresh(k)
		}
	case postgres.KindUser:
		var u keys.User
		if u, err = db.User(id); err == nil {
			a.keys.RefreshUser(u)
		}
	case postgres.KindFlag:
		if id == state.BrakeFlag {
			err = state.LoadBrake(a.layers.Brake, db.Flag)
		}
	}
	if err != nil {
		a.log.Warn("a change made through another instance is not applied yet: read again within "+resyncEvery.String(), "kind", kind, "id", id, "err", err)
		return
	}
	a.deny.Clear() // the change may lift a refusal remembered here; a resync may bring one a lost notification missed
}

// figuresTimeout bounds the reads of the service's figures for the
// operator (the dashboard, the CLI).
const figuresTimeout = 2 * time.Second

// serviceFigures makes the operator's figures on PostgreSQL the service's,
// not this instance's: each user's reads this month from the shared counts
// (the quota cache holds only what this instance has seen), and the
// budget's status from the shared ledger read at once (refreshed, not as
// the last tick left it). On bolt (usage is not the PostgreSQL money path)
// nothing changes.
func serviceFigures(l *operator.Layers, usage any) {
	money, ok := usage.(*postgres.Money)
	if !ok {
		return
	}
	l.Quotas = money.Quotas().Recorded()
	if g, ok := l.Brake.(*budget.Global); ok {
		l.Brake = freshBrake{g}
	}
}

// freshBrake is the budget whose status is read from the shared ledger
// first; if it cannot be, the view as the last refresh left it.
type freshBrake struct{ *budget.Global }

func (b freshBrake) Status(now time.Time) budget.Status {
	ctx, cancel := context.WithTimeout(context.Background(), figuresTimeout)
	defer cancel()
	_ = b.Refresh(ctx, now)
	return b.Global.Status(now)
}
