package api

import (
	"bytes"
	"net/http"
	"testing"

	"breakwater/server/edgetest"
	"breakwater/server/guard"
)

// TestDenyCacheCountedInMetrics: with a deny cache, a user over the daily
// line is refused from memory after the first refusal, and every refusal,
// remembered or not, answers the same problem and is counted in breakwater_refusals_total; the cache's
// own series say how many it holds and answered.
func TestDenyCacheCountedInMetrics(t *testing.T) {
	e := newEnv(t, envOptions{attempts: 1, deny: guard.NewDeny(0)})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	decodeOK(t, resp, data)
	const refusals = 5
	var first []byte
	for i := range refusals {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "daily_limit")
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("refusal %d without Retry-After", i+1)
		}
		if first == nil {
			first = data
		} else if !bytes.Equal(data, first) {
			t.Errorf("refusal %d from memory answered %s, the first %s", i+1, data, first)
		}
	}
	for name, want := range map[string]string{
		`breakwater_refusals_total{layer="attempts",reason="daily_line"}`: "5",
		"breakwater_deny_cache_answers_total":                             "4",
		"breakwater_deny_cache_entries":                                   "1",
	} {
		if got := metric(t, e, name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
