package ocr

import (
	"errors"
	"strings"
	"testing"
)

// TestGeminiRefusalsToldApart: each refusal of the upstream, sent with
// the body Gemini sends, gets its own reason; those that stop every read
// are not retried, wrap their sentinel and are logged at ERROR, and a
// rate limit is retried once.
func TestGeminiRefusalsToldApart(t *testing.T) {
	for _, tt := range []struct {
		name      string
		reply     reply
		reason    string
		sentinel  error // nil: not a refusal that stops every read
		wantCalls int32
	}{
		{"invalid key", reply{400, "err_400_key.json", ""}, ReasonAuth, ErrKeyRefused, 1},
		{"permission denied", reply{403, "err_403.json", ""}, ReasonAuth, ErrKeyRefused, 1},
		{"spend cap", reply{429, "err_429_spend_cap.json", ""}, ReasonSpendCap, ErrSpendCap, 1},
		{"credits depleted (429)", reply{429, "err_429_credits.json", ""}, ReasonCredits, ErrCreditsDepleted, 1},
		{"credits depleted (403)", reply{403, "err_403_credits.json", ""}, ReasonCredits, ErrCreditsDepleted, 1},
		{"model not found", reply{404, "err_404_model.json", ""}, ReasonModelNotFound, ErrModelNotFound, 1},
		{"billing disabled", reply{403, "err_403_billing.json", ""}, ReasonBilling, ErrBilling, 1},
		{"free tier not offered", reply{400, "err_400_precondition.json", ""}, ReasonBilling, ErrBilling, 1},
		{"rate limit", reply{429, "err_429.json", ""}, ReasonRateLimited, nil, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeGemini(t, DefaultMaxOutputTokens, tt.reply)
			g, _, logs := newTestGemini(t, Config{}, fake.URL)
			_, err := g.Read(t.Context(), testImage, alwaysRetry)
			ue := upstreamError(t, err)
			if ue.Reason != tt.reason || ue.Status != tt.reply.status {
				t.Errorf("error = %d %q, want %d %q", ue.Status, ue.Reason, tt.reply.status, tt.reason)
			}
			if got := fake.calls.Load(); got != tt.wantCalls {
				t.Errorf("calls = %d, want %d", got, tt.wantCalls)
			}
			if got, want := StopsEveryRead(err), tt.sentinel != nil; got != want {
				t.Errorf("StopsEveryRead = %v, want %v", got, want)
			}
			if tt.sentinel != nil {
				if !errors.Is(err, tt.sentinel) {
					t.Errorf("err = %v, want it to wrap %v", err, tt.sentinel)
				}
				if out := logs.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "reason="+tt.reason) {
					t.Errorf("log lacks an ERROR line with reason=%s:\n%s", tt.reason, out)
				}
			}
			if strings.Contains(err.Error(), "prepayment") || strings.Contains(err.Error(), "ai.studio") {
				t.Errorf("the error %q carries the upstream's message", err)
			}
		})
	}
}
