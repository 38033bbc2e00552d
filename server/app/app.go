// Package app owns the wiring of a Breakwater service: it loads
// config.toml (config.go), builds every part in order, starts the
// listeners and the background workers, applies a changed config, and
// stops everything in reverse order. `serve`, the operator commands on a
// stopped server and the end-to-end tests all go through it, so the
// wiring exists once.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"breakwater/budget"
	"breakwater/budget/reconcile/bigquery"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/admin"
	"breakwater/server/api"
	"breakwater/server/edge"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/jwtauth"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

// Bounds of the orderly stop.
const (
	// In-flight requests get the upstream call's own bound (ocr.timeout,
	// its retry included) plus this long to finish: enough for the usage
	// record's wait, so a paid read still gets its record and its answer.
	shutdownSlack = 15 * time.Second
	flushTimeout  = 5 * time.Second // statistics and mail get this long to leave
	// lockTimeout is how long Open waits for the database lock.
	lockTimeout = time.Second
)

// Options are what the App takes from its surroundings besides the config.
type Options struct {
	// Getenv reads the secrets (GEMINI_API_KEY, BREAKWATER_ADMIN_TOKEN,
	// BREAKWATER_SMTP_PASSWORD). Nil: os.Getenv.
	Getenv func(string) string
	// Logger receives every component's log. Nil: discard.
	Logger *slog.Logger
	// Now is the clock of every time-based part. Nil: time.Now.
	Now func() time.Time
	// Listen opens the listeners. Nil: net.Listen. A test that runs the
	// App in a synctest bubble, where real network I/O would stop its
	// clock, hands it an in-memory listener and drives Handler.
	Listen func(network, address string) (net.Listener, error)
	// CreateDatabase lets OpenOperator create the database when there is
	// none yet (keys create on a fresh install). Without it an operator
	// command refuses, naming the path it looked for. Open (serve)
	// always may.
	CreateDatabase bool
	// NoCatchUp skips the daily detection's catch-up at start (the days
	// missed while the server was down): for the demo's throwaway
	// database, which has no yesterday.
	NoCatchUp bool
	// BigQueryEndpoint replaces BigQuery's REST API for the daily
	// reconciliation (a test's fake); "": Google's.
	BigQueryEndpoint string
	// WriteBehindEvery is how often the defense layers' memory is copied
	// to the database. Zero: state.DefaultWriteBehindInterval (a second).
	// A test that simulates days in a synctest bubble spaces it out: each
	// copy is a wake-up of the whole service.
	WriteBehindEvery time.Duration
}

func (o Options) withDefaults() Options {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Listen == nil {
		o.Listen = net.Listen
	}
	if o.WriteBehindEvery <= 0 {
		o.WriteBehindEvery = state.DefaultWriteBehindInterval
	}
	return o
}

// App is a running service: the database, the layers, the detection and
// alerts, the statistics writer, the write-behind and both listeners.
type App struct {
	opts Options
	log  *slog.Logger

	db           Backend
	usage        guard.UsageRecorder // the usage records: db itself on bolt, the money path on postgres
	commits      api.CommitCounter   // the money writer's transactions, for metrics
	layers       state.Layers
	inviteLimits *invites.Limits
	plans        *keys.Plans
	keys         *keys.Keyring
	invites      *invites.Codes
	inviteKey    *invites.Key // keys the stored hashes of invite codes
	detect       *detect.Runner
	mail         detect.Sender // the mailer, nil (not a nil *Mailer) without [alerts]
	operator     *operator.Operator
	edge         *edge.Edge    // the transport both listeners share
	srv          *api.Server   // the public API
	admin        *admin.Server // the admin API and the dashboard
	// deny remembers the OCR route's exact refusals (guard.Deny); every
	// operator's change and every reload clears it.
	deny *guard.Deny

	addr, adminAddr string
	servers         []*http.Server
	errc            chan error // a listener that stopped by itself

	// closers unwind what Open built, in reverse order.
	closers []func()

	changes sync.Mutex // serialises the changes other instances make (postgres)

	// limits are the limits shared in the database (postgres; nil on
	// bolt), faults where they report a decision made in memory.
	limits *postgres.Limits
	faults atomic.Pointer[func(layer string, err error)]

	mu  sync.Mutex // serialises Reload
	cfg Config     // the config in force
}

