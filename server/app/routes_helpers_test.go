package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testClock is an injected clock the tests move by hand.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// received is what the test app got.
type received struct {
	method, path string
	header       http.Header
	body         string
	peer         string
}

// testApp is the developer's app behind Breakwater: it records every
// request and answers with respond (default 200 "hello from the app").
type testApp struct {
	*httptest.Server
	mu      sync.Mutex
	got     []received
	respond atomic.Pointer[func(w http.ResponseWriter, r *http.Request, body string)]
}

func newTestApp(t *testing.T) *testApp {
	t.Helper()
	a := &testApp{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.got = append(a.got, received{method: r.Method, path: r.URL.RequestURI(), header: r.Header.Clone(), body: string(b), peer: r.RemoteAddr})
		a.mu.Unlock()
		if f := a.respond.Load(); f != nil {
			(*f)(w, r, string(b))
			return
		}
		w.Header().Set("X-App", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "hello from the app")
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *testApp) set(f func(w http.ResponseWriter, r *http.Request, body string)) {
	a.respond.Store(&f)
}

func (a *testApp) requests() []received {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]received(nil), a.got...)
}

// routeEnv is a Breakwater App with [[routes]], on loopback, over a real
// database, with an injected clock.
type routeEnv struct {
	t     *testing.T
	cfg   Config
	clock *testClock
	app   *App
	logs  *bytes.Buffer
	lw    *lockedWriter
	admin string // BREAKWATER_ADMIN_TOKEN
}

const routeAdminToken = "route-tests-admin-token"

// startRoutes opens an App with routesTOML (its UPSTREAM replaced by the
// test app's URL) behind trusted_proxies 127.0.0.1/32.
func startRoutes(t *testing.T, upstream, routesTOML string) *routeEnv {
	t.Helper()
	dir := t.TempDir()
	body := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n"+
		"[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n%s\n%s",
		filepath.Join(dir, "bw.db"), minimal, strings.ReplaceAll(routesTOML, "UPSTREAM", upstream))
	cfg, err := Load(writeConfig(t, body), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	e := &routeEnv{t: t, cfg: cfg, clock: newTestClock(), logs: &bytes.Buffer{}, admin: routeAdminToken}
	e.lw = &lockedWriter{w: e.logs}
	e.open()
	t.Cleanup(func() { e.close() })
	return e
}

func (e *routeEnv) open() {
	e.t.Helper()
	log := slog.New(slog.NewTextHandler(e.lw, nil))
	a, err := Open(context.Background(), e.cfg, Options{
		Getenv: env(map[string]string{"BREAKWATER_ADMIN_TOKEN": e.admin}), Logger: log, Now: e.clock.now,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.app = a
}

func (e *routeEnv) close() {
	if e.app != nil {
		e.app.Close()
		e.app = nil
	}
}

// restart stops the App (its last write-behind flush included) and opens
// it again on the same database.
func (e *routeEnv) restart() {
	e.t.Helper()
	e.close()
	e.open()
}

func (e *routeEnv) url(p string) string { return "http://" + e.app.Addr() + p }

func (e *routeEnv) key(user string) string {
	e.t.Helper()
	secret, _, err := e.app.Keys().Create(user, "")
	if err != nil {
		e.t.Fatal(err)
	}
	return secret
}

// do sends a request from 127.0.0.1 (a trusted proxy) unless from says
// otherwise, and returns the answer with its body read.
func (e *routeEnv) do(method, path string, body string, header http.Header, from string) (*http.Response, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url(path), strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	client := http.DefaultClient
	if from != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		client = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// metric returns the lines of /metrics that start with prefix.
func (e *routeEnv) metric(prefix string) string {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+e.app.AdminAddr()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+e.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func (e *routeEnv) logText() string {
	w := e.lw
	w.mu.Lock()
	defer w.mu.Unlock()
	return e.logs.String()
}
