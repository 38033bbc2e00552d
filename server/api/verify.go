package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/server/edge"
	"breakwater/server/invites"
)

// maxVerifyBody is the largest POST /v1/invites/verify body: a code and
// an e-mail fit many times over.
const maxVerifyBody = 4 << 10

// verifyRoute is the route as recorded in statistics events.
const verifyRoute = "/v1/invites/verify"

// Reasons an invite verification is refused, as in logs, statistics
// events and breakwater_invite_refusals_total{reason}. Besides these the
// metric counts the limiter's "rate" and "burst" (429), and the fail
// limiter's "cooldown", "in_flight", "global" and "capacity".
const (
	reasonInvalid = "invalid" // no invite has that code (malformed codes too)
	reasonExpired = "expired"
	reasonUsedUp  = "used_up"
	reasonRevoked = "revoked"
)

// verifyRequest is the body of POST /v1/invites/verify.
type verifyRequest struct {
	Code  string `json:"code"`
	Email string `json:"email"`
}

// decodeVerifyRequest reads one JSON object with string fields code and
// email, and nothing after it. Unknown fields are ignored.
func decodeVerifyRequest(r io.Reader) (verifyRequest, error) {
	var req verifyRequest
	dec := json.NewDecoder(r)
	if err := dec.Decode(&req); err != nil {
		if edge.IsTooLarge(err) {
			return req, errVerifyTooLarge
		}
		return req, errVerifyBody
	}
	if _, err := dec.Token(); err != io.EOF {
		if edge.IsTooLarge(err) {
			return req, errVerifyTooLarge
		}
		return req, errVerifyBody
	}
	return req, nil
}

// handleVerifyInvite checks an invite code for an e-mail and redeems one
// use. The protections run in the order of docs/DESIGN.md: the IP rate limit
// and burst (429 with Retry-After), then the fail limit per IP and per
// e-mail, then the service-wide net. Every refusal that concerns the code
// gives errInviteRefused, byte for byte, after the same work, so that
// neither the answer nor its time tells one class from another (an
// unknown code, an expired, used-up or revoked one, a cooldown or the net
// holding, the right code included): the fail limit is asked, the code
// normalised, hashed and looked up, the outcome decided at the end, and
// the attempt ended, a failure recorded or, for an attempt the limit
// refused, the same work done on nothing (limiter.FailLimiter.EndRefused).
// Only a redemption writes to the database on the way. A refusal of the
// IP limit is remembered until its retry-after (checkFloods) and its
// repeats answered from memory; a cooldown is not, as its repeats would
// then be answered sooner than a failure.
func (s *Server) handleVerifyInvite(c echo.Context) error {
	start := s.now()
	ip := c.RealIP()
	ipKey := "ip:" + limiter.ClientKey(ip)

	// 1. The IP rate limit and burst, in memory; fails open.
	if r, _ := s.checkFloods(s.invitesOpen, invites.Layer, ipKey, start, func() error { return s.inviteLimits.Windows.Allow(ipKey, start) }); r != nil &&
		!s.inviteShadowed(start, ip, "", r.Reason) {
		s.recordInviteLayer(start, ip, "", detect.OutcomeLayerRefused)
		s.d.Metrics.inviteRefusals.WithLabelValues(r.Reason).Inc()
		return errInviteRateLimited.WithRetryAfter(ceilSeconds(r.RetryAfter))
	}

	req, err := decodeVerifyRequest(c.Request().Body)
	if err != nil {
		return err
	}
	// The e-mail is judged before the code is looked at, so this answer
	// depends on the e-mail alone and says nothing about the code.
	email, ok := invites.NormaliseEmail(req.Email)
	if !ok {
		return errInvalidEmail
	}
	code := invites.NormaliseCode(req.Code)
	hash := s.d.InviteKey.Hash(code)

	// 2 and 3. The fail limit per IP and per e-mail, and the service-wide
	// net: checked and counted in one step.
	var attempt *limiter.Attempt
	keys := []string{ipKey, "email:" + email}
	refused := s.invitesOpen.Check(func() (err error) {
		attempt, err = s.inviteLimits.Fails.Begin(keys, start)
		return err
	})
	defer attempt.Cancel() // a no-op once the attempt has an outcome
	refuse := refused != nil && !s.inviteShadowed(start, ip, email, refused.Reason)

	// The lookup runs whatever the fail limit said: a refusal decided
	// before it would be answered a lookup sooner.
	outcome, lookupErr := s.d.InviteCodes.CheckInvite(hash, email, start)
	if !invites.WellFormed(code) {
		outcome = invites.InviteUnknown
	}
	switch {
	case refuse:
		s.endAttempt(start, attempt, refused != nil, keys)
		return s.inviteRefusal(c, start, refused.Reason, email)
	case lookupErr != nil:
		s.log.Error("invite lookup failed", "request_id", requestID(c), "err", lookupErr)
		return errInvitesUnavailable
	case outcome == invites.InviteRedeemed:
		// Decide again and write in one transaction: the lookup may be
		// stale by now.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), recordTimeout)
		defer cancel()
		outcome, err = s.d.InviteCodes.RedeemInvite(ctx, hash, email, start)
		if err != nil {
			s.log.Error("invite redemption not written", "request_id", requestID(c), "err", err)
			return errInvitesUnavailable
		}
	}
	if !outcome.OK() {
		s.endAttempt(start, attempt, refused != nil, keys)
		return s.inviteRefusal(c, start, outcome.String(), email)
	}
	// Only a new redemption clears (or shortens) the run. An e-mail
	// verifying again a code it has redeemed is let in, so a user who
	// retries is answered the same, but it proves nothing new and is
	// neutral: as a success, one redeemed code would clear the run at
	// will between guesses.
	if outcome == invites.InviteRedeemed {
		attempt.Succeed(s.now())
	} else {
		attempt.Neutral()
	}
	s.recordVerify(c, start, email, "ok", http.StatusOK)
	s.log.Info("invite verified", "outcome", outcome.String(), "ip", ip, "request_id", requestID(c))
	return c.JSON(http.StatusOK, map[string]bool{"valid": true})
}

