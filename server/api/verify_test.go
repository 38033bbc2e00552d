package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"breakwater/detect"
	"breakwater/server/edge"
	"breakwater/server/edgetest"
	"breakwater/server/invites"
	"breakwater/server/operator"
	"breakwater/storage"
)

// loose is an [invites] config whose rate limit stays out of the way of
// tests about the fail limit.
func loose(c invites.Config) invites.Config {
	if c.Rate == 0 {
		c.Rate = 10_000
	}
	if c.Burst == 0 {
		c.Burst = 10_000
	}
	return c
}

// trustLoopback makes 127.0.0.1 a trusted proxy that names the client in
// X-Real-IP, so that tests can play many clients.
func trustLoopback(c *edge.Config) {
	c.TrustedProxies = []string{"127.0.0.1"}
	c.ClientIPHeader = edge.HeaderRealIP
}

// verify posts {"code","email"} with extra headers ("X-Real-IP": ...).
func (e *env) verify(code, email string, headers ...string) (*http.Response, []byte) {
	e.t.Helper()
	body, _ := json.Marshal(verifyRequest{Code: code, Email: email})
	return e.verifyRaw(body, headers...)
}

func (e *env) verifyRaw(body []byte, headers ...string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.http.URL+"/v1/invites/verify", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return do(e.t, req)
}

// newInvite creates an invite and returns its code.
func (e *env) newInvite(uses int, ttl time.Duration) (string, invites.Info) {
	e.t.Helper()
	code, info, err := e.invites.Create(uses, ttl, "test")
	if err != nil {
		e.t.Fatal(err)
	}
	return code, info
}

func wantValid(t *testing.T, e *env, code, email string, headers ...string) {
	t.Helper()
	resp, data := e.verify(code, email, headers...)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(data)) != `{"valid":true}` {
		t.Fatalf("status %d %s, want 200 {\"valid\":true}", resp.StatusCode, data)
	}
}

// refusedBody is the one face of every refusal, captured from the first
// one a test sees; wantRefused compares every later one byte for byte.
type refusedBody struct{ first []byte }

func (r *refusedBody) wantVerify(t *testing.T, e *env, code, email string, headers ...string) {
	t.Helper()
	resp, data := e.verify(code, email, headers...)
	r.want(t, resp, data)
}

func (r *refusedBody) want(t *testing.T, resp *http.Response, data []byte) {
	t.Helper()
	edgetest.DecodeProblem(t, resp, data, http.StatusForbidden, "invite_refused")
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Errorf("refusal carries Retry-After %q", ra)
	}
	if r.first == nil {
		r.first = data
	} else if !bytes.Equal(r.first, data) {
		t.Errorf("refusal body %s differs from %s", data, r.first)
	}
}

// inviteRefusals reads breakwater_invite_refusals_total{reason}.
func (e *env) inviteRefusals(reason string) int {
	e.t.Helper()
	var m dto.Metric
	if err := e.metrics.inviteRefusals.WithLabelValues(reason).Write(&m); err != nil {
		e.t.Fatal(err)
	}
	return int(m.GetCounter().GetValue())
}

func TestVerifyInviteRedeemsOncePerEmail(t *testing.T) {
	e := newEnv(t, envOptions{invites: loose(invites.Config{})})
	code, info := e.newInvite(2, 0)
	if len(strings.ReplaceAll(code, "-", "")) < 10 {
		t.Errorf("code %q is shorter than 10 characters", code)
	}
	wantValid(t, e, code, "ann@example.com")
	// Idempotent for the same e-mail, however it is written, and the code
	// is read without case or separators.
	wantValid(t, e, strings.ToLower(strings.ReplaceAll(code, "-", " ")), "  Ann@Example.COM ")
	wantValid(t, e, code, "bob@example.com")
	var r refusedBody
	r.wantVerify(t, e, code, "cat@example.com")
	list, err := e.invites.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != info.ID || list[0].Uses != 2 {
		t.Errorf("list %+v, want 2 uses of %s", list, info.ID)
	}
	if got := e.inviteRefusals(reasonUsedUp); got != 1 {
		t.Errorf("used_up refusals %d, want 1", got)
	}
}

