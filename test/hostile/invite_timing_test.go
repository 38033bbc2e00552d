package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"breakwater/server/invites"
)

// timingMargin is how far apart two classes of invite refusal may lie:
// a difference of the medians beyond it, told apart from the noise,
// fails TestInviteTimingFromOutside.
const timingMargin = 5 * time.Microsecond

// The pools of TestInviteTimingFromOutside: its fail limit, high enough
// that a pool address and e-mail never reach it (each is sent about 40
// failures at most), and the pools' sizes.
const (
	timingFailLimit = 100
	timingPool      = 1000 // addresses and e-mails that are not cooling down
	timingCooling   = 32   // addresses in a cooldown (each 100 + 500 requests, under the rate of 1,000)
)

// timingClass is one class of refused verification: what the i-th
// request of the class sends.
type timingClass struct {
	name string
	send func(i int) verification
}

// verification is what one verification sends: a code and an e-mail,
// from a client address.
type verification struct{ code, ip, email string }

// TestInviteTimingFromOutside measures, from outside over loopback, how
// long the real binary takes to refuse each class of verification: a
// code no invite has, an expired, a used-up and a revoked one, and the
// right code from an address in a cooldown, with another e-mail each
// time or with the one that cooled down with it, sent again and again.
// Every class must take as long as the unknown code, within timingMargin:
// neither whether a code exists nor whether a cooldown holds may show in
// the time of the answer (docs/API.md, Invite codes).
//
// One keep-alive connection, as a guesser's. Each round sends one
// request of every class, in random order, so that drift and the
// machine's other load fall on all alike, and a class is compared with
// the unknown code by the median of the rounds' differences, with its
// distribution-free 95% interval. Everything but the class is held
// alike: the requests that are not in a cooldown come from a pool of
// addresses and e-mails seen before (a new address costs the fail limit
// a new entry, whatever the code), and each class sends the same few
// codes again, as a guesser who wants to know whether a code exists does
// (a code sent again finds its records in the CPU's caches).
//
// Rounds are added until every class's interval lies within
// ±timingMargin (pass), or one lies wholly beyond it (fail), or after
// timingRounds or timingBudget: too busy a machine fails rather than
// passing blind.
func TestInviteTimingFromOutside(t *testing.T) {
	if os.Getenv("BREAKWATER_TIMED") != "alone" {
		// Inside the whole suite another package's load falls on
		// whichever class is being sent, and the intervals do not close
		// within the budget.
		t.Skip("timed alone: .ci/run runs it after the suite with BREAKWATER_TIMED=alone")
	}
	const (
		warmUp       = 200
		step         = 1000
		timingRounds = 8000
		timingBudget = 50 * time.Second
	)
	c := defaults
	c.InviteFails = timingFailLimit
	e := start(t, c)
	client := newClient(1)
	classes := e.timingClasses(client)
	rng := rand.New(rand.NewPCG(3, 4))
	times := make([][]float64, len(classes))
	order := make([]int, len(classes))
	for i := range order {
		order[i] = i
	}
	began := time.Now()
	for round := 0; ; round++ {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			took := e.timeVerify(client, classes[k].send(round))
			if round >= warmUp {
				times[k] = append(times[k], took)
			}
		}
		if n := round + 1 - warmUp; n <= 0 || n%step != 0 {
			continue
		}
		within, beyond := judgeTiming(t, classes, times)
		switch {
		case beyond != "":
			t.Fatalf("%s is answered apart from an unknown code, beyond ±%v (95%% interval above)", beyond, timingMargin)
		case within:
			return
		case round+1-warmUp >= timingRounds || time.Since(began) > timingBudget:
			t.Fatalf("after %d rounds in %v the 95%% intervals still cannot tell ±%v: the machine was too busy to measure",
				round+1-warmUp, time.Since(began).Round(time.Second), timingMargin)
		}
	}
}

// judgeTiming compares each class with the first (the unknown code) by
// the median of the rounds' differences and logs it: within when every
// class's 95% interval lies within ±timingMargin, beyond naming a class
// whose interval lies wholly beyond it ("" for none).
func judgeTiming(t *testing.T, classes []timingClass, times [][]float64) (within bool, beyond string) {
	t.Helper()
	within, margin := true, float64(timingMargin)
	for k := 1; k < len(classes); k++ {
		diffs := make([]float64, len(times[k]))
		for i := range diffs {
			diffs[i] = times[k][i] - times[0][i]
		}
		d, lo, hi := medianInterval(diffs)
		t.Logf("%d rounds: %-14s median %6.1fµs (unknown %6.1fµs), the rounds' difference %+6.2fµs, 95%% interval [%+6.2f, %+6.2f]µs",
			len(diffs), classes[k].name, median(times[k])/1e3, median(times[0])/1e3, d/1e3, lo/1e3, hi/1e3)
		if lo > margin || hi < -margin {
			beyond = classes[k].name
		}
		within = within && lo >= -margin && hi <= margin
	}
	return within, beyond
}

