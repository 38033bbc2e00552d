package ocr

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// ErrKeyRefused means the upstream refused GEMINI_API_KEY: a 400 "API key
// not valid", a 401 or a 403. Read returns it wrapped in an *UpstreamError
// with Reason "auth".
var ErrKeyRefused = errors.New("ocr: GEMINI_API_KEY was refused by the upstream")

// Refusals of the upstream that stop every read until the operator acts,
// each wrapped in an *UpstreamError with its Reason.
var (
	// ErrSpendCap: the project's spend cap is reached (Reason "spend_cap").
	ErrSpendCap = errors.New("ocr: the upstream project's spend cap is reached")
	// ErrCreditsDepleted: the project's prepaid credits are used up
	// (Reason "credits_depleted").
	ErrCreditsDepleted = errors.New("ocr: the upstream project's prepaid credits are depleted")
	// ErrModelNotFound: the upstream does not serve ocr.model (Reason
	// "model_not_found").
	ErrModelNotFound = errors.New("ocr: the upstream does not serve the model")
	// ErrBilling: the project's billing is off or its precondition unmet
	// (Reason "billing").
	ErrBilling = errors.New("ocr: the upstream project's billing is off or not set up")
)

// StopsEveryRead reports whether err is an upstream refusal that every
// read will meet until the operator acts: the key refused, the spend cap
// reached, the prepaid credits used up, the model unknown, billing off.
func StopsEveryRead(err error) bool {
	return errors.Is(err, ErrKeyRefused) || errors.Is(err, ErrSpendCap) || errors.Is(err, ErrCreditsDepleted) ||
		errors.Is(err, ErrModelNotFound) || errors.Is(err, ErrBilling)
}

// UpstreamError is any failed upstream call; HTTP layers map it to 502.
// Its text holds the HTTP status and the upstream's status word, never the
// upstream's message or the API key.
type UpstreamError struct {
	// Status is the HTTP status of the response, 0 if there was none.
	Status int
	// Reason is the upstream's status word ("RESOURCE_EXHAUSTED",
	// "INTERNAL", ...) or one of the Reason constants ("timeout",
	// "bad_output", "blocked", "auth", ...).
	Reason string
	// Err is the underlying error, if any: ErrKeyRefused,
	// context.DeadlineExceeded, a transport error, or a description of bad
	// output.
	Err error
}

