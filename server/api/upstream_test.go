package api

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"breakwater/detect"
	"breakwater/server/edgetest"
)

// The bodies Gemini sends with each refusal (its error reference and
// troubleshooting page; the credits message as AI Studio projects get it).
var (
	bodyKeyInvalid = `{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}`
	bodyPermission = `{"error":{"code":403,"message":"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.","status":"PERMISSION_DENIED"}}`
	bodySpendCap   = `{"error":{"code":429,"message":"Your project has exceeded its monthly spend cap. Please go to AI Studio at https://ai.studio/projects to manage your project and billing.","status":"RESOURCE_EXHAUSTED"}}`
	bodyCredits    = `{"error":{"code":429,"message":"Your prepayment credits are depleted. Please go to AI Studio at https://ai.studio/projects to manage your project and billing.","status":"RESOURCE_EXHAUSTED"}}`
	bodyNotFound   = `{"error":{"code":404,"message":"models/gemini-1.5-flash is not found for API version v1beta, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods.","status":"NOT_FOUND"}}`
	bodyBilling    = `{"error":{"code":403,"message":"This API method requires billing to be enabled. Please enable billing on project #123456789 then retry.","status":"PERMISSION_DENIED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"BILLING_DISABLED","domain":"googleapis.com"}]}}`
	bodyRateLimit = `{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.","status":"RESOURCE_EXHAUSTED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1s"}]}}`
)

func sendBody(status int, body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// TestUpstreamRefusalsToldApart: each refusal of the upstream is its own
// reason in the metrics and the log, and those that stop every read raise
// their alert at the first one. No client sees which: all are 502.
func TestUpstreamRefusalsToldApart(t *testing.T) {
	for _, tc := range []struct {
		name, body, reason, kind string
		status                   int
	}{
		{"invalid key", bodyKeyInvalid, "auth", detect.KindUpstreamKeyRefused, 400},
		{"permission denied", bodyPermission, "auth", detect.KindUpstreamKeyRefused, 403},
		{"spend cap", bodySpendCap, "spend_cap", detect.KindUpstreamSpendCap, 429},
		{"credits depleted", bodyCredits, "credits_depleted", detect.KindUpstreamCredits, 429},
		{"model not found", bodyNotFound, "model_not_found", detect.KindUpstreamModel, 404},
		{"billing disabled", bodyBilling, "billing", detect.KindUpstreamBilling, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingAlerter{}
			e := newEnv(t, envOptions{alerts: rec})
			e.gemini.set(sendBody(tc.status, tc.body))
			resp, data := e.post(e.key, "image/png", pngBytes(t, 8, 8))
			p := edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
			if strings.Contains(p.Detail, "credit") || strings.Contains(p.Detail, "cap") || strings.Contains(p.Detail, "key") {
				t.Errorf("the client's detail %q tells the upstream's reason", p.Detail)
			}
			if got := rec.got(); len(got) != 1 || got[0] != tc.kind {
				t.Errorf("alerts %v, want [%s]", got, tc.kind)
			}
			if got := metric(t, e, `breakwater_upstream_failures_total{reason="`+tc.reason+`"}`); got != "1" {
				t.Errorf("failures with reason %s = %s, want 1", tc.reason, got)
			}
		})
	}
}

// TestUpstreamRateLimitRunAlerts: a read refused by the upstream's rate
// limit (429 RESOURCE_EXHAUSTED, retried once) raises nothing;
// RateLimitRun such reads in a row do, and a success ends the run.
func TestUpstreamRateLimitRunAlerts(t *testing.T) {
	rec := &recordingAlerter{}
	e := newEnv(t, envOptions{alerts: rec})
	img := pngBytes(t, 8, 8)
	e.gemini.set(sendBody(429, bodyRateLimit))
	for range 2 {
		resp, data := e.post(e.key, "image/png", img)
		edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
	}
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("alerts after 2 rate-limited reads: %v, want none", got)
	}
	if got := metric(t, e, `breakwater_upstream_failures_total{reason="rate_limited"}`); got != "2" {
		t.Errorf("rate_limited failures = %s, want 2 (one per read; its retry is part of it)", got)
	}
	// A success ends the run: the next reads start a new one.
	e.gemini.set(nil)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	e.gemini.set(sendBody(429, bodyRateLimit))
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("alerts after a success and a rate-limited read: %v, want none", got)
	}
	for range 4 {
		resp, data = e.post(e.key, "image/png", pngBytes(t, 9, 9))
		edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
	}
	if got := rec.got(); len(got) == 0 || got[0] != detect.KindUpstreamRateLimited {
		t.Errorf("alerts after a run of rate-limited reads: %v, want %s", got, detect.KindUpstreamRateLimited)
	}
}
