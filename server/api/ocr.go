package api

import (
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/server/edge"
	"breakwater/server/failpoint"
	"breakwater/server/guard"
	"breakwater/server/jwtauth"
	"breakwater/server/keys"
)

// multipartSlack is what multipart framing may add around the image.
const multipartSlack = 64 << 10

// ocrResponse is the body of a successful read.
type ocrResponse struct {
	Serials   []string      `json:"serials"`
	Rejected  []string      `json:"rejected"`
	Quota     quotaResponse `json:"quota"`
	Model     string        `json:"model,omitempty"` // the model that read it: ocr.model or ocr.fallback_model; none when cached
	Simulated bool          `json:"simulated,omitempty"`
	Cached    bool          `json:"cached,omitempty"` // answered from the dedupe window, without a call
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
func (s *Server) authenticate(c echo.Context) (id keys.Identity, banned bool, err error) {
	// Two Authorization headers are refused, not resolved: a proxy and the
	// server might each believe a different one.
	auth := c.Request().Header[echo.HeaderAuthorization] // canonical already: not checked again
	if len(auth) != 1 {
		return keys.Identity{}, false, edge.ErrUnauthorized
	}
	token, ok := edge.Bearer(auth[0])
	if !ok {
		return keys.Identity{}, false, edge.ErrUnauthorized
	}
	if s.d.JWT != nil && jwtauth.IsJWT(token) {
		id, err := s.d.JWT.Verify(c.Request().Context(), token)
		if err != nil {
			reason := "other"
			var r *jwtauth.Refusal
			if errors.As(err, &r) {
				reason = r.Reason
			}
			s.d.Metrics.jwt.WithLabelValues(reason).Inc()
			s.log.Debug("JWT refused", "reason", reason, "err", err, "request_id", requestID(c))
			return keys.Identity{}, false, edge.ErrUnauthorized
		}
		return id, s.d.Keys.Banned(id.UserID), nil
	}
	id, banned, ok = s.d.Keys.Authenticate(token)
	if !ok {
		return keys.Identity{}, false, edge.ErrUnauthorized
	}
	return id, banned, nil
}

// ocrRequest is one POST /v1/ocr as its steps work on it, built once
// after layer 0: who asks and under which plan, from where, since when,
// and the lines the guard checks. The Echo context stays in it for the
// body, the answer and the client's going away only.
type ocrRequest struct {
	c     echo.Context
	id    string    // the request id
	ip    string    // the client's address, from trusted proxies only
	start time.Time // when the handler took the request: the time of its records
	who   keys.Identity
	plan  budget.Plan
	guard guard.Request // the layers' key and lines
	key   string        // the Idempotency-Key; "": none
	kept  bool          // an answer was kept under key (and the key's claim given back with it)
}

// newOCRRequest establishes who is asking (layer 0) and reads the
// Idempotency-Key, into one request value.
func (s *Server) newOCRRequest(c echo.Context) (ocrRequest, error) {
	start := s.now()
	id, plan, err := s.identify(c) // layer 0
	if err != nil {
		return ocrRequest{}, err
	}
	key, err := idempotencyKey(c.Request().Header)
	if err != nil {
		return ocrRequest{}, err
	}
	ip := c.RealIP()
	return ocrRequest{
		c: c, id: requestID(c), ip: ip, start: start, who: id, plan: plan, key: key,
		guard: guard.Request{Key: id.UserID, DailyLine: plan.DailyAttempts, MonthlyQuota: plan.MonthlyQuota,
			ShadowDaily: plan.ShadowDaily(), Client: limiter.ClientKey(ip), Route: ocrRoute, Plan: id.Plan},
	}, nil
}

// handleOCR reads serial numbers off one image. It walks the layer table
// of README.md: nothing that costs money runs before every check has
// passed, a refusal by layers 0-3 writes nothing to disk, and no result
// leaves before its usage record is on disk. A repeat of an idempotent
// request, or the same image again within the dedupe window, is answered
// from what the first read's usage transaction kept, without a call.
//
// The guard's admission (guard.Admission) carries the request through its
// steps and decides at each what is counted, written and given back; the
// handler only says which step it has reached.
func (s *Server) handleOCR(c echo.Context) error {
	req, err := s.newOCRRequest(c)
	if err != nil {
		return err
	}
	r := &req
	if r.key != "" {
		if !s.pending.acquire(r.who.UserID, r.key) {
			return errIdempotencyKeyInUse.WithRetryAfter(1)
		}
		defer s.pending.release(r.who.UserID, r.key)
	}
	a, refused := s.admit(r) // layers 1-3 from memory, before the body
	if refused != nil {
		return s.refusalOf(r.guard, r.start, refused)
	}
	defer a.Release() // whatever happens from here on, a panic too
	in, err := s.receive(r)
	if err != nil {
		return s.end(r, a, s.now(), err) // a bad upload counts against the rate as any other
	}
	defer in.mem.Close()
	if r.key != "" {
		return s.readKeyed(r, a, in)
	}
	return s.readOnce(r, a, in)
}

// admit is the guard's first step: for a plain request layer 1 and the
// looks at layers 2, 2b and 3; for a keyed one only layer 1, since a
// repeat uses nothing else.
func (s *Server) admit(r *ocrRequest) (*guard.Admission, *guard.Refusal) {
	if r.key != "" {
		return s.guard.AdmitKeyed(r.guard, r.start)
	}
	return s.guard.Admit(r.guard, r.start)
}

// end ends r without a call, answering it with answer unless the guard
// refuses it now (layer 1, counting the request as it ends).
func (s *Server) end(r *ocrRequest, a *guard.Admission, now time.Time, answer error) error {
	if refused := a.End(now); refused != nil {
		return s.refusalOf(r.guard, now, refused)
	}
	return answer
}

// readKeyed goes on with a request that has an Idempotency-Key once its
// upload is in: a repeat is answered with the stored answer; a key
// another instance holds is told to wait (409); a first request is looked
// at by layers 2, 2b and 3 and read as any other.
func (s *Server) readKeyed(r *ocrRequest, a *guard.Admission, in received) error {
	now := in.end // the upload may have taken a while
	if stored, ok := s.storedAnswer(r.who.UserID, r.key, now); ok {
		return s.replayStored(r, a, stored, in, now)
	}
	claimed, err := s.claimKey(r) // the other instances
	if err != nil {
		return s.end(r, a, now, err)
	}
	if claimed {
		defer s.releaseKey(r)
	}
	if s.d.Claims != nil {
		// Kept by another instance between the look and the claim?
		if stored, ok := s.storedAnswer(r.who.UserID, r.key, now); ok {
			return s.replayStored(r, a, stored, in, now)
		}
	}
	if refused := a.Look(now); refused != nil {
		return s.refusalOf(r.guard, now, refused)
	}
	return s.readOnce(r, a, in)
}

// replayStored ends a repeat of r's key, answering it with stored, the
// answer kept under it: byte for byte when it is for the same image, 422
// otherwise; unless the guard refuses it now (layer 1, counting it).
func (s *Server) replayStored(r *ocrRequest, a *guard.Admission, stored budget.Answer, in received, now time.Time) error {
	if refused := a.End(now); refused != nil {
		return s.refusalOf(r.guard, now, refused)
	}
	if stored.Fingerprint != in.fp {
		return errIdempotencyKeyReused
	}
	return s.replay(r, stored)
}

// readOnce answers the image from the dedupe window when it was read
// within it, and reads it otherwise. While the same user's read of the same
// image is under way, the request waits for that read's answer rather than
// paying for its own: a client that sends one image several times at once
// is billed once. If that read fails (or is refused), the waiters wake,
// find no answer and one of them reads the image in turn, so each
// attempt is still the request's own; a waiter whose client goes away
// stops waiting (499). The waiters are bounded by max_in_flight_per_user,
// since each holds one of its user's slots.
func (s *Server) readOnce(r *ocrRequest, a *guard.Admission, in received) error {
	if s.d.Answers == nil || s.d.DedupeWindow <= 0 {
		return s.read(r, a, in, in.end)
	}
	for now := in.end; ; now = s.now() { // after a wait, the time again
		if cached, ok := s.recentRead(r.who.UserID, in.fp, now); ok {
			if refused := a.End(now); refused != nil {
				return s.refusalOf(r.guard, now, refused)
			}
			return s.answerCached(r, cached, now)
		}
		done, wait := s.reading.lead(r.who.UserID, in.fp)
		if wait == nil {
			defer done()
			return s.read(r, a, in, now)
		}
		select {
		case <-wait:
		case <-r.c.Request().Context().Done():
			// It was let in and uploaded: it counts, though no one hears the answer.
			return s.refusalOf(r.guard, s.now(), a.Gone(r.c.Request().Context(), s.now()))
		}
	}
}

// received is a validated upload and what it took to receive it.
type received struct {
	data []byte
	img  ocr.Image
	fp   [32]byte
	mem  *edge.Lease
	at   time.Time // when the guard's checks before the body ended
	end  time.Time // when the upload was read and checked
}

// receive takes an in-flight slot and the body's memory, reads the upload
// and checks it cheaply: type sniffing and the image header. The caller
// closes mem.
func (s *Server) receive(r *ocrRequest) (received, error) {
	mem, err := s.edge.Enter(r.who)
	if err != nil {
		return received{}, err
	}
	in := received{mem: mem, at: s.now()}
	in.data, in.img, err = readValidImage(r.c.Request(), s.cfg, mem)
	if err != nil {
		mem.Close()
		return received{}, err
	}
	in.fp = fingerprint(in.img)
	in.end = s.now()
	return in, nil
}

// read makes the paid call for an admitted, validated upload: layers 2,
// 2b and 3 take their share, the claim goes to disk before the call, and
// the usage record (with what a repeat needs) before the answer. now is
// when the upload was in (or a read of the same image ended); the clock
// is read once per step after it: the checks, the claim's commit, the
// call.
func (s *Server) read(r *ocrRequest, a *guard.Admission, in received, now time.Time) error {
	c := s.choose(r, now)
	ctx := context.WithoutCancel(r.c.Request().Context()) // a paid call outlives its client
	if refused := s.reserve(a, c, in.img, now); refused != nil {
		return s.refusalOf(r.guard, now, refused)
	}
	checked := s.now()
	s.d.Metrics.guard.Observe((in.at.Sub(r.start) + checked.Sub(now)).Seconds())
	refused := a.Commit(ctx, checked)
	committed := s.now()
	s.d.Metrics.reserveLatency.Observe(committed.Sub(checked).Seconds())
	s.d.Metrics.guardOverhead.Observe((in.at.Sub(r.start) + committed.Sub(now)).Seconds())
	model, price := s.decided(a, c, committed) // the side of the soft line is the committed claim's
	worst := price.WorstCase(in.img.Width, in.img.Height)
	if refused != nil {
		if refused.Fault != nil {
			// The write failed: the one case that is a fault. A ceiling
			// another instance reached first is the brake's answer alone.
			s.log.Error("budget reservation not written: no call made, paid calls paused", "user", r.who.UserID, "request_id", r.id,
				"pause", guard.UsagePause, "err", refused.Fault)
			s.alert(detect.KindUsageCommitFailed, "a budget reservation could not be written: calls are refused (503) until the disk takes writes",
				map[string]string{"user": r.who.UserID, "request_id": r.id, "error": refused.Fault.Error()})
		}
		return s.refusalOf(r.guard, now, refused)
	}
	failpoint.Hit(failpoint.Reserved) // crash tests only: a kill between the reservation and the call
	if r.c.Request().Context().Err() != nil {
		return s.refusalOf(r.guard, now, a.Gone(ctx, now)) // gone before the call: nothing is spent
	}

	// The expensive call, with its one retry claimed like the call. It
	// starts when the reservation is committed: only a check lies between.
	requestID := r.id // the closure holds the id, not the request
	res, err := s.d.Reader.ReadModel(ctx, model, in.img, func() bool { return s.claimRetry(ctx, requestID, model, a, worst) })
	res.Model = model // the configured name, as it was priced: answers, usage rows and metrics agree
	called := s.now()
	latency := called.Sub(committed)
	cost := s.callCost(r.id, price, res.Usage, err, worst)
	s.countCall(model, latency, res.Usage, err)
	s.d.Metrics.cost.Add(usd(cost))
	event := detect.Event{
		Time: r.start, UserID: r.who.UserID, KeyID: r.who.KeyID, Plan: r.who.Plan, IP: r.ip, Route: ocrRoute,
		Bytes: int64(len(in.data)), LatencyMS: latency.Milliseconds(),
		PromptTokens: res.Usage.PromptTokens, OutputTokens: res.Usage.CandidatesTokens + res.Usage.ThoughtsTokens,
		CostMicroUSD: cost,
	}
	// The read is paid for, so what follows is written even if the client
	// has gone.
	ctx = s.recordCtx.get()
	if err != nil {
		a.Fail(ctx, cost)
		event.Outcome, event.Status = "upstream_failed", http.StatusBadGateway
		s.d.Events.Record(event)
		s.log.Warn("upstream read failed", "user", r.who.UserID, "request_id", r.id, "reason", ReasonOf(err), "err", err)
		return errUpstream
	}
	return s.record(ctx, r, a, event, s.usageRecord(r, res, in, cost, latency), res, in, called)
}

// usageRecord is the row of a successful read.
func (s *Server) usageRecord(r *ocrRequest, res ocr.Result, in received, cost int64, latency time.Duration) budget.UsageRecord {
	return budget.UsageRecord{
		Time: r.start, UserID: r.who.UserID, KeyID: r.who.KeyID, RequestID: r.id, Model: res.Model, Outcome: "ok",
		Bytes: int64(len(in.data)), PromptTokens: res.Usage.PromptTokens, CandidatesTokens: res.Usage.CandidatesTokens,
		ThoughtsTokens: res.Usage.ThoughtsTokens, CostMicroUSD: cost, LatencyMS: latency.Milliseconds(),
	}
}

// record is "$": the quota increment, the usage row, the settlement and
// what a repeat needs, in one durable transaction before the answer. With
// an idempotency key the answer is made first, so that what is kept is
// what is sent. now is when the call ended: the commit starts then.
func (s *Server) record(ctx context.Context, r *ocrRequest, a *guard.Admission, event detect.Event, rec budget.UsageRecord,
	res ocr.Result, in received, now time.Time) error {
	var body []byte
	if r.key != "" || s.d.DedupeWindow > 0 {
		rec.Answer = &budget.Answer{Fingerprint: in.fp, Serials: res.Serials, Rejected: res.Rejected, Simulated: res.Simulated}
	}
	if r.key != "" {
		body = answerBody(res, r.plan.MonthlyQuota, s.guard.Used(r.who.UserID, now)+1)
		rec.Answer.IdempotencyKey, rec.Answer.Status, rec.Answer.Body = r.key, http.StatusOK, body
	}
	used, refused := a.Record(ctx, rec, event.CostMicroUSD, now)
	s.d.Metrics.commitLatency.Observe(s.now().Sub(now).Seconds())
	if refused != nil {
		event.Outcome, event.Status = "usage_unavailable", http.StatusServiceUnavailable
		s.d.Events.Record(event)
		s.log.Error("usage record not written: result withheld, paid calls paused", "user", r.who.UserID, "request_id", r.id,
			"pause", guard.UsagePause, "err", refused.Fault)
		s.alert(detect.KindUsageCommitFailed, "a usage record could not be written: results are withheld (503)",
			map[string]string{"user": r.who.UserID, "request_id": r.id, "error": refused.Fault.Error()})
		return errUsageUnavailable
	}
	r.kept = r.key != ""              // the answer went with the record
	failpoint.Hit(failpoint.Recorded) // crash tests only: a kill between the usage record and the answer
	event.Outcome, event.Status = "ok", http.StatusOK
	s.d.Events.Record(event)
	if body == nil {
		body = answerBody(res, r.plan.MonthlyQuota, used)
	}
	return writeJSON(r.c, http.StatusOK, body)
}

// callCost is what a call is billed: its reported tokens at the prices in
// force when it started, or its worst case when the bill is unknown (a failure without
// usage, or a reply that reports none). requestID names the request in
// the log.
func (s *Server) callCost(requestID string, price *ocr.Price, u ocr.Usage, err error, worst int64) int64 {
	cost := price.Cost(u)
	switch {
	case !u.Known():
		if err == nil {
			s.log.Warn("the upstream answered without token usage: the call counts at its worst case",
				"request_id", requestID, "worst_micro_usd", worst)
		}
		return worst
	case cost > worst:
		s.log.Warn("the upstream reported more tokens than the worst case allowed for: check ocr.price and the image limits",
			"request_id", requestID, "cost_micro_usd", cost, "worst_micro_usd", worst)
	}
	return cost
}

// claimRetry is asked by the upstream client before its one retry: the
// retry is a second paid call, claimed and committed like the first, and
// made only if the budget has room for it.
func (s *Server) claimRetry(ctx context.Context, requestID, model string, a *guard.Admission, worst int64) bool {
	if !a.ClaimRetry(ctx, worst, s.now()) {
		s.log.Info("upstream retry skipped: the global budget has no room for it", "request_id", requestID)
		return false
	}
	s.d.Metrics.calls(model).failed.Inc() // the busy first call
	return true
}

// identify is layer 0 with what follows from it: who is asking (401),
// whether they are banned (403), and their plan (403 when it is gone).
func (s *Server) identify(c echo.Context) (keys.Identity, budget.Plan, error) {
	id, banned, err := s.authenticate(c)
	if err != nil {
		return keys.Identity{}, budget.Plan{}, err
	}
	edge.SetUser(c, id.UserID) // for the access log
	if banned {
		return keys.Identity{}, budget.Plan{}, errBanned
	}
	plan, ok := s.d.Plans.Get(id.Plan)
	if !ok {
		// Counted as it is answered, not logged per request: a plan
		// removed by a reload must not let its users flood the log.
		// `usage` shows them.
		return keys.Identity{}, budget.Plan{}, errNoPlan
	}
	return id, plan, nil
}

// readValidImage reads the upload into memory taken from mem and checks it
// cheaply: type sniffing and the image header only, nothing decoded.
func readValidImage(r *http.Request, cfg edge.Config, mem *edge.Lease) ([]byte, ocr.Image, error) {
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

// countCall feeds one upstream call into the metrics.
func (s *Server) countCall(model string, d time.Duration, u ocr.Usage, err error) {
	m := s.d.Metrics
	c := m.calls(model)
	calls := c.ok
	if err != nil {
		calls = c.failed
	}
	calls.Inc()
	s.noteUpstream(err) // its reason, and the alerts it calls for
	m.upstreamLatency.Observe(d.Seconds())
	m.promptTokens.Add(float64(u.PromptTokens))
	m.outputTokens.Add(float64(u.CandidatesTokens))
	m.thoughtsTokens.Add(float64(u.ThoughtsTokens))
}

// ocrRoute is the route as recorded in statistics events.
const ocrRoute = "/v1/ocr"

// refusalOf records a refusal of req by the guard at now (counted per
// minute and key by the recorder, for a replay) and turns it into the
// problem users see.
//
// A refusal of KindGone is no layer's: the client went away, 499, and
// nothing is recorded.
func (s *Server) refusalOf(req guard.Request, now time.Time, r *guard.Refusal) error {
	if r.Kind() == guard.KindGone {
		return errClientGone
	}
	s.d.Events.Record(detect.Event{Time: now, UserID: req.Key, IP: req.Client, Plan: req.Plan, Route: req.Route,
		Layer: r.Layer, Outcome: detect.OutcomeLayerRefused})
	return s.refusal(r, now)
}

// shadowedBy counts and records a refusal that a layer in shadow mode
// would have made; the request goes on.
func (s *Server) shadowedBy(req guard.Request, r *guard.Refusal) {
	now := s.now()
	s.shadowed(now, r.Layer, r.Reason)
	s.d.Events.Record(detect.Event{Time: now, UserID: req.Key, IP: req.Client, Plan: req.Plan, Route: req.Route,
		Layer: r.Layer, Outcome: detect.OutcomeShadowRefused})
}

// shadowed counts a would-be refusal in the metrics; the dashboard reads
// the recorded events (operator.ShadowToday), as breakwater usage does.
func (s *Server) shadowed(_ time.Time, layer, reason string) {
	s.d.Metrics.shadowRefusals.WithLabelValues(layer, reason).Inc()
}

// SetShadow switches the OCR route's rate limit (limits.user.mode) to
// shadow mode, or to enforce mode, live; a plan's daily line follows the
// plan's daily_mode.
func (s *Server) SetShadow(rate bool) {
	var layers []string
	if rate {
		layers = append(layers, guard.LayerRate)
	}
	_ = s.guard.SetShadow(layers...) // the rate layer is always shadowable
}

// readImage returns the uploaded image and its declared media type, from a
// raw body or from the multipart field "image". The image is held to max
// bytes without reading further, a form to maxParts parts. Its memory is
// taken from mem first: a declared length before a byte is read, so that
// an upload that cannot fit is refused at once; an unknown length as its
// bytes arrive.
func readImage(r *http.Request, max int64, maxParts int, mem *edge.Lease) (data []byte, declared string, err error) {
	ct := r.Header.Get(echo.HeaderContentType)
	var params map[string]string
	multi := false
	if maybeForm(ct) { // a plain upload's type is not parsed, which allocates
		var mt string
		mt, params, _ = mime.ParseMediaType(ct)
		multi = mt == formType
	}
	if !multi && r.ContentLength > max {
		return nil, "", edge.ErrTooLarge
	}
	var body io.Reader = r.Body
	if r.ContentLength > 0 {
		if err := mem.Need(min(r.ContentLength, max)); err != nil {
			return nil, "", err
		}
	} else {
		body = edge.Arrivals(body, mem, max)
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

// formType is the media type of a form.
const formType = "multipart/form-data"

// maybeForm reports whether mime.ParseMediaType may read ct as formType:
// false only when it cannot, for an ASCII ct that does not hold the name
// in any case. A ct with other bytes is left to mime, whose lower-casing
// maps some of them to ASCII letters.
func maybeForm(ct string) bool {
	for i := range len(ct) {
		if ct[i] >= utf8.RuneSelf {
			return true
		}
	}
	for i := 0; i+len(formType) <= len(ct); i++ {
		if strings.EqualFold(ct[i:i+len(formType)], formType) {
			return true
		}
	}
	return false
}

// readMultipartImage reads the field "image" of a form of at most maxParts
// parts (each part, even an empty one, costs a header parse), and then the
// rest of the form, so that the body ends and its connection can be
// reused. size is the body's declared length, -1 if unknown.
func readMultipartImage(body io.Reader, boundary string, max, size int64, maxParts int, mem *edge.Lease) ([]byte, string, error) {
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
func readAtMost(r io.Reader, limit, size int64, mem *edge.Lease) ([]byte, error) {
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
				return nil, bodyError(err, edge.ErrBadBody)
			}
			if int64(len(buf)) >= limit {
				return nil, edge.ErrTooLarge
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
			return nil, bodyError(err, edge.ErrBadBody)
		}
	}
	if len(buf) == 0 {
		return nil, errMissingImage
	}
	return buf, nil
}

// grow returns buf copied into a buffer of capacity n, whose bytes it
// takes from mem first.
func grow(buf []byte, n int64, mem *edge.Lease) ([]byte, error) {
	if err := mem.Need(n); err != nil {
		return nil, err
	}
	out := make([]byte, len(buf), n)
	copy(out, buf)
	return out, nil
}

// bodyError maps an error of reading the body to its problem, other for
// any that is not the body limit, the upload rate or the body memory.
func bodyError(err error, other *edge.Problem) error {
	var p *edge.Problem
	switch {
	case edge.IsTooLarge(err):
		return edge.ErrTooLarge
	case errors.Is(err, edge.ErrReadTooSlow):
		return edge.ErrUploadTooSlow
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
