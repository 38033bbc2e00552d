package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/server/guard"
	"breakwater/server/invites"
)

// sharedFails is a store that decides a fail limit's keys as the database
// does (limiter.SharedFails), from a FailLimiter of its own, and counts
// the decisions it is asked for: one a round trip on postgres.
type sharedFails struct {
	mu     sync.Mutex
	f      *limiter.FailLimiter
	open   map[string][]*limiter.Attempt
	begins int
}

func newSharedFails(t *testing.T, cfg limiter.FailConfig) *sharedFails {
	t.Helper()
	f, err := limiter.NewFail(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &sharedFails{f: f, open: map[string][]*limiter.Attempt{}}
}

func (s *sharedFails) Begin(keys []string, _ limiter.FailConfig, now time.Time) (*limiter.Refusal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begins++
	a, err := s.f.Begin(keys, now)
	var r *limiter.Refusal
	if errors.As(err, &r) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	k := strings.Join(keys, "\n")
	s.open[k] = append(s.open[k], a)
	return nil, nil
}

func (s *sharedFails) Finish(keys []string, outcome limiter.FailOutcome, _ limiter.FailConfig, _, now time.Time) ([]string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := strings.Join(keys, "\n")
	a := s.open[k][0]
	s.open[k] = s.open[k][1:]
	switch outcome {
	case limiter.OutcomeFail:
		tripped := a.Fail(now)
		return a.CooldownsStarted(), tripped, nil
	case limiter.OutcomeSucceed:
		a.Succeed(now)
	default:
		a.Cancel()
	}
	return nil, false, nil
}

func (s *sharedFails) Cooling(now time.Time) ([]limiter.Cooldown, error) {
	return s.f.Cooling(now), nil
}
func (s *sharedFails) Clear(key string) (bool, error)            { return s.f.Clear(key), nil }
func (s *sharedFails) GlobalFailures(now time.Time) (int, error) { return s.f.GlobalFailures(now), nil }

func (s *sharedFails) asked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begins
}

// sharedWindows is a store that decides rate windows as the database does
// (limiter.SharedWindows), from a Limiter of its own, and counts them.
type sharedWindows struct {
	l     *limiter.Limiter
	takes atomic.Int64
}

func (s *sharedWindows) Take(key string, _ limiter.Config, now time.Time) (*limiter.Refusal, error) {
	s.takes.Add(1)
	err := s.l.Allow(key, now)
	var r *limiter.Refusal
	if errors.As(err, &r) {
		return r, nil
	}
	return nil, err
}

// countedCodes counts the invite lookups: one a round trip on postgres.
type countedCodes struct {
	invites.Redeemer
	checks atomic.Int64
}

func (c *countedCodes) CheckInvite(hash [32]byte, email string, now time.Time) (invites.RedeemOutcome, error) {
	c.checks.Add(1)
	return c.Redeemer.CheckInvite(hash, email, now)
}

// TestVerifyCooldownFloodFromMemory: on a shared fail limit (as on
// postgres), an address and e-mail in a cooldown are refused once by the
// store, and then from memory: 200 more guesses, right or wrong, ask the
// store nothing and look no code up, and each gets the one face of a
// refusal, counted as a cooldown. A Clear (the operator's change) lets
// the right code through at once; without one, the cooldown's end does.
func TestVerifyCooldownFloodFromMemory(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	codes := &countedCodes{}
	deny := guard.NewDeny(0)
	e := newEnv(t, envOptions{clock: clk.now, invites: loose(invites.Config{}), deny: deny,
		redeemer: func(r invites.Redeemer) invites.Redeemer { codes.Redeemer = r; return codes }})
	store := newSharedFails(t, e.inviteLimits.Fails.Config())
	e.inviteLimits.Fails.Share(store, func(err error) { t.Errorf("store fault: %v", err) })
	code, _ := e.newInvite(3, 0)
	var r refusedBody
	for range 5 { // the default fail_limit: the fifth starts the cooldown
		r.wantVerify(t, e, "WRONG-CODE-ZZZ", "mallory@example.com")
	}
	r.wantVerify(t, e, code, "mallory@example.com") // decided by the store, then remembered
	begins, checks := store.asked(), codes.checks.Load()
	if begins != 6 || checks != 6 {
		t.Fatalf("before the flood: %d store decisions and %d lookups, want 6 and 6", begins, checks)
	}
	const flood = 200
	for i := range flood {
		guess := "WRONG-CODE-ZZZ"
		if i%2 == 0 {
			guess = code
		}
		clk.add(time.Second)
		r.wantVerify(t, e, guess, "mallory@example.com")
	}
	if got := store.asked() - begins; got != 0 {
		t.Errorf("the store was asked %d times for %d refusals of a remembered cooldown, want 0", got, flood)
	}
	if got := codes.checks.Load() - checks; got != 0 {
		t.Errorf("%d codes looked up for %d refusals of a remembered cooldown, want 0", got, flood)
	}
	if got := e.inviteRefusals(limiter.ReasonCooldown); got != flood+1 {
		t.Errorf("breakwater_invite_refusals_total{reason=cooldown} = %d, want %d (every one, from memory or not)", got, flood+1)
	}
	if got := e.srv.floods.Answered(); got != flood {
		t.Errorf("the flood cache answered %d, want %d", got, flood)
	}

	// Another e-mail from the address: the set differs, so the store
	// decides (and refuses: the address cools down too).
	r.wantVerify(t, e, code, "other@example.com")
	if got := store.asked() - begins; got != 1 {
		t.Errorf("another e-mail from the cooling address: %d store decisions, want 1", got)
	}

	// The operator lifts both cooldowns: the cache is cleared with them.
	for _, k := range []string{"ip:127.0.0.1", "email:mallory@example.com"} {
		if !e.inviteLimits.Fails.Clear(k) {
			t.Fatalf("Clear(%s): no state", k)
		}
	}
	deny.Clear()
	wantValid(t, e, code, "mallory@example.com")
}

