package edge

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
)

// Timeouts of the HTTP servers made by HTTPServer; the idle timeout is
// server.idle_timeout.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 60 * time.Second // a 10 MiB upload needs about 1.4 Mbit/s to fit
	// WriteTimeout bounds a request's answer: the upload, ocr.timeout (at
	// most 90 s) and the commit. A streamed answer moves it on.
	WriteTimeout = 180 * time.Second
)

// Options are what an Edge works with besides its config. All are
// optional.
type Options struct {
	Logger *slog.Logger
	Now    func() time.Time // the clock refusals are counted by; nil: time.Now
	// Location is the operator's time zone, whose days today's refusal
	// counts follow; nil: UTC.
	Location *time.Location
}

// Edge is the transport both listeners share: the connections and header
// blocks each listener holds, the client address behind trusted proxies,
// request ids, the bodies' memory and each user's requests in flight, the
// one error handler, and the counts of what it answered (Metrics, today's
// refusals).
type Edge struct {
	cfg       Config
	log       *slog.Logger
	access    *slog.Logger // nil: no access log
	now       func() time.Time
	wallClock func() time.Time // for connection deadlines, always real time
	reqIDs    *requestIDs
	clients   *clientIP
	metrics   *Metrics
	calendar  *budget.Calendar // today's key for the refusal counts

	// The transport bounds (transport.go).
	bodies   *bodyMemory
	inFlight *inFlight
	conns    atomic.Int64 // connections held open by HTTPServer's listeners

	refusalsToday dailyRefusals
}

// New builds the transport of cfg, taken with its defaults applied.
func New(cfg Config, o Options) (*Edge, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Location == nil {
		o.Location = time.UTC
	}
	trusted, _ := ParsePrefixes(cfg.TrustedProxies) // checked by Validate
	header, _ := clientIPHeader(cfg.ClientIPHeader)
	log := o.Logger.With("component", "server")
	e := &Edge{
		cfg:       cfg,
		log:       log,
		now:       o.Now,
		wallClock: time.Now,
		reqIDs:    newRequestIDs(),
		clients:   &clientIP{trusted: trusted, header: header, log: log},
		metrics:   newMetrics(),
		calendar:  budget.NewCalendar(o.Location),
		bodies:    &bodyMemory{capacity: cfg.MaxBodyMemory},
		inFlight:  &inFlight{max: cfg.MaxInFlightPerUser, n: map[string]int{}},
	}
	if cfg.AccessLog {
		e.access = o.Logger.With("component", "access")
	}
	e.metrics.observeTransport(func() int64 { used, _ := e.bodies.inUse(); return used }, e.conns.Load)
	return e, nil
}

// Config is the [server] section the Edge was built with, its defaults
// applied.
func (e *Edge) Config() Config { return e.cfg }

// Metrics are the service's Prometheus series; the Edge's own are the
// answers and refusals it counts.
func (e *Edge) Metrics() *Metrics { return e.metrics }

// NewEcho is an Echo behind the transport: the client address from
// trusted proxies only, a request id, panic recovery and the one
// problem+json error handler. A public listener's (public true) counts
// each answer in breakwater_http_requests_total and each refusal it
// answers (CountRefusal), and logs each to the access log when
// server.access_log is on; the admin listener's does neither.
func (e *Edge) NewEcho(public bool) *echo.Echo {
	answered, front := (func(*Problem))(nil), e.front(nil, nil)
	if public {
		answered, front = e.CountRefusal, e.front(e.metrics, e.access)
	}
	ec := echo.New()
	ec.HideBanner, ec.HidePort = true, true
	ec.IPExtractor = e.clients.extract
	ec.HTTPErrorHandler = errorHandler(e.log, answered)
	ec.Use(front)
	return ec
}

// HandleHealth answers GET /healthz on either listener.
func HandleHealth(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}
