package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/detect"
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

// Detection runs the daily detection on demand and lists its findings:
// detect.Runner.
type Detection interface {
	Run(ctx context.Context, day string, mail bool) (detect.Report, error)
	Yesterday(now time.Time) string
	Recent(from, to string) ([]detect.Finding, error)
}

var _ Detection = (*detect.Runner)(nil)

// ErrBadDay means a day is not written YYYY-MM-DD.
var ErrBadDay = errors.New("server: day must be YYYY-MM-DD")

// errNoDetection means the operator has no detection to run.
var errNoDetection = errors.New("server: detection is not set up")

// SetDetection gives the operator the detection it runs on demand and
// shows on the dashboard.
func (o *Operator) SetDetection(d Detection) { o.detection = d }

// DetectRun runs the daily detection for day ("" means yesterday in the
// budget's time zone) and returns its findings; mail sends the digest.
func (o *Operator) DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error) {
	if o.detection == nil {
		return detect.Report{}, errNoDetection
	}
	if day == "" {
		day = o.detection.Yesterday(o.now())
	}
	if t, err := time.Parse("2006-01-02", day); err != nil || t.Format("2006-01-02") != day {
		return detect.Report{}, fmt.Errorf("%w: got %q", ErrBadDay, day)
	}
	return o.detection.Run(ctx, day, mail)
}

// detectRunRequest is the body of POST /api/detect/run.
type detectRunRequest struct {
	Day    string `json:"day"`     // "" means yesterday
	NoMail bool   `json:"no_mail"` // skip the digest
}

func (s *Server) handleDetectRun(c echo.Context) error {
	var req detectRunRequest
	if err := c.Bind(&req); err != nil {
		return problem(http.StatusBadRequest, "bad_request", "Bad request", `Send JSON {"day":"YYYY-MM-DD","no_mail":false}.`)
	}
	rep, err := s.d.Operator.DetectRun(c.Request().Context(), req.Day, !req.NoMail)
	switch {
	case errors.Is(err, ErrBadDay):
		return problem(http.StatusBadRequest, "bad_request", "Bad request", err.Error())
	case errors.Is(err, detect.ErrPruned):
		return problem(http.StatusConflict, "pruned", "Conflict", err.Error())
	case err != nil:
		return err
	}
	s.log.Info("detection run by the operator", "day", rep.Day, "findings", len(rep.Findings))
	return c.JSON(http.StatusOK, rep)
}

// DetectRun asks the running server to run the daily detection.
func (a *AdminClient) DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error) {
	var out detect.Report
	err := a.call(ctx, http.MethodPost, "/api/detect/run", detectRunRequest{Day: day, NoMail: !mail}, &out)
	return out, err
}

// alert raises an immediate alert; it never waits.
func (s *Server) alert(kind, summary string, details map[string]string) {
	s.d.Alerts.Alert(kind, summary, details)
}

// dashboardFindings lists the last week's findings, newest day first, and
// the last alert of each kind, for the dashboard.
func (s *Server) dashboardFindings(now time.Time) []string {
	var out []string
	if ra, ok := s.d.Alerts.(recentAlerts); ok {
		for _, st := range ra.Recent() {
			out = append(out, fmt.Sprintf("alert %s at %s: %s", st.Kind, st.SentAt.In(s.d.Operator.loc).Format("2006-01-02 15:04"), st.Summary))
		}
	}
	det := s.d.Operator.detection
	if det == nil {
		return out
	}
	l := now.In(s.d.Operator.loc)
	from := time.Date(l.Year(), l.Month(), l.Day()-7, 12, 0, 0, 0, s.d.Operator.loc).Format("2006-01-02")
	findings, err := det.Recent(from, "")
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
