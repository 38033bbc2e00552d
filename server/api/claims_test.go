package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/ocr"
	"breakwater/server/edge"
	"breakwater/server/edgetest"
)

// fakeClaims is the shared claims table of storage/postgres as one
// instance sees it: a key is held by an owner ("me": this server; any
// other name: another instance) until it is given back. As there, a held
// key cannot be claimed again, not even by its holder; the usage record's
// transaction, which gives a claim back on postgres, is not modelled, so a
// kept answer leaves "me" holding the key.
type fakeClaims struct {
	mu       sync.Mutex
	held     map[string]string // user "\x00" key → owner
	claims   int
	releases int
	ttls     []time.Duration
	err      error  // answer every claim with this
	onClaim  func() // runs before each claim is decided: another instance's moves
}

func newFakeClaims() *fakeClaims { return &fakeClaims{held: map[string]string{}} }

func (f *fakeClaims) ClaimAnswer(ctx context.Context, user, key string, ttl time.Duration) (bool, error) {
	if f.onClaim != nil {
		f.onClaim()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims++
	f.ttls = append(f.ttls, ttl)
	if f.err != nil {
		return false, f.err
	}
	if _, held := f.held[user+"\x00"+key]; held {
		return false, nil
	}
	f.held[user+"\x00"+key] = "me"
	return true, nil
}

func (f *fakeClaims) ReleaseAnswer(ctx context.Context, user, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
	if f.held[user+"\x00"+key] == "me" {
		delete(f.held, user+"\x00"+key)
	}
	return nil
}

func (f *fakeClaims) set(user, key, owner string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if owner == "" {
		delete(f.held, user+"\x00"+key)
		return
	}
	f.held[user+"\x00"+key] = owner
}

func (f *fakeClaims) state(user, key string) (owner string, claims, releases int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[user+"\x00"+key], f.claims, f.releases
}

// postKey sends a PNG to /v1/ocr as alice with an Idempotency-Key.
func (e *env) postKey(key string, img []byte) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.http.URL+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "image/png")
	req.Header.Set("Idempotency-Key", key)
	return do(e.t, req)
}

// A key in flight on another instance is answered as a key in flight on
// this one: 409 idempotency_key_in_use with Retry-After 1, without a call;
// once the other instance gives it back, the key is read here. A read
// whose answer is kept does not give its claim back by a statement of its
// own: the usage transaction does (on postgres).
func TestClaimHeldByAnotherInstance(t *testing.T) {
	claims := newFakeClaims()
	e := newEnv(t, envOptions{answers: true, claims: claims})
	img := pngBytes(t, 64, 32)
	claims.set("alice", "k1", "other")
	resp, data := e.postKey("k1", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusConflict, "idempotency_key_in_use")
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	if n := e.gemini.calls.Load(); n != 0 {
		t.Errorf("%d upstream calls while another instance held the key, want 0", n)
	}
	if owner, _, releases := claims.state("alice", "k1"); owner != "other" || releases != 0 {
		t.Errorf("claim held by %q after %d releases, want the other instance's left alone", owner, releases)
	}

	claims.set("alice", "k1", "") // the other instance's read failed and gave the key back
	resp, data = e.postKey("k1", img)
	first := decodeOK(t, resp, data)
	if n := e.gemini.calls.Load(); n != 1 {
		t.Errorf("%d upstream calls, want 1", n)
	}
	if owner, n, releases := claims.state("alice", "k1"); owner != "me" || n != 2 || releases != 0 {
		t.Errorf("after the read: claim held by %q, %d claims, %d releases; want this instance's claim, 2, 0", owner, n, releases)
	}
	if ttl := claims.ttls[len(claims.ttls)-1]; ttl < edge.WriteTimeout {
		t.Errorf("claimed for %v, less than a read may take (%v)", ttl, edge.WriteTimeout)
	}
	resp, data = e.postKey("k1", img) // a retry here: the kept answer, no claim
	if again := decodeOK(t, resp, data); resp.Header.Get(headerReplayed) != "true" || again.Quota != first.Quota {
		t.Errorf("retry: %s (replayed %q), want the kept answer", data, resp.Header.Get(headerReplayed))
	}
	if _, n, _ := claims.state("alice", "k1"); n != 2 || e.gemini.calls.Load() != 1 {
		t.Errorf("retry made %d claims and %d calls in all, want 2 and 1", n, e.gemini.calls.Load())
	}
}

// The other instance may keep its answer between this one's look and its
// claim (its transaction gives its claim back): the winner looks again and
// replays that answer rather than paying for a second read, and gives its
// own claim back.
func TestClaimWonAfterAnswerKeptElsewhere(t *testing.T) {
	claims := newFakeClaims()
	e := newEnv(t, envOptions{answers: true, claims: claims})
	img := pngBytes(t, 64, 32)
	fp := fingerprint(ocr.Image{MIME: "image/png", Data: img})
	body := []byte(`{"serials":["SN-OTHER"],"rejected":[],"quota":{"limit":100,"used":1,"remaining":99}}` + "\n")
	claims.onClaim = func() {
		a := budget.Answer{Fingerprint: fp, IdempotencyKey: "k2", Status: http.StatusOK, Body: body}
		if err := e.db.KeepAnswer("alice", time.Now(), a); err != nil {
			t.Error(err)
		}
	}
	resp, data := e.postKey("k2", img)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(data, body) || resp.Header.Get(headerReplayed) != "true" {
		t.Errorf("answer %d %q (replayed %q), want the other instance's kept answer", resp.StatusCode, data, resp.Header.Get(headerReplayed))
	}
	if n := e.gemini.calls.Load(); n != 0 {
		t.Errorf("%d upstream calls, want 0", n)
	}
	if owner, n, releases := claims.state("alice", "k2"); owner != "" || n != 1 || releases != 1 {
		t.Errorf("claim held by %q, %d claims, %d releases; want given back after 1 claim", owner, n, releases)
	}
}