// Error returns "ocr: upstream [STATUS] [REASON][: ERR]".
func (e *UpstreamError) Error() string {
	var b strings.Builder
	b.WriteString("ocr: upstream")
	if e.Status != 0 {
		fmt.Fprintf(&b, " %d", e.Status)
	}
	if e.Reason != "" {
		b.WriteString(" " + e.Reason)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap returns e.Err.
func (e *UpstreamError) Unwrap() error { return e.Err }

// Retry and response bounds of Gemini.Read.
const (
	retryDelay       = time.Second     // wait before the one retry
	minRetryWindow   = 2 * time.Second // time a retry needs beyond the delay
	maxResponseBytes = 1 << 20         // larger bodies are bad output
)

// prompt is the text part of every request.
const prompt = "Read every serial number printed on this label. " +
	"Answer with JSON only, as {\"serials\": [...]}, each serial number exactly as printed, " +
	"in reading order, without its caption (such as S/N or Serial). " +
	"If there is none, answer {\"serials\": []}."

// Gemini reads serials with Google's generateContent REST API. It is safe
// for concurrent use.
type Gemini struct {
	cfg Config
	// primary is cfg.Model, fallback cfg.FallbackModel (name "" when none
	// is set): the two models a call may go to.
	primary, fallback target
	apiKey            string
	pattern           *regexp.Regexp
	client            *http.Client
	logger            *slog.Logger

	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// NewGemini returns a Gemini reader for cfg (zero fields take their
// defaults; cfg.Provider is not consulted). apiKey is required. client may
// be nil for a client without an overall timeout, since ctx and cfg.Timeout
// bound each Read; either way redirects are not followed, so the key goes to
// cfg.BaseURL only. A nil logger discards.
func NewGemini(cfg Config, apiKey string, client *http.Client, logger *slog.Logger) (*Gemini, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if apiKey == "" {
		return nil, errors.New("ocr: GEMINI_API_KEY is not set")
	}
	pattern, err := compileSerialPattern(cfg.SerialPattern)
	if err != nil { // Validate has compiled it already
		return nil, fmt.Errorf("ocr.serial_pattern: %w", err)
	}
	var c http.Client
	if client != nil {
		c = *client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	primary, err := targetOf(cfg, cfg.Model)
	if err != nil { // Validate has refused it
		return nil, fmt.Errorf("ocr.model: %w", err)
	}
	var fallback target
	if cfg.FallbackModel != "" {
		if fallback, err = targetOf(cfg, cfg.FallbackModel); err != nil {
			return nil, fmt.Errorf("ocr.fallback_model: %w", err)
		}
	}
	return &Gemini{
		cfg:      cfg,
		primary:  primary,
		fallback: fallback,
		apiKey:   apiKey,
		pattern:  pattern,
		client:   &c,
		logger:   logger.With("component", "ocr"),
		now:      time.Now,
		sleep:    sleepCtx,
	}, nil
}

// target is a model a call may go to: its table entry (image rule and
// thinking) and its generateContent URL.
type target struct {
	name     string
	info     ModelInfo
	endpoint string
}

// targetOf is model's target under cfg; an unknown model is an error.
func targetOf(cfg Config, model string) (target, error) {
	info, known := cfg.Lookup(model)
	if !known {
		return target{}, errors.New(unknownModelError(model))
	}
	bare := strings.TrimPrefix(model, "models/")
	return target{name: model, info: info,
		endpoint: strings.TrimRight(cfg.BaseURL, "/") + "/v1beta/models/" + url.PathEscape(bare) + ":generateContent"}, nil
}

// Read is ReadModel with ocr.model.
func (g *Gemini) Read(ctx context.Context, img Image, mayRetry func() bool) (Result, error) {
	return g.ReadModel(ctx, "", img, mayRetry)
}

// targetFor is the target of a call to model: "" or cfg.Model is the
// primary, cfg.FallbackModel the fallback; any other is an error, so that
// no call goes to a model whose price the caller did not reserve.
func (g *Gemini) targetFor(model string) (target, error) {
	switch {
	case model == "" || model == g.primary.name:
		return g.primary, nil
	case g.fallback.name != "" && model == g.fallback.name:
		return g.fallback, nil
	}
	return target{}, fmt.Errorf("%w: %q is neither ocr.model nor ocr.fallback_model", ErrModelNotFound, model)
}

// ReadModel asks model (ocr.model or ocr.fallback_model; "" is ocr.model)
// for the serials on img. The call, including one retry
// on 429 or 503 when time remains for it, is bounded by cfg.Timeout.
//
// The retry is a second paid call, so it is made only if mayRetry, asked
// just before, returns true: that is where the caller claims it against
// its budget. A nil mayRetry never retries.
//
// Every error is an *UpstreamError. When the model answered but the answer
// is unusable (Reason "bad_output" or "blocked"), the Result is returned
// with the error and holds the billed Usage; for other errors the cost is
// unknown and the caller should assume Price.WorstCase.
func (g *Gemini) ReadModel(ctx context.Context, model string, img Image, mayRetry func() bool) (Result, error) {
	to, err := g.targetFor(model)
	if err != nil {
		return Result{Model: model}, &UpstreamError{Reason: ReasonModelNotFound, Err: err}
	}
	res := Result{Model: to.name}
	body, err := g.body(to, img)
	if err != nil {
		return res, &UpstreamError{Reason: ReasonBadOutput, Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()

	for attempt := 1; ; attempt++ {
		status, data, err := g.post(ctx, to.endpoint, body)
		if err != nil {
			return res, transportError(ctx, err)
		}
		if status >= 200 && status <= 299 {
			if len(data) > maxResponseBytes {
				return res, &UpstreamError{Status: status, Reason: ReasonBadOutput, Err: errTooLarge}
			}
			return parseResponse(data, status, g.pattern, to.name)
		}
		uerr := statusError(status, data)
		if StopsEveryRead(uerr) {
			g.logger.Error(refusalLog[uerr.Reason], "status", status, "upstream_status", upstreamStatus(data), "reason", uerr.Reason)
			return res, uerr
		}
		if attempt > 1 || (uerr.Reason != ReasonRateLimited && status != http.StatusServiceUnavailable) || !g.timeLeft(ctx) {
			return res, uerr
		}
		if mayRetry == nil || !mayRetry() {
			g.logger.Warn("upstream busy; no retry, the caller's budget has no room for it", "status", status, "reason", uerr.Reason)
			return res, uerr
		}
		g.logger.Warn("upstream busy, retrying once", "status", status, "reason", uerr.Reason, "delay", retryDelay)
		if err := g.sleep(ctx, retryDelay); err != nil {
			return res, transportError(ctx, err)
		}
	}
}

// timeLeft reports whether ctx leaves room for the delay and a retry.
func (g *Gemini) timeLeft(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return !ok || deadline.Sub(g.now()) > retryDelay+minRetryWindow
}

// post sends one request and returns the status and at most
// maxResponseBytes+1 bytes of the body. The body is encoded as it is
// sent, afresh for each attempt.
func (g *Gemini) post(ctx context.Context, endpoint string, body *requestBody) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, body.open())
	if err != nil {
		return 0, nil, err
	}
	req.ContentLength = body.size()
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.open()), nil }
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-goog-api-key", g.apiKey)
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, data, nil
}

// transportError classifies an error that left no usable response.
func transportError(ctx context.Context, err error) *UpstreamError {
	var netErr net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return &UpstreamError{Reason: ReasonTimeout, Err: context.DeadlineExceeded}
	case ctx.Err() != nil:
		return &UpstreamError{Reason: ReasonCanceled, Err: ctx.Err()}
	case errors.As(err, &netErr) && netErr.Timeout():
		return &UpstreamError{Reason: ReasonTimeout, Err: context.DeadlineExceeded}
	}
	return &UpstreamError{Reason: ReasonTransport, Err: err}
}

// errorBody is the error envelope of a non-2xx response.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Reason string `json:"reason"`
		} `json:"details"`
	} `json:"error"`
}

