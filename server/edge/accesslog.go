package edge

import (
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
)

// userKey is where the access log leaves a slot (a *string) for the
// request's user id, which SetUser fills once layer 0 knows it. Without
// the access log there is no slot, and naming the user costs nothing.
const userKey = "breakwater.user"

// SetUser records who is asking, for the access log if it is on.
func SetUser(c echo.Context, user string) {
	if slot, ok := c.Get(userKey).(*string); ok {
		*slot = user
	}
}

// logAccess logs one line for a request answered (server.access_log): the
// route pattern, never the raw path, which a client controls; the user
// once layer 0 has named one; the status the client gets, a problem's
// included (route and status as answered gives them); the latency in
// real time since start. front calls it.
func (e *Edge) logAccess(log *slog.Logger, c echo.Context, start time.Time, route string, status int) {
	attrs := []any{"method", c.Request().Method, "route", route, "status", status,
		"latency", e.wallClock().Sub(start), "ip", c.RealIP(), "request_id", RequestID(c)}
	if user, ok := c.Get(userKey).(*string); ok && *user != "" {
		attrs = append(attrs, "user", *user)
	}
	log.Info("request", attrs...)
}
