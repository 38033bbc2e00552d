package api

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/server/edge"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/storage"
)

// refusalSeries reads every breakwater_refusals_total series off /metrics,
// by its labels as the text format writes them.
func refusalSeries(t *testing.T, e *env) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(scrape(t, e), "\n") {
		if rest, ok := strings.CutPrefix(line, "breakwater_refusals_total{"); ok {
			labels, value, _ := strings.Cut(rest, "} ")
			out[labels] = value
		}
	}
	return out
}

// limitedRate refuses user "carol" and lets everyone else through.
type limitedRate struct{}

func (limitedRate) Allow(key string, _ time.Time) error {
	if key == "carol" {
		return &limiter.Refusal{Reason: limiter.ReasonRate, RetryAfter: time.Minute}
	}
	return nil
}

// TestEveryRefusalCountedOnce: each refusal the public listener answers,
// whichever part of the transport refuses it, adds exactly 1 to exactly
// one breakwater_refusals_total series, and to the dashboard's refusals
// of today; a missing route adds nothing.
func TestEveryRefusalCountedOnce(t *testing.T) {
	e := newEnv(t, envOptions{rate: limitedRate{},
		cfg: func(c *edge.Config) { c.MaxImageBytes = 4096; c.MaxImagePixels = 10_000 }})
	carol := e.newKey("carol", "")
	dave := e.newKey("dave", "")
	if _, err := e.keys.SetBanned("dave", true, true); err != nil {
		t.Fatal(err)
	}
	img := pngBytes(t, 20, 20)
	send := func(method, path, token, contentType, body string) func() (*http.Response, []byte) {
		return func() (*http.Response, []byte) {
			req, err := http.NewRequest(method, e.http.URL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			req.Header.Set("Content-Type", contentType)
			return do(t, req)
		}
	}
	cases := []struct {
		name   string
		send   func() (*http.Response, []byte)
		status int
		series string // "" : none
	}{
		{"no key", send("POST", "/v1/ocr", "", "image/png", string(img)), 401, `layer="auth",reason="unauthorized"`},
		{"wrong key", send("POST", "/v1/ocr", "bw_wrong", "image/png", string(img)), 401, `layer="auth",reason="unauthorized"`},
		{"banned", send("POST", "/v1/ocr", dave, "image/png", string(img)), 403, `layer="auth",reason="banned"`},
		{"rate limited", send("POST", "/v1/ocr", carol, "image/png", string(img)), 429, `layer="rate",reason="rate"`},
		{"too large", send("POST", "/v1/ocr", e.key, "image/png", string(img)+strings.Repeat("x", 5000)), 413, `layer="input",reason="body_too_large"`},
		{"wrong type", send("POST", "/v1/ocr", e.key, "text/plain", "hello"), 415, `layer="input",reason="unsupported_media_type"`},
		{"undecodable", send("POST", "/v1/ocr", e.key, "image/png", string(img[:20])), 422, `layer="input",reason="undecodable_image"`},
		{"too many pixels", send("POST", "/v1/ocr", e.key, "image/png", string(pngBytes(t, 200, 200))), 422, `layer="input",reason="too_many_pixels"`},
		{"missing image", send("POST", "/v1/ocr", e.key, "image/png", ""), 400, `layer="input",reason="missing_image"`},
		{"invalid e-mail", send("POST", "/v1/invites/verify", "", "application/json", `{"code":"x","email":"nope"}`), 400, `layer="input",reason="invalid_email"`},
		{"verify body", send("POST", "/v1/invites/verify", "", "application/json", `[`), 400, `layer="input",reason="bad_request"`},
		{"invite refused", send("POST", "/v1/invites/verify", "", "application/json", `{"code":"INV-NOPE","email":"a@example.com"}`), 403, `layer="invites",reason="invite_refused"`},
		{"no such route", send("GET", "/nowhere", "", "text/plain", ""), 404, ""},
		{"wrong method", send("GET", "/v1/ocr", "", "text/plain", ""), 405, ""},
	}
	total := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := refusalSeries(t, e)
			resp, _ := c.send()
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			after := refusalSeries(t, e)
			var changed []string
			for labels, v := range after {
				if v != before[labels] {
					changed = append(changed, labels+" "+before[labels]+" -> "+v)
				}
			}
			want := 0
			if c.series != "" {
				want = 1
				total++
				if _, ok := before[c.series]; !ok {
					t.Errorf("series %s did not exist before its first refusal", c.series)
				}
			}
			if len(changed) != want || (want == 1 && !strings.HasPrefix(changed[0], c.series+" ")) ||
				(want == 1 && !isOneMore(before[c.series], after[c.series])) {
				t.Errorf("series changed: %v, want %s up by 1", changed, c.series)
			}
		})
	}
	var today int64
	for _, r := range e.edge.RefusalsOf(e.srv.calendar.Day(time.Now())) {
		today += r.Count
	}
	if got, want := today, int64(total); got != want {
		t.Errorf("dashboard counts %d refusals today, want %d", got, want)
	}
}

