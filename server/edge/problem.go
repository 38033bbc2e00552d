package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/detect"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/server/operator"
)

// Problem is an error answered as application/problem+json (RFC 9457).
// Code is the stable, machine-readable name that clients script against;
// Detail never holds a secret threshold.
type Problem struct {
	Status     int       `json:"status"`
	Code       string    `json:"code"`
	Title      string    `json:"title"`
	Detail     string    `json:"detail,omitempty"`
	Type       string    `json:"type"`
	retryAfter int       // seconds; sent as Retry-After when > 0
	body       []byte    // the encoded problem, made once when it is built
	at         time.Time // when a refusal was decided, for the day it is counted in; zero: when answered
	// layer and reason count the problem as a refusal (refusalLabels);
	// empty, a 4xx is counted as layer "input" with its code.
	layer, reason string
}

func (p *Problem) Error() string { return p.Code + ": " + p.Detail }

// RetryAfter is the Retry-After p sends, in seconds; 0 for none.
func (p *Problem) RetryAfter() int { return p.retryAfter }

// Body is p as its answer's body.
func (p *Problem) Body() []byte {
	if p.body == nil { // a Problem made without NewProblem
		return p.encode()
	}
	return p.body
}

// NewProblem builds a Problem; its type URI is derived from the code.
func NewProblem(status int, code, title, detail string) *Problem {
	p := &Problem{Status: status, Code: code, Title: title, Detail: detail, Type: "urn:breakwater:problem:" + code}
	p.body = p.encode()
	return p
}

// encode is p as the body of its answer. A refusal in a flood is then
// written, not encoded again.
func (p *Problem) encode() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p) // a struct of strings and an int: it cannot fail
	return b.Bytes()
}

// The problems of the transport itself, which any endpoint may answer
// with; each endpoint's own are declared beside it (the public API's in
// server/api, the admin API's in server/admin). Together they are the
// error table of docs/API.md. Each is copied before it gets a Retry-After.
var (
	ErrUnauthorized = NewProblem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"A valid API key or sign-in token is required: send it as Authorization: Bearer <token>.").RefusedIn(LayerAuth)
	ErrInternal = NewProblem(http.StatusInternalServerError, "internal", "Internal server error",
		"Something went wrong on our side.")
	ErrTooLarge = NewProblem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
		"The image is larger than this service accepts.")
	ErrBadBody         = NewProblem(http.StatusBadRequest, "bad_body", "Bad request", "The request body could not be read.")
	ErrTooManyInFlight = NewProblem(http.StatusTooManyRequests, "too_many_in_flight", "Too many requests",
		"Too many of your requests are in progress at once. Wait for one to finish.").RefusedIn(LayerTransport)
	ErrServerBusy = NewProblem(http.StatusServiceUnavailable, "server_busy", "Service busy",
		"The service is receiving too many uploads at once. Try again after the time in Retry-After.").RefusedIn(LayerTransport)
	ErrUploadTooSlow = NewProblem(http.StatusRequestTimeout, "upload_too_slow", "Request timeout",
		"The upload arrived too slowly or stalled.").RefusedIn(LayerTransport)
)

// BadRequest is the 400 of a request body or parameter that could not be
// understood; detail says what to send.
func BadRequest(detail string) *Problem {
	return NewProblem(http.StatusBadRequest, "bad_request", "Bad request", detail)
}

