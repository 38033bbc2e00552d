package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/detect"
	"breakwater/server/operator"
)

// Alerter raises an immediate alert without ever waiting: detect.Alerter.
// The invite code calls it with detect.KindInviteNet when its
// service-wide net trips.
type Alerter interface {
	Alert(kind, summary string, details map[string]string)
}

var _ Alerter = (*detect.Alerter)(nil)

// recentAlerts is what the dashboard reads from an Alerter that keeps
// state.
type recentAlerts interface {
	Recent() []detect.AlertState
}

// noAlerts drops every alert: a Server built without an Alerter.
type noAlerts struct{}

func (noAlerts) Alert(string, string, map[string]string) {}

func (s *Server) handleDetectRun(c echo.Context) error {
	var req operator.DetectRunRequest
	if err := bindBody(c, &req, `Send JSON {"day":"YYYY-MM-DD","no_mail":false}.`); err != nil {
		return err
	}
	rep, err := s.d.Operator.DetectRun(c.Request().Context(), req.Day, !req.NoMail)
	if err != nil {
		return err
	}
	s.log.Info("detection run by the operator", "day", rep.Day, "findings", len(rep.Findings))
	return c.JSON(http.StatusOK, rep)
}

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

// dashboardFindings lists the last week's findings, newest day first, and
// the last alert of each kind, for the dashboard.
func (s *Server) dashboardFindings(now time.Time) []string {
	var out []string
	if ra, ok := s.d.Alerts.(recentAlerts); ok {
		for _, st := range ra.Recent() {
			out = append(out, fmt.Sprintf("alert %s at %s: %s", st.Kind, st.SentAt.In(s.d.Operator.Location()).Format("2006-01-02 15:04"), st.Summary))
		}
	}
	loc := s.d.Operator.Location()
	l := now.In(loc)
	from := time.Date(l.Year(), l.Month(), l.Day()-7, 12, 0, 0, 0, loc).Format("2006-01-02")
	findings, err := s.d.Operator.RecentFindings(from)
	if err != nil {
		s.log.Warn("findings not shown on the dashboard", "err", err)
		return out
	}
	for i := len(findings) - 1; i >= 0 && len(out) < 50; i-- {
		f := findings[i]
		out = append(out, fmt.Sprintf("%s %s %s: %s", f.Day, f.Detector, f.Subject, detect.FiguresText(f.Figures)))
	}
	return out
}