// TestVerifyRefusalsLookAlike drives every refusal reason through real
// HTTP and requires one status and one byte-identical body, with the
// precise reason in the metric, the log and the statistics events.
func TestVerifyRefusalsLookAlike(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	alerts := &recordingAlerter{}
	e := newEnv(t, envOptions{
		clock: clk.now, cfg: trustLoopback, alerts: alerts,
		invites: loose(invites.Config{FailLimit: 3, GlobalFailPerHour: 9}),
	})
	expiring, _ := e.newInvite(1, time.Hour)
	clk.add(2 * time.Hour)
	good, _ := e.newInvite(5, 0)
	usedUp, _ := e.newInvite(1, 0)
	wantValid(t, e, usedUp, "first@example.com", "X-Real-IP", "198.51.100.99")
	revoked, revokedInfo := e.newInvite(1, 0)
	if _, err := e.invites.Revoke(revokedInfo.ID); err != nil {
		t.Fatal(err)
	}

	var r refusedBody
	cases := []struct {
		name, code, email, ip, reason string
	}{
		{"invalid", "ABCD-EFGH-JKMN", "a@example.com", "198.51.100.1", reasonInvalid},
		{"malformed", "!!", "b@example.com", "198.51.100.2", reasonInvalid},
		{"expired", expiring, "c@example.com", "198.51.100.3", reasonExpired},
		{"used up", usedUp, "d@example.com", "198.51.100.4", reasonUsedUp},
		{"revoked", revoked, "e@example.com", "198.51.100.5", reasonRevoked},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.wantVerify(t, e, c.code, c.email, "X-Real-IP", c.ip)
			if got := e.inviteRefusals(c.reason); got == 0 {
				t.Errorf("no %s refusal counted", c.reason)
			}
		})
	}
	// A cooldown: three wrong guesses from one address, then the right code.
	for i := range 3 {
		r.wantVerify(t, e, "WRONG-CODE-XXX", fmt.Sprintf("g%d@example.com", i), "X-Real-IP", "198.51.100.6")
	}
	r.wantVerify(t, e, good, "fresh@example.com", "X-Real-IP", "198.51.100.6")
	if got := e.inviteRefusals(limitReasonCooldown); got != 1 {
		t.Errorf("cooldown refusals %d, want 1", got)
	}
	// The service-wide net: 8 failures so far; the 9th trips it, and then
	// the right code from a fresh address and e-mail is refused too.
	if len(alerts.got()) != 0 {
		t.Fatalf("alert before the net tripped")
	}
	r.wantVerify(t, e, "WRONG-CODE-YYY", "h@example.com", "X-Real-IP", "198.51.100.7")
	if len(alerts.got()) != 1 {
		t.Errorf("%d alerts, want 1 when the net trips", len(alerts.got()))
	}
	r.wantVerify(t, e, good, "net@example.com", "X-Real-IP", "198.51.100.8")
	if got := e.inviteRefusals(limitReasonGlobal); got != 1 {
		t.Errorf("global refusals %d, want 1", got)
	}
	// An hour later the failures have left the count.
	clk.add(time.Hour + time.Minute)
	wantValid(t, e, good, "net@example.com", "X-Real-IP", "198.51.100.8")

	// The reasons reach the statistics, counted by reason.
	want := map[string]int{"invalid": 6, "expired": 1, "used_up": 1, "revoked": 1, "cooldown": 1, "global": 1, "ok": 2}
	if got := inviteChecks(t, e); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("invite checks by outcome %v, want %v", got, want)
	}
}

// inviteChecks stops the recorder, so that its tally of refusals is
// written, and sums the stored invite checks by outcome: one event per
// check that passed, the refusals of each reason in rows with a count.
func inviteChecks(t *testing.T, e *env) map[string]int {
	t.Helper()
	if err := e.events.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	events, err := e.db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, ev := range events {
		if ev.Route != verifyRoute || ev.Outcome == detect.OutcomeCooldownStarted || ev.Outcome == detect.OutcomeRefused {
			continue
		}
		got[ev.Outcome] += int(ev.N())
		if ev.Outcome == "ok" && (ev.IP == "" || ev.Status == 0) {
			t.Fatalf("check without IP or status: %+v", ev)
		}
	}
	return got
}

// Reason names of the fail limiter, as the metric carries them.
const (
	limitReasonCooldown = "cooldown"
	limitReasonGlobal   = "global"
)

