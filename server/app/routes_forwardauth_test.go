package app

import (
	byteorder "encoding/binary"
	"fmt"
	"net/http"
	"os"
	"testing"
)

const forwardAuthRoutes = `
[[routes]]
name = "checkout"
methods = ["POST"]
path = "/api/checkout"
identity = "user"
rate = 1
window = "1m"
burst = 0

[[routes]]
name = "billing"
path = "/api/billing/*"
identity = "ip"
rate = 100

[[routes]]
name = "item"
methods = ["DELETE"]
path = "/api/items/7"
identity = "ip"
rate = 1
window = "1m"
burst = 0
`

// forwardAuthCase is one forward-auth check: the proxy's headers and the
// answer they must get.
type forwardAuthCase struct {
	name       string
	header     http.Header
	status     int
	realStatus string // X-Breakwater-Status
	retryAfter bool
}

// forwardAuthCases are the checks TestForwardAuth sends with alice, the
// API key of user alice, under each proxy's header conventions.
func forwardAuthCases(alice string) []forwardAuthCase {
	caddy := func(method, uri string) http.Header {
		return hdr("X-Forwarded-Method", method, "X-Forwarded-Uri", uri, "X-Forwarded-For", "203.0.113.7", "Authorization", "Bearer "+alice)
	}
	traefik := func(method, uri string) http.Header {
		h := caddy(method, uri)
		h.Set("X-Forwarded-Proto", "https")
		h.Set("X-Forwarded-Host", "shop.example.com")
		return h
	}
	nginx := func(method, uri string) http.Header {
		return hdr("X-Original-Method", method, "X-Original-URI", uri, "X-Forwarded-For", "203.0.113.7", "Authorization", "Bearer "+alice)
	}
	return []forwardAuthCase{
		{"caddy allowed", caddy("POST", "/api/checkout?step=1"), 200, "", false},
		{"caddy rate limited", caddy("POST", "/api/checkout"), 429, "429", true},
		{"traefik rate limited", traefik("post", "/api/checkout"), 429, "429", true},
		{"nginx rate limited", nginx("POST", "/api/checkout"), 403, "429", true},
		{"dot segments resolved", caddy("POST", "/api/x/../checkout"), 429, "429", true},
		// Every spelling a framework serves as the route is the route.
		{"upper case", caddy("POST", "/API/Checkout"), 429, "429", true},
		{"trailing slash", nginx("POST", "/api/checkout/"), 403, "429", true},
		{"segment parameters", caddy("POST", "/api;v=1/checkout;x=1?q=2"), 429, "429", true},
		{"repeated slashes", nginx("POST", "//api///checkout"), 403, "429", true},
		{"dot segment", caddy("POST", "/api/./checkout"), 429, "429", true},
		{"escaped letter", caddy("POST", "/api/%63heckout"), 429, "429", true},
		{"escaped slash", caddy("POST", "/api%2Fcheckout"), 429, "429", true},
		{"escaped dot segment", caddy("POST", "/api/x/%2E%2E/checkout"), 429, "429", true},
		{"dot-dot with a parameter", caddy("POST", "/api/x/..;/checkout"), 429, "429", true},
		{"prefix route without its slash", nginx("GET", "/API/billing"), 200, "", false},
		{"format suffix", caddy("POST", "/api/checkout.json"), 429, "429", true},
		{"trailing dot", nginx("POST", "/api/checkout."), 403, "429", true},
		{"trailing space", caddy("POST", "/api/checkout%20"), 429, "429", true},
		{"backslashes", nginx("POST", `/api\checkout`), 403, "429", true},
		{"escaped backslash", caddy("POST", "/api%5Ccheckout"), 429, "429", true},
		// A POST may be made a DELETE by the app's framework (_method).
		{"the DELETE route", caddy("DELETE", "/api/items/7"), 200, "", false},
		{"a POST to the DELETE route", caddy("POST", "/api/items/7"), 429, "429", true},
		{"a PUT to the DELETE route passes", caddy("PUT", "/api/items/7"), 200, "", false},
		// nginx forwards a '#' as it came: an app may read it as the
		// fragment's start or as a letter.
		{"a fragment", nginx("POST", "/api/checkout#x"), 403, "403", false},
		{"a fragment hiding a dot segment", nginx("POST", "/page#/../api/checkout"), 403, "403", false},
		{"a fragment hiding backslashes", nginx("POST", `/api\checkout#x`), 403, "403", false},
		{"a '#' of the query", nginx("POST", "/page?a#/../api/checkout"), 200, "", false},
		// A request of no route passes, with no identity.
		{"unmatched uri passes", caddy("POST", "/api/other"), 200, "", false},
		{"unmatched method passes", caddy("GET", "/api/checkout"), 200, "", false},
		{"a longer path passes", caddy("POST", "/api/checkout2"), 200, "", false},
		{"uri that does not parse", caddy("POST", "http://evil/api/checkout"), 403, "403", false},
		{"bad escape", caddy("POST", "/api/%zzcheckout"), 403, "403", false},
		{"escaped control character", caddy("POST", "/api/checkout%00"), 403, "403", false},
		{"a client's identity header", func() http.Header {
			h := caddy("POST", "/api/other")
			h.Set("X-Breakwater-User", "victim")
			return h
		}(), 400, "400", false},
		{"a client's identity header with underscores", func() http.Header {
			h := caddy("POST", "/api/other")
			h["X_Breakwater_User"] = []string{"victim"}
			return h
		}(), 400, "400", false},
		{"a client's identity header with one underscore", func() http.Header {
			h := caddy("GET", "/")
			h["X-Breakwater_user"] = []string{"victim"}
			return h
		}(), 400, "400", false},
		{"a client's other Breakwater header, nginx", func() http.Header {
			h := nginx("GET", "/")
			h.Set("x-breakwater-anything", "1")
			return h
		}(), 403, "400", false},
		{"no uri", hdr("X-Forwarded-Method", "POST"), 403, "403", false},
		{"conventions that disagree", func() http.Header {
			h := caddy("POST", "/api/billing/x")
			h.Set("X-Original-URI", "/api/checkout")
			return h
		}(), 403, "403", false},
		{"prefix route, nginx", nginx("GET", "/api/billing/invoices/7"), 200, "", false},
		{"no credentials on a user route", hdr("X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/api/checkout"), 401, "401", false},
	}
}

