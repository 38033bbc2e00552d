package multi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// guardedFloodSize is how many requests each flood on a guarded route or
// the invite check sends, over both instances.
const guardedFloodSize = 2_000

// guardedFloods are the invite limits, tight (6 checks an hour from one
// address), and two guarded routes: login, for forward auth, limited per
// address to 3 an hour, and referral, proxied to UPSTREAM, with no rate
// and a fail limit per address and e-mail (5 failures, a 10-minute
// cooldown).
const guardedFloods = `
[invites]
rate = 6
window = "1h"
burst = 100

[[routes]]
name = "login"
path = "/api/login"
identity = "ip"
rate = 3
window = "1h"
burst = 0

[[routes]]
name = "referral"
methods = ["POST"]
path = "/api/referral/check"
upstream = "UPSTREAM"
identity = "ip"
rate = 0
burst = 0

[routes.fail]
statuses = [404]
by = ["ip", "json:email"]
limit = 5
window = "10m"
cooldown = "10m"
`

// referralUpstream is the referral route's app: 200 for the code "RIGHT",
// 404 for any other; it counts the requests it gets.
func referralUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		var req struct{ Code string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Code == "RIGHT" {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	return srv, &got
}

// guardedRequest is a request of a client (X-Forwarded-For) to the
// instance at addr: a forward-auth check of a route, a referral check or
// an invite check.
type guardedRequest func(ctx context.Context, addr string) (*http.Request, error)

func loginCheck(ip string) guardedRequest {
	return func(ctx context.Context, addr string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/forward-auth/login", nil)
		if err == nil {
			req.Header.Set("X-Forwarded-For", ip)
		}
		return req, err
	}
}

func referralCheck(ip, code, email string) guardedRequest {
	return jsonPost("/api/referral/check", ip, map[string]string{"code": code, "email": email})
}

func inviteCheck(ip, code, email string) guardedRequest {
	return jsonPost("/v1/invites/verify", ip, map[string]string{"code": code, "email": email})
}

func jsonPost(path, ip string, v any) guardedRequest {
	body, _ := json.Marshal(v)
	return func(ctx context.Context, addr string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
		if err == nil {
			req.Header.Set("X-Forwarded-For", ip)
			req.Header.Set("Content-Type", "application/json")
		}
		return req, err
	}
}

// ask sends one request to instance i and returns its answer as
// "status code" (the problem's code, if any).
func (p *pair) ask(ctx context.Context, client *http.Client, i int, r guardedRequest) string {
	req, err := r(ctx, p.proc(i).Addr)
	if err != nil {
		return "no request: " + err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return "no answer"
	}
	defer resp.Body.Close()
	var problem struct {
		Code string `json:"code"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(body, &problem)
	return strings.TrimSpace(fmt.Sprintf("%d %s", resp.StatusCode, problem.Code))
}

// guardedFlood sends guardedFloodSize requests r from 32 clients, request
// k to instance k%2, and returns the answers by "status code".
func (p *pair) guardedFlood(ctx context.Context, r guardedRequest) map[string]int {
	return floodEach(guardedFloodSize, func(client *http.Client, k int) string { return p.ask(ctx, client, k%2, r) })
}

// refusedOnBoth sends r to instance 0, then 1, alternating, until each
// has answered want once (each then remembers that refusal), at most 20
// requests; every answer must be want or in pass.
func (p *pair) refusedOnBoth(ctx context.Context, t *testing.T, what string, r guardedRequest, want string, pass ...string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var refused [2]bool
	for k := 0; !refused[0] || !refused[1]; k++ {
		if k == 20 {
			t.Fatalf("%s: not refused as %q on both instances in 20 requests\n%s", what, want, p.logs())
		}
		got := p.ask(ctx, client, k%2, r)
		switch {
		case got == want:
			refused[k%2] = true
		case !contains(pass, got):
			t.Fatalf("%s: instance %d answered %q, want %q or one of %q\n%s", what, k%2, got, want, pass, p.logs())
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestGuardedFloodsCostNoTransactions: on two instances over one
// PostgreSQL, where a guarded route's limits, its fail limit and the
// invite limits are decided in the database, floods of refused requests
// are answered from memory after each instance's first refusal. Over both
// instances, 2,000 checks of one address over a route's per-address rate,
// 2,000 requests of an address and e-mail in a route's cooldown, and
// 2,000 invite checks of an address and e-mail in a cooldown (and over
// the address's rate) make at most 10 transactions each beyond the idle
// rate, the ticks a flood keeps busy (floodTicks) and the count's noise
// (statNoise); without the caches each request was at least one. Then
// a cooldown lifted through A's admin API lets the key through on B
// within a second, for a route and for the invite check.
func TestGuardedFloodsCostNoTransactions(t *testing.T) {
	soak(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	dbURL := pgtest.NewDatabase(t)
	upstream, reached := referralUpstream(t)
	p := limitsPair(t, dbURL, "[limits.user]\nrate = 60\n", strings.ReplaceAll(guardedFloods, "UPSTREAM", upstream.URL))
	started := time.Now()
	out, err := harness.Command(ctx, bin, p.config, p.env, "invites", "create", "--uses", "5")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	code := lines[len(lines)-1]

	// Each flood's client refused once on each instance first.
	const loginIP, referralIP, guesser, victim = "198.51.100.1", "198.51.100.2", "203.0.113.5", "victim@example.com"
	p.refusedOnBoth(ctx, t, "login over its rate", loginCheck(loginIP), "429 rate_limited", "200")
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 5 {
		if got := p.ask(ctx, client, 0, referralCheck(referralIP, "WRONG", "x@example.com")); got != "404" {
			t.Fatalf("referral failure %d through A: %q, want the app's 404", i+1, got)
		}
	}
	p.refusedOnBoth(ctx, t, "referral in its cooldown", referralCheck(referralIP, "RIGHT", "x@example.com"), "429 too_many_failures")
	for i := range 5 {
		if got := p.ask(ctx, client, 0, inviteCheck(guesser, fmt.Sprintf("WRONG-CODE-%d", i), victim)); got != "403 invite_refused" {
			t.Fatalf("wrong invite guess %d through A: %q, want 403 invite_refused", i+1, got)
		}
	}
	p.refusedOnBoth(ctx, t, "invite checks in a cooldown", inviteCheck(guesser, code, victim), "429 rate_limited", "403 invite_refused")

	quietAutovacuum(ctx, t, dbURL)
	m := newMeter(ctx, t, dbURL, started)
	for _, f := range []struct {
		what string
		r    guardedRequest
		want string
	}{
		{"one address over login's rate", loginCheck(loginIP), "429 rate_limited"},
		{"an address and e-mail in referral's cooldown", referralCheck(referralIP, "RIGHT", "x@example.com"), "429 too_many_failures"},
		{"an address and e-mail in the invite cooldown", inviteCheck(guesser, code, victim), "429 rate_limited"},
	} {
		before := reached.Load()
		var answers map[string]int
		beyond, raw, took := m.measure(ctx, func() { answers = p.guardedFlood(ctx, f.r) })
		t.Logf("%s, %d requests in %v: %v; %.0f transactions, %.1f beyond the idle rate", f.what, guardedFloodSize, took, answers, raw, beyond)
		if answers[f.want] != guardedFloodSize {
			t.Errorf("%s: answers %v, want %d × %s", f.what, answers, guardedFloodSize, f.want)
		}
		if limit := 10 + floodTicks(took) + statNoise; beyond > limit {
			t.Errorf("%s: %.1f transactions beyond the idle rate for %d refusals, want at most 10, %.0f for the ticks and %d for the count's noise",
				f.what, beyond, guardedFloodSize, floodTicks(took), statNoise)
		}
		if got := reached.Load() - before; got != 0 {
			t.Errorf("%s: the app got %d requests, want none", f.what, got)
		}
	}

	// Lifted through A, the cooldowns no longer hold on B, which
	// remembers them.
	liftedOnB(ctx, t, p, "referral", `{"source":"route:referral","key":"ip:`+referralIP+`"}`, `{"source":"route:referral","key":"json:email:x@example.com"}`,
		referralCheck(referralIP, "RIGHT", "x@example.com"), "429 too_many_failures", "200")
	const other = "203.0.113.9" // the victim's e-mail from an address within its rate
	liftedOnB(ctx, t, p, "invites", `{"key":"email:`+victim+`"}`, "",
		inviteCheck(other, code, victim), "403 invite_refused", "200")
}

// liftedOnB checks that instance B refuses r as refused (and so
// remembers it), lifts the cooldowns clear1 and clear2 ("": none) through
// A's admin API, and requires B to answer r as passed within a second.
func liftedOnB(ctx context.Context, t *testing.T, p *pair, what, clear1, clear2 string, r guardedRequest, refused, passed string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	if got := p.ask(ctx, client, 1, r); got != refused {
		t.Fatalf("%s on B before the lift: %q, want %q", what, got, refused)
	}
	p.admin(ctx, t, 0, "/api/cooldowns/clear", clear1)
	if clear2 != "" {
		p.admin(ctx, t, 0, "/api/cooldowns/clear", clear2)
	}
	lifted := time.Now()
	var got string
	for time.Since(lifted) < time.Second {
		if got = p.ask(ctx, client, 1, r); got == passed {
			t.Logf("%s: a cooldown lifted through A lets the key through on B after %v", what, time.Since(lifted).Round(time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond) // at most 6 checks in all: the invite address's rate
	}
	t.Errorf("%s: B still answers %q a second after the lift through A, want %q\n%s", what, got, passed, p.logs())
}
