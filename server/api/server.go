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
	"breakwater/server/edge"
	"breakwater/server/guard"
	"breakwater/server/invites"
	"breakwater/server/jwtauth"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/server/routes"
)

// recordTimeout is the most a paid read waits to be recorded.
const recordTimeout = 10 * time.Second

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
// Commits, InviteLimits, Alerts, Logger and Now are required.
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
	// IdempotencyTTL and DedupeWindow are ocr.idempotency_ttl and
	// ocr.dedupe_window (0: the window is off).
	IdempotencyTTL, DedupeWindow time.Duration
	Metrics                      *Metrics           // registered on the edge's registry by New; nil: a fresh set
	Commits                      CommitCounter      // exported in /metrics; nil: not
	Operator                     *operator.Operator // the operator's time zone and figures, for alerts
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
	Logger         *slog.Logger
	Now            func() time.Time
}

// Server is the public API's handler.
type Server struct {
	edge         *edge.Edge  // the transport it shares with the admin API
	cfg          edge.Config // the [server] section, its defaults applied
	d            Deps
	log          *slog.Logger
	now          func() time.Time
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

	refusalLog edge.LogEvery // rate-limits the log lines of invite refusals
	rateRun    atomic.Int64  // upstream calls in a row refused for its rate limit (upstream.go)

	// The app's guarded routes (routeguard.go).
	guarded     map[string]*guardedRoute
	floods      *guard.Deny   // their refusals and the invite limits', beside the OCR route's (nil: none)
	allRoutes   *routes.Table // forward auth
	proxyRoutes *routes.Table // the routes with an upstream
	routeLog    edge.LogEvery
	// storeLogs rate-limit the warnings of stored answers and key claims
	// the database cannot give (answers.go).
	storeLogs [storeWarnings]edge.LogEvery
	public    *echo.Echo
}

// New builds the public API on the transport e, whose metrics it adds
// its series to.
func New(e *edge.Edge, d Deps) (*Server, error) {
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
	d.Metrics.register(e.Metrics())
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
	s := &Server{
		edge:         e,
		cfg:          e.Config(),
		d:            d,
		log:          d.Logger.With("component", "server"),
		now:          d.Now,
		inviteLimits: d.InviteLimits,
		calendar:     budget.NewCalendar(d.Operator.Location()),
	}
	s.recordCtx.now = time.Now // real time: the deadline is a timer's
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
	s.public = e.NewEcho(true)
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
