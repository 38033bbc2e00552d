package edge

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/server/keys"
)

// hexDigits is the alphabet of a request id's prefix.
const hexDigits = "0123456789abcdef"

// requestIDs makes request ids: a random prefix per process (12 hex digits
// from crypto/rand) and 64 random bits per request (math/rand/v2's
// generator, seeded from the system: fast, and not a counter, which would
// tell anyone who asks twice how much traffic the service has). A client's
// own X-Request-ID is never taken, so logs cannot be forged through it.
type requestIDs struct {
	prefix string
}

func newRequestIDs() *requestIDs {
	return &requestIDs{prefix: keys.RandomString(12, hexDigits)}
}

// next returns a fresh request id: the prefix, "-", the random part in
// base 36, made in one allocation.
func (g *requestIDs) next() string {
	var b [40]byte // 12 + 1 + at most 13 digits
	n := copy(b[:], g.prefix)
	b[n] = '-'
	return string(strconv.AppendUint(b[:n+1], mrand.Uint64(), 36))
}

// RequestID is the id front gave the request (X-Request-ID), for logs.
func RequestID(c echo.Context) string { return c.Response().Header().Get(echo.HeaderXRequestID) }

// front is a listener's one global middleware: it gives the request its
// id (X-Request-ID), turns a panic in a handler into a 500 problem and a
// log line with the request id, keeping the process alive, and, where they
// are set, counts the answer in metrics and logs it to access. Echo
// applies its global middleware anew on every request, one closure per
// step, so the steps are one function here: one closure a request. A
// panic is neither counted nor access-logged.
func (e *Edge) front(metrics *Metrics, access *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			c.Response().Header()[echo.HeaderXRequestID] = []string{e.reqIDs.next()} // canonical already
			defer func() {
				if r := recover(); r != nil {
					if r == http.ErrAbortHandler {
						panic(r)
					}
					e.log.Error("panic in handler", "panic", fmt.Sprint(r), "path", c.Path(),
						"request_id", RequestID(c))
					err = ErrInternal
				}
			}()
			var start time.Time
			if access != nil {
				start = e.wallClock()
				c.Set(userKey, new(string)) // filled by SetUser
			}
			err = next(c)
			if metrics != nil || access != nil {
				route, status := answered(c, err)
				if metrics != nil {
					metrics.countRequest(route, status)
				}
				if access != nil {
					e.logAccess(access, c, start, route, status)
				}
			}
			return err
		}
	}
}

// answered is the route pattern of a request (never the raw path, which a
// client controls; "unmatched" for none) and the status its client gets,
// a problem's included, for the metrics and the access log.
func answered(c echo.Context, err error) (route string, status int) {
	status = c.Response().Status
	if err != nil {
		status = ToProblem(err).Status
	}
	route = c.Path()
	if route == "" {
		route = "unmatched"
	}
	return route, status
}

// Chain is h behind the route middleware mw, the first outermost, made
// once: Echo would apply a route's middleware anew on every request.
func Chain(h echo.HandlerFunc, mw ...echo.MiddlewareFunc) echo.HandlerFunc {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// LimitBody refuses a body whose declared length exceeds max before reading
// a byte of it, and caps a body of unknown length (chunked) at max, so an
// absent Content-Length cannot make us buffer more. A declared length is
// already a cap: the server reads no further. Such a body is left as it
// is, so that the server still sees how much of it is unread when a
// refusal goes out (see dontWaitForBody).
func LimitBody(max int64) echo.MiddlewareFunc { return LimitBodyWith(max, ErrTooLarge) }

// LimitBodyWith is LimitBody answering a declared length over max with
// tooLarge.
func LimitBodyWith(max int64, tooLarge *Problem) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if r.ContentLength > max {
				return tooLarge
			}
			if r.ContentLength < 0 {
				CapBody(c, max)
			}
			return next(c)
		}
	}
}

// CapBody caps the request's body of unknown length at max as LimitBody
// does, for a handler that knows its limit only once it has found its
// route.
func CapBody(c echo.Context, max int64) {
	r := c.Request()
	r.Body = &limitedBody{ReadCloser: http.MaxBytesReader(c.Response(), r.Body, max)}
}

// limitedBody is a body of unknown length held to a limit; done once it has
// been read to its end.
type limitedBody struct {
	io.ReadCloser
	done bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.done = true
	}
	return n, err
}

// IsTooLarge reports whether err came from reading past the body limit.
func IsTooLarge(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}