// endAttempt ends a refused verification's attempt on keys: a failure
// recorded for an attempt the fail limit began (its cooldowns started go
// to the statistics, and the net tripping raises the alert), or, for one
// it refused (limited; shadow mode may have let it through), the same
// work done on nothing, so that the two take as long. An attempt the
// limit could not decide (failed open) has nothing to end.
func (s *Server) endAttempt(start time.Time, attempt *limiter.Attempt, limited bool, keys []string) {
	if limited {
		s.inviteLimits.Fails.EndRefused(keys, s.now())
		return
	}
	tripped := attempt.Fail(s.now())
	for _, key := range attempt.CooldownsStarted() {
		s.recordCooldownStart(start, key)
	}
	if tripped {
		s.log.Warn("invite service-wide net tripped: every verification is refused", "failures_last_hour", s.inviteLimits.Fails.GlobalFailures(s.now()))
		s.alert(detect.KindInviteNet, "invite verification is refusing every request: failures service-wide in the last hour passed invites.global_fail_per_hour, which looks like a distributed guessing attack",
			map[string]string{"failures_last_hour": strconv.Itoa(s.inviteLimits.Fails.GlobalFailures(s.now()))})
	}
}

// inviteRefusal counts and records the precise reason, logs it, and
// answers with the one face. The log gets at most one line per
// edge.RefusalLogInterval, which says how many it held back; the metric and
// the statistics count every refusal.
func (s *Server) inviteRefusal(c echo.Context, start time.Time, reason, email string) error {
	s.d.Metrics.inviteRefusals.WithLabelValues(reason).Inc()
	s.recordVerify(c, start, email, reason, errInviteRefused.Status)
	if ok, held := s.refusalLog.Allow(start, edge.RefusalLogInterval); ok {
		s.log.Info("invite refused", "reason", reason, "ip", c.RealIP(), "email", email, "request_id", requestID(c), "held_back", held)
	}
	return errInviteRefused
}

// inviteShadowed reports whether the invite protections are in shadow
// mode, and if so counts and records the refusal they would have made:
// the verification goes on, and a refused check counted nothing.
func (s *Server) inviteShadowed(start time.Time, ip, email, reason string) bool {
	if !s.inviteLimits.Shadow() {
		return false
	}
	s.shadowed(start, invites.Layer, reason)
	s.recordInviteLayer(start, ip, email, detect.OutcomeShadowRefused)
	return true
}

// recordInviteLayer records a verification the IP rate limit refused, or
// a would-be refusal in shadow mode, for the recorder's per-minute tally.
func (s *Server) recordInviteLayer(start time.Time, ip, email, outcome string) {
	s.d.Events.Record(detect.Event{Time: start, UserID: email, IP: ip, Route: verifyRoute, Layer: invites.Layer, Outcome: outcome})
}

// recordCooldownStart records that a failure started a cooldown on a fail
// key ("ip:ADDR" or "email:ADDR"), for the invite brute-force detector;
// the recorder counts it into its tally.
func (s *Server) recordCooldownStart(start time.Time, key string) {
	e := detect.Event{Time: start, Route: verifyRoute, Outcome: detect.OutcomeCooldownStarted}
	switch {
	case strings.HasPrefix(key, "ip:"):
		e.IP = strings.TrimPrefix(key, "ip:")
	case strings.HasPrefix(key, "email:"):
		e.UserID = strings.TrimPrefix(key, "email:")
	default:
		return
	}
	s.d.Events.Record(e)
}

// recordVerify records a statistics event of an invite check. There is no
// user yet, so the event's UserID holds the normalised e-mail: detection
// counts cooldowns per e-mail from it. The recorder stores a check that
// passed as it is and counts a refusal into its bounded tally.
func (s *Server) recordVerify(c echo.Context, start time.Time, email, outcome string, status int) {
	s.d.Events.Record(detect.Event{
		Time: start, UserID: email, IP: c.RealIP(), Route: verifyRoute, Outcome: outcome, Status: status,
		Bytes: c.Request().ContentLength, LatencyMS: s.now().Sub(start).Milliseconds(),
	})
}
