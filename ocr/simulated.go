package ocr

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Token counts the simulated provider reports besides the image's.
const (
	simulatedPromptTokens    = 40 // about what our prompt text costs upstream
	simulatedCandidateTokens = 12
)

// Simulated answers like Gemini without any network: the same image always
// gives the same serials and usage. It is for development and load tests.
// It is safe for concurrent use.
type Simulated struct {
	cfg     Config
	pattern *regexp.Regexp
	sleep   func(ctx context.Context, d time.Duration) error
}

// NewSimulated returns a simulated reader for cfg (zero fields take their
// defaults; cfg.Provider is not consulted).
func NewSimulated(cfg Config) (*Simulated, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pattern, err := compileSerialPattern(cfg.SerialPattern)
	if err != nil {
		return nil, fmt.Errorf("ocr.serial_pattern: %w", err)
	}
	return &Simulated{cfg: cfg, pattern: pattern, sleep: sleepCtx}, nil
}

// Read waits cfg.SimulatedLatency (it never fails, so never retries), then returns one or two serials of the
// form "SIM-" and 8 upper-case hex digits derived from the SHA-256 of
// img.Data, and the usage Gemini would report for an image of that size.
// Serials that do not match a custom SerialPattern are Rejected. A context
// that ends first gives an *UpstreamError with Reason "timeout" or
// "canceled".
func (s *Simulated) Read(ctx context.Context, img Image, mayRetry func() bool) (Result, error) {
	return s.ReadModel(ctx, "", img, mayRetry)
}

// ReadModel is Read as model would ("" is ocr.model): the usage is
// counted by that model's image rule. A model that is neither ocr.model
// nor ocr.fallback_model is an error, as with Gemini.
func (s *Simulated) ReadModel(ctx context.Context, model string, img Image, _ func() bool) (Result, error) {
	if model == "" {
		model = s.cfg.Model
	}
	res := Result{Model: model, Simulated: true}
	price, ok := s.cfg.PriceOf(model)
	if !ok || (model != s.cfg.Model && model != s.cfg.FallbackModel) {
		return res, &UpstreamError{Reason: ReasonModelNotFound, Err: fmt.Errorf("%w: %q is neither ocr.model nor ocr.fallback_model", ErrModelNotFound, model)}
	}
	if err := ctx.Err(); err != nil {
		return res, transportError(ctx, err)
	}
	if err := s.sleep(ctx, s.cfg.SimulatedLatency); err != nil {
		return res, transportError(ctx, err)
	}
	sum := sha256.Sum256(img.Data)
	values := []string{"SIM-" + strings.ToUpper(hex.EncodeToString(sum[0:4]))}
	if second := "SIM-" + strings.ToUpper(hex.EncodeToString(sum[5:9])); sum[4]&1 == 1 && second != values[0] {
		values = append(values, second)
	}
	res.Serials, res.Rejected = []string{}, []string{}
	for _, v := range values {
		if s.pattern.MatchString(v) {
			res.Serials = append(res.Serials, v)
		} else {
			res.Rejected = append(res.Rejected, v)
		}
	}
	res.Usage = SimulatedUsage(price, img.Width, img.Height)
	return res, nil
}

// SimulatedUsage is the usage the simulated provider reports for an image
// of width × height pixels read by the model p belongs to (its image
// tokens by p.ImageTokens): what `breakwater selftest` bills its reads at.
func SimulatedUsage(p Price, width, height int) Usage {
	return Usage{PromptTokens: p.ImageTokens(width, height) + simulatedPromptTokens, CandidatesTokens: simulatedCandidateTokens}
}