// timingClasses makes the invites and the cooldowns the classes need and
// returns the classes, the unknown code first.
func (e *env) timingClasses(c *http.Client) []timingClass {
	e.t.Helper()
	existing := e.refusedInvites()
	right, _ := e.createInvite(1_000_000, "", "note 93")
	for range 20 { // valid invites, never sent: the stand-ins of unknown codes
		e.createInvite(5, "", "valid")
	}
	unknown := []string{invites.NewCode(), invites.NewCode(), invites.NewCode()}
	pool := func(i int) (ip, email string) {
		return fmt.Sprintf("10.1.%d.%d", i/250, i%250), fmt.Sprintf("p%d@example.com", i)
	}
	for i := range timingPool { // the pool is seen before it is measured
		ip, email := pool(i)
		e.timeVerify(c, verification{unknown[0], ip, email})
	}
	cooling := func(i int) (ip, email string) {
		return fmt.Sprintf("203.0.113.%d", i+1), fmt.Sprintf("cool%d@example.com", i)
	}
	for i := range timingCooling {
		ip, email := cooling(i)
		for range timingFailLimit {
			e.timeVerify(c, verification{unknown[1], ip, email})
		}
	}
	next := 0
	fromPool := func(code string) verification {
		next++
		ip, email := pool(next % timingPool)
		return verification{code, ip, email}
	}
	return []timingClass{
		{"unknown", func(i int) verification { return fromPool(unknown[i%len(unknown)]) }},
		{"expired", func(int) verification { return fromPool(existing[0]) }},
		{"used up", func(int) verification { return fromPool(existing[1]) }},
		{"revoked", func(int) verification { return fromPool(existing[2]) }},
		{"cooldown", func(i int) verification {
			ip, _ := cooling(i % timingCooling)
			return verification{right, ip, fromPool("").email}
		}},
		{"cooldown again", func(i int) verification {
			ip, email := cooling(i % timingCooling)
			return verification{right, ip, email}
		}},
	}
}

// timeVerify sends v (its address through the trusted proxy's
// X-Forwarded-For), requires the refusal, and returns how long the
// answer took, in nanoseconds.
func (e *env) timeVerify(c *http.Client, v verification) float64 {
	e.t.Helper()
	body, _ := json.Marshal(map[string]string{"code": v.code, "email": v.email})
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.proc.Addr+"/v1/invites/verify", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", v.ip)
	begin := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(begin)
	if resp.StatusCode != http.StatusForbidden {
		e.t.Fatalf("verify %q from %s: status %d, want 403", v.code, v.ip, resp.StatusCode)
	}
	return float64(took)
}

// refusedInvites makes one invite of each kind that exists but is
// refused, through the admin API, and returns their codes: one expired,
// one used up, one revoked. Notes of one length, so that the records
// differ in what they say but not in what they cost to read.
func (e *env) refusedInvites() []string {
	e.t.Helper()
	expired, _ := e.createInvite(1, "1ms", "note 90")
	expiresAt := time.Now().Add(time.Millisecond)
	usedUp, _ := e.createInvite(1, "", "note 91")
	revoked, id := e.createInvite(3, "", "note 92")
	if status := e.adminPost("/api/invites/"+id+"/revoke", nil, nil); status != http.StatusOK {
		e.t.Fatalf("revoke invite: status %d", status)
	}
	body, _ := json.Marshal(map[string]string{"code": usedUp, "email": "first@example.com"})
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.proc.Addr+"/v1/invites/verify", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if a := do(adminClient, req); a.status != http.StatusOK {
		e.t.Fatalf("redeem the one-use invite: %d %v", a.status, a.err)
	}
	// The expired one's millisecond has passed while the others were made
	// (the server and the test share the clock); a verification would
	// redeem it if not.
	time.Sleep(time.Until(expiresAt))
	return []string{expired, usedUp, revoked}
}

// createInvite makes an invite through the admin API and returns its
// code and id.
func (e *env) createInvite(uses int, expires, note string) (code, id string) {
	e.t.Helper()
	var out struct {
		ID   string `json:"id"`
		Code string `json:"code"`
	}
	req := map[string]any{"uses": uses, "expires": expires, "note": note}
	if status := e.adminPost("/api/invites", req, &out); status != http.StatusCreated || out.Code == "" {
		e.t.Fatalf("create invite: status %d %+v", status, out)
	}
	return out.Code, out.ID
}

// adminPost posts body as JSON to the admin API and decodes the answer
// into out (if not nil); it returns the status.
func (e *env) adminPost(path string, body, out any) int {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+e.admin+path, bytes.NewReader(b))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := adminClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
		}
	}
	return resp.StatusCode
}

// median returns the median of v, which it leaves alone.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianInterval returns the median of v and its distribution-free 95%
// interval: the order statistics n/2 ± 1.96·√n/2 (the sign test's).
func medianInterval(v []float64) (m, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	half := int(math.Ceil(1.96 * math.Sqrt(float64(n)) / 2))
	return median(s), s[max(0, n/2-half)], s[min(n-1, (n-1)/2+half)]
}