// Open builds the service for cfg and starts it: it listens on
// server.listen (and on server.admin_listen when BREAKWATER_ADMIN_TOKEN is
// set) and runs its workers until Close. cfg must have passed Load.
func Open(ctx context.Context, cfg Config, opts Options) (_ *App, err error) {
	opts = opts.withDefaults()
	a := &App{opts: opts, log: opts.Logger, cfg: cfg, errc: make(chan error, 2), deny: guard.NewDeny(0)}
	defer func() {
		if err != nil {
			a.Close() // what was built so far
		}
	}()
	log, getenv := a.log, opts.Getenv
	adminToken := getenv("BREAKWATER_ADMIN_TOKEN")
	a.logStart(cfg, adminToken)
	if err := CheckAdminListen(cfg.Server.AdminListen, adminToken); err != nil {
		return nil, err
	}
	reader, err := NewReader(cfg.OCR, getenv("GEMINI_API_KEY"), log)
	if err != nil {
		return nil, err
	}
	if err := a.openState(cfg, lockTimeout, false); err != nil {
		return nil, err
	}
	// Layer 4's daily detection, and the operator's commands for the
	// admin API; the detection's mailer stops after the alerts, which
	// hand it their mail.
	counters := &detect.Counters{}
	if err := a.openOperator(cfg, counters); err != nil {
		return nil, err
	}
	db := a.db
	loc, _ := cfg.Budget.Location() // checked by Load
	verifier, err := a.openVerifier(ctx, cfg)
	if err != nil {
		return nil, err
	}
	events := detect.NewRecorder(db, detect.RecorderOptions{Logger: log, Now: opts.Now})
	a.operator.SetPendingEvents(events)
	a.onClose(func() {
		fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := events.Close(fctx); err != nil {
			log.Warn("statistics not all written", "err", err)
		}
	})

	alerter, err := a.openAlerts(cfg, counters)
	if err != nil {
		return nil, err
	}
	guarded, err := loadRoutes(db, cfg.Routes, loc, opts.Now()) // the app's [[routes]]
	if err != nil {
		return nil, err
	}
	a.shareLimits(guarded)
	a.setCooldowns(guarded)
	ocfg := cfg.OCR.WithDefaults()
	fallbackPrice, _ := ocfg.PriceOf(ocfg.FallbackModel) // Validate has checked it is known
	if err := a.openEdge(cfg, loc, alerter, adminToken); err != nil {
		return nil, err
	}
	a.srv, err = api.New(a.edge, api.Deps{
		Keys: a.keys, JWT: verifier, Budget: a.layers.Brake, Plans: a.plans, Reader: reader, Events: events, Price: cfg.OCR.Price,
		Model: ocfg.Model, FallbackModel: ocfg.FallbackModel, FallbackPrice: fallbackPrice,
		Layers:  guard.Layers{Rate: a.layers.Windows, Attempts: a.layers.Attempts, Quotas: a.layers.Quotas, Brake: a.layers.Brake, Usage: a.usage, Deny: a.deny},
		Answers: db, Claims: answerClaimer(db), Commits: a.commits, IdempotencyTTL: cfg.OCR.IdempotencyTTL, DedupeWindow: cfg.OCR.DedupeWindow,
		InviteCodes: db, InviteKey: a.inviteKey, InviteLimits: a.inviteLimits, Routes: guarded,
		Operator: a.operator, Alerts: alerter, DetectCounters: counters,
		Logger: log, Now: opts.Now,
	})
	if err != nil {
		return nil, err
	}
	a.reportTo(a.srv)
	a.srv.SetShadow(cfg.Limits.User.Shadow())
	if err := a.startWriteBehind(guarded); err != nil {
		return nil, err
	}
	a.background(func(ctx context.Context) { a.pruneAnswers(ctx, cfg.OCR) })
	if pg, ok := db.(*postgres.DB); ok {
		a.followShared(pg, guarded)
	}

	// Close stops HTTP first: in-flight requests finish and are recorded
	// before anything they need is stopped.
	a.onClose(a.shutdownHTTP)
	if a.addr, err = a.listen("public", cfg.Server.Listen, a.srv.Handler()); err != nil {
		return nil, err
	}
	if adminToken == "" {
		if cfg.Storage.Backend == storage.BackendPostgres {
			log.Warn("BREAKWATER_ADMIN_TOKEN is not set: the admin API and the dashboard are off; the operator commands work on the database directly")
		} else {
			log.Warn("BREAKWATER_ADMIN_TOKEN is not set: the admin API is off, so the operator commands work only while the server is stopped")
		}
	} else if a.adminAddr, err = a.listen("admin", cfg.Server.AdminListen, a.admin.Handler()); err != nil {
		return nil, err
	}
	return a, nil
}