func TestVerifyCooldownHoldsTheRightCodeAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	cfg := loose(invites.Config{})
	e := newEnv(t, envOptions{dir: dir, clock: clk.now, invites: cfg})
	code, _ := e.newInvite(3, 0)
	var r refusedBody
	for range 5 { // the default fail_limit
		r.wantVerify(t, e, "WRONG-CODE-ZZZ", "mallory@example.com")
	}
	r.wantVerify(t, e, code, "mallory@example.com")
	r.wantVerify(t, e, code, "someone-else@example.com") // the address is cooling down too

	// Restart: the state is written behind and reloaded.
	e.writeBehind(e.db).Flush()
	e.http.Close()
	e.events.Close(context.Background())
	e.db.Close()
	clk.add(5 * time.Minute)
	e2 := newEnv(t, envOptions{dir: dir, clock: clk.now, invites: cfg, gemini: e.gemini})
	r.wantVerify(t, e2, code, "mallory@example.com")

	clk.add(5 * time.Minute) // the 10-minute cooldown is over
	wantValid(t, e2, code, "mallory@example.com")
}

// TestVerifyRecordsCooldownStarts: the failure that starts a cooldown
// is counted once per cooled-down key, the IP and the e-mail, which the
// brute-force detector reads.
func TestVerifyRecordsCooldownStarts(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now, invites: loose(invites.Config{})})
	var r refusedBody
	for range 7 { // the fifth starts the cooldowns; the last two are refused during them
		r.wantVerify(t, e, "WRONG-CODE-ZZZ", "mallory@example.com")
	}
	if err := e.events.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	events, err := e.db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var ips, emails int64
	for _, ev := range events {
		if ev.Outcome != detect.OutcomeCooldownStarted {
			continue
		}
		if ev.IP == "127.0.0.1" {
			ips += ev.N()
		}
		if ev.UserID == "mallory@example.com" {
			emails += ev.N()
		}
	}
	if ips != 1 || emails != 1 {
		t.Errorf("cooldown starts recorded: %d for the IP, %d for the e-mail; want 1 and 1", ips, emails)
	}
}

func TestVerifyParallelGuesses(t *testing.T) {
	cases := []struct {
		name    string
		headers func(i int) []string
		email   func(i int) string
	}{
		{"one address, one e-mail", func(int) []string { return nil }, func(int) string { return "x@example.com" }},
		{"one address, many e-mails", func(int) []string { return nil }, func(i int) string { return fmt.Sprintf("x%d@example.com", i) }},
		{"many addresses, one e-mail", func(i int) []string { return []string{"X-Real-IP", fmt.Sprintf("203.0.113.%d", i+1)} },
			func(int) string { return "x@example.com" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOptions{cfg: trustLoopback, invites: loose(invites.Config{})})
			var wg sync.WaitGroup
			var other atomic.Int64
			var r refusedBody
			var mu sync.Mutex
			for i := range 50 {
				wg.Go(func() {
					resp, data := e.verify("WRONG-CODE-AAA", c.email(i), c.headers(i)...)
					if resp.StatusCode != http.StatusForbidden {
						other.Add(1)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					r.want(t, resp, data)
				})
			}
			wg.Wait()
			if other.Load() != 0 {
				t.Errorf("%d answers were not the refusal", other.Load())
			}
			if got := e.inviteRefusals(reasonInvalid); got < 1 || got > 5 {
				t.Errorf("%d guesses evaluated, want 1 to 5 (fail_limit)", got)
			}
			held := e.inviteRefusals(limitReasonCooldown) + e.inviteRefusals("in_flight")
			if held+e.inviteRefusals(reasonInvalid) != 50 {
				t.Errorf("%d held by the fail limit, want the rest of 50", held)
			}
		})
	}
}