// WithRetryAfter returns a copy of p that sends Retry-After: seconds.
func (p *Problem) WithRetryAfter(seconds int) *Problem {
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

// The headers of every problem, in their canonical spelling, so that they
// can be put in the header map as they are.
const (
	headerRetryAfter      = "Retry-After"
	headerCacheControl    = "Cache-Control"
	headerWWWAuthenticate = "Www-Authenticate" // WWW-Authenticate
)

// The values of the problems' fixed headers, shared by every answer
// rather than made for each: a header map's values are only read, or
// replaced, never written in place, and each holds one value at full
// capacity, so that an Add copies it before it appends.
var (
	problemContentType = []string{"application/problem+json"}
	noStore            = []string{"no-store"}
	bearerChallenge    = []string{`Bearer realm="breakwater"`}
)

// retryAfterValues are the Retry-After values of up to an hour, each made
// the first time it is answered and shared from then on: a flood of
// refusals counts down through the same few.
var retryAfterValues [3601]atomic.Pointer[[]string]

// retryAfterValue is the Retry-After header value of seconds, shared as
// the fixed ones are.
func retryAfterValue(seconds int) []string {
	if seconds < 0 || seconds >= len(retryAfterValues) {
		return []string{strconv.Itoa(seconds)}
	}
	if v := retryAfterValues[seconds].Load(); v != nil {
		return *v
	}
	v := []string{strconv.Itoa(seconds)}
	retryAfterValues[seconds].Store(&v)
	return v
}

// errorHandler returns Echo's HTTPErrorHandler: every error a handler or
// middleware returns becomes one problem+json answer here, and is logged
// once, here. answered, if set, is told of each problem as it is answered
// (the public listener counts its refusals there).
func errorHandler(log *slog.Logger, answered func(*Problem)) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		p := ToProblem(err)
		// Expected refusals (a paused budget, a failed upstream, a usage
		// record not written) are logged where they happen, once, or
		// counted in metrics; only the unexpected is logged here, so an
		// attack on a paused service cannot flood the log.
		if p.Status == http.StatusInternalServerError {
			log.Error("request failed", "status", p.Status, "code", p.Code, "path", c.Path(), "request_id", RequestID(c), "err", err)
		}
		h := c.Response().Header()
		if p.retryAfter > 0 {
			h[headerRetryAfter] = retryAfterValue(p.retryAfter)
		}
		dontWaitForBody(c)
		h[echo.HeaderContentType] = problemContentType
		h[headerCacheControl] = noStore
		if p.Status == http.StatusUnauthorized && FirstValue(h, headerWWWAuthenticate) == "" {
			h[headerWWWAuthenticate] = bearerChallenge
		}
		c.Response().WriteHeader(p.Status)
		if answered != nil {
			answered(p)
		}
		if c.Request().Method == http.MethodHead {
			return
		}
		_, _ = c.Response().Write(p.Body())
	}
}

// domainErrors map the errors of the packages below the transport that a
// request can cause to the problem answered; the detail is the error's own
// text, which says what was wrong and names no threshold.
var domainErrors = []struct {
	err    error
	status int
	code   string
	title  string
}{
	{keys.ErrBadUserID, http.StatusBadRequest, "bad_request", "Bad request"},
	{keys.ErrReservedUserID, http.StatusBadRequest, "bad_request", "Bad request"},
	{keys.ErrAmbiguousUserID, http.StatusBadRequest, "bad_request", "Bad request"},
	{keys.ErrUnknownPlan, http.StatusBadRequest, "bad_request", "Bad request"},
	{invites.ErrInvalid, http.StatusBadRequest, "bad_request", "Bad request"},
	{operator.ErrBadDay, http.StatusBadRequest, "bad_request", "Bad request"},
	{operator.ErrBadID, http.StatusBadRequest, "bad_request", "Bad request"},
	{operator.ErrBackupOntoDatabase, http.StatusConflict, "backup_target_is_database", "Conflict"},
	{detect.ErrPruned, http.StatusConflict, "pruned", "Conflict"},
}

// ToProblem maps any error to the problem users see: a *Problem as it is,
// a domain error by domainErrors, Echo's own by status, anything else 500.
func ToProblem(err error) *Problem {
	if p, ok := err.(*Problem); ok { // most are, unwrapped
		return p
	}
	return toProblemWrapped(err)
}

// toProblemWrapped is ToProblem for an error that is not a bare *Problem.
func toProblemWrapped(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	for _, d := range domainErrors {
		if errors.Is(err, d.err) {
			return NewProblem(d.status, d.code, d.title, err.Error())
		}
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return NewProblem(he.Code, "not_found", "Not found", "No such route.")
		case http.StatusMethodNotAllowed:
			return NewProblem(he.Code, "method_not_allowed", "Method not allowed", "This route does not take that method.")
		case http.StatusRequestEntityTooLarge:
			return ErrTooLarge
		case http.StatusUnauthorized:
			return ErrUnauthorized
		}
		if he.Code >= 400 && he.Code < 500 {
			return NewProblem(he.Code, "bad_request", http.StatusText(he.Code), "The request was not understood.")
		}
	}
	return ErrInternal
}
