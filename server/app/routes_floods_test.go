package app

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// floodsRoutes are a route limited per client address to 1 a minute, for
// forward auth, and the referral route's fail limit.
const floodsRoutes = `
[[routes]]
name = "login"
path = "/api/login"
identity = "ip"
rate = 1
window = "1m"
burst = 0
` + referralRoute

// answered reads breakwater_deny_cache_answers_total.
func (e *routeEnv) answered() int {
	e.t.Helper()
	m := e.metric("breakwater_deny_cache_answers_total ")
	n, err := strconv.Atoi(strings.TrimPrefix(m, "breakwater_deny_cache_answers_total "))
	if err != nil {
		e.t.Fatalf("breakwater_deny_cache_answers_total: %q", m)
	}
	return n
}

// A guarded route's cooldown is refused from memory after its first
// refusal, each repeat answered and counted as the first; the operator's
// lift through the admin API lets the key through at once.
func TestRouteCooldownFloodFromMemory(t *testing.T) {
	up := referralApp(t)
	e := startRoutes(t, up.URL, strings.Replace(floodsRoutes, "UNIFORM", "", 1))
	from := hdr("X-Forwarded-For", "198.51.100.1", "Content-Type", "application/json")
	for range 5 {
		if resp, _ := e.do("POST", "/api/referral/check", referral("WRONG", "x@example.com"), from, ""); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("a failure: %d, want the app's 404", resp.StatusCode)
		}
	}
	const flood = 30
	var first string
	for i := range flood + 1 {
		e.clock.advance(time.Second)
		resp, body := e.do("POST", "/api/referral/check", referral("RIGHT", "x@example.com"), from, "")
		if want := strconv.Itoa(600 - 1 - i); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != want {
			t.Fatalf("refusal %d: %d Retry-After %q, want 429 with %s", i, resp.StatusCode, resp.Header.Get("Retry-After"), want)
		}
		if first == "" {
			first = body
		} else if body != first {
			t.Fatalf("refusal %d from memory: %s, the first %s", i, body, first)
		}
	}
	if got := e.answered(); got != flood {
		t.Errorf("%d refusals answered from memory, want %d", got, flood)
	}
	if m := e.metric(`breakwater_route_failures_total{reason="cooldown",route="referral"}`); !strings.HasSuffix(m, " "+strconv.Itoa(flood+1)) {
		t.Errorf("cooldown refusals metric: %q, want %d (every one, from memory or not)", m, flood+1)
	}
	if n := len(up.requests()); n != 5 {
		t.Fatalf("the app got %d requests, want the 5 failures", n)
	}

	for _, key := range []string{"ip:198.51.100.1", "json:email:x@example.com"} {
		e.adminPost("/api/cooldowns/clear", `{"source":"route:referral","key":"`+key+`"}`)
	}
	if resp, body := e.do("POST", "/api/referral/check", referral("RIGHT", "x@example.com"), from, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("right after the operator lifted the cooldowns: %d %s, want 200", resp.StatusCode, body)
	}
}

// A guarded route's rate refusal is remembered until its exact
// retry-after; a reload that raises the rate clears it.
func TestRouteRateFloodFromMemory(t *testing.T) {
	e := startRoutes(t, "http://127.0.0.1:1", strings.Replace(floodsRoutes, "UNIFORM", "", 1))
	check := func() *http.Response {
		resp, _ := e.do("GET", "/v1/forward-auth/login", "", hdr("X-Forwarded-For", "198.51.100.7"), "")
		return resp
	}
	if resp := check(); resp.StatusCode != http.StatusOK {
		t.Fatalf("the first check: %d", resp.StatusCode)
	}
	for i := range 20 {
		e.clock.advance(time.Second)
		if resp := check(); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != strconv.Itoa(60-1-i) {
			t.Fatalf("check %d in the window: %d Retry-After %q, want 429 with %d", i, resp.StatusCode, resp.Header.Get("Retry-After"), 60-1-i)
		}
	}
	if got := e.answered(); got != 19 {
		t.Errorf("%d rate refusals answered from memory, want 19", got)
	}
	if m := e.metric(`breakwater_refusals_total{layer="route:login",reason="rate"}`); !strings.HasSuffix(m, " 20") {
		t.Errorf("rate refusals metric: %q, want 20 (every one, from memory or not)", m)
	}

	next := e.cfg
	next.Routes = slices.Clone(e.cfg.Routes)
	for i := range next.Routes {
		if next.Routes[i].Name == "login" {
			next.Routes[i].Rate = 2
		}
	}
	if err := e.app.Reload(next, "test"); err != nil {
		t.Fatal(err)
	}
	if resp := check(); resp.StatusCode != http.StatusOK {
		t.Fatalf("after a reload to 2 a minute: %d, want 200", resp.StatusCode)
	}
	if resp := check(); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the third in the window: %d, want 429", resp.StatusCode)
	}
	e.clock.advance(40 * time.Second) // the first check leaves the window
	if resp := check(); resp.StatusCode != http.StatusOK {
		t.Fatalf("once the window reopened: %d, want 200", resp.StatusCode)
	}
}

// adminPost posts body to the admin API at path and fails t unless it
// answers 200.
func (e *routeEnv) adminPost(path, body string) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.app.AdminAddr()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.admin)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("POST %s %s: %d", path, body, resp.StatusCode)
	}
}