// answerClaimer holds idempotency keys in flight across instances: only
// a shared database has other instances (nil on bolt).
func answerClaimer(db Backend) api.AnswerClaimer {
	if pg, ok := db.(*postgres.DB); ok {
		return pg
	}
	return nil
}

// openEdge builds the transport both listeners share and, on it, the
// admin API and the dashboard; the public API is built on it next.
func (a *App) openEdge(cfg Config, loc *time.Location, alerter *detect.Alerter, adminToken string) (err error) {
	if a.edge, err = edge.New(cfg.Server, edge.Options{Logger: a.log, Now: a.opts.Now, Location: loc}); err != nil {
		return err
	}
	var service admin.ServiceRefusalReader // every instance's refusals: only a shared database has other instances
	if pg, ok := a.db.(*postgres.DB); ok {
		service = pg
	}
	a.admin, err = admin.New(a.edge, admin.Deps{Operator: a.operator, Alerts: alerter, ServiceRefusals: service,
		AdminToken: adminToken, Logger: a.log, Now: a.opts.Now})
	return err
}

// logStart says what the service runs with, so that an override from
// the environment can be confirmed; never a secret.
func (a *App) logStart(cfg Config, adminToken string) {
	admin := cfg.Server.AdminListen
	if adminToken == "" {
		admin = "off (BREAKWATER_ADMIN_TOKEN unset)"
	}
	where := cfg.Storage.Path
	if cfg.Storage.Backend == storage.BackendPostgres {
		where = "postgres (" + postgres.EnvURL + ")"
	}
	upstream := cfg.OCR.BaseURL
	if cfg.OCR.Provider == ocr.ProviderSimulated {
		upstream = "none (simulated)" // the simulated provider calls no one
	}
	a.log.Info("starting breakwater", "storage", where, "provider", cfg.OCR.Provider, "model", cfg.OCR.Model,
		"base_url", upstream, "listen", cfg.Server.Listen, "admin_listen", admin, "layers", cfg.LayersText())
	for _, w := range cfg.OffSwitches() {
		a.log.Warn("LIMIT OFF: " + w)
	}
	for _, w := range cfg.Warnings() {
		a.log.Warn(w)
	}
	day := cfg.Today(a.opts.Now())
	for _, w := range cfg.OCR.Warnings(day) {
		a.log.Warn(w)
	}
	for _, model := range []string{cfg.OCR.Model, cfg.OCR.FallbackModel} {
		if line, _, ok := cfg.OCR.PriceOutlook(model, day); ok && model != "" && cfg.OCR.Provider != ocr.ProviderSimulated {
			a.log.Info("price of " + line)
		}
	}
}

// openVerifier starts JWT sign-in when [auth.jwt] is set (nil when not).
func (a *App) openVerifier(ctx context.Context, cfg Config) (*jwtauth.Verifier, error) {
	// JWT sign-in: the verifier fetches the JWKS in the background until
	// it is closed, after HTTP has stopped. An unreachable JWKS is logged,
	// not fatal: API keys work meanwhile and JWTs are refused.
	if !cfg.Auth.JWT.Enabled() {
		return nil, nil
	}
	verifier, err := jwtauth.NewVerifier(context.WithoutCancel(ctx), cfg.Auth.JWT, a.plans.Has, jwtauth.Options{Now: a.opts.Now, Logger: a.log})
	if err != nil {
		return nil, err
	}
	a.onClose(func() { verifier.Close() })
	a.log.Info("JWT sign-in on", "issuer", cfg.Auth.JWT.Issuer, "jwks_url", cfg.Auth.JWT.JWKSURL)
	if warning := cfg.JWTAudienceWarning(); warning != "" {
		a.log.Warn(warning)
	}
	return verifier, nil
}