var statusWord = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)

// upstreamStatus returns the status word of an error body if it is one.
func upstreamStatus(data []byte) string {
	var eb errorBody
	_ = json.Unmarshal(data, &eb) // best effort: a broken body has no word
	if statusWord.MatchString(eb.Error.Status) {
		return eb.Error.Status
	}
	return ""
}

// refusalLog is the log line of each refusal that stops every read.
var refusalLog = map[string]string{
	ReasonAuth:          "GEMINI_API_KEY was refused by the upstream",
	ReasonSpendCap:      "the upstream refused the call: the project's spend cap is reached",
	ReasonCredits:       "the upstream refused the call: the project's prepaid credits are depleted",
	ReasonModelNotFound: "the upstream refused the call: it does not serve ocr.model",
	ReasonBilling:       "the upstream refused the call: the project's billing is off or not set up",
}

// statusError turns a non-2xx response into an *UpstreamError. The
// refusals that stop every read are told apart by status and message, as
// Gemini's error reference shows them; credits come first, since Gemini
// has sent their message with 429 and with 403.
func statusError(status int, data []byte) *UpstreamError {
	var eb errorBody
	_ = json.Unmarshal(data, &eb) // best effort: a broken body says nothing
	msg := strings.ToLower(eb.Error.Message)
	switch {
	case strings.Contains(msg, "credits are depleted") || strings.Contains(msg, "credit balance is depleted"):
		return &UpstreamError{Status: status, Reason: ReasonCredits, Err: ErrCreditsDepleted}
	case status == http.StatusTooManyRequests && (strings.Contains(msg, "spend cap") || strings.Contains(msg, "spending cap") ||
		strings.Contains(msg, "spend limit") || strings.Contains(msg, "spending limit")):
		return &UpstreamError{Status: status, Reason: ReasonSpendCap, Err: ErrSpendCap}
	case (status == http.StatusForbidden && billingOff(eb)) || (status == http.StatusBadRequest && eb.Error.Status == "FAILED_PRECONDITION"):
		return &UpstreamError{Status: status, Reason: ReasonBilling, Err: ErrBilling}
	case status == http.StatusUnauthorized || status == http.StatusForbidden || (status == http.StatusBadRequest && keyInvalid(data)):
		return &UpstreamError{Status: status, Reason: ReasonAuth, Err: ErrKeyRefused}
	case status == http.StatusNotFound && eb.Error.Status == "NOT_FOUND":
		return &UpstreamError{Status: status, Reason: ReasonModelNotFound, Err: ErrModelNotFound}
	case status == http.StatusTooManyRequests:
		return &UpstreamError{Status: status, Reason: ReasonRateLimited}
	}
	word := upstreamStatus(data)
	if word == "" {
		word = ReasonUnknown
	}
	return &UpstreamError{Status: status, Reason: word}
}

