package app

import (
	"errors"
	"fmt"
	"time"

	"breakwater/detect"
	"breakwater/server/api"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/operator"
	"breakwater/storage"
)

// operatorLockTimeout is how long an operator command waits for the
// database lock before it decides that the server holds it.
const operatorLockTimeout = 300 * time.Millisecond

// OpenOperator reaches the service for an operator command: the database
// directly, with the layers' state as the server would load it and the
// daily detection, if no server holds it; else the server's admin API.
// The returned func delivers the mail a command queued (the digest of
// detect run) and closes the database.
func OpenOperator(cfg Config, opts Options) (operator.Service, func(), error) {
	opts = opts.withDefaults()
	a := &App{opts: opts, log: opts.Logger, cfg: cfg}
	err := a.openState(cfg, operatorLockTimeout, !opts.CreateDatabase)
	if errors.Is(err, storage.ErrLocked) {
		a.Close()
		token := opts.Getenv("BREAKWATER_ADMIN_TOKEN")
		if token == "" {
			return nil, nil, fmt.Errorf("the server is running and holds %s: set BREAKWATER_ADMIN_TOKEN so this command can use its admin API at %s", cfg.Storage.Path, cfg.Server.AdminListen)
		}
		return operator.NewAdminClient(cfg.Server.AdminListen, token).ForDatabase(cfg.Storage.Path), func() {}, nil
	}
	if err == nil {
		err = a.openOperator(cfg, &detect.Counters{})
	}
	var guarded []api.Route
	if err == nil {
		loc, _ := cfg.Budget.Location() // checked by Load
		if guarded, err = loadRoutes(a.db, cfg.Routes, loc, opts.Now()); err == nil {
			a.shareLimits(guarded)
			a.setCooldowns(guarded)
		}
	}
	if err == nil {
		// What a command changes in the invite limits and the routes' fail
		// limits (a lifted cooldown) is written before the database
		// closes, as the server's write-behind would.
		var wb *state.WriteBehind
		snapshots := append(a.inviteLimits.Snapshots(), routeFailSnapshots(guarded)...)
		if wb, err = state.NewWriteBehind(a.db, snapshots, state.Options{Logger: a.log, Now: opts.Now}); err == nil {
			a.onClose(wb.Flush)
		}
	}
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a.operator, a.Close, nil
}

// openOperator builds, over the state openState loaded, the invites, the
// daily detection and the operator's commands on them.
func (a *App) openOperator(cfg Config, counters *detect.Counters) error {
	var err error
	if err := a.openInviteKey(cfg); err != nil {
		return err
	}
	if a.invites, err = invites.NewCodes(a.db, invites.Options{Now: a.opts.Now, Key: a.inviteKey}); err != nil {
		return err
	}
	if err := a.openDetection(cfg, counters); err != nil {
		return err
	}
	loc, _ := cfg.Budget.Location() // checked by Load
	layers := operator.Layers{Attempts: a.layers.Attempts, Quotas: a.layers.Quotas, Brake: a.layers.Brake}
	serviceFigures(&layers, a.usage)
	a.operator = operator.New(a.keys, a.invites, layers, a.db, a.plans.All, loc, operator.Options{Now: a.opts.Now, Changed: a.deny.Clear})
	a.operator.SetDetection(a.detect)
	a.setCooldowns(nil)
	return nil
}

// setCooldowns gives the operator the fail limits whose cooldowns it
// lists and lifts: the invite limits', then each guarded route's; on
// postgres a lift is notified to every instance (notifying).
func (a *App) setCooldowns(guarded []api.Route) {
	sources := []operator.CooldownSource{{Name: operator.SourceInvites, Fails: a.notifying(a.inviteLimits.Fails)}}
	for _, r := range guarded {
		if r.Fails != nil {
			sources = append(sources, operator.CooldownSource{Name: operator.RouteSource(r.Config.Name), Fails: a.notifying(r.Fails)})
		}
	}
	a.operator.SetCooldowns(sources...)
}
