package app

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// lenientApp is the developer's app as common frameworks serve it: one
// handler for every spelling of a path that Express's defaults (case,
// a trailing slash) and other routers (";parameters", repeated slashes,
// dot segments, %-escapes) take for the same route, and those of
// frameworkPaths. It records which handler ran and the X-Breakwater-*
// headers it got, '_' read as '-' as CGI, WSGI and Rack servers do.
type lenientApp struct {
	*httptest.Server
	mu   sync.Mutex
	runs []appRun
}

type appRun struct {
	handler    string // checkout, contact, referral or page
	target     string // the request target as the app got it
	client     string // the first address of X-Forwarded-For
	user, plan string
	breakwater []string // every X-Breakwater-* header with a value, "Name: value"
}

func newLenientApp(t *testing.T) *lenientApp {
	t.Helper()
	a := &lenientApp{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		paths := frameworkPaths(r)
		client, _, _ := strings.Cut(r.Header.Get("X-Forwarded-For"), ",")
		run := appRun{handler: "page", target: r.RequestURI, client: strings.TrimSpace(client)}
		for k, vs := range r.Header {
			name := strings.ReplaceAll(strings.ToLower(k), "_", "-")
			if !strings.HasPrefix(name, "x-breakwater-") {
				continue
			}
			for _, v := range vs {
				switch name {
				case "x-breakwater-user":
					run.user = v
				case "x-breakwater-plan":
					run.plan = v
				}
				if v != "" { // an empty one is no identity (Caddy 2.6 copies it so)
					run.breakwater = append(run.breakwater, k+": "+v)
				}
			}
		}
		status := http.StatusOK
		post := strings.ToUpper(r.Method) == http.MethodPost // Django and Werkzeug upper-case the method
		switch {
		case paths["/api/checkout"] && post:
			run.handler, status = "checkout", http.StatusCreated
		case paths["/contact"] && post:
			run.handler, status = "contact", http.StatusCreated
		case paths["/api/referral/check"] && post:
			run.handler, status = "referral", http.StatusNotFound
			if strings.Contains(string(body), "RIGHT") {
				status = http.StatusOK
			}
		}
		a.mu.Lock()
		a.runs = append(a.runs, run)
		a.mu.Unlock()
		w.WriteHeader(status)
		io.WriteString(w, run.handler)
	}))
	t.Cleanup(a.Close)
	return a
}