// TestVerifyCooldownRemembersUntilItsEnd: a cooldown remembered is
// answered until its exact end, and the key is decided again then.
func TestVerifyCooldownRemembersUntilItsEnd(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now, invites: loose(invites.Config{}), deny: guard.NewDeny(0)})
	store := newSharedFails(t, e.inviteLimits.Fails.Config())
	e.inviteLimits.Fails.Share(store, nil)
	code, _ := e.newInvite(3, 0)
	var r refusedBody
	for range 6 {
		r.wantVerify(t, e, "WRONG-CODE-ZZZ", "mallory@example.com")
	}
	clk.add(10*time.Minute - time.Nanosecond) // the default cooldown, less a nanosecond
	r.wantVerify(t, e, code, "mallory@example.com")
	if got := e.srv.floods.Answered(); got != 1 {
		t.Errorf("a nanosecond before the end: %d answered from memory, want 1", got)
	}
	clk.add(time.Nanosecond)
	wantValid(t, e, code, "mallory@example.com")
}

// TestVerifyLocalCooldownStillLooksUp: on a fail limit in memory (bolt)
// a remembered cooldown still looks the code up, as a decided one does:
// the timing tells no cooldown from a wrong code, and the lookup costs no
// round trip there.
func TestVerifyLocalCooldownStillLooksUp(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	codes := &countedCodes{}
	e := newEnv(t, envOptions{clock: clk.now, invites: loose(invites.Config{}), deny: guard.NewDeny(0),
		redeemer: func(r invites.Redeemer) invites.Redeemer { codes.Redeemer = r; return codes }})
	var r refusedBody
	for range 16 {
		r.wantVerify(t, e, "WRONG-CODE-ZZZ", "mallory@example.com")
	}
	if got := e.srv.floods.Answered(); got != 10 {
		t.Errorf("%d refusals answered from memory, want 10 (all but the first of the cooldown)", got)
	}
	if got := codes.checks.Load(); got != 16 {
		t.Errorf("%d codes looked up for 16 checks, want 16", got)
	}
}

// TestVerifyRateFloodFromMemory: the address limit's refusal (the burst,
// 3 a second) is asked of the shared store once and remembered until its
// exact retry-after: 100 more requests in that second are refused from
// memory, each a 429 with Retry-After, counted as a burst refusal.
func TestVerifyRateFloodFromMemory(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now, deny: guard.NewDeny(0)}) // the defaults: burst 3
	lim, err := limiter.New(e.inviteLimits.Windows.Config())
	if err != nil {
		t.Fatal(err)
	}
	store := &sharedWindows{l: lim}
	e.inviteLimits.Windows.Share(store, nil)
	code, _ := e.newInvite(5, 0)
	for i := range 3 {
		wantValid(t, e, code, fmt.Sprintf("b%d@example.com", i))
	}
	for i := range 101 {
		clk.add(time.Millisecond)
		resp, data := e.verify(code, "b4@example.com")
		decodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
		if resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("refusal %d: Retry-After %q, want 1", i, resp.Header.Get("Retry-After"))
		}
	}
	if got := store.takes.Load(); got != 4 {
		t.Errorf("the store was asked %d times for 3 passes and 101 refusals, want 4", got)
	}
	if got := e.inviteRefusals(limiter.ReasonBurst); got != 101 {
		t.Errorf("breakwater_invite_refusals_total{reason=burst} = %d, want 101", got)
	}
	clk.add(time.Second)
	wantValid(t, e, code, "b4@example.com")
}

// TestVerifyInFlightNotRemembered: a refusal of attempts in flight is
// not exact (they end any time): it is not remembered.
func TestVerifyInFlightNotRemembered(t *testing.T) {
	e := newEnv(t, envOptions{invites: loose(invites.Config{FailLimit: 1}), deny: guard.NewDeny(0)})
	a, err := e.inviteLimits.Fails.Begin([]string{"ip:127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var r refusedBody
	r.wantVerify(t, e, "WRONG-CODE-ZZZ", "mallory@example.com")
	if got := e.inviteRefusals(limiter.ReasonInFlight); got != 1 {
		t.Fatalf("breakwater_invite_refusals_total{reason=in_flight} = %d, want 1", got)
	}
	if n := e.srv.floods.Len(); n != 0 {
		t.Errorf("%d refusals remembered after an in_flight refusal, want 0", n)
	}
	a.Cancel()
	code, _ := e.newInvite(1, 0)
	wantValid(t, e, code, "mallory@example.com")
}

// failSetKey tells sets apart however their keys split, and is 32 bytes
// however long they are.
func TestFailSetKey(t *testing.T) {
	a := failSetKey([]string{"ip:1", "json:email:x"})
	for _, other := range [][]string{
		{"ip:1json:email:x"}, {"ip:", "1json:email:x"}, {"json:email:x", "ip:1"}, {"ip:1", "json:email:y"},
	} {
		if failSetKey(other) == a {
			t.Errorf("%q gives the key of [ip:1 json:email:x]", other)
		}
	}
	if failSetKey([]string{"ip:1", "json:email:x"}) != a {
		t.Error("one set, two keys")
	}
	if n := len(failSetKey([]string{strings.Repeat("x", 10_000)})); n != 32 {
		t.Errorf("a long key's set key is %d bytes, want 32", n)
	}
}
