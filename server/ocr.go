package server

import (
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/server/failpoint"
	"breakwater/storage"
)

// multipartSlack is what multipart framing may add around the image.
const multipartSlack = 64 << 10

var (
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
		"This account is suspended. Contact the operator of this service.")
	errNoPlan = problem(http.StatusForbidden, "no_plan", "Forbidden",
		"Your account has no valid plan. Contact the operator of this service.")
	errRateLimited = problem(http.StatusTooManyRequests, "rate_limited", "Too many requests",
		"Too many requests in a short time. Wait for the time in Retry-After.")
	errDailyLimit = problem(http.StatusTooManyRequests, "daily_limit", "Too many requests",
		"Your account has made too many requests today. It resets at midnight.")
	errQuotaExceeded = problem(http.StatusTooManyRequests, "quota_exceeded", "Too many requests",
		"Your monthly quota is used up; it resets at the start of next month.")
	errBudgetBusy = problem(http.StatusServiceUnavailable, "budget_busy", "Service busy",
		"The service is busy with other reads right now. Try again after the time in Retry-After.")
	errBudgetPaused = problem(http.StatusServiceUnavailable, "budget_paused", "Service paused",
		"The service has reached its spending limit and is paused for today. Try again after the time in Retry-After.")
)

// ocrResponse is the body of a successful read.
type ocrResponse struct {
	Serials   []string      `json:"serials"`
	Rejected  []string      `json:"rejected"`
	Quota     quotaResponse `json:"quota"`
	Simulated bool          `json:"simulated,omitempty"`
}

type quotaResponse struct {
	Limit     int64 `json:"limit"`
	Used      int64 `json:"used"`
	Remaining int64 `json:"remaining"`
}

// authenticate is layer 0: no valid API key or JWT, no entry. A token
// shaped like a JWT goes to the verifier when JWT sign-in is on; anything
// else to the keyring. Every failure gives the same 401 body; why a JWT was
// refused goes to the debug log and a metric, never to the client. It also
// tells whether the user is banned: for an API key that comes with the
// key's own lookup.
func (s *Server) authenticate(c echo.Context) (id Identity, banned bool, err error) {
	// Two Authorization headers are refused, not resolved: a proxy and the
	// server might each believe a different one.
	auth := c.Request().Header.Values(echo.HeaderAuthorization)
	if len(auth) != 1 {
		return Identity{}, false, errUnauthorized
	}
	token, ok := bearer(auth[0])
	if !ok {
		return Identity{}, false, errUnauthorized
	}
	if s.d.JWT != nil && IsJWT(token) {
		id, err := s.d.JWT.Verify(c.Request().Context(), token)
		if err != nil {
			reason := "other"
			var r *JWTRefusal
			if errors.As(err, &r) {
				reason = r.Reason
			}
			s.d.Metrics.jwt.WithLabelValues(reason).Inc()
			s.log.Debug("JWT refused", "reason", reason, "err", err, "request_id", requestID(c))
			return Identity{}, false, errUnauthorized
		}
		return id, s.d.Keys.Banned(id.UserID), nil
	}
	id, banned, ok = s.d.Keys.Authenticate(token)
	if !ok {
		return Identity{}, false, errUnauthorized
	}
	return id, banned, nil
}

