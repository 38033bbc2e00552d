package api

import (
	"time"

	"breakwater/detect"
	"breakwater/server/edge"
	"breakwater/server/guard"
)

// The public API's refusals are counted by the edge as they are answered
// (edge.Edge.CountRefusal); this file turns the guard's refusals into the
// problems answered and names the label sets that exist from start.

// knownRefusals are the label sets of breakwater_refusals_total that exist
// from start, at zero, so that an alert rule needs no absent().
var knownRefusals = map[string][]string{
	guard.LayerRate:     {"rate", "burst"},
	guard.LayerAttempts: {"daily_line"},
	guard.LayerQuota:    {"monthly_quota", guard.ReasonUnavailable},
	guard.LayerUsage:    {"records_failing", "ledger_failing"},
	guard.LayerBudget:   {"manual", "daily_requests", "daily_usd", "monthly_usd", "daily_usd_in_flight", "monthly_usd_in_flight"},
	edge.LayerAuth:      {edge.ErrUnauthorized.Code, errBanned.Code, errNoPlan.Code},
	edge.LayerTransport: {edge.ErrTooManyInFlight.Code, edge.ErrServerBusy.Code, edge.ErrUploadTooSlow.Code, errTooManyParts.Code,
		"max_connections", "max_header_lines", "max_header_memory"},
	edge.LayerInput: {edge.ErrTooLarge.Code, edge.ErrBadBody.Code, errMissingImage.Code, errUnsupportedType.Code,
		errUndecodable.Code, errTooManyPixels.Code, errInvalidEmail.Code, "bad_request"},
	edge.LayerInvites: {errInviteRefused.Code, errInviteRateLimited.Code},
}

// routeRefusal is refusal for a guarded route: the problem of the guard's
// refusal, counted under the route's layer ("route:NAME").
func (s *Server) routeRefusal(layer string, r *guard.Refusal) error {
	p, retry := refusalProblem(r)
	return p.Refusal(retry, layer, r.Reason, time.Time{})
}

// refusal turns a refusal by layers 1-3 at now into the problem users
// see, counted under the guard's layer and reason, in now's day, when it
// is answered. The problems carry no figure of any threshold.
func (s *Server) refusal(r *guard.Refusal, now time.Time) error {
	p, retry := refusalProblem(r)
	return p.Refusal(retry, r.Layer, r.Reason, now)
}

// refusalProblem is the problem of a refusal by layers 1-3 and its
// Retry-After, in seconds.
func refusalProblem(r *guard.Refusal) (*edge.Problem, int) {
	retry := ceilSeconds(r.RetryAfter)
	switch {
	case r.Layer == guard.LayerRate:
		return errRateLimited, retry
	case r.Layer == guard.LayerAttempts:
		return errDailyLimit, retry
	case r.Layer == guard.LayerQuota && r.Reason == guard.ReasonUnavailable:
		// The database did not answer: the service's failure, not the
		// user's quota (counted as quota/unavailable).
		return errRecordsUnavailable, retry
	case r.Layer == guard.LayerQuota:
		return errQuotaExceeded, retry
	case r.Layer == guard.LayerUsage:
		return errUsagePaused, retry
	case r.Busy:
		// Only the worst cases of calls in flight block this one: the
		// brake is not engaged, and a retry in seconds may fit.
		return errBudgetBusy, retry
	case r.Reason == "manual":
		return errPausedByOperator, retry
	case r.Reason == "daily_requests":
		return errRequestCeiling, retry
	}
	return errBudgetPaused, retry
}

// refusedBy is the guard's hook on each refusal: it raises the brake
// alert when a budget ceiling or the operator's switch holds (for the
// switch, the alert confirms that calls are really refused). The refusal
// is counted when it is answered, not here.
func (s *Server) refusedBy(r *guard.Refusal) {
	if r.Layer == guard.LayerBudget && !r.Busy {
		// The ceiling's value and the count go to the operator only; the
		// refusal answered to the client names no figure.
		// Made once per alert, not on every refusal of a flood.
		reason := r.Reason
		s.alertWith(detect.KindBrakeEngaged, func() (string, map[string]string) {
			now := s.now()
			figures := CountedFigures(s.d.Budget.Counted(now)) // what the brake decided on
			if reason == "manual" {
				figures = Figures(s.d.Budget.Status(now)) // no ceiling: what was made
			}
			return detect.BrakeAlert(reason, figures, now, s.d.Operator.Location())
		})
	}
}
