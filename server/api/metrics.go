package api

import (
	"maps"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/server/edge"
)

// waitBuckets are the bounds of the commit-wait histograms, fine enough
// below 10 ms to read a p50 and a p99 from.
var waitBuckets = []float64{100e-6, 200e-6, 300e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3,
	10e-3, 20e-3, 50e-3, 0.1, 0.25, 1}

// Metrics are the public API's Prometheus series, which the admin
// listener's GET /metrics exports beside the transport's (edge.Metrics,
// whose registry they join).
type Metrics struct {
	reg      *prometheus.Registry   // the edge's: set by register
	failOpen *prometheus.CounterVec // layer
	guard    prometheus.Histogram   // layers 0-3 of an admitted request, without waits

	upstreamCalls   *prometheus.CounterVec // outcome, model
	upstreamLatency prometheus.Histogram
	tokens          *prometheus.CounterVec // kind
	// A call's counters, resolved once: a call counts in all four.
	// modelCalls holds the calls counters of the configured models (see
	// startModels), and no other: the label stays bounded.
	modelCalls                                 atomic.Pointer[map[string]callCounters]
	promptTokens, outputTokens, thoughtsTokens prometheus.Counter
	cost                                       prometheus.Counter     // US dollars
	commitLatency                              prometheus.Histogram   // the usage record's commit wait
	reserveLatency                             prometheus.Histogram   // the budget reservation's commit wait
	guardOverhead                              prometheus.Histogram   // layers 0-3 with the reservation's commit wait
	jwt                                        *prometheus.CounterVec // reason
	inviteRefusals                             *prometheus.CounterVec // reason
	shadowRefusals                             *prometheus.CounterVec // layer, reason: routemetrics.go
	routeFailures                              *prometheus.CounterVec // route, reason: routemetrics.go
	alertsRaised                               *prometheus.CounterVec // kind
	upstreamFailures                           *prometheus.CounterVec // reason: upstream.go
}

// callCounters are one model's series of breakwater_upstream_calls_total.
type callCounters struct{ ok, failed prometheus.Counter }

// startModels creates the calls series of the configured models at zero;
// "" (no fallback) is left out. The models' series made by an earlier
// call stay: the label's values are the models configured since start.
func (m *Metrics) startModels(models ...string) {
	next := map[string]callCounters{}
	if cur := m.modelCalls.Load(); cur != nil {
		maps.Copy(next, *cur)
	}
	for _, model := range models {
		if model != "" {
			next[model] = callCounters{ok: m.upstreamCalls.WithLabelValues("ok", model), failed: m.upstreamCalls.WithLabelValues("failed", model)}
		}
	}
	m.modelCalls.Store(&next)
}

// calls are model's calls counters; a model startModels was not told of
// (not expected) counts under "other", so the label stays bounded.
func (m *Metrics) calls(model string) callCounters {
	if c, ok := (*m.modelCalls.Load())[model]; ok {
		return c
	}
	return callCounters{ok: m.upstreamCalls.WithLabelValues("ok", "other"), failed: m.upstreamCalls.WithLabelValues("failed", "other")}
}

// NewMetrics makes the public API's series; New registers them on the
// edge's registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "breakwater_layer_failopen_total",
			Help: "Requests let through because a defense layer's own machinery failed (panic or persistence error).",
		}, []string{"layer"}),
		guard: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "breakwater_guard_check_seconds",
			Help:    "Time spent in layers 0-3 on a request that reached the upstream, excluding the upload, the image check and commit waits.",
			Buckets: []float64{5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6, 100e-6, 150e-6, 200e-6, 500e-6, 1e-3, 5e-3},
		}),
		jwt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "breakwater_jwt_refusals_total",
			Help: "Bearer tokens refused by JWT verification, by reason (expired, issuer, unknown_kid, ...). Every one answered the same 401.",
		}, []string{"reason"}),
	}
	m.upstreamCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_upstream_calls_total",
		Help: "Calls to the OCR provider, by outcome (ok or failed) and model (ocr.model or ocr.fallback_model).",
	}, []string{"outcome", "model"})
	m.upstreamLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "breakwater_upstream_latency_seconds",
		Help:    "Duration of calls to the OCR provider, including its one retry.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60},
	})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_upstream_tokens_total",
		Help: "Tokens the provider reported, by kind (prompt, output, thoughts).",
	}, []string{"kind"})
	m.cost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "breakwater_upstream_cost_usd_total",
		Help: "Money spent on the provider in US dollars, failed calls of unknown cost at their worst case.",
	})
	m.commitLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "breakwater_usage_commit_seconds",
		Help:    "Time to commit a usage record durably (group commit wait included).",
		Buckets: waitBuckets,
	})
	m.reserveLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "breakwater_reservation_commit_seconds",
		Help:    "Time to cover an upstream call with durable budget before it is made: a lease top-up's group commit when the lease is empty, about zero when the call is taken from the lease or every ceiling is off.",
		Buckets: waitBuckets,
	})
	m.guardOverhead = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "breakwater_guard_overhead_seconds",
		Help:    "Time from a request's arrival until its budget reservation is committed, on a request that reached the upstream, excluding the upload and the image check.",
		Buckets: waitBuckets,
	})
	m.promptTokens, m.outputTokens = m.tokens.WithLabelValues("prompt"), m.tokens.WithLabelValues("output")
	m.thoughtsTokens = m.tokens.WithLabelValues("thoughts")
	m.inviteRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_invite_refusals_total",
		Help: "Invite verifications refused, by reason: rate, burst, invalid, expired, used_up, revoked, cooldown, in_flight, global.",
	}, []string{"reason"})
	m.newRouteSeries()
	m.alertsRaised = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_alerts_raised_total",
		Help: "Immediate alerts raised, by kind: every event, before the alerter's min_interval decides which are mailed.",
	}, []string{"kind"})
	m.upstreamFailures = newUpstreamFailures()
	m.startModels()
	return m
}