// openAlerts starts the immediate alerts, their webhooks, the early
// warnings and the daily detection's schedule; all stop after HTTP, before
// the statistics writer and the database, the webhooks after the alerts
// that hand them their notices.
func (a *App) openAlerts(cfg Config, counters *detect.Counters) (*detect.Alerter, error) {
	loc, _ := cfg.Budget.Location() // checked by Load
	settings := cfg.AlertSettings()
	alerter, err := detect.NewAlerter(a.db, detect.AlerterOptions{
		MinInterval: alertInterval(cfg), Location: loc, Mail: a.mail, Hooks: a.openWebhooks(settings, counters),
		DashboardURL: settings.DashboardURL, Counters: counters, Logger: a.log, Now: a.opts.Now,
	})
	if err != nil {
		return nil, err
	}
	a.onClose(func() {
		actx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := alerter.Close(actx); err != nil {
			a.log.Warn("alerts not all handed to the mailer", "err", err)
		}
	})
	sched := detect.SchedulerOptions{NoCatchUp: a.opts.NoCatchUp, Logger: a.log, Now: a.opts.Now}
	if pg, ok := a.db.(*postgres.DB); ok {
		sched.Elector = pg // the instances elect one to run the service's detection
	}
	runner, err := a.dailyRunner(cfg, alerter)
	if err != nil {
		return nil, err
	}
	scheduler, err := detect.NewScheduler(runner, cfg.Detect, loc, sched)
	if err != nil {
		return nil, err
	}
	a.background(scheduler.Run)
	if err := a.openWarner(alerter, settings, loc); err != nil {
		return nil, err
	}
	return alerter, nil
}

// openWarner starts the early warnings: the brake tells the Warner of
// each share its figures reach, on the claim (or the shared ledger's
// answer) that reaches it, so that a burst's warnings are queued before
// the brake's refusals raise brake_engaged; a ticker reads the same
// figures as a backstop (after a restart, say).
func (a *App) openWarner(alerter *detect.Alerter, settings detect.AlertsConfig, loc *time.Location) error {
	brake := a.layers.Brake
	warner, err := detect.NewWarner(alerter, func(now time.Time) detect.BudgetFigures { return api.CountedFigures(brake.Counted(now)) },
		detect.WarnerOptions{Shares: settings.WarnAt, Location: loc, Logger: a.log, Now: a.opts.Now})
	if err != nil {
		return err
	}
	brake.OnShare(warner.Percents(), func(c budget.Counted) { warner.Observe(api.CountedFigures(c)) })
	a.background(warner.Run)
	return nil
}

// openWebhooks starts a Webhook for each [[alerts.webhook]] whose URL is
// in the environment; one whose variable is empty is left out, loudly.
// Each is closed after the Alerter, which hands it its notices.
func (a *App) openWebhooks(settings detect.AlertsConfig, counters *detect.Counters) []detect.Notifier {
	var hooks []detect.Notifier
	for _, w := range Webhooks(settings, a.opts.Getenv, counters, a.log) {
		if w.Err != nil {
			a.log.Error("webhook left out", "err", w.Err)
			continue
		}
		hook := w.Hook
		hooks = append(hooks, hook)
		a.onClose(func() {
			ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
			defer cancel()
			if err := hook.Close(ctx); err != nil {
				a.log.Warn("webhook alerts not all delivered before shutdown", "webhook", hook.Name(), "err", err)
			}
		})
	}
	return hooks
}

// OpenedWebhook is one [[alerts.webhook]] entry, started, or why not.
type OpenedWebhook struct {
	Name string // "webhook FORMAT ($URL_ENV)": never the URL, a secret
	Hook *detect.Webhook
	Err  error
}

// Webhooks starts the [[alerts.webhook]] entries of settings, reading
// their URLs and secrets with getenv; the caller closes each Hook.
func Webhooks(settings detect.AlertsConfig, getenv func(string) string, counters *detect.Counters, log *slog.Logger) []OpenedWebhook {
	var out []OpenedWebhook
	for i, w := range settings.Webhooks {
		name := fmt.Sprintf("webhook %s ($%s)", w.Format, w.URLEnv)
		secret := ""
		if w.SecretEnv != "" {
			secret = getenv(w.SecretEnv)
		}
		hook, err := detect.NewWebhook(w, getenv(w.URLEnv), secret, detect.WebhookOptions{Counters: counters, Logger: log})
		if err != nil {
			err = fmt.Errorf("alerts.webhook[%d]: %w", i+1, err)
		}
		out = append(out, OpenedWebhook{Name: name, Hook: hook, Err: err})
	}
	return out
}