func isOneMore(before, after string) bool {
	return (before == "0" && after == "1") || (before == "1" && after == "2")
}

// TestRefusalCountsSurviveRestart: the dashboard's refusals of today are
// written behind with the defense state and loaded by the next server on
// the same database; those of another day are not.
func TestRefusalCountsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOptions{dir: dir})
	for range 3 {
		e.post("", "image/png", pngBytes(t, 4, 4))
	}
	e.post(e.key, "text/plain", []byte("hello"))
	e.writeBehind(e.db).Flush()
	e.http.Close()
	e.admin.Close()
	e.events.Close(context.Background())
	e.db.Close()

	e2 := newEnv(t, envOptions{dir: dir})
	today := e2.srv.calendar.Day(time.Now())
	counts, err := e2.db.LoadState(state.RefusalsState(today))
	if err != nil {
		t.Fatal(err)
	}
	e2.edge.LoadRefusals(today, counts)
	e2.post("", "image/png", pngBytes(t, 4, 4))
	got := e2.edge.RefusalsOf(today)
	want := []edge.RefusalCount{{Layer: "auth", Reason: "unauthorized", Count: 4}, {Layer: "input", Reason: "unsupported_media_type", Count: 1}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("refusals today after a restart %+v, want %+v", got, want)
	}
	e2.edge.LoadRefusals("1999-01-01", counts)
	if got := e2.edge.RefusalsOf(today); len(got) != 2 || got[0].Count != 4 {
		t.Errorf("another day's counts were loaded: %+v", got)
	}
}

// TestAlertRuleMetricsExist: every metric the README's sample alert rules
// use has a series on /metrics from start, before any event.
func TestAlertRuleMetricsExist(t *testing.T) {
	f, err := os.Open("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rules strings.Builder
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```yaml") && !in:
			in = true
		case in && strings.HasPrefix(line, "```"):
			in = false
		case in:
			rules.WriteString(line + "\n")
		}
	}
	exprs := regexp.MustCompile(`expr: (.+)`).FindAllStringSubmatch(rules.String(), -1)
	if len(exprs) < 4 {
		t.Fatalf("%d alert rules in the README's yaml blocks, want at least 4", len(exprs))
	}
	e := newEnv(t, envOptions{})
	metrics := scrape(t, e)
	series := regexp.MustCompile(`breakwater_[a-z_]+(\{[^}]*\})?`)
	for _, x := range exprs {
		for _, s := range series.FindAllString(x[1], -1) {
			name, labels, _ := strings.Cut(strings.TrimSuffix(s, "}"), "{")
			line := regexp.MustCompile(`(?m)^` + name + `(\{[^}]*\})? `)
			found := false
			for _, m := range line.FindAllString(metrics, -1) {
				if labels == "" || strings.Contains(m, strings.ReplaceAll(labels, " ", "")) {
					found = true
				}
			}
			if !found {
				t.Errorf("the alert rule %q uses %s, which has no series on /metrics at start", x[1], s)
			}
		}
	}
}

var _ state.StateLoader = (*storage.DB)(nil)