// Forward auth with Caddy's, Traefik's and nginx's header conventions:
// allowed with the identity headers, refused with the real status (as
// 403 plus X-Breakwater-Status under nginx's), every spelling of a
// route's path matched as the route, a request of no route let through
// with no identity, an unreadable URI or a client's X-Breakwater-* header
// refused, and no answer to an untrusted peer.
func TestForwardAuth(t *testing.T) {
	e := startRoutes(t, "", forwardAuthRoutes)
	for _, tc := range forwardAuthCases(e.key("alice")) {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("GET", "/v1/forward-auth", "", tc.header, "")
			if resp.StatusCode != tc.status || resp.Header.Get("X-Breakwater-Status") != tc.realStatus || (resp.Header.Get("Retry-After") != "") != tc.retryAfter {
				t.Fatalf("%d X-Breakwater-Status %q Retry-After %q %s", resp.StatusCode, resp.Header.Get("X-Breakwater-Status"), resp.Header.Get("Retry-After"), body)
			}
			if tc.status == 200 && tc.name == "caddy allowed" &&
				(resp.Header.Get("X-Breakwater-User") != "alice" || resp.Header.Get("X-Breakwater-Plan") != "free") {
				t.Errorf("identity headers %v", resp.Header)
			}
			if tc.status == 200 && tc.name != "caddy allowed" && (resp.Header.Get("X-Breakwater-User") != "" || resp.Header.Get("X-Breakwater-Plan") != "") {
				t.Errorf("identity headers on a pass without a user route: %v", resp.Header)
			}
		})
	}
	checkForwardAuthByName(t, e)
}

// checkForwardAuthByName: forward auth by a route's name; an unknown name
// is 404, and a peer that is not a trusted proxy gets 403.
func checkForwardAuthByName(t *testing.T, e *routeEnv) {
	// By name; an unknown name is 404.
	if resp, _ := e.do("POST", "/v1/forward-auth/billing", "", hdr("X-Forwarded-For", "203.0.113.8"), ""); resp.StatusCode != 200 {
		t.Errorf("by name: %d", resp.StatusCode)
	}
	if resp, _ := e.do("GET", "/v1/forward-auth/nope", "", nil, ""); resp.StatusCode != 404 {
		t.Errorf("unknown name: %d", resp.StatusCode)
	}
	// From a peer that is not a trusted proxy: 403, whatever it says.
	resp, body := e.do("GET", "/v1/forward-auth/billing", "", hdr("X-Forwarded-For", "203.0.113.9"), "127.0.0.2")
	if resp.StatusCode != 403 || problemCode(t, body) != "untrusted_proxy" {
		t.Errorf("untrusted peer: %d %s", resp.StatusCode, body)
	}
}

// A forward-auth check of no route (the proxies send every request of
// the app) writes nothing: no event, no transaction in the database,
// in any spelling, a format suffix included. Measured on bbolt's
// transaction id, read from its meta pages: opening and closing the App
// commits some transactions of its own, so a run with the checks must
// commit as many as a run without, and one with a route's check more.
func TestForwardAuthPassOfNoRouteWritesNothing(t *testing.T) {
	e := startRoutes(t, "", forwardAuthRoutes)
	txid := func() uint64 {
		t.Helper()
		b, err := os.ReadFile(e.cfg.Storage.Path)
		if err != nil {
			t.Fatal(err)
		}
		// A page header of 16 bytes, then the meta: magic, version,
		// page size, flags (4 bytes each), the root bucket (16), the
		// freelist and high-water page ids (8 each), the txid (8).
		if len(b) < 2*4096 {
			t.Fatalf("the database is %d bytes, no bbolt file", len(b))
		}
		pageSize := int(byteorder.LittleEndian.Uint32(b[16+8:]))
		return max(byteorder.LittleEndian.Uint64(b[64:]), byteorder.LittleEndian.Uint64(b[pageSize+64:]))
	}
	run := func(checks func()) uint64 {
		e.close()
		before := txid()
		e.open()
		checks()
		e.close()
		return txid() - before
	}
	check := func(method, uri string) {
		resp, body := e.do("GET", "/v1/forward-auth", "", hdr("X-Forwarded-Method", method, "X-Forwarded-Uri", uri, "X-Forwarded-For", "203.0.113.1"), "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s, want 200", method, uri, resp.StatusCode, body)
		}
	}
	idle := run(func() {})
	passes := run(func() {
		for i := range 50 {
			check("GET", fmt.Sprintf("/static/app.%d.js?v=%d", i, i))
			check("POST", "/Static//a.b.c.d.e.f/./app.js;v=3/")
			check("GET", "/api/checkout.json") // a route's path, not its method
		}
	})
	checked := run(func() { check("GET", "/api/billing/x") })
	if passes != idle || checked <= idle {
		t.Errorf("transactions committed: %d by opening and closing, %d with 150 checks of no route (want as many), %d with one of a route (want more)",
			idle, passes, checked)
	}
}
