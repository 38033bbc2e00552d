package ocr

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Result is what one read produced.
type Result struct {
	// Serials are the values that match SerialPattern, trimmed of spaces,
	// de-duplicated, in the order the model gave them; at most maxSerials.
	// Non-nil when Read succeeds.
	Serials []string
	// Rejected is everything else the model returned: strings that do not
	// match the pattern, and other JSON values as their JSON text. Each entry
	// is cut to 64 bytes of valid UTF-8, and there are at most 32 of them.
	// Empty strings are dropped. Non-nil when Read succeeds.
	Rejected []string
	// Usage is the token counts the provider reported. Read fills it also
	// when it returns a bad_output or blocked *UpstreamError, since the call
	// is billed all the same.
	Usage Usage
	// Model is the modelVersion the provider reported, or the configured
	// model.
	Model string
	// Simulated is true when the simulated provider produced the result.
	Simulated bool
}

// Bounds on what a Result holds, whatever the model returns.
const (
	maxSerials       = 100
	maxRejected      = 32
	maxRejectedBytes = 64
	maxModelBytes    = 64
)

// Reasons of an UpstreamError that this package sets itself; any other
// Reason is the status word of the upstream's error body, such as
// "RESOURCE_EXHAUSTED", or ReasonUnknown.
const (
	ReasonTimeout   = "timeout"    // the call ran out of time (cfg.Timeout or the caller's deadline)
	ReasonCanceled  = "canceled"   // the caller canceled the context
	ReasonTransport = "transport"  // no HTTP response: connection refused, reset, TLS...
	ReasonBadOutput = "bad_output" // a 2xx response whose content is not what we asked for
	ReasonBlocked   = "blocked"    // the prompt or the answer was blocked (safety and the like)
	ReasonAuth      = "auth"       // the API key was refused; Err is ErrKeyRefused
	ReasonUnknown   = "unknown"    // a non-2xx response without a readable status word
	// ReasonSpendCap: a 429 whose message names the project's spend cap;
	// Err is ErrSpendCap.
	ReasonSpendCap = "spend_cap"
	// ReasonCredits: the project's prepaid credits are used up ("Your
	// prepayment credits are depleted"); Err is ErrCreditsDepleted.
	ReasonCredits = "credits_depleted"
	// ReasonModelNotFound: a 404 NOT_FOUND, the model unknown or retired;
	// Err is ErrModelNotFound.
	ReasonModelNotFound = "model_not_found"
	// ReasonBilling: the project's billing is off or a precondition of
	// it is not met (403 BILLING_DISABLED, 400 FAILED_PRECONDITION: the
	// free tier not offered where the server runs); Err is ErrBilling.
	ReasonBilling = "billing"
	// ReasonRateLimited: any other 429 RESOURCE_EXHAUSTED, the project's
	// rate or tier limit: worth one retry.
	ReasonRateLimited = "rate_limited"
)

// Errors held in UpstreamError.Err for bad output. They describe the
// output's shape and never quote it.
var (
	errNotJSON       = errors.New("ocr: model output is not JSON")
	errWrongShape    = errors.New(`ocr: model output is not {"serials":[...]}`)
	errTruncated     = errors.New("ocr: model output was cut off")
	errNoCandidate   = errors.New("ocr: response has no candidate")
	errBlocked       = errors.New("ocr: content was blocked")
	errTooLarge      = errors.New("ocr: response is too large")
	errUnexpectedEnd = errors.New("ocr: model stopped for an unexpected reason")
)

