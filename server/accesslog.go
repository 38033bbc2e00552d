package server

import (
	"log/slog"

	"github.com/labstack/echo/v4"
)

// userKey is where a request's user id is kept once layer 0 knows it.
const userKey = "breakwater.user"

// setUser records who is asking, for the access log.
func setUser(c echo.Context, user string) { c.Set(userKey, user) }

// accessLog is middleware that logs one line per request (server.access_log):
// the route pattern, never the raw path, which a client controls; the user
// once layer 0 has named one; the status the client gets, a problem's
// included; the latency in real time.
func (s *Server) accessLog(log *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := s.wallClock()
			err := next(c)
			status := c.Response().Status
			if err != nil {
				status = toProblem(err).Status
			}
			route := c.Path()
			if route == "" {
				route = "unmatched"
			}
			attrs := []any{"method", c.Request().Method, "route", route, "status", status,
				"latency", s.wallClock().Sub(start), "ip", c.RealIP(), "request_id", requestID(c)}
			if user, ok := c.Get(userKey).(string); ok {
				attrs = append(attrs, "user", user)
			}
			log.Info("request", attrs...)
			return err
		}
	}
}
