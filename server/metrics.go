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
	}
	m.reg.MustRegister(m.failOpen, m.refusals,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
