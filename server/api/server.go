package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/guard"
	"breakwater/server/invites"
	"breakwater/server/jwtauth"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/server/routes"
)

// Timeouts of the HTTP servers made by HTTPServer; the idle timeout is
// server.idle_timeout.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 60 * time.Second  // a 10 MiB upload needs about 1.4 Mbit/s to fit
	writeTimeout      = 180 * time.Second // the upload, ocr.timeout (at most 90 s) and the commit
	recordTimeout     = 10 * time.Second  // most a paid read waits to be recorded
)

// Reader reads serial numbers off an image: ocr.Gemini or ocr.Simulated.
type Reader interface {
	// ReadModel calls the upstream with model (ocr.model or
	// ocr.fallback_model); before a retry it asks mayRetry, which claims
	// that second call against the global budget.
	ReadModel(ctx context.Context, model string, img ocr.Image, mayRetry func() bool) (ocr.Result, error)
}

// BudgetStatus is the global budget's figures and ceilings, for the
// metrics read at scrape time: budget.Global.
type BudgetStatus interface {
	Status(now time.Time) budget.Status
	// Counted is what the brake decides on: calls in flight included.
	Counted(now time.Time) budget.Counted
	// Soft names the soft ceiling the day is above ("" for none): the
	// side of a read of a plan on "auto" when the brake failed open and
	// its claim decided none (see Server.decided).
	Soft(now time.Time) string
}

// AnswerStore reads what usage transactions kept of earlier reads
// (budget.UsageRecord.Answer): by idempotency key and by image. KeepAnswer
// binds an idempotency key to an answer that made no read of its own (one
// from the dedupe window), as of at.
type AnswerStore interface {
	StoredAnswer(user, key string) (a budget.Answer, at time.Time, found bool, err error)
	RecentRead(user string, fingerprint [32]byte) (a budget.Answer, at time.Time, found bool, err error)
	KeepAnswer(user string, at time.Time, a budget.Answer) error
}

// EventRecorder takes a statistics event without ever waiting.
type EventRecorder interface {
	Record(e detect.Event)
}

// CommitCounter counts the storage writer's group commits and the writes
// they carried (storage.DB).
type CommitCounter interface {
	Transactions() int64
	Writes() int64
}

// Deps are the components a Server works with. All but JWT, Metrics,
// Commits, InviteLimits, Alerts, AdminToken, Logger and Now are required.
type Deps struct {
	Keys *keys.Keyring
	JWT  *jwtauth.Verifier // nil: JWT sign-in is off, every bearer token is an API key
	// Layers are POST /v1/ocr's layers 1-3 and "$", every one required:
	// the rate limit keyed by user id, the daily line, the quota, the
	// global budget and the usage recorder.
	Layers guard.Layers
	// Budget is layer 3's figures for /metrics: the same budget.Global as
	// Layers.Brake.
	Budget BudgetStatus
	Plans  *keys.Plans
	Reader Reader
	Events EventRecorder
	Price  ocr.Price // to bound each call's cost before it and price it after
	// Model is ocr.model, the primary model, named in answers, usage rows
	// and metrics; "" is ocr.DefaultModel.
	Model string
	// FallbackModel is ocr.fallback_model ("" for none) and FallbackPrice
	// the price its calls are reserved and settled at.
	FallbackModel string
	FallbackPrice ocr.Price
	// Answers keeps reads for Idempotency-Key repeats and the dedupe
	// window; nil: both are off.
	Answers AnswerStore
	// Claims holds idempotency keys in flight across the instances that
	// share a database; nil: one instance, whose keys in flight are held
	// in its memory only.
	Claims AnswerClaimer
	// ServiceRefusals sums the refusals of every instance that shares the
	// database, for /metrics and the dashboard beside this instance's;
	// nil: one instance, whose own counts are the service's.
	ServiceRefusals ServiceRefusalReader
	// IdempotencyTTL and DedupeWindow are ocr.idempotency_ttl and
	// ocr.dedupe_window (0: the window is off).
	IdempotencyTTL, DedupeWindow time.Duration
	Metrics                      *Metrics           // nil: a fresh set
	Commits                      CommitCounter      // exported in /metrics; nil: not
	Operator                     *operator.Operator // the admin API's commands and the dashboard's figures
	// InviteCodes looks invite codes up and redeems them (POST
	// /v1/invites/verify).
	InviteCodes invites.Redeemer
	// InviteKey hashes submitted codes as they are stored (keyed with the
	// server's secret).
	InviteKey *invites.Key
	// InviteLimits holds the invite protections' state; nil: a fresh one
	// with the default InviteConfig.
	InviteLimits *invites.Limits
	// Routes are the app's guarded routes ([[routes]]) with their layers;
	// none: only Breakwater's own endpoints.
	Routes []Route
	// Alerts raises immediate alerts (detect.Alerter); nil: none.
	Alerts Alerter
	// DetectCounters feed the detection and alert metrics; nil: zeros.
	DetectCounters *detect.Counters
	// AdminToken guards the admin API; empty disables it (every call 401).
	AdminToken string
	Logger     *slog.Logger
	Now        func() time.Time
}