// startWriteBehind copies the defense layers' memory to the database
// every second, until Close; the last flush runs after HTTP has stopped
// and before the database closes. It first restores the dashboard's
// refusal counts of today.
func (a *App) startWriteBehind(guarded []api.Route) error {
	// Each limiter registers its state here, one line each.
	// Limits shared in the database (postgres) are not: they are written
	// as they are decided.
	snapshots := []state.Snapshot{state.Attempts(guard.LayerAttempts, a.layers.Attempts)}
	if a.limits == nil {
		snapshots = append(snapshots, state.Windows(state.StateUserWindows, guard.LayerRate, a.layers.Windows))
		snapshots = append(snapshots, a.inviteLimits.Snapshots()...)
		// The dashboard's refusals of today, as written behind before a
		// restart; without them it counts from zero. On postgres the
		// instances would write theirs over each other under one key:
		// there an instance counts its own from its start, and the
		// service's refusals of the day are read from the events.
		snapshots = append(snapshots, state.Refusals(api.RefusalCountsLayer, a.edge.DirtyRefusals))
		loc, _ := a.cfg.Budget.Location() // checked by Load
		today := budget.DayKey(a.opts.Now(), loc)
		if counts, err := a.db.LoadState(state.RefusalsState(today)); err != nil {
			a.log.Warn("refusal counts of today not loaded: the dashboard counts them from zero", "err", err)
		} else {
			a.edge.LoadRefusals(today, counts)
		}
	}
	snapshots = append(snapshots, routeSnapshots(guarded, a.limits != nil)...)
	wb, err := state.NewWriteBehind(a.db, snapshots, state.Options{
		FailedOpen: a.srv.FailedOpen, Logger: a.log.With("component", "defense"), Now: a.opts.Now,
	})
	if err != nil {
		return err
	}
	a.background(func(ctx context.Context) { wb.Run(ctx, a.opts.WriteBehindEvery) })
	return nil
}

// openState opens the database and loads what the layers keep in memory:
// rate windows, attempt counts, quotas, the budget and its manual switch,
// the invite limits, the plans and the keyring.
func (a *App) openState(cfg Config, timeout time.Duration, mustExist bool) error {
	var err error
	if cfg.Storage.Backend == storage.BackendPostgres {
		err = a.openPostgres(cfg)
	} else {
		err = a.openBolt(cfg, timeout, mustExist)
	}
	if err != nil {
		return err
	}
	// The budget's lease is given back after HTTP has stopped (no call is
	// in flight) and before the database closes, so that a clean stop
	// leaves each day's ledger at exactly the calls made.
	brake := a.layers.Brake
	a.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := brake.Close(ctx); err != nil {
			a.log.Warn("budget lease not given back: today's ledger counts its unused calls as made", "err", err, "max_calls", budget.MaxLease(cfg.Budget))
		}
	})
	db := a.db
	if err := state.LoadBrake(a.layers.Brake, db.Flag); err != nil {
		return err
	}
	if a.inviteLimits, err = invites.LoadLimits(db, cfg.Invites, a.opts.Now()); err != nil {
		return err
	}
	a.plans = keys.NewPlans(cfg.Plans)
	a.keys, err = keys.NewKeyring(db, a.plans.Has, keys.Options{Now: a.opts.Now})
	return err
}

// openBolt opens the BoltDB file, which this process then owns, and
// loads the layers from it.
func (a *App) openBolt(cfg Config, timeout time.Duration, mustExist bool) error {
	db, err := storage.Open(cfg.Storage.Path, storage.Options{Timeout: timeout, Logger: a.log, MustExist: mustExist})
	if errors.Is(err, storage.ErrNoDatabase) {
		return fmt.Errorf("no database at %s: check storage.path in config.toml (a relative path is taken from the config file's folder); "+
			"serve and keys create make a new one", cfg.Storage.Path)
	}
	if err != nil {
		return err
	}
	a.db, a.usage, a.commits = db, db, db
	a.onClose(func() {
		if err := db.Close(); err != nil {
			a.log.Error("close database", "err", err)
		}
	})
	loc, _ := cfg.Budget.Location() // checked by Load
	a.layers, err = state.LoadLayers(db, cfg.Limits.User, cfg.Budget, loc, a.opts.Now(), a.log)
	return err
}

