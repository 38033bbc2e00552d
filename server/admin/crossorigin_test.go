package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// adminCall is one request the admin listener received, as it arrived
// and as it was answered.
type adminCall struct {
	method, path, origin, fetchSite string
	withToken                       bool
	status                          int
	code                            string
}

// adminRecorder serves the admin handler and records what reached it.
// Its extra paths play the operator in the browser: /login asks for Basic
// credentials as the admin listener does and, once the browser sends
// them, sends it on to next; /login-dashboard does the same and sends it
// to /dashboard-click, the real dashboard (fetched from the handler) with
// a script that clicks its brake button, as the operator would.
type adminRecorder struct {
	h    http.Handler
	next string
	mu   sync.Mutex
	got  []adminCall
}

func (a *adminRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, token, ok := r.BasicAuth()
	switch r.URL.Path {
	case "/login", "/login-dashboard":
		if !ok || token != testAdminToken {
			w.Header().Set("WWW-Authenticate", `Basic realm="breakwater admin", charset="UTF-8"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		next := a.next
		if r.URL.Path == "/login-dashboard" {
			next = "/dashboard-click"
		}
		http.Redirect(w, r, next, http.StatusFound)
		return
	case "/dashboard-click":
		get := httptest.NewRequest(http.MethodGet, "/", nil)
		get.Header.Set("Authorization", "Bearer "+testAdminToken)
		rec := httptest.NewRecorder()
		a.h.ServeHTTP(rec, get)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(rec.Body.Bytes())
		io.WriteString(w, `<script>document.getElementById("brake-button").click()</script>`)
		return
	}
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, r)
	var p struct{ Code string }
	json.Unmarshal(rec.Body.Bytes(), &p)
	a.mu.Lock()
	a.got = append(a.got, adminCall{method: r.Method, path: r.URL.Path, origin: r.Header.Get("Origin"), fetchSite: r.Header.Get("Sec-Fetch-Site"),
		withToken: ok && token == testAdminToken, status: rec.Code, code: p.Code})
	a.mu.Unlock()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

func (a *adminRecorder) calls() []adminCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]adminCall(nil), a.got...)
}

// A page of another origin, opened in a browser that holds the admin
// token as the dashboard's Basic credentials, cannot change anything
// through the admin API: in real headless Chromium it auto-submits a form
// to /api/invites and posts to /api/detect/run and /api/keys/ID/revoke;
// each arrives with the credentials and is refused 403 cross_origin, and
// no invite is created and no key revoked. Nor can it make the server
// copy its database for it (a no-cors fetch of /api/backup, which the
// page cannot read but the server pays for): 403 too. The dashboard's own
// brake button, clicked in the browser, still works. On the old code the
// invite was created and the key revoked; then the backup was still
// answered 200.
func TestAdminRefusesCrossOriginPostsInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("this test needs Debian's chromium (apt-get install chromium); .ci/run installs it")
	}
	e := newTestAdmin(t, adminOptions{})
	keyID := e.keyOf(t, "alice")

	// Every address is known before any server starts, so the handlers
	// only read what is set up front.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminURL := "http://" + ln.Addr().String()
	page := fmt.Sprintf(attackPage, adminURL, adminURL, keyID)
	done := make(chan struct{})
	var doneOnce sync.Once
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, page)
		case "/done":
			doneOnce.Do(func() { close(done) })
		}
	}))
	t.Cleanup(attacker.Close)
	rec := &adminRecorder{h: e.Handler(), next: attacker.URL + "/"}
	admin := &httptest.Server{Listener: ln, Config: &http.Server{Handler: rec}}
	admin.Start()
	t.Cleanup(admin.Close)

	browse(t, bin, strings.Replace(admin.URL, "http://", "http://admin:"+testAdminToken+"@", 1)+"/login", done, rec)

	attacks := map[string]bool{"POST /api/invites": false, "POST /api/detect/run": false, "POST /api/keys/" + keyID + "/revoke": false,
		"GET /api/backup": false}
	for _, c := range rec.calls() {
		if _, ok := attacks[c.method+" "+c.path]; !ok {
			continue
		}
		attacks[c.method+" "+c.path] = true
		if !c.withToken {
			t.Errorf("%s %s arrived without the admin credentials: the test proves nothing (%+v)", c.method, c.path, c)
		}
		if c.status != http.StatusForbidden || c.code != "cross_origin" {
			t.Errorf("%s %s from origin %q (Sec-Fetch-Site %q): %d %q, want 403 cross_origin", c.method, c.path, c.origin, c.fetchSite, c.status, c.code)
		}
	}
	for path, seen := range attacks {
		if !seen {
			t.Errorf("the page's %s never reached the admin listener; it saw %+v", path, rec.calls())
		}
	}
	resp, body := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/invites", testAdminToken))
	var invites []json.RawMessage
	if err := json.Unmarshal(body, &invites); resp.StatusCode != http.StatusOK || err != nil || len(invites) != 0 {
		t.Errorf("invites after the attack: %d %s, want none", resp.StatusCode, body)
	}
	list, err := e.keys.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range list {
		if k.ID == keyID && !k.RevokedAt.IsZero() {
			t.Errorf("the key %s was revoked by another origin's page", keyID)
		}
	}

	// The dashboard's own brake form, clicked in the same browser, still
	// works: its post is same-origin.
	clicked := make(chan struct{})
	go func() {
		defer close(clicked)
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for _, c := range rec.calls() {
				if c.path == "/brake" && c.status != http.StatusUnauthorized {
					return // answered with the credentials (the browser may ask without them first)
				}
			}
		}
	}()
	browse(t, bin, strings.Replace(admin.URL, "http://", "http://admin:"+testAdminToken+"@", 1)+"/login-dashboard", clicked, rec)
	var brake []adminCall
	for _, c := range rec.calls() {
		if c.path == "/brake" && c.status != http.StatusUnauthorized {
			brake = append(brake, c)
		}
	}
	if len(brake) != 1 || brake[0].status != http.StatusSeeOther || brake[0].fetchSite != "same-origin" || !brake[0].withToken {
		t.Errorf("the dashboard's brake form: %+v, want one same-origin post with the credentials answered 303", brake)
	}
	if st := e.brake.Status(time.Now()); !st.Manual || !st.Engaged {
		t.Errorf("the dashboard's brake button did not engage the brake: %+v", st)
	}
}

// browse opens url in headless Chromium and closes it once until is
// closed; it fails the test if Chromium stops first or a minute passes.
func browse(t *testing.T, bin, url string, until <-chan struct{}, rec *adminRecorder) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
		"--user-data-dir="+filepath.Join(t.TempDir(), "profile"), "--remote-debugging-port=0", url)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	select {
	case <-until:
	case err := <-exited:
		t.Fatalf("chromium stopped before the page was done: %v\n%s", err, out.String())
	case <-ctx.Done():
		t.Fatalf("the page never finished; the admin listener saw %+v\n%s", rec.calls(), out.String())
	}
}

// attackPage is another site's page: it posts a form to the admin API
// into a hidden frame, then posts to two more admin routes with fetch, and
// reports that it is done. Its arguments: the admin URL twice, the key
// id.
const attackPage = `<!doctype html>
<html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="f" method="POST" action="%s/api/invites" target="sink">
<input type="hidden" name="note" value="from another site">
</form>
<script>
const admin = %q, sink = document.querySelector("iframe");
sink.addEventListener("load", async () => {
  const post = (path) => fetch(admin + path, {method: "POST", mode: "no-cors", credentials: "include"}).catch(() => {});
  await post("/api/detect/run");
  await post("/api/keys/" + %q + "/revoke");
  await fetch(admin + "/api/backup", {mode: "no-cors", credentials: "include"}).catch(() => {});
  await fetch("/done");
}, {once: true});
document.getElementById("f").submit();
</script>
</body></html>
`

// Every route that changes state refuses another origin's browser
// request, whatever its method, before the admin token is looked at, and
// every route refuses what another site's page embeds or fetches; a link
// followed from another site, the CLI (no browser headers) and the
// dashboard's own origin pass.
func TestAdminWritesRefuseAnotherOrigin(t *testing.T) {
	e := newTestAdmin(t, adminOptions{})
	host := strings.TrimPrefix(e.admin.URL, "http://")
	send := func(method, path, body string, headers ...string) (int, string) {
		t.Helper()
		req := mustRequest(t, method, e.admin.URL+path, testAdminToken)
		if body != "" {
			req.Body = io.NopCloser(strings.NewReader(body))
			req.ContentLength = int64(len(body))
			req.Header.Set("Content-Type", "application/json")
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, data := do(t, req)
		var p struct{ Code string }
		json.Unmarshal(data, &p)
		return resp.StatusCode, p.Code
	}
	writes := []struct{ method, path, body string }{
		{http.MethodPost, "/api/keys", `{"user":"mallory"}`},
		{http.MethodPost, "/api/keys/" + e.keyOf(t, "alice") + "/revoke", ""},
		{http.MethodPost, "/api/invites", `{"uses":1}`},
		{http.MethodPost, "/api/invites/inv_x/revoke", ""},
		{http.MethodDelete, "/api/invites/inv_x", ""},
		{http.MethodPost, "/api/users/alice", `{"banned":true}`},
		{http.MethodPost, "/api/brake", `{"on":true}`},
		{http.MethodPost, "/api/detect/run", `{}`},
		{http.MethodPost, "/api/cooldowns/clear", `{"key":"ip:203.0.113.7"}`},
		{http.MethodPost, "/brake", ""},
	}
	foreign := [][]string{
		{"Origin", "http://evil.example"},
		{"Origin", "http://127.0.0.1:1"},
		{"Origin", "null"},
		{"Origin", "http://" + host, "Sec-Fetch-Site", "same-site"},
		{"Sec-Fetch-Site", "cross-site"},
	}
	for _, w := range writes {
		for _, h := range foreign {
			if status, code := send(w.method, w.path, w.body, h...); status != http.StatusForbidden || code != "cross_origin" {
				t.Errorf("%s %s with %q: %d %q, want 403 cross_origin", w.method, w.path, h, status, code)
			}
		}
	}
	if st := e.brake.Status(time.Now()); st.Manual {
		t.Errorf("the brake moved: %+v", st)
	}
	for _, h := range [][]string{nil, {"Origin", "http://" + host}, {"Origin", "http://" + host, "Sec-Fetch-Site", "same-origin"}, {"Sec-Fetch-Site", "none"}} {
		if status, _ := send(http.MethodPost, "/api/brake", `{"on":false}`, h...); status != http.StatusOK {
			t.Errorf("POST /api/brake with %q: %d, want 200", h, status)
		}
	}
	// Reading: another site's page may link to the dashboard, but not
	// embed or fetch what the admin API answers (a backup, days of
	// events: each costs the server, and the browser adds the
	// credentials).
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"},
		{"Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"},
		{"Sec-Fetch-Site", "none", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"},
		{"Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "cors", "Sec-Fetch-Dest", "empty"},
		nil,
	} {
		if status, _ := send(http.MethodGet, "/api/keys", "", h...); status != http.StatusOK {
			t.Errorf("GET /api/keys with %q: %d, want 200", h, status)
		}
	}
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors", "Sec-Fetch-Dest", "image"},
		{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "iframe"},
		{"Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "cors", "Sec-Fetch-Dest", "empty", "Origin", "http://127.0.0.1:1"},
		{"Sec-Fetch-Site", "cross-site"},
	} {
		for _, path := range []string{"/api/keys", "/api/backup", "/api/recorded"} {
			if status, code := send(http.MethodGet, path, "", h...); status != http.StatusForbidden || code != "cross_origin" {
				t.Errorf("GET %s with %q: %d %q, want 403 cross_origin", path, h, status, code)
			}
		}
	}
}