// frameworkPaths are the paths, lower-cased, that one framework or another
// routes r to:
//   - the decoded path, ";parameters" removed, cleaned (Go's ServeMux,
//     Tomcat, which read a '#' that nginx passed on as a letter);
//   - that path with backslashes as slashes and the spaces around a
//     segment and the dots at its end removed (Windows servers, Spring
//     with trimTokens);
//   - that path without a format suffix in its last segment (Rails'
//     "(.:format)", Spring's suffix patterns);
//   - the target as sent, cut at a '#' or '?', backslashes as slashes,
//     without a trailing slash (Express, whose parseurl hands a target
//     with a '#' to Node's url.parse).
func frameworkPaths(r *http.Request) map[string]bool {
	clean := func(p string) string { return strings.ToLower(path.Clean("/" + p)) }
	segs := strings.Split(r.URL.Path, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	plain := clean(strings.Join(segs, "/"))
	segs = strings.Split(strings.ReplaceAll(strings.Join(segs, "/"), `\`, "/"), "/")
	for i, s := range segs {
		if s = strings.Trim(s, " "); s != "." && s != ".." {
			s = strings.TrimRight(s, ". ")
		}
		segs[i] = s
	}
	trimmed := clean(strings.Join(segs, "/"))
	dir, last := path.Split(trimmed)
	last, _, _ = strings.Cut(last, ".")
	express := r.RequestURI
	if i := strings.IndexAny(express, "?#"); i >= 0 {
		express = express[:i]
	}
	express = strings.ToLower(strings.ReplaceAll(express, `\`, "/"))
	if len(express) > 1 {
		express = strings.TrimSuffix(express, "/")
	}
	return map[string]bool{plain: true, trimmed: true, dir + last: true, express: true}
}

func (a *lenientApp) ran() []appRun {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]appRun(nil), a.runs...)
}

// spellings are the ways of writing p that a lenient framework serves as
// p: the first is p itself.
func spellings(p string) []string {
	dir, last := path.Split(p)
	return []string{
		p,
		p + "/",
		strings.ToUpper(p),
		p + ";x=1",
		"/" + p,
		dir + "./" + last,
		dir + fmt.Sprintf("%%%02x", last[0]) + last[1:],
	}
}

// oddSpellings are the spellings of p that some frameworks serve as p
// (frameworkPaths) beyond those of spellings: a format suffix, a trailing
// dot or space, backslashes, and a '#' that nginx passes on as it came.
func oddSpellings(p string) []string {
	return []string{
		p + ".json",
		p + ".",
		p + "%20",
		"/" + strings.ReplaceAll(p[1:], "/", `\`) + `\`,
		`/x\..\` + p[1:],
		"/page#/.." + p,
		"/" + strings.ReplaceAll(p[1:], "/", `\`) + "#x",
	}
}

// rawRequest sends one request as written, target included (no client
// library cleans it), from the loopback address from, and returns the
// status and the body.
func rawRequest(t *testing.T, addr, from, method, target string, header http.Header, body string) (int, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n", method, target, addr, len(body))
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// The README's snippets, run verbatim by real Caddy and nginx in front of
// spellingRoute is one of the README's example routes as the spelling
// test sends to it.
type spellingRoute struct {
	name, path string
	limit      int // how many requests of one client pass, all at one instant
	body       func(i int) string
}

// spellingRoutes are the README's example routes with their limits.
var spellingRoutes = []spellingRoute{
	{"checkout", "/api/checkout", 2, func(int) string { return "{}" }},                                                         // burst = 2
	{"contact", "/contact", 1, func(int) string { return "hello" }},                                                            // burst = 1
	{"referral", "/api/referral/check", 5, func(i int) string { return referral("WRONG", fmt.Sprintf("r%d@example.com", i)) }}, // fail limit 5
}

// spellingSent is what one client sent: sent requests to route by one
// spelling of its path, from one address (and for checkout as one user).
type spellingSent struct {
	route, path, spelling, from, user string
	sent                              int
}

// withForgedIdentity sets a forged Breakwater identity on h.
func withForgedIdentity(h http.Header) http.Header {
	h.Set("X-Breakwater-User", "victim")
	h.Set("X-Breakwater-Plan", "gold")
	return h
}

// Breakwater with the README's example routes and an app that serves
// every spelling of a path as the path: for each route and each spelling
// (its own client, its own user), more requests than the limit reach the
// route's handler at most the limit's number of times, and a client's
// X-Breakwater-* header never reaches the app, on any path. On the old
// snippets (only the exact paths sent to Breakwater, nginx without
// /contact, identity headers stripped only inside the guarded location)
// the handlers ran for every request of most spellings. Before
// Breakwater matched oddSpellings too (a format suffix, trailing dots and
// spaces, backslashes), refused a '#' in a forwarded URI and a client's
// X_Breakwater_User, their requests reached the app unguarded under both
// proxies, and Caddy passed X_Breakwater_User: victim on to the app.
func TestRealProxiesGuardEverySpelling(t *testing.T) {
	for _, proxy := range []string{"caddy", "nginx"} {
		t.Run(proxy, func(t *testing.T) {
			app := newLenientApp(t)
			e := startRoutes(t, "", strings.ReplaceAll(snippet(t, "routes-config"), "http://127.0.0.1:3000", app.URL))
			addr := startRealProxy(t, proxy, e, app.URL)

			results := sendEverySpelling(t, e, addr)
			sendForgedIdentities(t, e, addr)
			checkSpellingRuns(t, app.ran(), results)
		})
	}
}

// sendEverySpelling sends more than its limit to each route in every
// spelling of its path, with a forged identity. Each spelling is sent by
// a client of its own (a loopback address, and for checkout a user) so
// that each meets the limit afresh.
func sendEverySpelling(t *testing.T, e *routeEnv, addr string) []spellingSent {
	client := 0
	var results []spellingSent
	for _, r := range spellingRoutes {
		for _, sp := range append(spellings(r.path), oddSpellings(r.path)...) {
			client++
			from := fmt.Sprintf("127.0.0.%d", 10+client)
			h := withForgedIdentity(hdr("Content-Type", "application/json"))
			res := spellingSent{route: r.name, path: r.path, spelling: sp, from: from, sent: r.limit + 2}
			if r.name == "checkout" {
				res.user = fmt.Sprintf("user%d", client)
				h.Set("Authorization", "Bearer "+e.key(res.user))
			}
			for range res.sent {
				rawRequest(t, addr, from, http.MethodPost, sp, h, r.body(client))
			}
			results = append(results, res)
		}
	}
	return results
}

// sendForgedIdentities sends a client's X-Breakwater-* headers on paths
// of no route and, spelled with '_', on the routes: each must be removed,
// or the request refused.
func sendForgedIdentities(t *testing.T, e *routeEnv, addr string) {
	// A client's X-Breakwater-* headers on paths of no route:
	// removed, or the request refused.
	for i, target := range []string{"/", "/page", "/api/profile", "/API/CHECKOUT/extra"} {
		h := withForgedIdentity(hdr())
		if i%2 == 1 {
			h.Set("X-Breakwater-Anything", "1")
		}
		rawRequest(t, addr, "127.0.0.9", http.MethodGet, target, h, "")
	}
	// The same names with '_', one name with '-' to a CGI, WSGI or
	// Rack server: removed, or the request refused, through
	// forward auth and through Breakwater's proxy alike.
	underscored := hdr("Authorization", "Bearer "+e.key("underscored"), "Content-Type", "application/json")
	underscored["X_Breakwater_User"] = []string{"victim"}
	underscored["X-Breakwater_Plan"] = []string{"gold"}
	for _, target := range []string{"/page", "/api/checkout", "/api/checkout/", "/contact", "/CONTACT/", "/api/referral/check"} {
		rawRequest(t, addr, "127.0.0.9", http.MethodPost, target, underscored, referral("RIGHT", "u@example.com"))
	}
	if status, body := rawRequest(t, addr, "127.0.0.9", http.MethodGet, "/page", withForgedIdentity(hdr()), ""); status != http.StatusOK || body != "page" {
		t.Errorf("a page of no route with a forged identity: %d %q, want the app's 200 (the header removed)", status, body)
	}
}

// checkSpellingRuns checks the app's handler runs: no forged identity
// reached the app, and each spelling ran its route's handler at most the
// limit's number of times (exactly that, as written).
func checkSpellingRuns(t *testing.T, runs []appRun, results []spellingSent) {
	for _, run := range runs {
		if run.user == "victim" || run.plan == "gold" || (run.handler != "checkout" && len(run.breakwater) != 0) {
			t.Errorf("a client's X-Breakwater-* header reached the app's %s handler: %+v", run.handler, run)
		}
	}
	for _, res := range results {
		n := 0
		for _, run := range runs {
			if run.handler != res.route || run.client != res.from {
				continue
			}
			n++
			if res.route == "checkout" && (run.user != res.user || len(run.breakwater) != 2) {
				t.Errorf("checkout spelled %q: the app got %v, want only %s's identity", res.spelling, run.breakwater, res.user)
			}
		}
		limit := 0
		for _, r := range spellingRoutes {
			if r.name == res.route {
				limit = r.limit
			}
		}
		t.Logf("%s spelled %q: the handler ran %d of %d times", res.route, res.spelling, n, res.sent)
		if n > limit {
			t.Errorf("%s spelled %q: %d requests, the handler ran %d times; the limit is %d", res.route, res.spelling, res.sent, n, limit)
		}
		if res.spelling == res.path && n != limit {
			t.Errorf("%s as written: the handler ran %d times, want %d", res.route, n, limit)
		}
	}
}

// Breakwater's own proxy, without a proxy in front: every spelling of a
// proxied path is the route, counted under one key, and the app gets the
// path that was matched, without a client's X-Breakwater-* header in any
// spelling; another method of the path goes on unguarded.
func TestRouteProxyEverySpelling(t *testing.T) {
	up := newTestApp(t)
	e := startRoutes(t, up.URL, strings.Replace(contactRoute, `path = "/contact"`, "path = \"/contact\"\nmethods = [\"POST\"]", 1))
	addr := e.app.Addr()
	var all []string
	for _, sp := range append(spellings("/contact"), oddSpellings("/contact")...) {
		if !strings.HasSuffix(sp, "#x") { // the fragment: no route, 404
			all = append(all, sp)
		}
	}
	for i, sp := range all {
		h := hdr("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1), "X-Breakwater_User", "victim")
		h["X_Breakwater_Plan"] = []string{"gold"}
		for j := range 3 {
			status, body := rawRequest(t, addr, "127.0.0.1", http.MethodPost, sp, h, "hi")
			want := http.StatusCreated
			if j == 2 {
				want = http.StatusTooManyRequests
			}
			if status != want {
				t.Fatalf("%s, request %d: %d %s, want %d", sp, j, status, body, want)
			}
		}
	}
	got := up.requests()
	if n := len(all) * 2; len(got) != n {
		t.Fatalf("the app got %d requests, want %d", len(got), n)
	}
	for _, r := range got {
		if p := strings.TrimSuffix(r.path, ".json"); !strings.EqualFold(p, "/contact") { // the case as sent: the app's own business
			t.Errorf("the app got %s, want the path matched, /contact", r.path)
		}
		for k := range r.header {
			if strings.Contains(strings.ToLower(k), "breakwater") {
				t.Errorf("the app got the client's %s: %q", k, r.header[k])
			}
		}
	}
	if status, _ := rawRequest(t, addr, "127.0.0.1", http.MethodGet, "/Contact/", hdr("X-Forwarded-For", "198.51.100.1"), ""); status != http.StatusCreated {
		t.Errorf("GET of the POST route's path: %d, want the app's answer", status)
	}
	for _, p := range []string{"/contact/more", "/contacts", "/v1/OCR"} {
		if status, _ := rawRequest(t, addr, "127.0.0.1", http.MethodPost, p, nil, "hi"); status != http.StatusNotFound {
			t.Errorf("POST %s: %d, want 404", p, status)
		}
	}
	if n := len(up.requests()); n != len(got)+1 {
		t.Errorf("the app got %d requests, want %d", n, len(got)+1)
	}
}

// A fail-limited route asked about through forward auth, in any
// spelling or by name, is refused: only Breakwater's proxy sees the
// app's answers that the fail limit counts.
func TestForwardAuthRefusesFailLimitedRoute(t *testing.T) {
	e := startRoutes(t, "http://127.0.0.1:1", strings.Replace(referralRoute, "UNIFORM", "", 1))
	for _, uri := range []string{"/api/referral/check", "/API/referral/check/"} {
		resp, body := e.do("GET", "/v1/forward-auth", "", hdr("X-Forwarded-Method", "POST", "X-Forwarded-Uri", uri, "X-Forwarded-For", "203.0.113.1"), "")
		if resp.StatusCode != http.StatusForbidden || problemCode(t, body) != "route_not_proxied" {
			t.Errorf("%s: %d %s, want 403 route_not_proxied", uri, resp.StatusCode, body)
		}
	}
	if resp, body := e.do("GET", "/v1/forward-auth/referral", "", nil, ""); resp.StatusCode != http.StatusForbidden || problemCode(t, body) != "route_not_proxied" {
		t.Errorf("by name: %d %s, want 403 route_not_proxied", resp.StatusCode, body)
	}
}

// The Traefik snippet, which no test can run (Traefik is not packaged):
// every request goes through the forward-auth middleware but the proxied
// routes' paths, which its PathRegexp (Go's regexp, as Traefik's) sends
// to Breakwater in each spelling that Traefik's path leaves; and
// authResponseHeadersRegex removes every X-Breakwater-* header of the
// client's. Its forward-auth headers are tested in TestForwardAuth.
func TestTraefikSnippet(t *testing.T) {
	conf := snippet(t, "traefik")
	find := func(re string) string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(conf)
		if m == nil {
			t.Fatalf("the traefik snippet has no %s", re)
		}
		return m[1]
	}
	through := regexp.MustCompile(find("PathRegexp\\(`([^`]+)`\\)"))
	for _, p := range append(spellings("/api/referral/check"), spellings("/contact")...) {
		if strings.HasPrefix(p, "//") || strings.Contains(p, "/./") || strings.Contains(p, "%") {
			continue // Traefik cleans and decodes the path before it is matched
		}
		if !through.MatchString(p) {
			t.Errorf("%s does not go through Breakwater", p)
		}
	}
	for _, p := range []string{"/contact/more", "/contacts", "/api/referral", "/"} {
		if through.MatchString(p) {
			t.Errorf("%s goes through Breakwater's proxy, which answers it 404", p)
		}
	}
	headers := regexp.MustCompile(find(`authResponseHeadersRegex: "([^"]+)"`))
	for _, h := range []string{"X-Breakwater-User", "X-Breakwater-Plan", "X-Breakwater-Anything", "x-breakwater-user"} {
		if !headers.MatchString(h) {
			t.Errorf("a client's %s is not removed", h)
		}
	}
	if headers.MatchString("X-Forwarded-For") || headers.MatchString("X-Api-Breakwater-User") {
		t.Errorf("authResponseHeadersRegex removes more than X-Breakwater-*")
	}
	if !regexp.MustCompile("(?s)app:\\s+rule: \"PathPrefix\\(`/`\\)\".*?middlewares: \\[\"breakwater\"\\]").MatchString(conf) {
		t.Errorf("the app router does not send every other request through forward auth:\n%s", conf)
	}
}