// Server holds the public and admin HTTP handlers.
type Server struct {
	cfg          Config
	d            Deps
	log          *slog.Logger
	now          func() time.Time
	reqIDs       *requestIDs
	clients      *clientIP
	failOpen     *failOpens
	inviteLimits *invites.Limits
	invitesOpen  *guard.FailOpen          // runs the invite limits' checks, failing open
	models       atomic.Pointer[modelSet] // the two models and their prices; swapped by a config reload
	priceDay     atomic.Pointer[string]   // the last ledger day a read was priced on (notePriceDay)
	calendar     *budget.Calendar         // today's key for the refusal counts
	guard        *guard.Guard             // layers 1-3 and "$" for POST /v1/ocr
	pending      pendingKeys              // idempotency keys whose first request is in flight
	reading      readsInFlight            // images being read, for the dedupe window's waiters
	// recordCtx bounds a paid read's wait to be recorded.
	recordCtx recordContexts

	// The transport bounds (transport.go).
	bodies    *bodyMemory
	inFlight  *inFlight
	conns     atomic.Int64     // connections held open by HTTPServer's listeners
	wallClock func() time.Time // for connection deadlines, always real time

	refusalsToday dailyRefusals
	csrf          formToken    // the dashboard's brake form
	refusalLog    logEvery     // rate-limits the log lines of invite refusals
	rateRun       atomic.Int64 // upstream calls in a row refused for its rate limit (upstream.go)

	// serviceRefusals are today's refusals of every instance (nil: one
	// instance); serviceLog rate-limits the lines of their failed reads.
	serviceRefusals *serviceRefusals
	serviceLog      logEvery

	// The app's guarded routes (routeguard.go).
	guarded     map[string]*guardedRoute
	floods      *guard.Deny   // their refusals and the invite limits', beside the OCR route's (nil: none)
	allRoutes   *routes.Table // forward auth
	proxyRoutes *routes.Table // the routes with an upstream
	routeLog    logEvery
	public      *echo.Echo
	admin       *echo.Echo
}

