package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/server/invites"
)

// refusalMargin is how far apart two classes of invite refusal may lie
// in TestInviteRefusalsTakeAlike.
const refusalMargin = 5 * time.Microsecond

// The pools of TestInviteRefusalsTakeAlike: its fail limit, high enough
// that a pool address and e-mail never reach it, and the pools' sizes.
const (
	alikeFailLimit = 50
	alikePool      = 500 // addresses and e-mails seen before, in no cooldown
	alikeCooling   = 16  // addresses in a cooldown
)

// refusalClass is one class of refused verification: what its i-th
// request sends.
type refusalClass struct {
	name string
	send func(i int) verifyCall
}

// verifyCall is one verification: a code and an e-mail, from a client
// address (X-Forwarded-For, 127.0.0.1 being a trusted proxy).
type verifyCall struct{ code, ip, email string }

// TestInviteRefusalsTakeAlike: every class of invite refusal takes as
// long to answer, over real HTTP on 127.0.0.1, as a code no invite has:
// an expired, a used-up and a revoked code, and the right code from an
// address in a cooldown, with another e-mail each time or again with the
// one that cooled down with it. A class whose median lies more than
// refusalMargin (5µs) from the unknown code's, with its 95% interval
// wholly beyond it, fails: neither whether a code exists nor whether a
// cooldown holds may show in the answer's time (docs/API.md).
//
// The classes are interleaved: each round sends one request of each, in
// random order, on one keep-alive connection, so that drift and the
// machine's other load fall on all alike; a class is compared with the
// unknown code by the median of the rounds' differences, with its
// distribution-free interval. All but the class is held alike: outside a
// cooldown the requests come from a pool of addresses and e-mails seen
// before (a new one costs the fail limit an entry whatever the code),
// and each class sends its few codes again and again, as a guesser
// checking whether a code exists does. It fails only on a difference
// told apart from the noise, so a busy machine widens the interval
// rather than failing it. Under the race detector (go test -race), the
// right code in a cooldown remembered by the flood cache, which skipped
// the fail limit, was answered 15µs sooner (95% interval 7 to 23µs)
// before every refusal did the same work, and fails; now every class
// lies within ±4µs of the unknown code (without -race, ±1µs).
func TestInviteRefusalsTakeAlike(t *testing.T) {
	const warmUp, rounds = 200, 2500
	a, classes := alikeApp(t)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
	rng := rand.New(rand.NewPCG(5, 6))
	times := make([][]float64, len(classes))
	order := make([]int, len(classes))
	for i := range order {
		order[i] = i
	}
	for round := range warmUp + rounds {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			took := timeRefusal(t, a, client, classes[k].send(round))
			if round >= warmUp {
				times[k] = append(times[k], float64(took))
			}
		}
	}
	margin := float64(refusalMargin)
	for k := 1; k < len(classes); k++ {
		diffs := make([]float64, rounds)
		for i := range diffs {
			diffs[i] = times[k][i] - times[0][i]
		}
		d, lo, hi := medianWithInterval(diffs)
		t.Logf("%-14s the rounds' difference from an unknown code %+6.2fµs, 95%% interval [%+6.2f, %+6.2f]µs (medians %.1fµs and %.1fµs)",
			classes[k].name, d/1e3, lo/1e3, hi/1e3, medianOf(times[k])/1e3, medianOf(times[0])/1e3)
		if lo > margin || hi < -margin {
			t.Errorf("%s is answered %+.2fµs from an unknown code (95%% interval [%+.2f, %+.2f]µs), beyond ±%v",
				classes[k].name, d/1e3, lo/1e3, hi/1e3, refusalMargin)
		}
	}
}