// handleOCR reads serial numbers off one image. It walks the layers in
// DESIGN.md order; nothing that costs money runs before every check has
// passed, a refusal by layers 0-3 writes nothing to disk, and no result
// leaves before its usage record is on disk.
func (s *Server) handleOCR(c echo.Context) error {
	start := s.now()
	price := s.price.Load()
	id, plan, err := s.admit(c, start)
	if err != nil {
		return err
	}
	body, err := s.enter(id) // an in-flight slot and the body's memory
	if err != nil {
		return err
	}
	defer body.close()
	admitted := s.now()
	data, img, err := readValidImage(c.Request(), s.cfg, body)
	if err != nil {
		return err
	}
	now := s.now() // the upload may have taken a while
	worst := price.WorstCase(img.Width, img.Height)
	slot, reservation, err := s.reserve(id, plan, worst, now)
	if err != nil {
		return err
	}
	// Whatever happens from here on, even a panic, the quota slot is
	// either confirmed or given back.
	confirmed := false
	defer func() {
		if !confirmed {
			s.d.Quotas.Release(slot)
		}
	}()
	// Guard-check time: the layers' own work, without the upload, the
	// image check and the commit wait below.
	s.d.Metrics.guard.Observe((admitted.Sub(start) + s.now().Sub(now)).Seconds())

	// The claim is committed durably before the call, so that it still
	// counts after a crash (layer 3 fails open if the disk refuses).
	_ = s.defend(layerBudget, func() error {
		return s.d.Brake.Commit(context.WithoutCancel(c.Request().Context()), &reservation)
	}, isPaused)
	failpoint.Hit(failpoint.Reserved) // crash tests only: a kill between the reservation and the call
	if c.Request().Context().Err() != nil {
		// The client has gone before the call: nothing is spent, and
		// nobody reads this answer.
		s.settle(context.WithoutCancel(c.Request().Context()), reservation, 0)
		return errClientGone
	}

	// The expensive call. It is paid for once made, so a client that
	// hangs up now does not cancel it: its cost is still known and
	// recorded.
	//
	// A retry is a second paid call: it is claimed against the global
	// budget like the first, and made only if the claim fits. The busy
	// first call's cost is unknown, so its reservation keeps the worst
	// case; the retry's reservation is the one settled at the answer's
	// cost.
	callStart := s.now()
	var retry *budget.Reservation
	mayRetry := func() bool {
		r, ok := s.claimRetry(c, worst)
		if ok {
			retry = &r
		}
		return ok
	}
	res, err := s.d.Reader.Read(context.WithoutCancel(c.Request().Context()), img, mayRetry)
	latency := s.now().Sub(callStart) // the upstream's own time
	cost := price.Cost(res.Usage)
	if !res.Usage.Known() {
		cost = worst // billing unknown: keep the worst case
		if err == nil {
			s.log.Warn("the upstream answered without token usage: the call counts at its worst case",
				"request_id", requestID(c), "worst_micro_usd", worst)
		}
	} else if cost > worst {
		s.log.Warn("the upstream reported more tokens than the worst case allowed for: check ocr.price and the image limits",
			"request_id", requestID(c), "cost_micro_usd", cost, "worst_micro_usd", worst)
	}
	s.countCall(latency, res.Usage, err)
	event := storage.Event{
		Time: start, UserID: id.UserID, KeyID: id.KeyID, Plan: id.Plan, IP: c.RealIP(), Route: "/v1/ocr",
		Bytes: int64(len(data)), LatencyMS: latency.Milliseconds(),
		PromptTokens: res.Usage.PromptTokens, OutputTokens: res.Usage.CandidatesTokens + res.Usage.ThoughtsTokens,
		CostMicroUSD: cost,
	}
	// The read is paid for, so what follows is written even if the client
	// has gone.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), recordTimeout)
	defer cancel()
	if retry != nil {
		s.settle(ctx, reservation, reservation.Worst)
		reservation = *retry
	}
	if err != nil {
		s.d.Metrics.cost.Add(usd(cost))
		s.settle(ctx, reservation, cost)
		event.Outcome, event.Status, event.CostMicroUSD = "upstream_failed", http.StatusBadGateway, cost
		s.d.Events.Record(event)
		s.log.Warn("upstream read failed", "user", id.UserID, "request_id", requestID(c), "err", err)
		return errUpstream
	}

	// "$": the quota increment, the usage row and the budget settlement,
	// in one durable transaction before the answer.
	rec := storage.UsageRecord{
		Time: start, UserID: id.UserID, KeyID: id.KeyID, RequestID: requestID(c), Model: res.Model, Outcome: "ok",
		Bytes: int64(len(data)), PromptTokens: res.Usage.PromptTokens, CandidatesTokens: res.Usage.CandidatesTokens,
		ThoughtsTokens: res.Usage.ThoughtsTokens, CostMicroUSD: cost, LatencyMS: latency.Milliseconds(),
	}
	s.d.Metrics.cost.Add(usd(cost))
	commitStart := s.now()
	err = s.d.Usage.RecordUsage(ctx, slot.Month, rec, reservation.Settlement(cost))
	s.d.Metrics.commitLatency.Observe(s.now().Sub(commitStart).Seconds())
	if err != nil {
		s.settle(ctx, reservation, cost)
		event.Outcome, event.Status = "usage_unavailable", http.StatusServiceUnavailable
		s.d.Events.Record(event)
		s.usageOut.start(s.now())
		s.log.Error("usage record not written: result withheld, paid calls paused", "user", id.UserID, "request_id", rec.RequestID,
			"pause", usagePause, "err", err)
		s.alert(detect.KindUsageCommitFailed, "a usage record could not be written: results are withheld (503)",
			map[string]string{"user": id.UserID, "request_id": rec.RequestID, "error": err.Error()})
		return errUsageUnavailable
	}
	failpoint.Hit(failpoint.Recorded) // crash tests only: a kill between the usage record and the answer
	s.usageOut.end()
	s.d.Brake.Settled(reservation, cost)
	used := s.d.Quotas.Confirm(slot)
	confirmed = true
	event.Outcome, event.Status = "ok", http.StatusOK
	s.d.Events.Record(event)

	return c.JSON(http.StatusOK, ocrResponse{
		Serials:   nonNil(res.Serials),
		Rejected:  nonNil(res.Rejected),
		Quota:     quotaResponse{Limit: slot.Limit, Used: used, Remaining: max(slot.Limit-used, 0)},
		Simulated: res.Simulated,
	})
}

