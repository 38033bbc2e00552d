package api

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// routes lists every route of both listeners.
func (s *Server) routes() {
	// Public listener. The body limit leaves room for multipart framing;
	// the image itself is held to max_image_bytes when it is read.
	s.public.GET("/healthz", s.handleHealth)
	s.public.HEAD("/healthz", s.handleHealth) // for monitors that only ask HEAD
	// boundUploads (the upload rate, the transport's refusal counts)
	// paces the body that limitBody has limited.
	// Their middleware is chained once, not by Echo on every request.
	s.public.POST("/v1/ocr", chain(s.handleOCR, limitBody(s.cfg.MaxImageBytes+multipartSlack), s.boundUploads))
	s.public.POST("/v1/invites/verify", chain(s.handleVerifyInvite, limitBodyWith(maxVerifyBody, errVerifyTooLarge)))
	// The app's guarded routes: forward auth (any method), and the paths
	// proxied to the app (routeguard.go, proxy.go, forwardauth.go).
	s.public.Any("/v1/forward-auth", s.handleForwardAuth)
	s.public.Any("/v1/forward-auth/:name", s.handleForwardAuth)
	// Every other path: each spelling of a proxied route's path is
	// matched as the route, the rest is 404.
	if s.hasProxied() {
		s.public.RouteNotFound("/*", s.handleRoute)
	}

	// Admin listener: every route needs the admin token, and none that
	// changes anything acts for a page of another origin.
	a := s.admin.Group("", s.sameOriginWrites, s.adminOnly)
	a.GET("/", s.handleDashboard)
	a.POST("/brake", s.handleDashboardBrake, limitBody(64<<10)) // the dashboard's button
	a.GET("/healthz", s.handleHealth)
	a.GET("/metrics", echo.WrapHandler(s.d.Metrics.Handler()))
	a.GET("/api/keys", s.handleListKeys)
	a.POST("/api/keys", s.handleCreateKey, limitBody(64<<10))
	a.POST("/api/keys/:id/revoke", s.handleRevokeKey)
	a.GET("/api/invites", s.handleListInvites)
	a.POST("/api/invites", s.handleCreateInvite, limitBody(64<<10))
	a.POST("/api/invites/:id/revoke", s.handleRevokeInvite)
	a.DELETE("/api/invites/:id", s.handleDeleteInvite)
	a.POST("/api/users/:id", s.handleUpdateUser, limitBody(64<<10))
	a.GET("/api/usage", s.handleUsage)
	a.GET("/api/budget", s.handleBudget)
	a.POST("/api/brake", s.handleBrake, limitBody(64<<10))
	a.GET("/api/backup", s.handleBackup)
	a.POST("/api/detect/run", s.handleDetectRun, limitBody(64<<10))
	a.GET("/api/cooldowns", s.handleCooldowns)
	a.POST("/api/cooldowns/clear", s.handleClearCooldown, limitBody(64<<10))
	a.GET("/api/recorded", s.handleRecorded)
	a.GET("/api/ledger", s.handleLedger)
	if s.cfg.AdminPprof {
		pprofRoutes(a) // off by default: a profile shows request internals
	}
}

func (s *Server) handleHealth(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}
