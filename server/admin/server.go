package admin

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/server/edge"
	"breakwater/server/operator"
)

// RecentAlerts is what the dashboard reads from an Alerter that keeps
// state: detect.Alerter.
type RecentAlerts interface {
	Recent() []detect.AlertState
}

var _ RecentAlerts = (*detect.Alerter)(nil)

// Deps are the components the admin API works with. Operator is
// required.
type Deps struct {
	Operator *operator.Operator // the admin API's commands and the dashboard's figures
	// Alerts are the immediate alerts the service raises, whose last of
	// each kind the dashboard shows; nil: none shown.
	Alerts RecentAlerts
	// ServiceRefusals sums the refusals of every instance that shares the
	// database, for /metrics and the dashboard beside this instance's;
	// nil: one instance, whose own counts are the service's.
	ServiceRefusals ServiceRefusalReader
	// AdminToken guards the admin API; empty disables it (every call 401).
	AdminToken string
	Logger     *slog.Logger
	Now        func() time.Time
}

// Server is the admin API and the dashboard, served on the admin
// listener (a loopback address by default) behind the admin token.
type Server struct {
	edge      *edge.Edge
	d         Deps
	log       *slog.Logger
	now       func() time.Time
	wallClock func() time.Time // for write deadlines, always real time
	calendar  *budget.Calendar // today's key for the service's refusals
	csrf      formToken        // the dashboard's brake form

	// serviceRefusals are today's refusals of every instance (nil: one
	// instance); serviceLog rate-limits the lines of their failed reads.
	serviceRefusals *serviceRefusals
	serviceLog      edge.LogEvery

	echo *echo.Echo
}

// New builds the admin API on the transport e, whose metrics it serves.
func New(e *edge.Edge, d Deps) (*Server, error) {
	if d.Operator == nil {
		return nil, errors.New("admin: the operator is required")
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	s := &Server{
		edge:      e,
		d:         d,
		log:       d.Logger.With("component", "server"),
		now:       d.Now,
		wallClock: time.Now,
		calendar:  budget.NewCalendar(d.Operator.Location()),
		csrf:      newFormToken(d.AdminToken),
		echo:      e.NewEcho(false),
	}
	s.observeService(d.ServiceRefusals)
	s.routes()
	return s, nil
}

// Handler is the admin API; serve it on a loopback address only.
func (s *Server) Handler() http.Handler { return s.echo }

// routes lists every route of the admin listener: every one needs the
// admin token, and none that changes anything acts for a page of another
// origin.
func (s *Server) routes() {
	a := s.echo.Group("", s.sameOriginWrites, s.adminOnly)
	a.GET("/", s.handleDashboard)
	a.POST("/brake", s.handleDashboardBrake, edge.LimitBody(64<<10)) // the dashboard's button
	a.GET("/healthz", edge.HandleHealth)
	a.GET("/metrics", echo.WrapHandler(s.edge.Metrics().Handler()))
	a.GET("/api/keys", s.handleListKeys)
	a.POST("/api/keys", s.handleCreateKey, edge.LimitBody(64<<10))
	a.POST("/api/keys/:id/revoke", s.handleRevokeKey)
	a.GET("/api/invites", s.handleListInvites)
	a.POST("/api/invites", s.handleCreateInvite, edge.LimitBody(64<<10))
	a.POST("/api/invites/:id/revoke", s.handleRevokeInvite)
	a.DELETE("/api/invites/:id", s.handleDeleteInvite)
	a.POST("/api/users/:id", s.handleUpdateUser, edge.LimitBody(64<<10))
	a.GET("/api/usage", s.handleUsage)
	a.GET("/api/budget", s.handleBudget)
	a.POST("/api/brake", s.handleBrake, edge.LimitBody(64<<10))
	a.GET("/api/backup", s.handleBackup)
	a.POST("/api/detect/run", s.handleDetectRun, edge.LimitBody(64<<10))
	a.GET("/api/cooldowns", s.handleCooldowns)
	a.POST("/api/cooldowns/clear", s.handleClearCooldown, edge.LimitBody(64<<10))
	a.GET("/api/recorded", s.handleRecorded)
	a.GET("/api/ledger", s.handleLedger)
	if s.edge.Config().AdminPprof {
		pprofRoutes(a) // off by default: a profile shows request internals
	}
}

// The admin API's problems, beside the transport's (edge.ErrUnauthorized
// and the others).
var (
	errAdminUnauthorized = edge.NewProblem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"The admin API needs Authorization: Bearer $BREAKWATER_ADMIN_TOKEN (browsers: the token as the password).")
	errKeyNotFound        = edge.NewProblem(http.StatusNotFound, "not_found", "Not found", "No key has that id.")
	errUserNotFound       = edge.NewProblem(http.StatusNotFound, "not_found", "Not found", "No user has that id.")
	errBackupOntoDatabase = edge.NewProblem(http.StatusConflict, "backup_target_is_database", "Conflict",
		"The backup target is the live database file; write the copy elsewhere.")
	errInviteNotFound = edge.NewProblem(http.StatusNotFound, "not_found", "Not found", "No invite has that id.")
	errFormToken      = edge.NewProblem(http.StatusForbidden, "form_refused", "Forbidden",
		"The form did not come from this dashboard, or it is from before a restart: reload the dashboard and try again.")
	errCrossOrigin = edge.NewProblem(http.StatusForbidden, "cross_origin", "Forbidden",
		"A browser sent this request for a page of another origin: the admin API changes nothing for another site. Use the dashboard itself, the breakwater CLI, or a client that sends no Origin header.")
	errNoCooldown = edge.NewProblem(http.StatusNotFound, "not_found", "Not found", "No cooldown is on that key.")
)

// wrongDatabase is the admin API's 409 to a CLI whose config names
// another database than the one this server holds.
func wrongDatabase(held, meant string) *edge.Problem {
	return edge.NewProblem(http.StatusConflict, "wrong_database", "Conflict",
		"This server holds "+held+", not "+meant+": check server.admin_listen and storage.path.")
}

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
