package app

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

const checkoutRoute = `
[[routes]]
name = "checkout"
methods = ["POST"]
path = "/api/checkout"
upstream = "UPSTREAM"
identity = "user"
rate = 3
window = "1m"
burst = 2
daily = 4
max_body = 100

[[routes]]
name = "down"
path = "/api/down"
upstream = "http://127.0.0.1:1"
identity = "ip"
`

func problemCode(t *testing.T, body string) string {
	t.Helper()
	var p struct{ Code string }
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("not problem+json: %q", body)
	}
	return p.Code
}

// A per-user route: 401 without credentials, the rate and burst exact,
// the daily line, the identity passed on and a forged one dropped, the
// app's answer unchanged, and nothing refused ever reaching the app.
func TestRouteProxyPerUser(t *testing.T) {
	up := newTestApp(t)
	e := startRoutes(t, up.URL, checkoutRoute)
	alice := e.key("alice")
	auth := hdr("Authorization", "Bearer "+alice, "X-Breakwater-User", "mallory", "X-Breakwater-Plan", "gold", "X-Request-ID", "forged")

	resp, body := e.do("POST", "/api/checkout", "{}", nil, "")
	if resp.StatusCode != http.StatusUnauthorized || problemCode(t, body) != "unauthorized" {
		t.Fatalf("without credentials: %d %s", resp.StatusCode, body)
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("the app got %d requests without credentials", n)
	}

	checkCheckoutLimits(t, e, auth)
	checkAppGotAlice(t, e, up, alice)
	checkCheckoutOtherMethodsAndBan(t, e, up, auth)
	checkAppDown(t, e)
}