// usagePause is how long paid calls stop after a usage record could not be
// written. A failing or full disk would otherwise have every read paid for
// and then withheld (503).
const usagePause = 10 * time.Second

// pause holds paid calls off after a usage record failed. When it is over,
// one request alone goes through as a probe while the others keep waiting:
// its record succeeding ends the pause, failing starts the next. Safe for
// concurrent use.
type pause struct{ until atomic.Pointer[time.Time] } // nil: no pause

func (p *pause) start(now time.Time) {
	until := now.Add(usagePause)
	p.until.Store(&until)
}

// end lifts the pause, if there is one: a usage record was written.
func (p *pause) end() {
	if p.until.Load() != nil {
		p.until.Store(nil)
	}
}

// enter returns how long a request at now must wait; 0 lets it in. Times
// are compared on Go's monotonic clock, so a wall clock stepped back does
// not stretch the pause.
func (p *pause) enter(now time.Time) time.Duration {
	for {
		until := p.until.Load()
		if until == nil {
			return 0
		}
		if left := until.Sub(now); left > 0 {
			return min(left, usagePause)
		}
		next := now.Add(usagePause) // the others wait while the probe runs
		if p.until.CompareAndSwap(until, &next) {
			return 0
		}
	}
}

// admit runs what is checked before the body is read: layer 0 (who is it,
// banned, on which plan), layer 1 (rate and burst), and cheap looks at
// layers 2, 2b and 3, so that a user with nothing left today or this
// month, or a service whose brake is engaged, costs no upload. All from
// memory; the counting itself happens in reserve, after validation.
func (s *Server) admit(c echo.Context, now time.Time) (Identity, budget.Plan, error) {
	id, banned, err := s.authenticate(c)
	if err != nil {
		return Identity{}, budget.Plan{}, err
	}
	if banned {
		s.refused("auth", "banned")
		return Identity{}, budget.Plan{}, errBanned
	}
	plan, ok := s.d.Plans.Get(id.Plan)
	if !ok {
		// Counted, not logged per request: a plan removed by a reload
		// must not let its users flood the log. `usage` shows them.
		s.refused("auth", "no_plan")
		return Identity{}, budget.Plan{}, errNoPlan
	}
	if wait := s.usageOut.enter(now); wait > 0 {
		// Usage records are failing: a read now would be paid for and
		// withheld. Nothing is counted, not even a rate slot; no body is
		// read.
		s.refused("usage", "records_failing")
		return Identity{}, budget.Plan{}, errUsagePaused.withRetryAfter(ceilSeconds(wait))
	}
	err = s.defend(layerRate, func() error { return s.d.Limiter.Allow(id.UserID, now) }, isRateRefusal)
	if err == nil {
		err = s.defend(layerAttempts, func() error { return s.d.Attempts.Check(id.UserID, plan.DailyAttempts, now) }, isLineRefusal)
	}
	if err == nil {
		err = s.d.Quotas.Check(id.UserID, plan.MonthlyQuota, now)
	}
	if err == nil {
		err = s.defend(layerBudget, func() error { return s.d.Brake.Check(now) }, isPaused)
	}
	if err != nil {
		return Identity{}, budget.Plan{}, s.refusal(err)
	}
	return id, plan, nil
}

