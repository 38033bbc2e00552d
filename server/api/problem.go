package api

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

// problem builds a Problem; its type URI is derived from the code.
func problem(status int, code, title, detail string) *Problem {
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

// Every problem an endpoint answers with, in one place: this list is the
// error table of docs/API.md. Each is copied before it gets a Retry-After.
var (
	// Transport and every endpoint.
	errUnauthorized = problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"A valid API key or sign-in token is required: send it as Authorization: Bearer <token>.").refusedIn(layerAuth)
	errInternal = problem(http.StatusInternalServerError, "internal", "Internal server error",
		"Something went wrong on our side.")
	errTooLarge = problem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
		"The image is larger than this service accepts.")
	errBadBody         = problem(http.StatusBadRequest, "bad_body", "Bad request", "The request body could not be read.")
	errTooManyInFlight = problem(http.StatusTooManyRequests, "too_many_in_flight", "Too many requests",
		"Too many of your requests are in progress at once. Wait for one to finish.").refusedIn(layerTransport)
	errServerBusy = problem(http.StatusServiceUnavailable, "server_busy", "Service busy",
		"The service is receiving too many uploads at once. Try again after the time in Retry-After.").refusedIn(layerTransport)
	errUploadTooSlow = problem(http.StatusRequestTimeout, "upload_too_slow", "Request timeout",
		"The upload arrived too slowly or stalled.").refusedIn(layerTransport)
	errTooManyParts = problem(http.StatusBadRequest, "too_many_parts", "Bad request",
		"The form has too many parts. Send the image in the field \"image\" with few other fields, or as the raw body.").refusedIn(layerTransport)

	// POST /v1/ocr.
	errUsageUnavailable = problem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"The read could not be recorded, so no result is returned and nothing is counted. Try again shortly.")
	errUsagePaused = problem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"Reads cannot be recorded right now, so none are made and nothing is counted. Try again after the time in Retry-After.")
	// errRecordsUnavailable is usage_unavailable for a quota the database
	// could not answer (guard reason "unavailable"): the records that
	// make a read are out of reach, which is not a used-up quota.
	errRecordsUnavailable = problem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"Reads cannot be checked against your quota right now, so none are made and nothing is counted. Try again after the time in Retry-After.")
	errUpstream = problem(http.StatusBadGateway, "upstream_failed", "Bad gateway",
		"The OCR provider did not give a usable answer. Nothing was counted against your quota.")
	errMissingImage = problem(http.StatusBadRequest, "missing_image", "Bad request",
		"Send the image as the request body with an image/* Content-Type, or as multipart/form-data in the field \"image\".")
	errUnsupportedType = problem(http.StatusUnsupportedMediaType, "unsupported_media_type", "Unsupported media type",
		"Send a PNG, JPEG or WebP image whose Content-Type matches its contents.")
	errUndecodable = problem(http.StatusUnprocessableEntity, "undecodable_image", "Unprocessable image",
		"The image could not be decoded.")
	errTooManyPixels = problem(http.StatusUnprocessableEntity, "too_many_pixels", "Unprocessable image",
		"The image has more pixels, or a longer side, than this service accepts; scale it down.")
	// errClientGone is answered to nobody; its status (nginx's 499) keeps
	// disconnects apart from server errors in logs and metrics.
	errClientGone = problem(499, "client_closed_request", "Client closed request",
		"The client went away before the read started.")
	errBanned = problem(http.StatusForbidden, "banned", "Forbidden",
		"This account is suspended. Contact the operator of this service.").refusedIn(layerAuth)
	errNoPlan = problem(http.StatusForbidden, "no_plan", "Forbidden",
		"Your account has no valid plan. Contact the operator of this service.").refusedIn(layerAuth)
	errRateLimited = problem(http.StatusTooManyRequests, "rate_limited", "Too many requests",
		"Too many requests in a short time. Wait for the time in Retry-After.")
	errDailyLimit = problem(http.StatusTooManyRequests, "daily_limit", "Too many requests",
		"Your account has made too many requests today. It resets at midnight.")
	errQuotaExceeded = problem(http.StatusTooManyRequests, "quota_exceeded", "Too many requests",
		"Your monthly quota is used up; it resets at the start of next month.")
	errBudgetBusy = problem(http.StatusServiceUnavailable, "budget_busy", "Service busy",
		"The service is busy with other reads right now. Try again after the time in Retry-After.")
	errPausedByOperator = problem(http.StatusServiceUnavailable, "paused_by_operator", "Service paused",
		"The operator has paused this service. Try again later.")
	errBudgetPaused = problem(http.StatusServiceUnavailable, "budget_paused", "Service paused",
		"The service has reached its spending limit and is paused. Try again after the time in Retry-After.")
	// errRequestCeiling is budget_paused for the ceiling on requests per
	// day (budget.daily_requests), which is not money; it names no figure.
	errRequestCeiling = problem(http.StatusServiceUnavailable, "budget_paused", "Service paused",
		"The service has reached its ceiling on requests for today and is paused. Try again after the time in Retry-After.")

	// Idempotency-Key on POST /v1/ocr.
	errIdempotencyKeyInvalid = problem(http.StatusBadRequest, "idempotency_key_invalid", "Bad request",
		"Idempotency-Key must be 1 to 255 printable ASCII characters, once.")
	errIdempotencyKeyReused = problem(http.StatusUnprocessableEntity, "idempotency_key_reused", "Unprocessable request",
		"This Idempotency-Key was used with another image; use a new key for a new request.")
	errIdempotencyKeyInUse = problem(http.StatusConflict, "idempotency_key_in_use", "Conflict",
		"The first request with this Idempotency-Key is still in progress. Try again after the time in Retry-After.")

	// POST /v1/invites/verify. errInviteRefused is the one face of every
	// refusal that concerns the code: it carries no reason, no figure and
	// no hint of how many tries are left.
	errInviteRefused = problem(http.StatusForbidden, "invite_refused", "Forbidden",
		"This invite code cannot be used. Check it, or try again later.").refusedIn(layerInvites)
	errInviteRateLimited = problem(http.StatusTooManyRequests, "rate_limited", "Too many requests",
		"Too many requests from your address in a short time. Wait for the time in Retry-After.").refusedIn(layerInvites)
	errVerifyBody   = badRequest(`Send JSON {"code":"...","email":"..."}.`)
	errInvalidEmail = problem(http.StatusBadRequest, "invalid_email", "Bad request",
		"The e-mail address is not valid.")
	errVerifyTooLarge = problem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
		"The request body is larger than this endpoint accepts.")
	errInvitesUnavailable = problem(http.StatusServiceUnavailable, "invites_unavailable", "Service unavailable",
		"Invite codes cannot be checked right now. Try again shortly.")

	// The app's guarded routes ([[routes]]): proxied, and forward auth.
	// Their rate, burst and daily refusals are rate_limited and
	// daily_limit, as above, with Retry-After.
	errRouteTooLarge = problem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
		"The request body is larger than this route accepts.")
	errRouteUpstream = problem(http.StatusBadGateway, "upstream_failed", "Bad gateway",
		"The application behind this route did not answer. Try again shortly.")
	errTooManyFailures = problem(http.StatusTooManyRequests, "too_many_failures", "Too many requests",
		"Too many failed attempts in a row. Wait for the time in Retry-After.")
	errUntrustedProxy = problem(http.StatusForbidden, "untrusted_proxy", "Forbidden",
		"Forward-auth checks are answered only to the proxies listed in server.trusted_proxies.")
	errRouteNotProxied = problem(http.StatusForbidden, "route_not_proxied", "Forbidden",
		"This route's fail limit is judged on the app's answers, which a forward-auth check never sees: the proxy must send the route's requests through Breakwater.")
	errClientIdentityHeader = problem(http.StatusBadRequest, "client_identity_header", "Bad request",
		"X-Breakwater-* headers are Breakwater's own; a client may not send them.")
	errBadForwardedURI = problem(http.StatusForbidden, "bad_forwarded_uri", "Forbidden",
		"The original method and URI of this check are missing, unreadable or contradictory, so it is refused.")
	errRouteNotFound = problem(http.StatusNotFound, "not_found", "Not found", "No guarded route has that name.")

	// The admin API.
	errAdminUnauthorized = problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"The admin API needs Authorization: Bearer $BREAKWATER_ADMIN_TOKEN (browsers: the token as the password).")
	errKeyNotFound        = problem(http.StatusNotFound, "not_found", "Not found", "No key has that id.")
	errUserNotFound       = problem(http.StatusNotFound, "not_found", "Not found", "No user has that id.")
	errBackupOntoDatabase = problem(http.StatusConflict, "backup_target_is_database", "Conflict",
		"The backup target is the live database file; write the copy elsewhere.")
	errInviteNotFound = problem(http.StatusNotFound, "not_found", "Not found", "No invite has that id.")
	errFormToken      = problem(http.StatusForbidden, "form_refused", "Forbidden",
		"The form did not come from this dashboard, or it is from before a restart: reload the dashboard and try again.")
	errCrossOrigin = problem(http.StatusForbidden, "cross_origin", "Forbidden",
		"A browser sent this request for a page of another origin: the admin API changes nothing for another site. Use the dashboard itself, the breakwater CLI, or a client that sends no Origin header.")
	errNoCooldown = problem(http.StatusNotFound, "not_found", "Not found", "No cooldown is on that key.")
)

