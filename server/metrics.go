package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the Prometheus series the service exports on the admin
// listener's GET /metrics.
type Metrics struct {
	reg      *prometheus.Registry
	failOpen *prometheus.CounterVec // layer
	refusals *prometheus.CounterVec // layer, reason
	guard    prometheus.Histogram   // layers 0-3 of an admitted request, without waits
	// inviteRefusals counts refused invite verifications by reason.
	inviteRefusals *prometheus.CounterVec // reason
}

// NewMetrics registers every series on a registry of its own, with the Go
// runtime and process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "breakwater_layer_failopen_total",
			Help: "Requests let through because a defense layer's own machinery failed (panic or persistence error).",
		}, []string{"layer"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "breakwater_refusals_total",
			Help: "Requests refused, by layer and reason.",
		}, []string{"layer", "reason"}),
		guard: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "breakwater_guard_check_seconds",
			Help:    "Time spent in layers 0-3 on a request that reached the upstream, excluding the upload, the image check and commit waits.",
			Buckets: []float64{5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6, 100e-6, 150e-6, 200e-6, 500e-6, 1e-3, 5e-3},
		}),
	}
	m.inviteRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_invite_refusals_total",
		Help: "Invite verifications refused, by reason: rate, burst, invalid, expired, used_up, revoked, cooldown, in_flight, global.",
	}, []string{"reason"})
	m.reg.MustRegister(m.failOpen, m.refusals, m.guard, m.inviteRefusals,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