// pruneAnswersEvery is how often the answers kept for idempotency keys
// and the dedupe window are pruned once past their time.
const pruneAnswersEvery = time.Hour

// pruneAnswers deletes kept answers older than ocr.idempotency_ttl (by
// key) and ocr.dedupe_window (by image), at start and then every
// pruneAnswersEvery, until ctx ends.
func (a *App) pruneAnswers(ctx context.Context, c ocr.Config) {
	prune := func(now time.Time) {
		if n, err := a.db.PruneAnswers(now.Add(-c.IdempotencyTTL), now.Add(-c.DedupeWindow)); err != nil {
			a.log.Warn("kept answers not pruned", "err", err)
		} else if n > 0 {
			a.log.Info("kept answers pruned", "answers", n)
		}
	}
	prune(a.opts.Now())
	a.tick(ctx, pruneAnswersEvery, prune)
}

// tick calls f with the clock's time every d, until ctx ends.
func (a *App) tick(ctx context.Context, d time.Duration, f func(now time.Time)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(a.opts.Now())
		}
	}
}

// onClose adds a step to the reverse-order unwinding of Close.
func (a *App) onClose(f func()) { a.closers = append(a.closers, f) }

// background runs f until Close, which cancels its context and waits for
// it to return.
func (a *App) background(f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f(ctx) }()
	a.onClose(func() { cancel(); <-done })
}

// listen starts serving h on addr and returns the address it got.
func (a *App) listen(name, addr string, h http.Handler) (string, error) {
	ln, err := a.opts.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%s listener: %w", name, err)
	}
	hs, ln := a.edge.HTTPServer(ln, h)
	a.servers = append(a.servers, hs)
	go func() {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			a.errc <- fmt.Errorf("%s listener: %w", name, err)
		}
	}()
	a.log.Info("listening", "listener", name, "addr", ln.Addr().String())
	return ln.Addr().String(), nil
}

// shutdownHTTP stops both listeners, letting in-flight requests finish for
// ShutdownTimeout.
func (a *App) shutdownHTTP() {
	a.mu.Lock()
	timeout := ShutdownTimeout(a.cfg)
	a.mu.Unlock()
	a.log.Info("shutting down: finishing in-flight requests", "timeout", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, hs := range a.servers {
		if err := hs.Shutdown(ctx); err != nil {
			a.log.Error("shutdown", "addr", hs.Addr, "err", err)
		}
	}
}

// Addr is where the public API listens (host:port).
func (a *App) Addr() string { return a.addr }

// AdminAddr is where the admin API listens, "" when it is off.
func (a *App) AdminAddr() string { return a.adminAddr }

// Keys is the keyring, for commands that act on the running service (the
// demo's key).
func (a *App) Keys() *keys.Keyring { return a.keys }

// Invites are the invite codes, for commands that make one on the running
// service (selftest's fail-limit check).
func (a *App) Invites() *invites.Codes { return a.invites }

// Handler is the public API's handler, the one Addr serves, for driving
// the service in-process (the soak test's simulated days in a synctest
// bubble, where no real network I/O may happen).
func (a *App) Handler() http.Handler { return a.srv.Handler() }

// Wait blocks until ctx ends or a listener stops by itself (its error).
func (a *App) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-a.errc:
		return err
	}
}

// Close stops the service in reverse order of Open: HTTP first (in-flight
// requests finish), then the write-behind's last flush, the detection,
// alerts and mail, the statistics writer, and the database last, which
// commits every queued write before it closes. It is safe to call once.
func (a *App) Close() {
	if a.closers == nil {
		return
	}
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
	a.log.Info("stopped: every write is committed and the database closed")
}

// ShutdownTimeout is how long in-flight requests get to finish: a read
// that started just before the signal must still be recorded and answered.
func ShutdownTimeout(c Config) time.Duration {
	return c.OCR.WithDefaults().Timeout + shutdownSlack
}

