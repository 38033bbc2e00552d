package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"
)

// Problem is an error answered as application/problem+json (RFC 9457).
// Code is the stable, machine-readable name that clients script against;
// Detail never holds a secret threshold.
type Problem struct {
	Status     int    `json:"status"`
	Code       string `json:"code"`
	Title      string `json:"title"`
	Detail     string `json:"detail,omitempty"`
	Type       string `json:"type"`
	retryAfter int    // seconds; sent as Retry-After when > 0
}

func (p *Problem) Error() string { return p.Code + ": " + p.Detail }

// problem builds a Problem; its type URI is derived from the code.
func problem(status int, code, title, detail string) *Problem {
	return &Problem{Status: status, Code: code, Title: title, Detail: detail, Type: "urn:breakwater:problem:" + code}
}

// The problems that need no per-request detail. Each is copied before use.
var (
	errUnauthorized = problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"A valid API key or sign-in token is required: send it as Authorization: Bearer <token>.")
	errUsageUnavailable = problem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"The read could not be recorded, so no result is returned and nothing is counted. Try again shortly.")
	errUsagePaused = problem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"Reads cannot be recorded right now, so none are made and nothing is counted. Try again after the time in Retry-After.")
	errUpstream = problem(http.StatusBadGateway, "upstream_failed", "Bad gateway",
		"The OCR provider did not give a usable answer. Nothing was counted against your quota.")
	errInternal = problem(http.StatusInternalServerError, "internal", "Internal server error",
		"Something went wrong on our side.")
)

// withRetryAfter returns a copy of p that sends Retry-After: seconds.
func (p *Problem) withRetryAfter(seconds int) *Problem {
	c := *p
	if seconds < 1 {
		seconds = 1
	}
	c.retryAfter = seconds
	return &c
}

// dontWaitForBody lets a refusal go out without waiting for a body that
// has not arrived. Go's server drains up to 256 KiB of an unread body
// before it answers, so that the connection can be reused, and closes the
// connection instead when a declared length says more is left. A body of
// unknown length (chunked) cannot be judged, so its connection is closed
// after the answer; the server then reads none of it.
func dontWaitForBody(c echo.Context) {
	if b, ok := c.Request().Body.(*limitedBody); ok && !b.done {
		c.Response().Header().Set("Connection", "close")
	}
}

// errorHandler returns Echo's HTTPErrorHandler: every error a handler or
// middleware returns becomes one problem+json answer here, and is logged
// once, here.
func errorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		p := toProblem(err)
		// Expected refusals (a paused budget, a failed upstream, a usage
		// record not written) are logged where they happen, once, or
		// counted in metrics; only the unexpected is logged here, so an
		// attack on a paused service cannot flood the log.
		if p.Status == http.StatusInternalServerError {
			log.Error("request failed", "status", p.Status, "code", p.Code, "path", c.Path(), "request_id", requestID(c), "err", err)
		}
		h := c.Response().Header()
		if p.retryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(p.retryAfter))
		}
		dontWaitForBody(c)
		h.Set(echo.HeaderContentType, "application/problem+json")
		h.Set("Cache-Control", "no-store")
		if p.Status == http.StatusUnauthorized && h.Get("WWW-Authenticate") == "" {
			h.Set("WWW-Authenticate", `Bearer realm="breakwater"`)
		}
		c.Response().WriteHeader(p.Status)
		if c.Request().Method == http.MethodHead {
			return
		}
		enc := json.NewEncoder(c.Response())
		enc.SetEscapeHTML(false)
		_ = enc.Encode(p)
	}
}

// toProblem maps any error to the problem users see.
func toProblem(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return problem(he.Code, "not_found", "Not found", "No such route.")
		case http.StatusMethodNotAllowed:
			return problem(he.Code, "method_not_allowed", "Method not allowed", "This route does not take that method.")
		case http.StatusRequestEntityTooLarge:
			return errTooLarge
		case http.StatusUnauthorized:
			return errUnauthorized
		}
		if he.Code >= 400 && he.Code < 500 {
			return problem(he.Code, "bad_request", http.StatusText(he.Code), "The request was not understood.")
		}
	}
	return errInternal
}
