package edge

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the service's Prometheus series, on a registry of their own
// that the admin listener's GET /metrics serves: the Edge's (the answers
// and refusals it counts, the body memory and connections it holds, the
// Go runtime and the process), and those the public API registers beside
// them (Registry).
type Metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec // route, status
	requestsBy *counterTable[routeStatus]
	refusals   *prometheus.CounterVec   // layer, reason
	refusalsBy *counterTable[[2]string] // refusals by layer, reason
}

func newMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_http_requests_total",
		Help: "HTTP requests answered, by route pattern and status.",
	}, []string{"route", "status"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_refusals_total",
		Help: "Requests refused, by layer and reason.",
	}, []string{"layer", "reason"})
	m.requestsBy = newCounterTable(m.requests, func(k routeStatus) []string {
		return []string{k.route, strconv.Itoa(k.status)}
	})
	m.refusalsBy = newCounterTable(m.refusals, func(k [2]string) []string { return k[:] })
	m.reg.MustRegister(m.requests, m.refusals,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where the other series of the service are registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// StartRefusals creates the label sets of breakwater_refusals_total that
// exist from start, at zero, so that an alert rule needs no absent():
// reasons by layer.
func (m *Metrics) StartRefusals(known map[string][]string) {
	for layer, reasons := range known {
		for _, reason := range reasons {
			m.refusals.WithLabelValues(layer, reason)
		}
	}
}

// observeTransport exports the body memory and the connections in use.
func (m *Metrics) observeTransport(bodyBytes, conns func() int64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "breakwater_body_memory_bytes",
		Help: "Bytes of request bodies held in memory now (at most server.max_body_memory).",
	}, func() float64 { return float64(bodyBytes()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "breakwater_connections_open",
		Help: "Connections held open, public and admin listeners together (each at most server.max_connections).",
	}, func() float64 { return float64(conns()) }))
}

// countRequest counts an answer by route pattern (never the raw path,
// which a client controls) and status, as answered gives them; front
// calls it for every request of the public listener.
func (m *Metrics) countRequest(route string, status int) {
	m.requestsBy.get(routeStatus{route, status}).Inc()
}

// routeStatus is a label set of breakwater_http_requests_total.
type routeStatus struct {
	route  string
	status int
}