// openDetection builds the daily detection over the database, and the
// mailer when config.toml has an [alerts] section; Close delivers what
// mail is still queued.
func (a *App) openDetection(c Config, counters *detect.Counters) error {
	loc, _ := c.Budget.Location() // checked by Load
	if c.AlertSettings().MailOn() {
		m, err := detect.NewMailer(*c.Alerts, detect.MailerOptions{
			Password: a.opts.Getenv("BREAKWATER_SMTP_PASSWORD"), Counters: counters, Logger: a.log,
		})
		if err != nil {
			return err
		}
		a.mail = m
		a.onClose(func() {
			ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
			defer cancel()
			if err := m.Close(ctx); err != nil {
				a.log.Warn("e-mails not all delivered before shutdown", "err", err)
			}
		})
	}
	plans, keys, brake := a.plans, a.keys, a.layers.Brake
	runner, err := detect.NewRunner(a.db, detect.RunnerOptions{
		Config: c.Detect, Location: loc, RetentionDays: c.Storage.StatsRetentionDays,
		Lines: func() detect.Lines {
			all := plans.All()
			lines := detect.Lines{ByPlan: map[string]int64{}, ByUser: map[string]int64{}}
			for name, p := range all {
				lines.ByPlan[name] = p.DailyAttempts
			}
			for _, u := range keys.Users() {
				lines.ByUser[u.ID] = all[u.Plan].DailyAttempts
			}
			return lines
		},
		Ceilings: func() detect.Ceilings {
			st := brake.Status(a.opts.Now())
			return detect.Ceilings{DailyRequests: st.DailyRequests, DailyMicroUSD: st.DailyMicroUSD, MonthlyMicroUSD: st.MonthlyMicroUSD}
		},
		Mail: a.mail, Counters: counters, Logger: a.log, Now: a.opts.Now,
	})
	if err != nil {
		return err
	}
	a.detect = runner
	return nil
}

// alertInterval is [alerts] min_interval, or its default without mail.
func alertInterval(c Config) time.Duration {
	if c.Alerts == nil {
		return detect.DefaultMinInterval
	}
	return c.Alerts.MinInterval
}

// CheckAdminListen refuses an admin API reachable from other machines
// unless its token is long enough to resist guessing.
func CheckAdminListen(addr, token string) error {
	if token == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("server.admin_listen: %q is not host:port", addr)
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if !loopback && len(token) < 32 {
		return fmt.Errorf("server.admin_listen %q is not a loopback address: BREAKWATER_ADMIN_TOKEN must then be at least 32 characters", addr)
	}
	return nil
}

// errNoGeminiKey stops the start of a service that would call Gemini
// without a key.
var errNoGeminiKey = errors.New("GEMINI_API_KEY is not set: put your Gemini API key in the environment, or set ocr.provider = \"simulated\" to try the service without one")

// CheckStart reports what in the environment would make Open refuse to
// start with cfg, a config that passed Load: for config check, which must
// fail where serve would.
func CheckStart(cfg Config, getenv func(string) string) error {
	var errs []error
	if cfg.OCR.Provider != "simulated" && getenv("GEMINI_API_KEY") == "" {
		errs = append(errs, errNoGeminiKey)
	}
	errs = append(errs, CheckAdminListen(cfg.Server.AdminListen, getenv("BREAKWATER_ADMIN_TOKEN")))
	if cfg.Storage.Backend == storage.BackendPostgres {
		if getenv(postgres.EnvURL) == "" {
			errs = append(errs, postgres.ErrNoURL)
		}
		if getenv("BREAKWATER_SECRET") == "" {
			errs = append(errs, errNoSharedSecret)
		}
	}
	if cfg.Reconcile.BigQueryTable != "" && getenv(bigquery.CredentialsEnv) == "" {
		errs = append(errs, fmt.Errorf("%s is not set: reconcile.bigquery_table needs a service account's key file (BigQuery Data Viewer and Job User)", bigquery.CredentialsEnv))
	}
	if s := getenv("BREAKWATER_SECRET"); s != "" && len(s) < invites.MinSecretLen {
		errs = append(errs, fmt.Errorf("BREAKWATER_SECRET: %w", invites.ErrShortSecret))
	}
	return errors.Join(errs...)
}

// NewReader makes the upstream client ocr.provider names.
func NewReader(c ocr.Config, apiKey string, log *slog.Logger) (api.Reader, error) {
	if c.Provider == "simulated" {
		log.Warn("ocr.provider is \"simulated\": answers are made up locally and marked \"simulated\": true; no real reads")
		return ocr.NewSimulated(c)
	}
	if apiKey == "" {
		return nil, errNoGeminiKey
	}
	return ocr.NewGemini(c, apiKey, nil, log) // logStart logs the model's warnings
}