// readValidImage reads the upload into memory taken from mem and checks it
// cheaply: type sniffing and the image header only, nothing decoded.
func readValidImage(r *http.Request, cfg Config, mem *lease) ([]byte, ocr.Image, error) {
	data, declared, err := readImage(r, cfg.MaxImageBytes, cfg.MaxMultipartParts, mem)
	if err != nil {
		return nil, ocr.Image{}, err
	}
	img, err := ocr.Inspect(data, declared, ocr.Limits{MaxPixels: cfg.MaxImagePixels, MaxSide: cfg.MaxImageSide})
	switch {
	case errors.Is(err, ocr.ErrUnsupportedType):
		return nil, ocr.Image{}, errUnsupportedType
	case errors.Is(err, ocr.ErrTooManyPixels):
		return nil, ocr.Image{}, errTooManyPixels
	case err != nil:
		return nil, ocr.Image{}, errUndecodable
	}
	return data, img, nil
}

// reserve counts the attempt against the daily line (layer 2), reserves a
// read of the plan quota (layer 2b, fails closed) and claims the call's
// worst-case cost in the global budget (layer 3), all in memory. On a
// refusal nothing stays reserved.
func (s *Server) reserve(id Identity, plan budget.Plan, worst int64, now time.Time) (budget.Slot, budget.Reservation, error) {
	err := s.defend(layerAttempts, func() error { return s.d.Attempts.Take(id.UserID, plan.DailyAttempts, now) }, isLineRefusal)
	if err != nil {
		return budget.Slot{}, budget.Reservation{}, s.refusal(err)
	}
	slot, err := s.d.Quotas.Reserve(id.UserID, plan.MonthlyQuota, now)
	if err != nil {
		return budget.Slot{}, budget.Reservation{}, s.refusal(err)
	}
	var reservation budget.Reservation
	err = s.defend(layerBudget, func() (err error) {
		reservation, err = s.d.Brake.Claim(worst, now)
		return err
	}, isPaused)
	if err != nil {
		s.d.Quotas.Release(slot)
		return budget.Slot{}, budget.Reservation{}, s.refusal(err)
	}
	return slot, reservation, nil
}

// claimRetry claims a retry of the upstream call, one more call at worst
// micro-dollars, against the global budget, and commits the claim durably
// before the retry is made. A ceiling without room for it refuses the
// retry, never the request: the answer is then the first call's failure.
func (s *Server) claimRetry(c echo.Context, worst int64) (budget.Reservation, bool) {
	var r budget.Reservation
	err := s.defend(layerBudget, func() (err error) {
		r, err = s.d.Brake.Claim(worst, s.now())
		return err
	}, isPaused)
	if err != nil || r.Day == "" {
		// Refused, or the brake's machinery failed: a retry is never
		// worth an unclaimed call.
		s.log.Info("upstream retry skipped: the global budget has no room for it", "request_id", requestID(c))
		return budget.Reservation{}, false
	}
	s.d.Metrics.upstreamCalls.WithLabelValues("failed").Inc() // the busy first call
	_ = s.defend(layerBudget, func() error {
		return s.d.Brake.Commit(context.WithoutCancel(c.Request().Context()), &r)
	}, isPaused)
	return r, true
}