// A read that fails keeps nothing and gives its claim back at once, so a
// retry on any instance reads again; a retry with another image is still
// its own key's first read.
func TestClaimGivenBackWhenReadFails(t *testing.T) {
	claims := newFakeClaims()
	e := newEnv(t, envOptions{answers: true, claims: claims})
	img := pngBytes(t, 64, 32)
	e.gemini.set(func(w http.ResponseWriter, r *http.Request) {
		writeUpstreamError(w, http.StatusBadRequest, "INVALID_ARGUMENT")
	})
	resp, data := e.postKey("k3", img)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, data)
	}
	if owner, n, releases := claims.state("alice", "k3"); owner != "" || n != 1 || releases != 1 {
		t.Errorf("after a failed read: claim held by %q, %d claims, %d releases; want given back", owner, n, releases)
	}
	e.gemini.set(nil)
	resp, data = e.postKey("k3", img)
	decodeOK(t, resp, data)
	if n := e.gemini.calls.Load(); n != 2 {
		t.Errorf("%d upstream calls, want 2 (the failed read and its retry)", n)
	}
}

// A claim that cannot be made (the database unreachable) does not refuse
// the request: it goes on as on one instance, and the log says why.
func TestClaimErrorGoesOn(t *testing.T) {
	claims := newFakeClaims()
	claims.err = errors.New("connection refused")
	var logs bytes.Buffer
	e := newEnv(t, envOptions{answers: true, claims: claims, logTo: &logs})
	resp, data := e.postKey("k4", pngBytes(t, 64, 32))
	decodeOK(t, resp, data)
	if n := e.gemini.calls.Load(); n != 1 {
		t.Errorf("%d upstream calls, want 1", n)
	}
	if _, _, releases := claims.state("alice", "k4"); releases != 0 {
		t.Errorf("%d releases of a claim never made, want 0", releases)
	}
	if !strings.Contains(logs.String(), "idempotency key not claimed across instances") {
		t.Errorf("log does not say the claim failed:\n%s", logs.String())
	}
}

// With the database down, each request would log that its key was not
// claimed: one line per storeWarnEvery goes out, the next saying how many
// were held back.
func TestClaimErrorsAreLoggedAtARate(t *testing.T) {
	claims := newFakeClaims()
	claims.err = errors.New("connection refused")
	var logs bytes.Buffer
	clk := newClock(time.Now())
	e := newEnv(t, envOptions{answers: true, claims: claims, logTo: &logs, clock: clk.now})
	img := pngBytes(t, 64, 32)
	for i := range 5 {
		resp, data := e.postKey(fmt.Sprint("flood-", i), img)
		decodeOK(t, resp, data)
	}
	const line = "idempotency key not claimed across instances"
	if n := strings.Count(logs.String(), line); n != 1 {
		t.Fatalf("%d log lines for 5 claims that failed at once, want 1:\n%s", n, logs.String())
	}
	clk.add(storeWarnEvery)
	resp, data := e.postKey("flood-late", img)
	decodeOK(t, resp, data)
	if n := strings.Count(logs.String(), line); n != 2 || !strings.Contains(logs.String(), "unlogged_since_last=4") {
		t.Errorf("after storeWarnEvery: %d lines, want 2, the second counting the 4 held back:\n%s", n, logs.String())
	}
}

// A first request answered from the dedupe window keeps that answer under
// its key (KeepAnswer gives the claim back on postgres): no release of its
// own; a request that makes no claim (no key) touches no claim.
func TestClaimOfCachedAnswer(t *testing.T) {
	claims := newFakeClaims()
	e := newEnv(t, envOptions{answers: true, dedupe: time.Minute, claims: claims})
	img := pngBytes(t, 64, 32)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	if _, n, releases := claims.state("alice", ""); n != 0 || releases != 0 {
		t.Errorf("a request without a key made %d claims, %d releases", n, releases)
	}
	resp, data = e.postKey("k5", img)
	if b := decodeOK(t, resp, data); !strings.Contains(string(data), `"cached":true`) || len(b.Serials) != 2 {
		t.Errorf("answer %s, want the cached read", data)
	}
	if owner, n, releases := claims.state("alice", "k5"); owner != "me" || n != 1 || releases != 0 || e.gemini.calls.Load() != 1 {
		t.Errorf("claim held by %q, %d claims, %d releases, %d calls; want one claim kept with the answer, one call",
			owner, n, releases, e.gemini.calls.Load())
	}
}