// billingOff reports whether a 403 body says the project's billing is
// off rather than the key refused.
func billingOff(eb errorBody) bool {
	for _, d := range eb.Error.Details {
		if d.Reason == "BILLING_DISABLED" {
			return true
		}
	}
	return strings.Contains(strings.ToLower(eb.Error.Message), "billing to be enabled")
}

// keyInvalid reports whether a 400 body says the API key is bad.
func keyInvalid(data []byte) bool {
	var eb errorBody
	_ = json.Unmarshal(data, &eb)
	if strings.Contains(eb.Error.Message, "API key not valid") || strings.Contains(eb.Error.Message, "API key expired") {
		return true
	}
	for _, d := range eb.Error.Details {
		if strings.HasPrefix(d.Reason, "API_KEY_") {
			return true
		}
	}
	return false
}

// The request body of generateContent; see GEMINI.md.
type (
	generateRequest struct {
		Contents         []content        `json:"contents"`
		GenerationConfig generationConfig `json:"generationConfig"`
	}
	content struct {
		Role  string `json:"role"`
		Parts []part `json:"parts"`
	}
	part struct {
		InlineData      *inlineData          `json:"inlineData,omitempty"`
		MediaResolution *partMediaResolution `json:"mediaResolution,omitempty"`
		Text            string               `json:"text,omitempty"`
	}
	// partMediaResolution is a part's own media_resolution (Gemini 3 and
	// later); the only way to ask for ultra_high.
	partMediaResolution struct {
		Level string `json:"level"`
	}
	inlineData struct {
		MIMEType string `json:"mimeType"`
		Data     []byte `json:"data"` // standard base64 with padding
	}
	generationConfig struct {
		ResponseMIMEType string         `json:"responseMimeType"`
		ResponseSchema   schema         `json:"responseSchema"`
		MaxOutputTokens  int            `json:"maxOutputTokens"`
		ThinkingConfig   thinkingConfig `json:"thinkingConfig"`
		MediaResolution  string         `json:"mediaResolution,omitempty"`
	}
	schema struct {
		Type       string            `json:"type"`
		Properties map[string]schema `json:"properties,omitempty"`
		Items      *schema           `json:"items,omitempty"`
		Required   []string          `json:"required,omitempty"`
	}
	// thinkingConfig holds one of the two: a model takes either a level
	// (Gemini 3 and later) or a budget (Gemini 2.5), never both.
	thinkingConfig struct {
		ThinkingLevel  string `json:"thinkingLevel,omitempty"`
		ThinkingBudget *int   `json:"thinkingBudget,omitempty"`
	}
)