// countCall feeds one upstream call into the metrics.
func (s *Server) countCall(d time.Duration, u ocr.Usage, err error) {
	m := s.d.Metrics
	outcome := "ok"
	if err != nil {
		outcome = "failed"
	}
	m.upstreamCalls.WithLabelValues(outcome).Inc()
	m.upstreamLatency.Observe(d.Seconds())
	m.tokens.WithLabelValues("prompt").Add(float64(u.PromptTokens))
	m.tokens.WithLabelValues("output").Add(float64(u.CandidatesTokens))
	m.tokens.WithLabelValues("thoughts").Add(float64(u.ThoughtsTokens))
}

// settle closes a budget reservation whose call did not end in a usage
// record. If that write fails too, the reservation keeps counting at its
// worst case, which errs on the safe side.
func (s *Server) settle(ctx context.Context, r budget.Reservation, cost int64) {
	if err := s.d.Brake.Settle(ctx, r, cost); err != nil {
		s.failOpen.note(layerBudget, err)
	}
}

// refusal counts a refusal by layers 1-3 and turns it into the problem
// users see. The problems carry no figure of any threshold.
func (s *Server) refusal(err error) error {
	var (
		rl *limiter.Refusal
		le *budget.LineError
		qe *budget.QuotaError
		pe *budget.PausedError
	)
	switch {
	case errors.As(err, &rl):
		s.refused(layerRate, rl.Reason)
		return errRateLimited.withRetryAfter(rl.RetryAfterSeconds())
	case errors.As(err, &le):
		s.refused(layerAttempts, "daily_line")
		return errDailyLimit.withRetryAfter(ceilSeconds(le.RetryAfter))
	case errors.As(err, &qe):
		s.refused(layerQuota, "monthly_quota")
		return errQuotaExceeded.withRetryAfter(ceilSeconds(qe.RetryAfter))
	case errors.As(err, &pe) && pe.Busy:
		// Only the worst cases of calls in flight block this one: the
		// brake is not engaged, and a retry in seconds may fit.
		s.refused(layerBudget, pe.Ceiling+"_in_flight")
		return errBudgetBusy.withRetryAfter(ceilSeconds(pe.RetryAfter))
	case errors.As(err, &pe):
		s.refused(layerBudget, pe.Ceiling)
		if pe.Ceiling != "manual" { // the operator's own switch needs no alert
			s.alert(detect.KindBrakeEngaged, "the global budget brake is engaged: upstream calls are refused (503)",
				map[string]string{"ceiling": pe.Ceiling, "retry_after": pe.RetryAfter.Round(time.Second).String()})
		}
		return errBudgetPaused.withRetryAfter(ceilSeconds(pe.RetryAfter))
	}
	return err
}

func (s *Server) refused(layer, reason string) {
	s.d.Metrics.refusals.WithLabelValues(layer, reason).Inc()
	s.refusalsToday.add(s.calendar.Day(s.now()), layer, reason)
}

// readImage returns the uploaded image and its declared media type, from a
// raw body or from the multipart field "image". The image is held to max
// bytes without reading further, a form to maxParts parts. Its memory is
// taken from mem first: a declared length before a byte is read, so that
// an upload that cannot fit is refused at once; an unknown length as its
// bytes arrive.
func readImage(r *http.Request, max int64, maxParts int, mem *lease) (data []byte, declared string, err error) {
	ct := r.Header.Get(echo.HeaderContentType)
	mt, params, _ := mime.ParseMediaType(ct)
	multi := mt == "multipart/form-data"
	if !multi && r.ContentLength > max {
		return nil, "", errTooLarge
	}
	var body io.Reader = r.Body
	if r.ContentLength > 0 {
		if err := mem.need(min(r.ContentLength, max)); err != nil {
			return nil, "", err
		}
	} else {
		body = &arrivals{r: body, mem: mem, max: max}
	}
	if multi {
		return readMultipartImage(body, params["boundary"], max, r.ContentLength, maxParts, mem)
	}
	data, err = readAtMost(body, max, r.ContentLength, mem)
	if err != nil {
		return nil, "", err
	}
	return data, ct, nil
}