// generateResponse is the part of a generateContent response we read.
type generateResponse struct {
	Candidates []struct {
		Content struct {
			Parts []struct {
				Text    string `json:"text"`
				Thought bool   `json:"thought"`
			} `json:"parts"`
		} `json:"content"`
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
	PromptFeedback struct {
		BlockReason string `json:"blockReason"`
	} `json:"promptFeedback"`
	UsageMetadata struct {
		PromptTokenCount     int `json:"promptTokenCount"`
		CandidatesTokenCount int `json:"candidatesTokenCount"`
		ThoughtsTokenCount   int `json:"thoughtsTokenCount"`
	} `json:"usageMetadata"`
	ModelVersion string `json:"modelVersion"`
}

// blockedFinish are the finishReason values that mean the answer was
// withheld rather than cut or malformed.
var blockedFinish = map[string]bool{
	"SAFETY": true, "RECITATION": true, "BLOCKLIST": true, "PROHIBITED_CONTENT": true,
	"SPII": true, "IMAGE_SAFETY": true, "IMAGE_PROHIBITED_CONTENT": true, "IMAGE_RECITATION": true,
}

// parseResponse reads a 2xx generateContent body. The Result carries the
// usage whenever the body reported it, also alongside an error.
func parseResponse(body []byte, status int, pattern *regexp.Regexp, model string) (Result, error) {
	res := Result{Model: model}
	fail := func(reason string, err error) (Result, error) {
		return res, &UpstreamError{Status: status, Reason: reason, Err: err}
	}

	var resp generateResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		// A type error in one field leaves the others filled, usage
		// included; anything else leaves nothing worth reading.
		var typeErr *json.UnmarshalTypeError
		if !errors.As(err, &typeErr) {
			return fail(ReasonBadOutput, errNotJSON)
		}
		res.Usage = usageOf(resp)
		res.Model = modelOf(resp.ModelVersion, model)
		return fail(ReasonBadOutput, errWrongShape)
	}
	res.Usage = usageOf(resp)
	res.Model = modelOf(resp.ModelVersion, model)

	if len(resp.Candidates) == 0 {
		if resp.PromptFeedback.BlockReason != "" {
			return fail(ReasonBlocked, errBlocked)
		}
		return fail(ReasonBadOutput, errNoCandidate)
	}
	cand := resp.Candidates[0]
	switch fr := cand.FinishReason; {
	case fr == "STOP" || fr == "":
	case fr == "MAX_TOKENS":
		return fail(ReasonBadOutput, errTruncated)
	case blockedFinish[fr]:
		return fail(ReasonBlocked, errBlocked)
	default:
		return fail(ReasonBadOutput, errUnexpectedEnd)
	}
	var text strings.Builder
	for _, p := range cand.Content.Parts {
		if !p.Thought {
			text.WriteString(p.Text)
		}
	}
	serials, rejected, err := parseOutput(text.String(), pattern)
	if err != nil {
		return fail(ReasonBadOutput, err)
	}
	res.Serials, res.Rejected = serials, rejected
	return res, nil
}

func usageOf(r generateResponse) Usage {
	return Usage{
		PromptTokens:     max(r.UsageMetadata.PromptTokenCount, 0),
		CandidatesTokens: max(r.UsageMetadata.CandidatesTokenCount, 0),
		ThoughtsTokens:   max(r.UsageMetadata.ThoughtsTokenCount, 0),
	}
}

// modelOf returns the reported model version if it is short printable
// text, else the configured model.
func modelOf(reported, configured string) string {
	if reported == "" || len(reported) > maxModelBytes {
		return configured
	}
	for _, r := range reported {
		if !strconv.IsPrint(r) || r == utf8.RuneError {
			return configured
		}
	}
	return reported
}

// parseOutput parses the model's text strictly as {"serials":[...]}: one
// JSON object with the single key "serials" holding an array. Array items
// that are strings matching pattern (after trimming spaces) become serials;
// every other item is rejected.
func parseOutput(text string, pattern *regexp.Regexp) (serials, rejected []string, err error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, nil, errWrongShape // valid JSON, not an object
		}
		return nil, nil, errNotJSON
	}
	raw, ok := obj["serials"]
	if !ok || len(obj) != 1 {
		return nil, nil, errWrongShape
	}
	var items []json.RawMessage
	if !bytes.HasPrefix(raw, []byte("[")) || json.Unmarshal(raw, &items) != nil {
		return nil, nil, errWrongShape
	}

	serials, rejected = []string{}, []string{}
	seen := make(map[string]bool)
	reject := func(s string) {
		if s != "" && len(rejected) < maxRejected {
			rejected = append(rejected, cutUTF8(s, maxRejectedBytes))
		}
	}
	for _, item := range items {
		var s string
		if item[0] != '"' || json.Unmarshal(item, &s) != nil {
			var compact bytes.Buffer
			if json.Compact(&compact, item) != nil {
				reject(string(item))
			} else {
				reject(compact.String())
			}
			continue
		}
		s = strings.TrimSpace(s)
		switch {
		case !pattern.MatchString(s):
			reject(s)
		case seen[s]:
		case len(serials) >= maxSerials:
			reject(s)
		default:
			seen[s] = true
			serials = append(serials, s)
		}
	}
	return serials, rejected, nil
}

// cutUTF8 returns s cut to at most n bytes on a rune boundary, with any
// invalid UTF-8 replaced.
func cutUTF8(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}