func TestVerifyParallelRedemptionOfOneUse(t *testing.T) {
	e := newEnv(t, envOptions{cfg: trustLoopback, invites: loose(invites.Config{})})
	code, _ := e.newInvite(1, 0)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			resp, data := e.verify(code, fmt.Sprintf("racer%d@example.com", i), "X-Real-IP", fmt.Sprintf("203.0.113.%d", i+1))
			switch resp.StatusCode {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusForbidden:
				refused.Add(1)
			default:
				t.Errorf("status %d: %s", resp.StatusCode, data)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 || refused.Load() != 9 {
		t.Errorf("%d ok and %d refused, want 1 and 9", ok.Load(), refused.Load())
	}
	inv, err := e.db.InviteByHash(e.inviteKey.Hash(invites.NormaliseCode(code)))
	if err != nil || inv.Used != 1 {
		t.Errorf("stored uses %d (%v), want 1", inv.Used, err)
	}
}

// TestVerifyForgedHeadersFromUntrustedPeer: with no trusted proxy, every
// request is its TCP peer whatever headers it carries, so neither the fail
// limit nor the rate limit can be walked around by forging them.
func TestVerifyForgedHeadersFromUntrustedPeer(t *testing.T) {
	e := newEnv(t, envOptions{invites: invites.Config{Rate: 4, Burst: 100, FailLimit: 3}})
	code, _ := e.newInvite(1, 0)
	var r refusedBody
	for i := range 3 {
		r.wantVerify(t, e, "WRONG-CODE-BBB", fmt.Sprintf("f%d@example.com", i),
			"X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1), "X-Real-IP", fmt.Sprintf("192.0.2.%d", i+100))
	}
	r.wantVerify(t, e, code, "new@example.com", "X-Forwarded-For", "192.0.2.50", "X-Real-IP", "192.0.2.51")
	resp, data := e.verify(code, "new2@example.com", "X-Real-IP", "192.0.2.52")
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if !strings.Contains(e.logs.String(), "trusted_proxies is empty") {
		t.Error("no warning about forwarding headers without trusted_proxies")
	}
}

// TestVerifyBehindTrustedProxy: the leftmost X-Forwarded-For entry is the
// client's own writing; rotating it changes nothing, while two real
// clients behind the proxy are kept apart.
func TestVerifyBehindTrustedProxy(t *testing.T) {
	xff := func(c *edge.Config) { c.TrustedProxies = []string{"127.0.0.1"}; c.ClientIPHeader = "x-forwarded-for" }
	e := newEnv(t, envOptions{cfg: xff, invites: loose(invites.Config{FailLimit: 3})})
	code, _ := e.newInvite(2, 0)
	var r refusedBody
	for i := range 3 {
		r.wantVerify(t, e, "WRONG-CODE-CCC", fmt.Sprintf("p%d@example.com", i),
			"X-Forwarded-For", fmt.Sprintf("10.9.9.%d, 203.0.113.5", i))
	}
	r.wantVerify(t, e, code, "a@example.com", "X-Forwarded-For", "10.9.9.77, 203.0.113.5")
	wantValid(t, e, code, "b@example.com", "X-Forwarded-For", "10.9.9.1, 203.0.113.6")
}

func TestVerifyIPv6KeyedByPrefix(t *testing.T) {
	e := newEnv(t, envOptions{cfg: trustLoopback, invites: loose(invites.Config{FailLimit: 3})})
	code, _ := e.newInvite(2, 0)
	var r refusedBody
	for i := range 3 {
		r.wantVerify(t, e, "WRONG-CODE-DDD", fmt.Sprintf("v%d@example.com", i), "X-Real-IP", fmt.Sprintf("2001:db8:0:7::%x", i+1))
	}
	r.wantVerify(t, e, code, "a@example.com", "X-Real-IP", "2001:db8:0:7:ffff::1")
	wantValid(t, e, code, "b@example.com", "X-Real-IP", "2001:db8:0:8::1")
}

func TestVerifyBurstIs429WithRetryAfter(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now}) // the defaults: burst 3
	code, _ := e.newInvite(5, 0)
	for i := range 3 {
		wantValid(t, e, code, fmt.Sprintf("b%d@example.com", i))
	}
	resp, data := e.verify(code, "b4@example.com")
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
	if resp.Header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q, want 1", resp.Header.Get("Retry-After"))
	}
	clk.add(time.Second)
	wantValid(t, e, code, "b4@example.com")
}

func TestVerifyBadRequests(t *testing.T) {
	e := newEnv(t, envOptions{invites: loose(invites.Config{FailLimit: 2})})
	code, _ := e.newInvite(1, 0)
	cases := []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"not json", "code=x", 400, "bad_request"},
		{"trailing data", `{"code":"x","email":"a@b"} {}`, 400, "bad_request"},
		{"wrong type", `{"code":1,"email":"a@b"}`, 400, "bad_request"},
		{"no e-mail", `{"code":"` + code + `"}`, 400, "invalid_email"},
		{"two @", `{"code":"` + code + `","email":"a@b@c"}`, 400, "invalid_email"},
		{"control character", `{"code":"` + code + `","email":"a\u0000@b"}`, 400, "invalid_email"},
		{"space inside", `{"code":"WRONG","email":"a b@c"}`, 400, "invalid_email"},
		{"too long", `{"code":"x","email":"` + strings.Repeat("a", 250) + `@b.cd"}`, 400, "invalid_email"},
		{"too large", `{"code":"` + strings.Repeat("A", 5000) + `","email":"a@b"}`, 413, "body_too_large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, data := e.verifyRaw([]byte(c.body))
			edgetest.DecodeProblem(t, resp, data, c.status, c.code)
		})
	}
	// None of them counted as a failure: the right code still works.
	wantValid(t, e, code, "ok@example.com")
}