// checkCheckoutLimits sends as alice (auth) until each of the checkout
// route's limits refuses: the burst, the rate, the daily line.
func checkCheckoutLimits(t *testing.T, e *routeEnv, auth http.Header) {
	var resp *http.Response
	var body string
	// The burst: 2 in one second, the third refused until the second
	// has passed.
	for i := range 2 {
		resp, body = e.do("POST", "/api/checkout", `{"item":1}`, auth, "")
		if resp.StatusCode != http.StatusCreated || body != "hello from the app" || resp.Header.Get("X-App") != "yes" {
			t.Fatalf("request %d: %d %q %v, want the app's 201 unchanged", i, resp.StatusCode, body, resp.Header)
		}
	}
	resp, body = e.do("POST", "/api/checkout", `{}`, auth, "")
	if resp.StatusCode != http.StatusTooManyRequests || problemCode(t, body) != "rate_limited" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("third in a second: %d %s Retry-After %q, want 429 rate_limited after 1s", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	e.clock.advance(time.Second)
	if resp, _ = e.do("POST", "/api/checkout", `{}`, auth, ""); resp.StatusCode != http.StatusCreated {
		t.Fatalf("after the burst second: %d", resp.StatusCode)
	}
	// The rate: 3 a minute, exact.
	e.clock.advance(time.Second)
	resp, _ = e.do("POST", "/api/checkout", `{}`, auth, "")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "58" {
		t.Fatalf("fourth in a minute: %d Retry-After %q, want 429 after 58s", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	e.clock.advance(58 * time.Second)
	if resp, _ = e.do("POST", "/api/checkout", `{}`, auth, ""); resp.StatusCode != http.StatusCreated {
		t.Fatalf("once the window let one go: %d", resp.StatusCode)
	}
	// The daily line: 4 a day.
	e.clock.advance(time.Hour)
	resp, body = e.do("POST", "/api/checkout", `{}`, auth, "")
	if resp.StatusCode != http.StatusTooManyRequests || problemCode(t, body) != "daily_limit" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("fifth today: %d %s", resp.StatusCode, body)
	}
}

// checkAppGotAlice: the app got the 4 requests allowed, the first with
// alice's identity, her Authorization unchanged, the forwarding headers
// and Breakwater's request id (not the forged one), and its body.
func checkAppGotAlice(t *testing.T, e *routeEnv, up *testApp, alice string) {
	got := up.requests()
	if len(got) != 4 {
		t.Fatalf("the app got %d requests, want the 4 allowed", len(got))
	}
	r := got[0]
	if r.header.Get("X-Breakwater-User") != "alice" || r.header.Get("X-Breakwater-Plan") != "free" || len(r.header.Values("X-Breakwater-User")) != 1 {
		t.Errorf("identity headers at the app: %v", r.header)
	}
	if r.header.Get("Authorization") != "Bearer "+alice {
		t.Errorf("Authorization at the app: %q, want it unchanged", r.header.Get("Authorization"))
	}
	if r.header.Get("X-Forwarded-For") != "127.0.0.1" || r.header.Get("X-Forwarded-Proto") != "http" || r.header.Get("X-Forwarded-Host") != e.app.Addr() {
		t.Errorf("forwarding headers at the app: %v", r.header)
	}
	if id := r.header.Get("X-Request-ID"); id == "" || id == "forged" {
		t.Errorf("X-Request-ID at the app: %q, want Breakwater's", id)
	}
	if r.path != "/api/checkout" || r.body != `{"item":1}` {
		t.Errorf("the app got %s %q", r.path, r.body)
	}
}

// checkCheckoutOtherMethodsAndBan, a day later: max_body is 413 from the
// declared length; another method goes on to the app with no identity and
// counts against nothing; a banned user is refused.
func checkCheckoutOtherMethodsAndBan(t *testing.T, e *routeEnv, up *testApp, auth http.Header) {
	var resp *http.Response
	var body string
	// max_body: 413 from the declared length, before the body is read;
	// another method is not guarded: it goes on to the app with no
	// identity (a forged one dropped) and counts against nothing.
	e.clock.advance(24 * time.Hour)
	resp, body = e.do("POST", "/api/checkout", strings.Repeat("x", 101), auth, "")
	if resp.StatusCode != http.StatusRequestEntityTooLarge || problemCode(t, body) != "body_too_large" {
		t.Errorf("a body over max_body: %d %s", resp.StatusCode, body)
	}
	for range 3 {
		if resp, _ = e.do("GET", "/api/checkout/", "", auth, ""); resp.StatusCode != http.StatusCreated {
			t.Errorf("GET on a POST route: %d, want the app's 201", resp.StatusCode)
		}
	}
	if got := up.requests(); len(got) != 7 || got[6].method != "GET" || got[6].path != "/api/checkout" || got[6].header.Get("X-Breakwater-User") != "" {
		t.Errorf("the app got %d requests, the last %+v; want 7, the last a GET without identity", len(got), got[len(got)-1])
	}
	if resp, _ = e.do("POST", "/api/checkout", "{}", auth, ""); resp.StatusCode != http.StatusCreated {
		t.Errorf("a POST after the GETs: %d, want 201 (the GETs counted against nothing)", resp.StatusCode)
	}
	if _, err := e.app.Keys().SetBanned("alice", true, true); err != nil {
		t.Fatal(err)
	}
	if resp, body = e.do("POST", "/api/checkout", "{}", auth, ""); resp.StatusCode != http.StatusForbidden || problemCode(t, body) != "banned" {
		t.Errorf("banned: %d %s", resp.StatusCode, body)
	}
}

// checkAppDown: an app that is down is 502 upstream_failed, logged.
func checkAppDown(t *testing.T, e *routeEnv) {
	resp, body := e.do("GET", "/api/down", "", nil, "")
	if resp.StatusCode != http.StatusBadGateway || problemCode(t, body) != "upstream_failed" {
		t.Errorf("app down: %d %s", resp.StatusCode, body)
	}
	if !strings.Contains(e.logText(), "route upstream failed") {
		t.Errorf("the failed upstream is not logged:\n%s", e.logText())
	}
}

const contactRoute = `
[[routes]]
name = "contact"
path = "/contact"
upstream = "UPSTREAM"
identity = "ip"
rate = 2
window = "1m"
burst = 0
`

// A per-IP route: an IPv6 /64 is one client, the client IP is believed
// from a trusted proxy only, and an untrusted peer's X-Forwarded-For
// changes neither its key nor what the app is told.
func TestRouteProxyPerIP(t *testing.T) {
	up := newTestApp(t)
	e := startRoutes(t, up.URL, contactRoute)
	xff := func(ip string) http.Header { return hdr("X-Forwarded-For", ip) }

	for i, ip := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9"} {
		if resp, _ := e.do("POST", "/contact", "hi", xff(ip), ""); resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d from %s: %d", i, ip, resp.StatusCode)
		}
	}
	if resp, _ := e.do("POST", "/contact", "hi", xff("2001:db8:1:2::77"), ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third address of the same /64: %d, want 429", resp.StatusCode)
	}
	forged := hdr("X-Forwarded-For", "2001:db8:1:3::1", "X-Breakwater-User", "mallory", "x-breakwater-status", "200")
	if resp, _ := e.do("POST", "/contact", "hi", forged, ""); resp.StatusCode != http.StatusCreated {
		t.Fatalf("another /64: %d, want it counted apart", resp.StatusCode)
	}
	for k := range up.requests()[2].header {
		if strings.HasPrefix(k, "X-Breakwater-") {
			t.Errorf("the client's %s reached the app", k)
		}
	}

	// From 127.0.0.2, which is not a trusted proxy: its own address is
	// the key whatever X-Forwarded-For says.
	for i := range 3 {
		resp, _ := e.do("POST", "/contact", "hi", xff("198.51.100."+string(rune('1'+i))), "127.0.0.2")
		want := http.StatusCreated
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("untrusted request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	got := up.requests()
	last := got[len(got)-1]
	if f := last.header.Get("X-Forwarded-For"); f != "127.0.0.2" {
		t.Errorf("X-Forwarded-For at the app from an untrusted peer: %q, want only the peer", f)
	}
	if f := got[0].header.Get("X-Forwarded-For"); f != "2001:db8:1:2::1, 127.0.0.1" {
		t.Errorf("X-Forwarded-For at the app through a trusted proxy: %q, want the chain with the peer appended", f)
	}
}
