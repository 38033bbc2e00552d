package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/server/invites"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// refusalMargin is how far apart two classes of invite refusal may lie
// in TestInviteRefusalsTakeAlike; pgRefusalMargin on PostgreSQL, whose
// own noise (tens of µs a request) resolves no finer, and where a
// cooldown sent again with its own e-mail measured 7.5µs sooner alone.
const (
	refusalMargin   = 5 * time.Microsecond
	pgRefusalMargin = 10 * time.Microsecond
)

// timedAlone skips a timed test inside the whole suite, where another
// package's load falls on whichever class is being sent (on PostgreSQL,
// which every package's tests share, a 38µs difference under it where
// alone there is 7.5µs): .ci/run runs it alone after the suite, with
// BREAKWATER_TIMED=alone.
func timedAlone(t *testing.T) {
	t.Helper()
	if os.Getenv("BREAKWATER_TIMED") != "alone" {
		t.Skip("timed alone: .ci/run runs it after the suite with BREAKWATER_TIMED=alone")
	}
}

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
// wholly beyond it in two samples (checkAlike), fails: neither whether a
// code exists nor whether a cooldown holds may show in the answer's time
// (docs/API.md).
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
//
// It runs alone (under -race, as .ci/run runs it after the
// suite): inside go test ./... it once measured the cooldown 15µs sooner
// (interval [-23, -8]µs), while alone and beside two CPU-bound processes
// it measured within ±7µs in five runs.
func TestInviteRefusalsTakeAlike(t *testing.T) {
	timedAlone(t)
	a, classes := alikeApp(t, "bolt")
	checkAlike(t, a, classes, 2500, refusalMargin)
}

// TestInviteRefusalsTakeAlikeOnPostgres is TestInviteRefusalsTakeAlike
// on PostgreSQL for the classes the fail limit refuses, where the limit
// is the database's (bw_fail_begin, bw_fail_finish): the right code from
// an address in a cooldown, with another e-mail or the one that cooled
// down with it, against an unknown code, which the limit lets through
// and records as a failure. A refusal there takes three round trips,
// about 1.3ms, whose time varies by tens of µs from one request to the
// next: on the loaded 2-core test machine 5,000 rounds give 95% intervals
// about ±7µs wide (±10µs under -race), so a class fails when it lies
// more than about 12µs (15µs) from the unknown code, never when within
// 5µs, and may pass between. Before migration 0012, which has a refusal
// of the fail limit do a failure's work, the cooldowns were answered
// 156µs and 160µs sooner than an unknown code (intervals [-166, -147]
// and [-170, -150]µs) and failed; now they lie within 8µs (under -race,
// the cooldown with its own e-mail up to 13µs sooner, interval [-21,
// -4]µs: the limit of what this test resolves). The codes that exist
// (expired, used up, revoked) are timed on bolt; on PostgreSQL their
// lookup is one statement of one shape
// (TestCheckInviteMissDoesTheWorkOfAHit). About 45 s, under -race too.
//
// The cooldown sent again with its own e-mail is not timed here: this
// harness gives that class 16 addresses and e-mails, each sent again
// every 16 rounds, against 500 for an unknown code, and on PostgreSQL
// rows written that often are answered from hot pages (measured 15µs
// sooner, alone); the real binary's test (test/hostile), whose classes
// have keys of their own used alike, found the same bias on bolt and none
// in the server. Its work in the database is counted exactly instead
// (storage/postgres TestFailsRefusalDoesTheWorkOfAFailure).
func TestInviteRefusalsTakeAlikeOnPostgres(t *testing.T) {
	timedAlone(t)
	a, classes := alikeApp(t, "postgres")
	classes = slices.DeleteFunc(classes, func(c refusalClass) bool {
		return c.name != "unknown" && c.name != "cooldown"
	})
	checkAlike(t, a, classes, 5000, pgRefusalMargin)
}

// timeAlike sends rounds of one request of each class, in random order,
// after a warm-up of 200, and returns each class's times.
func timeAlike(t *testing.T, a *App, classes []refusalClass, rounds int) [][]float64 {
	t.Helper()
	const warmUp = 200
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
	return times
}

// checkAlike times rounds of classes and fails a class whose difference
// from an unknown code lies beyond ±within. A class beyond it is timed
// again, with fresh rounds, and fails only if it is beyond it again: a
// timing leak is in every sample, while a stall of the shared machine
// that fell on the unknown code's requests (once, in CI, every class
// came out 4 to 15µs sooner than it under -race) is not. A leak found in
// one sample and not the next is logged.
func checkAlike(t *testing.T, a *App, classes []refusalClass, rounds int, within time.Duration) {
	t.Helper()
	beyond := judgeAlike(t, classes, timeAlike(t, a, classes, rounds), within)
	if len(beyond) == 0 {
		return
	}
	t.Logf("%v beyond ±%v: timing every class again", beyond, within)
	again := judgeAlike(t, classes, timeAlike(t, a, classes, rounds), within)
	for _, name := range beyond {
		if slices.Contains(again, name) {
			t.Errorf("%s is answered apart from an unknown code in two samples of %d rounds", name, rounds)
		}
	}
}

// judgeAlike compares each class with the first (the unknown code) by
// the median of the rounds' differences, logs it, and returns the classes
// whose 95% interval lies wholly beyond ±within.
func judgeAlike(t *testing.T, classes []refusalClass, times [][]float64, within time.Duration) (beyond []string) {
	t.Helper()
	margin := float64(within)
	for k := 1; k < len(classes); k++ {
		diffs := make([]float64, len(times[k]))
		for i := range diffs {
			diffs[i] = times[k][i] - times[0][i]
		}
		d, lo, hi := harness.MedianInterval(diffs)
		t.Logf("%-14s the rounds' difference from an unknown code %+6.2fµs, 95%% interval [%+6.2f, %+6.2f]µs (medians %.1fµs and %.1fµs)",
			classes[k].name, d/1e3, lo/1e3, hi/1e3, harness.Median(times[k])/1e3, harness.Median(times[0])/1e3)
		if lo > margin || hi < -margin {
			t.Logf("%s is answered %+.2fµs from an unknown code (95%% interval [%+.2f, %+.2f]µs), beyond ±%v",
				classes[k].name, d/1e3, lo/1e3, hi/1e3, within)
			beyond = append(beyond, classes[k].name)
		}
	}
	return beyond
}

// alikeApp opens an App on a fresh database of backend ("bolt" or
// "postgres"), makes the invites and the cooldowns of the refusal
// classes, and returns the classes, the unknown code first.
func alikeApp(t *testing.T, backend string) (*App, []refusalClass) {
	t.Helper()
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	vars := map[string]string{"GEMINI_API_KEY": "k", "BREAKWATER_SECRET": "00112233445566778899aabbccddeeff"}
	storage := fmt.Sprintf("path = %q", filepath.Join(t.TempDir(), "bw.db"))
	if backend == "postgres" {
		vars[postgres.EnvURL] = pgtest.NewDatabase(t)
		storage = `backend = "postgres"`
	}
	cfg, err := Load(writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
trusted_proxies = ["127.0.0.1"]
[storage]
%s
[invites]
rate = 100000
burst = 100000
fail_limit = %d
global_fail_per_hour = 1000000000
[plans.free]
monthly_quota = 10
`, storage, alikeFailLimit)), env(vars))
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