// request is the generateContent request for img. For a model of Gemini 3
// or later it sets media_resolution on the image part and, but for
// ultra_high (which only a part may ask for), in generationConfig too, and
// the model's least thinking level; for Gemini 2.5 its thinking budget
// (0: off). maxOutputTokens caps thoughts and answer together, so the
// output side of Price.WorstCase holds.
func (g *Gemini) request(to target, img Image) generateRequest {
	image := part{InlineData: &inlineData{MIMEType: img.MIME, Data: img.Data}}
	var thinking thinkingConfig
	var media string
	if to.info.Image == ImageMediaResolution {
		level := mediaLevels[g.cfg.MediaResolution].wire
		image.MediaResolution = &partMediaResolution{Level: level}
		if g.cfg.MediaResolution != MediaUltraHigh {
			media = level
		}
		thinking.ThinkingLevel = to.info.ThinkingLevel
	} else {
		budget := to.info.ThinkingBudget
		thinking.ThinkingBudget = &budget
	}
	return generateRequest{
		Contents: []content{{
			Role:  "user",
			Parts: []part{image, {Text: prompt}},
		}},
		GenerationConfig: generationConfig{
			ResponseMIMEType: "application/json",
			ResponseSchema: schema{
				Type: "OBJECT",
				Properties: map[string]schema{
					"serials": {Type: "ARRAY", Items: &schema{Type: "STRING"}},
				},
				Required: []string{"serials"},
			},
			MaxOutputTokens: g.cfg.Price.MaxOutputTokens,
			ThinkingConfig:  thinking,
			MediaResolution: media,
		},
	}
}

// requestBody is a generateContent request whose image is base64-encoded
// while it is sent rather than before: the JSON around the image is
// marshalled once (a few hundred bytes), and the image's 4/3 larger
// encoding never exists in memory as a whole. The bytes sent are exactly
// json.Marshal(g.request(to, img)).
type requestBody struct {
	head, tail []byte // the JSON before and after the image's base64
	data       []byte // the image
}

// dataField is how json.Marshal writes inlineData.data of an empty image;
// the image's base64 goes between its quotes.
var dataField = []byte(`,"data":""`)

// body marshals the request for img around an empty image and splits it
// where the image's base64 belongs. The first such field is the image's:
// inlineData is the first part, and a JSON string (the MIME type) cannot
// hold an unescaped quote.
func (g *Gemini) body(to target, img Image) (*requestBody, error) {
	req := g.request(to, Image{MIME: img.MIME, Data: []byte{}})
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	i := bytes.Index(b, dataField)
	if i < 0 {
		return nil, errors.New("ocr: request has no inlineData.data field")
	}
	cut := i + len(dataField) - 1 // before the closing quote
	return &requestBody{head: b[:cut], tail: b[cut:], data: img.Data}, nil
}

// size is the exact length of the body in bytes, sent as Content-Length.
func (b *requestBody) size() int64 {
	return int64(len(b.head) + base64.StdEncoding.EncodedLen(len(b.data)) + len(b.tail))
}

// open returns a reader of the whole body from its start.
func (b *requestBody) open() io.Reader {
	return io.MultiReader(bytes.NewReader(b.head), &base64Reader{src: b.data}, bytes.NewReader(b.tail))
}

// base64Reader reads src in standard base64 with padding, encoding it a
// buffer at a time.
type base64Reader struct {
	src     []byte
	pending []byte // encoded, not yet read
	buf     [4]byte
}

func (r *base64Reader) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		return n, nil
	}
	if len(r.src) == 0 {
		return 0, io.EOF
	}
	if len(p) < 4 {
		// Too small for a quantum: encode one into buf and hand it out
		// piece by piece.
		n := min(len(r.src), 3)
		base64.StdEncoding.Encode(r.buf[:], r.src[:n])
		r.src = r.src[n:]
		r.pending = r.buf[:base64.StdEncoding.EncodedLen(n)]
		return r.Read(p)
	}
	// Whole quanta of 3 bytes, so that padding comes only at the very end.
	n := min(len(r.src), len(p)/4*3)
	base64.StdEncoding.Encode(p, r.src[:n])
	r.src = r.src[n:]
	return base64.StdEncoding.EncodedLen(n), nil
}

// sleepCtx waits for d or until ctx is done, whichever comes first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