// TestRefusalAnswers: a 429 to a key over its rate and a 401 to an
// unknown key are answered in full, each with its own headers only: the
// shared header values of one answer never show up in another.
func TestRefusalAnswers(t *testing.T) {
	e := newEnv(t, envOptions{limits: limiter.Config{Rate: 1, Window: time.Hour}})
	img := pngBytes(t, 16, 16)
	if resp, data := e.post(e.key, "image/png", img); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %d %s", resp.StatusCode, data)
	}
	check := func(resp *http.Response, data []byte, status int, want *edge.Problem, retry bool) {
		t.Helper()
		if resp.StatusCode != status || string(data) != string(want.Body()) {
			t.Errorf("%d %s, want %d %s", resp.StatusCode, data, status, want.Body())
		}
		for name, value := range map[string]string{"Content-Type": "application/problem+json", "Cache-Control": "no-store"} {
			if got := resp.Header.Values(name); len(got) != 1 || got[0] != value {
				t.Errorf("%d: %s %q, want %q", status, name, got, value)
			}
		}
		if id := resp.Header.Values("X-Request-ID"); len(id) != 1 || !strings.Contains(id[0], "-") {
			t.Errorf("%d: X-Request-ID %q", status, id)
		}
		ra := resp.Header.Values("Retry-After")
		if !retry {
			if len(ra) != 0 {
				t.Errorf("%d: Retry-After %q, want none", status, ra)
			}
			return
		}
		if n, err := strconv.Atoi(strings.Join(ra, ",")); err != nil || n < 1 || n > 3600 {
			t.Errorf("%d: Retry-After %q, want 1 to 3600 seconds", status, ra)
		}
	}
	unknown := "bw_" + strings.Repeat("A", 32)
	for range 3 {
		resp, data := e.post(e.key, "image/png", img)
		check(resp, data, http.StatusTooManyRequests, errRateLimited, true)
		resp, data = e.post(unknown, "image/png", img)
		check(resp, data, http.StatusUnauthorized, edge.ErrUnauthorized, false)
		if got := resp.Header.Values("WWW-Authenticate"); len(got) != 1 || got[0] != `Bearer realm="breakwater"` {
			t.Errorf("401: WWW-Authenticate %q", got)
		}
	}
	// server/edge's TestSharedHeaderValuesKept checks the shared values
	// themselves after such answers.
}

// TestRefusalAllocations: a refusal through the public handler allocates
// little (BenchmarkRefusal follows the figures): at most 6 allocations
// for a 429 to a key over its rate, 3 for a 401 to an unknown key (2 more
// under the race detector); the middleware chain, the problem's headers,
// the metrics' labels and the client address once took 31 and 18.
func TestRefusalAllocations(t *testing.T) {
	e := newEnv(t, envOptions{limits: limiter.Config{Rate: 1, Window: time.Hour}})
	img := pngBytes(t, 16, 16)
	h := e.srv.Handler()
	w := &discardWriter{h: http.Header{}}
	req, body := refusalRequest(img)
	for _, tc := range []struct {
		name   string
		key    string
		status int
		most   float64
	}{
		{"429", e.key, http.StatusTooManyRequests, 6},
		{"401", "bw_" + strings.Repeat("A", 32), http.StatusUnauthorized, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req.Header["Authorization"] = []string{"Bearer " + tc.key}
			serve := func() {
				w.reset()
				body.Reset(img)
				h.ServeHTTP(w, req)
			}
			serve() // the key's one request an hour, or a 401 already
			allocs := testing.AllocsPerRun(200, func() {
				serve()
				if w.status != tc.status {
					t.Fatalf("status %d, want %d", w.status, tc.status)
				}
			})
			most := tc.most
			if raceEnabled {
				most += 2 // the detector's own
			}
			if allocs > most {
				t.Errorf("%v allocations per refusal, want at most %v", allocs, most)
			}
		})
	}
}

// TestQuotaUnavailableIsNotExceeded: a quota the database could not
// answer is the service's failure, 503 usage_unavailable with a
// Retry-After of seconds, never the user's 429 quota_exceeded; a used-up
// quota stays 429.
func TestQuotaUnavailableIsNotExceeded(t *testing.T) {
	for _, tc := range []struct {
		r      guard.Refusal
		status int
		code   string
	}{
		{guard.Refusal{Layer: guard.LayerQuota, Reason: guard.ReasonUnavailable, RetryAfter: 3 * time.Second}, http.StatusServiceUnavailable, "usage_unavailable"},
		{guard.Refusal{Layer: guard.LayerQuota, Reason: "monthly_quota", RetryAfter: time.Hour}, http.StatusTooManyRequests, "quota_exceeded"},
	} {
		b, retry := refusalProblem(&tc.r)
		p := b.WithRetryAfter(retry)
		if p.Status != tc.status || p.Code != tc.code || p.RetryAfter() < 1 || p.RetryAfter() > ceilSeconds(tc.r.RetryAfter) {
			t.Errorf("%s/%s: %d %s, Retry-After %d; want %d %s, Retry-After 1 to %d",
				tc.r.Layer, tc.r.Reason, p.Status, p.Code, p.RetryAfter(), tc.status, tc.code, ceilSeconds(tc.r.RetryAfter))
		}
	}
}