func TestAdminClientManagesInvites(t *testing.T) {
	e := newEnv(t, envOptions{invites: loose(invites.Config{})})
	ctx := context.Background()
	ac := operator.NewAdminClient(strings.TrimPrefix(e.admin.URL, "http://"), testAdminToken)
	code, info, err := ac.CreateInvite(ctx, 2, 72*time.Hour, "for the beta")
	if err != nil {
		t.Fatal(err)
	}
	if info.MaxUses != 2 || info.Note != "for the beta" || info.ExpiresAt.Sub(info.CreatedAt) != 72*time.Hour {
		t.Errorf("created %+v", info)
	}
	wantValid(t, e, code, "a@example.com")
	list, err := ac.ListInvites(ctx)
	if err != nil || len(list) != 1 || list[0].Uses != 1 {
		t.Fatalf("list %+v %v", list, err)
	}
	if _, body := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/invites", testAdminToken)); strings.Contains(string(body), code) ||
		strings.Contains(string(body), strings.ReplaceAll(code, "-", "")) || strings.Contains(string(body), "a@example.com") {
		t.Errorf("invite list shows a code or an e-mail: %s", body)
	}
	if _, err := ac.RevokeInvite(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	var r refusedBody
	r.wantVerify(t, e, code, "b@example.com")
	if _, err := ac.RevokeInvite(ctx, "inv_nope"); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("revoke unknown: %v", err)
	}
	if _, _, err := ac.CreateInvite(ctx, -1, 0, ""); err == nil {
		t.Error("negative uses accepted")
	}
	// Deleting erases the invite with its redemptions; the code is then
	// refused like one that never existed.
	if deleted, err := ac.DeleteInvite(ctx, info.ID); err != nil || deleted.Uses != 1 {
		t.Fatalf("delete: %+v %v", deleted, err)
	}
	if list, err := ac.ListInvites(ctx); err != nil || len(list) != 0 {
		t.Errorf("list after delete %+v %v", list, err)
	}
	if left, err := e.db.Redemptions(e.inviteKey.Hash(invites.NormaliseCode(code))); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("redemptions after delete: %v, %v; want none (not found)", left, err)
	}
	r.wantVerify(t, e, code, "c@example.com")
	if _, err := ac.DeleteInvite(ctx, info.ID); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
}

func TestVerifyRateWindowSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	cfg := invites.Config{Rate: 2, Window: time.Minute, Burst: 100}
	e := newEnv(t, envOptions{dir: dir, clock: clk.now, invites: cfg})
	code, _ := e.newInvite(10, 0)
	wantValid(t, e, code, "r1@example.com")
	wantValid(t, e, code, "r2@example.com")
	e.writeBehind(e.db).Flush()
	e.http.Close()
	e.events.Close(context.Background())
	e.db.Close()

	e2 := newEnv(t, envOptions{dir: dir, clock: clk.now, invites: cfg, gemini: e.gemini})
	resp, data := e2.verify(code, "r3@example.com")
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
	if e2.inviteRefusals("rate") != 1 {
		t.Errorf("rate refusals %d, want 1", e2.inviteRefusals("rate"))
	}
	clk.add(time.Minute)
	wantValid(t, e2, code, "r3@example.com")
}

// TestVerifyRotatingTheUntrustedHeader plays two proxies, each setting one
// forwarding header itself and passing the client's own other one through:
// Caddy by default (appends to X-Forwarded-For, passes X-Real-IP) and an
// nginx that sets only X-Real-IP (passes X-Forwarded-For). With
// client_ip_header naming the header the proxy sets, a client rotating the
// other is still one address to the fail limit: at most fail_limit guesses
// are evaluated.
func TestVerifyRotatingTheUntrustedHeader(t *testing.T) {
	for _, p := range []struct {
		name          string
		header        string // client_ip_header
		rotated, real string // the header the client rotates, the proxy's own
	}{
		{"Caddy", edge.HeaderXFF, "X-Real-IP", "X-Forwarded-For"},
		{"nginx with X-Real-IP only", edge.HeaderRealIP, "X-Forwarded-For", "X-Real-IP"},
	} {
		t.Run(p.name, func(t *testing.T) {
			proxy := func(c *edge.Config) { c.TrustedProxies, c.ClientIPHeader = []string{"127.0.0.1"}, p.header }
			e := newEnv(t, envOptions{cfg: proxy, invites: loose(invites.Config{})})
			var r refusedBody
			for i := range 30 {
				resp, data := e.verify("WRONG-CODE-BBB", fmt.Sprintf("z%d@example.com", i),
					p.rotated, fmt.Sprintf("198.51.100.%d", i+1), p.real, "203.0.113.7")
				r.want(t, resp, data)
			}
			if got := e.inviteRefusals(reasonInvalid); got != 5 {
				t.Errorf("%d guesses evaluated, want 5 (fail_limit for 203.0.113.7)", got)
			}
		})
	}
}

