package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/labstack/echo/v4"
)

var errTooLarge = problem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
	"The image is larger than this service accepts.")

// requestIDs makes request ids that are unique within the process and
// unguessable across restarts: a random prefix and a counter. A client's own
// X-Request-ID is never taken, so logs cannot be forged through it.
type requestIDs struct {
	prefix string
	n      atomic.Uint64
}

func newRequestIDs() *requestIDs {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return &requestIDs{prefix: hex.EncodeToString(b)}
}

func (g *requestIDs) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := g.prefix + "-" + strconv.FormatUint(g.n.Add(1), 36)
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		return next(c)
	}
}

// recoverPanics turns a panic in a handler into a 500 problem and a log
// line with the request id, and keeps the process alive.
func recoverPanics(log *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if r := recover(); r != nil {
					if r == http.ErrAbortHandler {
						panic(r)
					}
					log.Error("panic in handler", "panic", fmt.Sprint(r), "path", c.Path(),
						"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
					err = errInternal
				}
			}()
			return next(c)
		}
	}
}

// limitBody refuses a body whose declared length exceeds max before reading
// a byte of it, and caps what can be read from any other body at max, so a
// lying or absent Content-Length cannot make us buffer more.
func limitBody(max int64) echo.MiddlewareFunc { return limitBodyWith(max, errTooLarge) }

// limitBodyWith is limitBody answering a declared length over max with
// tooLarge.
func limitBodyWith(max int64, tooLarge *Problem) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if r.ContentLength > max {
				return tooLarge
			}
			r.Body = http.MaxBytesReader(c.Response(), r.Body, max)
			return next(c)
		}
	}
}

// isTooLarge reports whether err came from reading past the body limit.
func isTooLarge(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}