// register adds m's series to the edge's registry, every known label set
// at zero.
func (m *Metrics) register(em *edge.Metrics) {
	m.reg = em.Registry()
	m.reg.MustRegister(m.upstreamCalls, m.upstreamLatency, m.tokens, m.cost, m.commitLatency,
		m.reserveLatency, m.guardOverhead)
	m.reg.MustRegister(m.failOpen, m.guard, m.jwt, m.inviteRefusals)
	m.reg.MustRegister(m.shadowRefusals, m.routeFailures, m.alertsRaised, m.upstreamFailures)
	em.StartRefusals(knownRefusals)
	m.startAtZero()
}

// observeBudget exports the global budget's figures and ceilings as gauges
// read at scrape time.
func (m *Metrics) observeBudget(status func() budget.Status) {
	gauge := func(name, help string, value func(budget.Status) float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return value(status()) }))
	}
	gauge("breakwater_budget_requests_today", "Upstream calls claimed today.", func(s budget.Status) float64 { return float64(s.Requests) })
	gauge("breakwater_budget_spent_today_usd", "Money committed today, open calls at their worst case (on postgres: the service's, as settled).", func(s budget.Status) float64 { return usd(s.SpendMicroUSD) })
	gauge("breakwater_budget_spent_month_usd", "Money committed this month (on postgres: the service's, as settled).", func(s budget.Status) float64 { return usd(s.MonthMicroUSD) })
	gauge("breakwater_budget_daily_requests", "Ceiling on upstream calls per day (0: off).", func(s budget.Status) float64 { return float64(s.DailyRequests) })
	gauge("breakwater_budget_daily_usd", "Ceiling on money per day (0: off).", func(s budget.Status) float64 { return usd(s.DailyMicroUSD) })
	gauge("breakwater_budget_monthly_usd", "Ceiling on money per month (0: off).", func(s budget.Status) float64 { return usd(s.MonthlyMicroUSD) })
	gauge("breakwater_budget_brake_engaged", "1 while the brake refuses calls (a ceiling reached or the manual switch on).", func(s budget.Status) float64 {
		if s.Engaged {
			return 1
		}
		return 0
	})
}

// counterFunc registers a counter read from v at scrape time.
func counterFunc[T uint64 | int64](m *Metrics, name, help string, v func() T) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
		func() float64 { return float64(v()) }))
}

// observeDrops exports a count of dropped statistics events.
func (m *Metrics) observeDrops(dropped func() uint64) {
	counterFunc(m, "breakwater_stats_events_dropped_total", "Statistics events lost to a full queue or a failed write.", dropped)
}

// observeCommits exports the storage writer's group commit: how many
// transactions it has run and how many writes they carried. Over an
// interval, writes over commits is how many writes a commit carries, and
// for a writer that is never idle (full load) the interval over the
// commits is the time one commit takes.
func (m *Metrics) observeCommits(txs, writes func() int64) {
	counterFunc(m, "breakwater_storage_commits_total",
		"Transactions the storage writer has run (group commit: each with its fsyncs), rolled-back tries included.", txs)
	counterFunc(m, "breakwater_storage_writes_total",
		"Durable writes the storage writer has answered (usage records, ledger writes, statistics batches), committed or refused.", writes)
}

// observeDeny exports the deny cache's figures (guard.Deny): how many
// refusals it holds, and how many it has answered from memory.
func (m *Metrics) observeDeny(entries func() int, answered func() uint64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "breakwater_deny_cache_entries",
		Help: "Refusals the deny caches hold until their retry-after (on the OCR route a user's rate refusal, daily line or quota; a guarded route's rate, daily line or cooldown; the invite limits' address rate or cooldown).",
	}, func() float64 { return float64(entries()) }))
	counterFunc(m, "breakwater_deny_cache_answers_total",
		"Refusals answered from the deny caches, without asking a layer; each is counted as a decided refusal is (breakwater_refusals_total, breakwater_invite_refusals_total).", answered)
}

// observeDetect exports layer 4's counters.
func (m *Metrics) observeDetect(c *detect.Counters) {
	counterFunc(m, "breakwater_alerts_sent_total", "Alert and digest e-mails delivered.", c.AlertsSent.Load)
	counterFunc(m, "breakwater_alert_failures_total", "Failed e-mail deliveries (each attempt), and alerts or e-mails dropped by a full queue.", c.AlertFailures.Load)
	counterFunc(m, "breakwater_detect_runs_total", "Daily detection runs finished (one per day run, scheduled or by the operator).", c.Runs.Load)
	counterFunc(m, "breakwater_detect_failures_total", "Daily detection runs that failed.", c.RunFailures.Load)
	counterFunc(m, "breakwater_webhooks_sent_total", "Alerts delivered to webhooks.", c.WebhooksSent.Load)
	counterFunc(m, "breakwater_webhook_failures_total", "Failed webhook delivery attempts (each try).", c.WebhookFailures.Load)
	counterFunc(m, "breakwater_webhook_dropped_total", "Webhook alerts dropped: a full queue, a refusal, or their tries used up.", c.WebhookDropped.Load)
}

// usd turns micro-dollars into dollars for metrics.
func usd(micro int64) float64 { return float64(micro) / 1e6 }