// New builds the handlers. cfg is taken with its defaults applied.
func New(cfg Config, d Deps) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := d.Layers
	if d.Keys == nil || l.Rate == nil || l.Attempts == nil || l.Quotas == nil || l.Brake == nil || d.Budget == nil ||
		d.Reader == nil || l.Usage == nil || d.Events == nil || d.Plans == nil || d.Operator == nil ||
		d.InviteCodes == nil || d.InviteKey == nil {
		return nil, errors.New("server: keys, every layer, the budget's status, plans, reader, usage recorder, event recorder, operator, invites and their key are all required")
	}
	if d.InviteLimits == nil {
		g, err := invites.NewLimits(invites.Config{})
		if err != nil {
			return nil, err
		}
		d.InviteLimits = g
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Alerts == nil {
		d.Alerts = noAlerts{}
	}
	if d.DetectCounters == nil {
		d.DetectCounters = &detect.Counters{}
	}
	trusted, _ := ParsePrefixes(cfg.TrustedProxies) // checked by Validate
	header, _ := clientIPHeader(cfg.ClientIPHeader)
	s := &Server{
		cfg:          cfg,
		d:            d,
		log:          d.Logger.With("component", "server"),
		now:          d.Now,
		reqIDs:       newRequestIDs(),
		clients:      &clientIP{trusted: trusted, header: header, log: d.Logger.With("component", "server")},
		inviteLimits: d.InviteLimits,
		calendar:     budget.NewCalendar(d.Operator.Location()),
		bodies:       &bodyMemory{capacity: cfg.MaxBodyMemory},
		inFlight:     &inFlight{max: cfg.MaxInFlightPerUser, n: map[string]int{}},
		wallClock:    time.Now,
		csrf:         newFormToken(d.AdminToken),
	}
	s.recordCtx.now = s.wallClock
	s.failOpen = &failOpens{metrics: d.Metrics, log: s.log, now: d.Now, logged: map[string]time.Time{}, missed: map[string]int{},
		alerts: d.Alerts, recent: map[string][]time.Time{}}
	g, err := guard.New(d.Layers, guard.Hooks{Refused: s.refusedBy, FailedOpen: s.failOpen.note, Shadowed: s.shadowedBy})
	if err != nil {
		return nil, err
	}
	s.guard = g
	s.invitesOpen = guard.NewFailOpen(invites.Layer, guard.Hooks{FailedOpen: s.failOpen.note})
	if err := s.newRoutes(d.Routes); err != nil {
		return nil, err
	}
	if d.Model == "" {
		d.Model = ocr.DefaultModel
	}
	s.models.Store(&modelSet{primary: d.Model, primaryPrice: d.Price, fallback: d.FallbackModel, fallbackPrice: d.FallbackPrice})
	d.Metrics.startModels(d.Model, d.FallbackModel)
	var access *slog.Logger
	if cfg.AccessLog {
		access = d.Logger.With("component", "access")
	}
	s.public = s.newEcho(s.countRefusal, s.front(d.Metrics, access))
	s.admin = s.newEcho(nil, s.front(nil, nil))
	d.Metrics.observeBudget(func() budget.Status { return d.Budget.Status(d.Now()) })
	if r, ok := d.Events.(interface{ Dropped() uint64 }); ok {
		d.Metrics.observeDrops(r.Dropped)
	}
	if d.Commits != nil {
		d.Metrics.observeCommits(d.Commits.Transactions, d.Commits.Writes)
	}
	if deny := d.Layers.Deny; deny != nil { // and s.floods beside it
		d.Metrics.observeDeny(func() int { return deny.Len() + s.floods.Len() },
			func() uint64 { return deny.Answered() + s.floods.Answered() })
	}
	d.Metrics.observeDetect(d.DetectCounters)
	s.observeService(d.ServiceRefusals)
	d.Metrics.observeTransport(func() int64 { used, _ := s.bodies.inUse(); return used }, s.conns.Load)
	s.routes()
	return s, nil
}

// FailedOpen counts a defense layer's machinery failing outside a request
// (the write-behind's lost writes) as the layers' own faults are counted:
// a metric, a rate-limited log line, an alert when they repeat.
func (s *Server) FailedOpen(layer string, err error) { s.failOpen.note(layer, err) }

// StoreBack tells the server that the store of the usage records answers
// again after it did not: paid calls paused after a failed record try
// again at once (guard.Guard.StoreBack).
func (s *Server) StoreBack(now time.Time) { s.guard.StoreBack(now) }

// SetPrice applies new token prices of the primary model to the calls
// that start from now on.
func (s *Server) SetPrice(p ocr.Price) {
	m := *s.models.Load()
	m.primaryPrice = p
	s.models.Store(&m)
}

// Handler is the public API.
func (s *Server) Handler() http.Handler { return s.public }

// AdminHandler is the admin API; serve it on a loopback address only.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// newEcho is an Echo with the transport's error handler, which tells
// answered of every problem it answers (nil: nobody), and front as its one
// global middleware.
func (s *Server) newEcho(answered func(*Problem), front echo.MiddlewareFunc) *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = s.clients.extract
	e.HTTPErrorHandler = errorHandler(s.log, answered)
	e.Use(front)
	return e
}