// alikeApp opens an App on a fresh bolt database, makes the invites and
// the cooldowns of the refusal classes, and returns the classes, the
// unknown code first.
func alikeApp(t *testing.T) (*App, []refusalClass) {
	t.Helper()
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	vars := map[string]string{"GEMINI_API_KEY": "k", "BREAKWATER_SECRET": "00112233445566778899aabbccddeeff"}
	cfg, err := Load(writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
trusted_proxies = ["127.0.0.1"]
[storage]
path = %q
[invites]
rate = 100000
burst = 100000
fail_limit = %d
global_fail_per_hour = 1000000000
[plans.free]
monthly_quota = 10
`, filepath.Join(t.TempDir(), "bw.db"), alikeFailLimit)), env(vars))
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), cfg, Options{Getenv: env(vars), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	create := func(uses int, ttl time.Duration, note string) (string, string) {
		code, info, err := a.Invites().Create(uses, ttl, note)
		if err != nil {
			t.Fatal(err)
		}
		return code, info.ID
	}
	// Notes of one length: the records differ in what they say, not in
	// what they cost to read.
	expired, _ := create(1, time.Hour, "note 90")
	offset.Store(int64(2 * time.Hour))
	usedUp, _ := create(1, 0, "note 91")
	client := &http.Client{}
	if status := verifyStatus(t, a, client, verifyCall{usedUp, "192.0.2.1", "first@example.com"}); status != http.StatusOK {
		t.Fatalf("redeem the one-use invite: %d", status)
	}
	revoked, id := create(3, 0, "note 92")
	if _, err := a.Invites().Revoke(id); err != nil {
		t.Fatal(err)
	}
	right, _ := create(1_000_000, 0, "note 93")
	for i := range 20 { // valid invites, never sent: the stand-ins of unknown codes
		create(5, 0, fmt.Sprintf("note %02d", i))
	}
	return a, alikeClasses(t, a, client, []string{expired, usedUp, revoked}, right)
}

// alikeClasses warms the pool, puts the cooling addresses in a cooldown
// and returns the classes.
func alikeClasses(t *testing.T, a *App, client *http.Client, existing []string, right string) []refusalClass {
	t.Helper()
	unknown := []string{invites.NewCode(), invites.NewCode(), invites.NewCode()}
	pool := func(i int) (ip, email string) {
		i %= alikePool
		return fmt.Sprintf("10.1.%d.%d", i/250, i%250), fmt.Sprintf("p%d@example.com", i)
	}
	cooling := func(i int) (ip, email string) {
		i %= alikeCooling
		return fmt.Sprintf("203.0.113.%d", i+1), fmt.Sprintf("cool%d@example.com", i)
	}
	for i := range alikePool {
		ip, email := pool(i)
		timeRefusal(t, a, client, verifyCall{unknown[0], ip, email})
	}
	for i := range alikeCooling {
		ip, email := cooling(i)
		for range alikeFailLimit {
			timeRefusal(t, a, client, verifyCall{unknown[1], ip, email})
		}
	}
	next := 0
	fromPool := func(code string) verifyCall {
		next++
		ip, email := pool(next)
		return verifyCall{code, ip, email}
	}
	return []refusalClass{
		{"unknown", func(i int) verifyCall { return fromPool(unknown[i%len(unknown)]) }},
		{"expired", func(int) verifyCall { return fromPool(existing[0]) }},
		{"used up", func(int) verifyCall { return fromPool(existing[1]) }},
		{"revoked", func(int) verifyCall { return fromPool(existing[2]) }},
		{"cooldown", func(i int) verifyCall {
			ip, _ := cooling(i)
			return verifyCall{right, ip, fromPool("").email}
		}},
		{"cooldown again", func(i int) verifyCall {
			ip, email := cooling(i)
			return verifyCall{right, ip, email}
		}},
	}
}

// verifyStatus sends v to a's POST /v1/invites/verify and returns the
// status.
func verifyStatus(t *testing.T, a *App, client *http.Client, v verifyCall) int {
	t.Helper()
	status, _ := sendVerify(t, a, client, v)
	return status
}

// timeRefusal sends v, requires the refusal and returns how long the
// answer took.
func timeRefusal(t *testing.T, a *App, client *http.Client, v verifyCall) time.Duration {
	t.Helper()
	status, took := sendVerify(t, a, client, v)
	if status != http.StatusForbidden {
		t.Fatalf("verify %q from %s: status %d, want 403", v.code, v.ip, status)
	}
	return took
}

func sendVerify(t *testing.T, a *App, client *http.Client, v verifyCall) (int, time.Duration) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": v.code, "email": v.email})
	req, err := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/v1/invites/verify", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", v.ip)
	begin := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(begin)
}

// medianOf returns the median of v, which it leaves alone.
func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianWithInterval returns the median of v and its distribution-free
// 95% interval: the order statistics n/2 ± 1.96·√n/2 (the sign test's).
func medianWithInterval(v []float64) (m, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	half := int(math.Ceil(1.96 * math.Sqrt(float64(n)) / 2))
	return medianOf(s), s[max(0, n/2-half)], s[min(n-1, (n-1)/2+half)]
}