// readMultipartImage reads the field "image" of a form of at most maxParts
// parts (each part, even an empty one, costs a header parse), and then the
// rest of the form, so that the body ends and its connection can be
// reused. size is the body's declared length, -1 if unknown.
func readMultipartImage(body io.Reader, boundary string, max, size int64, maxParts int, mem *lease) ([]byte, string, error) {
	if boundary == "" {
		return nil, "", errMissingImage
	}
	mr := multipart.NewReader(body, boundary)
	for parts := 1; ; parts++ {
		part, err := mr.NextPart()
		if err == io.EOF {
			return nil, "", errMissingImage
		}
		if err != nil {
			return nil, "", bodyError(err, errMissingImage)
		}
		if parts > maxParts {
			return nil, "", errTooManyParts
		}
		if part.FormName() != "image" {
			continue // NextPart discards the rest of this part
		}
		data, err := readAtMost(part, max, size, mem)
		if err != nil {
			return nil, "", err
		}
		declared := part.Header.Get(echo.HeaderContentType)
		for parts++; ; parts++ {
			if _, err := mr.NextPart(); err != nil {
				break // the image is whole; a broken end does not matter
			}
			if parts > maxParts {
				return nil, "", errTooManyParts
			}
		}
		return data, declared, nil
	}
}

// firstBuffer is readAtMost's first buffer for a body of unknown length.
const firstBuffer = 64 << 10

// readAtMost reads r to its end, refusing more than limit bytes and an empty
// body. size is what the body declared, -1 if unknown: a declared size is
// read into one buffer of that size, an unknown one into a buffer that
// doubles as bytes arrive. Each buffer's bytes are taken from mem before
// it is made, so memory grows with the bytes that actually arrive, never
// with what a Content-Length header merely claims beyond mem's lease.
func readAtMost(r io.Reader, limit, size int64, mem *lease) ([]byte, error) {
	n := min(limit, firstBuffer)
	if size >= 0 {
		n = min(limit, size)
	}
	buf, err := grow(nil, n, mem)
	if err != nil {
		return nil, err
	}
	for {
		if len(buf) == cap(buf) {
			// Full: does the body end here?
			var one [1]byte
			n, err := io.ReadAtLeast(r, one[:], 1)
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, bodyError(err, errBadBody)
			}
			if int64(len(buf)) >= limit {
				return nil, errTooLarge
			}
			if buf, err = grow(buf, min(limit, max(2*int64(cap(buf)), firstBuffer)), mem); err != nil {
				return nil, err
			}
			buf = append(buf, one[:n]...)
			continue
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, bodyError(err, errBadBody)
		}
	}
	if len(buf) == 0 {
		return nil, errMissingImage
	}
	return buf, nil
}

// grow returns buf copied into a buffer of capacity n, whose bytes it
// takes from mem first.
func grow(buf []byte, n int64, mem *lease) ([]byte, error) {
	if err := mem.need(n); err != nil {
		return nil, err
	}
	out := make([]byte, len(buf), n)
	copy(out, buf)
	return out, nil
}

var errBadBody = problem(http.StatusBadRequest, "bad_body", "Bad request", "The request body could not be read.")

// bodyError maps an error of reading the body to its problem, other for
// any that is not the body limit, the upload rate or the body memory.
func bodyError(err error, other *Problem) error {
	var p *Problem
	switch {
	case isTooLarge(err):
		return errTooLarge
	case errors.Is(err, errReadTooSlow):
		return errUploadTooSlow
	case errors.As(err, &p):
		return p
	}
	return other
}

func requestID(c echo.Context) string { return c.Response().Header().Get(echo.HeaderXRequestID) }

// ceilSeconds rounds d up to whole seconds, at least 1.
func ceilSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