// wrongDatabase is the admin API's 409 to a CLI whose config names
// another database than the one this server holds.
func wrongDatabase(held, meant string) *Problem {
	return problem(http.StatusConflict, "wrong_database", "Conflict",
		"This server holds "+held+", not "+meant+": check server.admin_listen and storage.path.")
}

// uniformProblem is the one answer of a route with
// [routes.fail] uniform_status: every failure of the app's that the fail
// limit counts, and every fail-limit refusal, with nothing that tells
// them apart.
func uniformProblem(status int) *Problem {
	return problem(status, "request_refused", http.StatusText(status),
		"This request cannot be completed. Check it, or try again later.")
}

// badRequest is the 400 of a request body or parameter that could not be
// understood; detail says what to send.
func badRequest(detail string) *Problem {
	return problem(http.StatusBadRequest, "bad_request", "Bad request", detail)
}

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
			h[headerRetryAfter] = retryAfterValue(p.retryAfter)
		}
		dontWaitForBody(c)
		h[echo.HeaderContentType] = problemContentType
		h[headerCacheControl] = noStore
		if p.Status == http.StatusUnauthorized && firstValue(h, headerWWWAuthenticate) == "" {
			h[headerWWWAuthenticate] = bearerChallenge
		}
		c.Response().WriteHeader(p.Status)
		if answered != nil {
			answered(p)
		}
		if c.Request().Method == http.MethodHead {
			return
		}
		body := p.body
		if body == nil { // a Problem made without problem()
			body = p.encode()
		}
		_, _ = c.Response().Write(body)
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

// toProblem maps any error to the problem users see: a *Problem as it is,
// a domain error by domainErrors, Echo's own by status, anything else 500.
func toProblem(err error) *Problem {
	if p, ok := err.(*Problem); ok { // most are, unwrapped
		return p
	}
	return toProblemWrapped(err)
}

// toProblemWrapped is toProblem for an error that is not a bare *Problem.
func toProblemWrapped(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	for _, d := range domainErrors {
		if errors.Is(err, d.err) {
			return problem(d.status, d.code, d.title, err.Error())
		}
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
