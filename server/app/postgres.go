package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/api"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
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
// usage records) decides in the database, exact across instances, and so
// do the users' rate windows (shareLimits: the invites' and the routes').
func (a *App) openPostgres(cfg Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), postgresOpenTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, a.opts.Getenv(postgres.EnvURL), postgres.Options{Logger: a.log, Now: a.opts.Now, MaxConns: int32(cfg.Storage.PostgresMaxConnections)})
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
	a.limits = db.Limits()
	windows.Share(a.limits.Windows(sharedUserWindows), a.limitFault(guard.LayerRate))
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
	lastResync := a.opts.Now()
	a.tick(ctx, refreshEvery, func(now time.Time) {
		if brake != nil {
			if err := brake.Refresh(ctx, now); err != nil && ctx.Err() == nil {
				a.log.Debug("budget totals not refreshed", "err", err)
			}
		}
		if now.Sub(lastResync) >= resyncEvery {
			lastResync = now
			a.applyChange(db, postgres.KindResync, "")
		}
	})
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
	case kindCooldown: // the database decides the cooldowns: nothing to read
	}
	if err != nil {
		a.log.Warn("a change made through another instance is not applied yet: read again within "+resyncEvery.String(), "kind", kind, "id", id, "err", err)
		return
	}
	if kind == postgres.KindResync {
		// No change known, but one whose notification was lost may come
		// with it: each refusal remembered here is decided again once,
		// not dropped under a flood's requests in flight.
		a.deny.Refresh()
		return
	}
	a.deny.Clear() // the change may lift a refusal remembered here
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

// sharedUserWindows names the users' rate windows ([limits.user]) in the
// database; the invite limits are "invites" and a guarded route's
// "route:NAME", as their layers are named in metrics.
const sharedUserWindows = "user"

// followShared runs, until Close, what an instance on PostgreSQL does in
// the background: it follows the other instances' changes and prunes the
// shared limits.
func (a *App) followShared(db *postgres.DB, guarded []api.Route) {
	a.background(func(ctx context.Context) { a.followChanges(ctx, db) })
	a.background(func(ctx context.Context) { a.pruneLimits(ctx, guarded) })
}

// reportTo makes the shared limits report their faults to srv's
// fail-open count from now on, and, on PostgreSQL, has the money path
// tell srv when the database answers again after it did not: paid calls,
// paused by the usage records that failed meanwhile, try again at once.
func (a *App) reportTo(srv *api.Server) {
	report := srv.FailedOpen
	a.faults.Store(&report)
	if money, ok := a.usage.(*postgres.Money); ok {
		money.OnBack(func() { srv.StoreBack(a.opts.Now()) })
	}
}

// limitFault is where a shared limit of layer reports a decision it made
// in memory because the database could not: the fail-open count and log
// of the server (breakwater_layer_failopen_total{layer}), once the server
// is built; a log line before.
func (a *App) limitFault(layer string) func(error) {
	return func(err error) {
		if h := a.faults.Load(); h != nil {
			(*h)(layer, fmt.Errorf("%w: %w", api.ErrDecidedAlone, err))
			return
		}
		a.log.Warn("a shared limit decided in memory: the database did not answer", "layer", layer, "err", err)
	}
}

// shareLimits makes the database decide the invite limits and each
// guarded route's rate windows, daily line and fail limit, on postgres
// (a.limits set);
// on bolt it does nothing. Each keeps its memory as the fallback.
func (a *App) shareLimits(guarded []api.Route) {
	if a.limits == nil {
		return
	}
	a.inviteLimits.Windows.Share(a.limits.Windows(invites.Layer), a.limitFault(invites.Layer))
	a.inviteLimits.Fails.Share(a.limits.Fails(invites.Layer), a.limitFault(invites.Layer))
	for _, r := range guarded {
		layer := "route:" + r.Config.Name
		r.Windows.Share(a.limits.Windows(layer), a.limitFault(layer))
		r.Attempts.Share(a.limits.Daily(layer), a.limitFault(layer))
		if r.Fails != nil {
			r.Fails.Share(a.limits.Fails(layer), a.limitFault(layer))
		}
	}
}

// pruneLimitsEvery is how often an instance deletes the shared limits'
// rows that no longer decide anything.
const pruneLimitsEvery = time.Minute

// pruneLimits deletes, every pruneLimitsEvery until ctx ends, the shared
// windows and fail limits' rows that no longer count under the config in
// force (each instance does; a delete done twice deletes nothing more).
func (a *App) pruneLimits(ctx context.Context, guarded []api.Route) {
	a.tick(ctx, pruneLimitsEvery, func(now time.Time) {
		pctx, cancel := context.WithTimeout(ctx, figuresTimeout)
		err := a.pruneLimitsOnce(pctx, guarded, now)
		cancel()
		if err != nil && ctx.Err() == nil {
			a.log.Debug("shared limits not pruned", "err", err)
		}
	})
}

func (a *App) pruneLimitsOnce(ctx context.Context, guarded []api.Route, now time.Time) error {
	a.mu.Lock()
	user := a.cfg.Limits.User // as reloaded
	a.mu.Unlock()
	windows := map[string]limiter.Config{sharedUserWindows: user, invites.Layer: a.inviteLimits.Windows.Config()}
	fails := map[string]limiter.FailConfig{invites.Layer: a.inviteLimits.Fails.Config()}
	for _, r := range guarded {
		windows["route:"+r.Config.Name] = r.Windows.Config()
		if r.Fails != nil {
			fails["route:"+r.Config.Name] = r.Fails.Config()
		}
	}
	for name, cfg := range windows {
		if _, err := a.limits.Windows(name).PruneWindows(ctx, cfg, now); err != nil {
			return err
		}
	}
	for name, cfg := range fails {
		if _, err := a.limits.Fails(name).PruneFails(ctx, cfg, now); err != nil {
			return err
		}
	}
	loc, _ := a.cfg.Budget.Location() // checked by Load; the zone needs a restart
	yesterday := budget.DayKey(now.AddDate(0, 0, -1), loc)
	for _, r := range guarded {
		if _, err := a.limits.Daily("route:"+r.Config.Name).PruneDays(ctx, yesterday); err != nil {
			return err
		}
	}
	return nil
}

// kindCooldown is the change notified when the operator lifts a
// cooldown (notifying): every instance clears the refusals it remembers
// (guard.Deny), a cooldown among them.
const kindCooldown = "cooldown"

// notifying returns f, whose Clear, on postgres, also tells every
// instance to forget what it remembers: a cooldown lifted through one
// instance, or the CLI, then lets the key through on every other at
// once, not when its remembered refusal expires. On bolt, f as it is.
func (a *App) notifying(f operator.Cooldowns) operator.Cooldowns {
	db, ok := a.db.(*postgres.DB)
	if !ok {
		return f
	}
	return clearNotified{Cooldowns: f, db: db, a: a}
}

// clearNotified is a fail limit whose lifted cooldowns are notified.
type clearNotified struct {
	operator.Cooldowns
	db *postgres.DB
	a  *App
}

func (c clearNotified) Clear(key string) bool {
	if !c.Cooldowns.Clear(key) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), figuresTimeout)
	defer cancel()
	if err := c.db.Notify(ctx, kindCooldown, key); err != nil {
		c.a.log.Warn("a lifted cooldown is not notified: other instances may refuse the key from memory until their resync, within "+resyncEvery.String(), "key", key, "err", err)
	}
	return true
}