// TestVerifyRefusalFloodIsBounded: 20,000 refused invite checks from
// 2,000 addresses, each with its own e-mail, write a bounded number of
// statistics rows and one log line per second, which says how many it
// held back; the metric still counts every refusal by reason.
func TestVerifyRefusalFloodIsBounded(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	logs := &bytes.Buffer{}
	e := newEnv(t, envOptions{clock: clk.now, cfg: trustLoopback, logTo: logs, invites: loose(invites.Config{GlobalFailPerHour: 1_000_000})})
	const flood, workers = 20_000, 8
	var wg sync.WaitGroup
	var unexpected atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < flood; i += workers {
				resp, _ := e.verify("WRONG-CODE-ZZZ", fmt.Sprintf("guess%d@example.com", i), "X-Real-IP", fmt.Sprintf("10.0.%d.%d", i/250%8, i%250))
				if resp.StatusCode != http.StatusForbidden {
					unexpected.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := unexpected.Load(); n != 0 {
		t.Fatalf("%d answers were not the refusal", n)
	}
	clk.add(2 * time.Second) // the next refusal is logged again, with the count held back
	var r refusedBody
	r.wantVerify(t, e, "WRONG-CODE-ZZZ", "late@example.com", "X-Real-IP", "192.0.2.77")

	if got := e.inviteRefusals(reasonInvalid) + e.inviteRefusals(limitReasonCooldown); got != flood+1 {
		t.Errorf("refusals counted in the metric: %d, want %d", got, flood+1)
	}
	checks := inviteChecks(t, e) // stops the recorder
	if got := checks[reasonInvalid] + checks[limitReasonCooldown]; got != flood+1 {
		t.Errorf("refusals in the statistics: %v, want %d in all", checks, flood+1)
	}
	events, err := e.db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, ev := range events {
		if ev.Route == verifyRoute {
			rows++
		}
	}
	// Per window: a row per kept IP and e-mail (and Other) for refusals
	// and for cooldown starts, and one per reason.
	if most := 4*(detect.DefaultTallyKeys+1) + 4; rows > most {
		t.Errorf("%d statistics rows for %d refusals, want at most %d", rows, flood+1, most)
	}
	lines := strings.Count(logs.String(), `msg="invite refused"`)
	if lines != 2 {
		t.Errorf("%d log lines of refusals, want 2 (one per second of the clock)", lines)
	}
	if want := fmt.Sprintf("held_back=%d", flood-1); !strings.Contains(logs.String(), want) {
		t.Errorf("the second line does not say %s", want)
	}
}

// The invite limits fail open through the guard as the OCR layers do: a
// broken IP limit or fail limit (here each panics on its first use) lets
// the verification through, and is counted under layer "invites" and
// logged once a minute.
func TestInviteLimitsFailOpen(t *testing.T) {
	e := newEnv(t, envOptions{invites: loose(invites.Config{})})
	e.inviteLimits.Windows, e.inviteLimits.Fails = nil, nil // before any request
	code, _ := e.newInvite(3, 0)
	for _, email := range []string{"ann@example.com", "bob@example.com", "cat@example.com"} {
		wantValid(t, e, code, email)
	}
	var r refusedBody
	r.wantVerify(t, e, code, "dan@example.com") // used up: the lookup still decides
	if got, want := e.inviteRefusals("used_up"), 1; got != want {
		t.Errorf("%d used_up refusals, want %d", got, want)
	}
	if metrics, want := scrape(t, e), `breakwater_layer_failopen_total{layer="invites"} 8`; !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %s", want)
	}
	if n := strings.Count(e.logs.String(), "defense layer failed open"); n != 1 {
		t.Errorf("%d fail-open log lines, want 1 (one a minute per layer):\n%s", n, e.logs.String())
	}
}
