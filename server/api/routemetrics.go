package api

import "github.com/prometheus/client_golang/prometheus"

// newRouteSeries makes the series of the app's guarded routes.
func (m *Metrics) newRouteSeries() {
	m.shadowRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_shadow_refusals_total",
		Help: "Requests a layer in shadow mode would have refused and let through, by layer (route:NAME for a guarded route) and reason.",
	}, []string{"layer", "reason"})
	m.routeFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "breakwater_route_failures_total",
		Help: "A guarded route's fail limit at work, by route and reason: the app's status of a counted failure (404, ...), or cooldown, in_flight for a refusal.",
	}, []string{"route", "reason"})
}
