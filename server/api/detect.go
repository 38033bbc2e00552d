package api

import "breakwater/detect"

// Alerter raises an immediate alert without ever waiting: detect.Alerter.
// The invite code calls it with detect.KindInviteNet when its
// service-wide net trips.
type Alerter interface {
	Alert(kind, summary string, details map[string]string)
}

var _ Alerter = (*detect.Alerter)(nil)

// noAlerts drops every alert: a Server built without an Alerter.
type noAlerts struct{}

func (noAlerts) Alert(string, string, map[string]string) {}

// alert raises an immediate alert, counted in
// breakwater_alerts_raised_total; it never waits.
func (s *Server) alert(kind, summary string, details map[string]string) {
	s.d.Metrics.alertsRaised.WithLabelValues(kind).Inc()
	s.d.Alerts.Alert(kind, summary, details)
}

// lazyAlerter is an Alerter that makes an alert's text only when it
// raises it (detect.Alerter).
type lazyAlerter interface {
	AlertWith(kind string, build func() (summary string, details map[string]string))
}

var _ lazyAlerter = (*detect.Alerter)(nil)

// alertWith is alert for a text that costs something to make: with a lazy
// Alerter it is made only when the alert is raised, not on every call.
func (s *Server) alertWith(kind string, build func() (string, map[string]string)) {
	if la, ok := s.d.Alerts.(lazyAlerter); ok {
		s.d.Metrics.alertsRaised.WithLabelValues(kind).Inc()
		la.AlertWith(kind, build)
		return
	}
	summary, details := build()
	s.alert(kind, summary, details)
}
