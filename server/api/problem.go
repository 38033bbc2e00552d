package api

import (
	"net/http"

	"breakwater/server/edge"
)

// Every problem the public API answers with beside the transport's
// (edge.ErrUnauthorized, edge.ErrTooLarge and the others), in one place:
// with those and the admin API's, this list is the error table of
// docs/API.md. Each is copied before it gets a Retry-After.
var (
	errTooManyParts = edge.NewProblem(http.StatusBadRequest, "too_many_parts", "Bad request",
		"The form has too many parts. Send the image in the field \"image\" with few other fields, or as the raw body.").RefusedIn(edge.LayerTransport)

	// POST /v1/ocr.
	errUsageUnavailable = edge.NewProblem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"The read could not be recorded, so no result is returned and nothing is counted. Try again shortly.")
	errUsagePaused = edge.NewProblem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"Reads cannot be recorded right now, so none are made and nothing is counted. Try again after the time in Retry-After.")
	// errRecordsUnavailable is usage_unavailable for a quota the database
	// could not answer (guard reason "unavailable"): the records that
	// make a read are out of reach, which is not a used-up quota.
	errRecordsUnavailable = edge.NewProblem(http.StatusServiceUnavailable, "usage_unavailable", "Service unavailable",
		"Reads cannot be checked against your quota right now, so none are made and nothing is counted. Try again after the time in Retry-After.")
	errUpstream = edge.NewProblem(http.StatusBadGateway, "upstream_failed", "Bad gateway",
		"The OCR provider did not give a usable answer. Nothing was counted against your quota.")
	errMissingImage = edge.NewProblem(http.StatusBadRequest, "missing_image", "Bad request",
		"Send the image as the request body with an image/* Content-Type, or as multipart/form-data in the field \"image\".")
	errUnsupportedType = edge.NewProblem(http.StatusUnsupportedMediaType, "unsupported_media_type", "Unsupported media type",
		"Send a PNG, JPEG or WebP image whose Content-Type matches its contents.")
	errUndecodable = edge.NewProblem(http.StatusUnprocessableEntity, "undecodable_image", "Unprocessable image",
		"The image could not be decoded.")
	errTooManyPixels = edge.NewProblem(http.StatusUnprocessableEntity, "too_many_pixels", "Unprocessable image",
		"The image has more pixels, or a longer side, than this service accepts; scale it down.")
	// errClientGone is answered to nobody; its status (nginx's 499) keeps
	// disconnects apart from server errors in logs and metrics.
	errClientGone = edge.NewProblem(499, "client_closed_request", "Client closed request",
		"The client went away before the read started.")
	errBanned = edge.NewProblem(http.StatusForbidden, "banned", "Forbidden",
		"This account is suspended. Contact the operator of this service.").RefusedIn(edge.LayerAuth)
	errNoPlan = edge.NewProblem(http.StatusForbidden, "no_plan", "Forbidden",
		"Your account has no valid plan. Contact the operator of this service.").RefusedIn(edge.LayerAuth)
	errRateLimited = edge.NewProblem(http.StatusTooManyRequests, "rate_limited", "Too many requests",
		"Too many requests in a short time. Wait for the time in Retry-After.")
	errDailyLimit = edge.NewProblem(http.StatusTooManyRequests, "daily_limit", "Too many requests",
		"Your account has made too many requests today. It resets at midnight.")
	errQuotaExceeded = edge.NewProblem(http.StatusTooManyRequests, "quota_exceeded", "Too many requests",
		"Your monthly quota is used up; it resets at the start of next month.")
	errBudgetBusy = edge.NewProblem(http.StatusServiceUnavailable, "budget_busy", "Service busy",
		"The service is busy with other reads right now. Try again after the time in Retry-After.")
	errPausedByOperator = edge.NewProblem(http.StatusServiceUnavailable, "paused_by_operator", "Service paused",
		"The operator has paused this service. Try again later.")
	errBudgetPaused = edge.NewProblem(http.StatusServiceUnavailable, "budget_paused", "Service paused",
		"The service has reached its spending limit and is paused. Try again after the time in Retry-After.")
	// errRequestCeiling is budget_paused for the ceiling on requests per
	// day (budget.daily_requests), which is not money; it names no figure.
	errRequestCeiling = edge.NewProblem(http.StatusServiceUnavailable, "budget_paused", "Service paused",
		"The service has reached its ceiling on requests for today and is paused. Try again after the time in Retry-After.")

	// Idempotency-Key on POST /v1/ocr.
	errIdempotencyKeyInvalid = edge.NewProblem(http.StatusBadRequest, "idempotency_key_invalid", "Bad request",
		"Idempotency-Key must be 1 to 255 printable ASCII characters, once.")
	errIdempotencyKeyReused = edge.NewProblem(http.StatusUnprocessableEntity, "idempotency_key_reused", "Unprocessable request",
		"This Idempotency-Key was used with another image; use a new key for a new request.")
	errIdempotencyKeyInUse = edge.NewProblem(http.StatusConflict, "idempotency_key_in_use", "Conflict",
		"The first request with this Idempotency-Key is still in progress. Try again after the time in Retry-After.")

	// POST /v1/invites/verify. errInviteRefused is the one face of every
	// refusal that concerns the code: it carries no reason, no figure and
	// no hint of how many tries are left.
	errInviteRefused = edge.NewProblem(http.StatusForbidden, "invite_refused", "Forbidden",
		"This invite code cannot be used. Check it, or try again later.").RefusedIn(edge.LayerInvites)
	errInviteRateLimited = edge.NewProblem(http.StatusTooManyRequests, "rate_limited", "Too many requests",
		"Too many requests from your address in a short time. Wait for the time in Retry-After.").RefusedIn(edge.LayerInvites)
	errVerifyBody   = edge.BadRequest(`Send JSON {"code":"...","email":"..."}.`)
	errInvalidEmail = edge.NewProblem(http.StatusBadRequest, "invalid_email", "Bad request",
		"The e-mail address is not valid.")
	errVerifyTooLarge = edge.NewProblem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
		"The request body is larger than this endpoint accepts.")
	errInvitesUnavailable = edge.NewProblem(http.StatusServiceUnavailable, "invites_unavailable", "Service unavailable",
		"Invite codes cannot be checked right now. Try again shortly.")

	// The app's guarded routes ([[routes]]): proxied, and forward auth.
	// Their rate, burst and daily refusals are rate_limited and
	// daily_limit, as above, with Retry-After.
	errRouteTooLarge = edge.NewProblem(http.StatusRequestEntityTooLarge, "body_too_large", "Payload too large",
		"The request body is larger than this route accepts.")
	errRouteUpstream = edge.NewProblem(http.StatusBadGateway, "upstream_failed", "Bad gateway",
		"The application behind this route did not answer. Try again shortly.")
	errTooManyFailures = edge.NewProblem(http.StatusTooManyRequests, "too_many_failures", "Too many requests",
		"Too many failed attempts in a row. Wait for the time in Retry-After.")
	errUntrustedProxy = edge.NewProblem(http.StatusForbidden, "untrusted_proxy", "Forbidden",
		"Forward-auth checks are answered only to the proxies listed in server.trusted_proxies.")
	errRouteNotProxied = edge.NewProblem(http.StatusForbidden, "route_not_proxied", "Forbidden",
		"This route's fail limit is judged on the app's answers, which a forward-auth check never sees: the proxy must send the route's requests through Breakwater.")
	errClientIdentityHeader = edge.NewProblem(http.StatusBadRequest, "client_identity_header", "Bad request",
		"X-Breakwater-* headers are Breakwater's own; a client may not send them.")
	errBadForwardedURI = edge.NewProblem(http.StatusForbidden, "bad_forwarded_uri", "Forbidden",
		"The original method and URI of this check are missing, unreadable or contradictory, so it is refused.")
	errRouteNotFound = edge.NewProblem(http.StatusNotFound, "not_found", "Not found", "No guarded route has that name.")
)

// uniformProblem is the one answer of a route with
// [routes.fail] uniform_status: every failure of the app's that the fail
// limit counts, and every fail-limit refusal, with nothing that tells
// them apart.
func uniformProblem(status int) *edge.Problem {
	return edge.NewProblem(status, "request_refused", http.StatusText(status),
		"This request cannot be completed. Check it, or try again later.")
}
