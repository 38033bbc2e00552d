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
	"breakwater/server/edgetest"
	"breakwater/server/guard"
	"breakwater/server/invites"
)

// sharedFails is a store that decides a fail limit's keys as the database
// does (limiter.SharedFails), from a FailLimiter of its own, and counts
// the decisions it is asked for and the attempts it is told to end (the
// stand-ins of limiter.FailLimiter.EndRefused included): each a round
// trip on postgres.
type sharedFails struct {
	mu       sync.Mutex
	f        *limiter.FailLimiter
	open     map[string][]*limiter.Attempt
	begins   int
	finishes int
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

func (s *sharedFails) Finish(keys []string, outcome limiter.FailOutcome, _ limiter.FailConfig, begun, now time.Time) ([]string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finishes++
	if outcome == limiter.OutcomeRelease && begun.IsZero() {
		return nil, false, nil // an attempt Begin refused: nothing to end
	}
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

// asked returns how many attempts the store was asked to begin and to
// end.
func (s *sharedFails) asked() (begins, finishes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begins, s.finishes
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

// workEnv is a verification env whose fail limit is decided by a store
// (as on postgres) when shared, with its lookups counted.
type workEnv struct {
	*env
	clk   *clock
	store *sharedFails // nil: the fail limit in memory (bolt)
	codes *countedCodes
}

func newWorkEnv(t *testing.T, shared bool, cfg invites.Config) *workEnv {
	t.Helper()
	w := &workEnv{clk: newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)), codes: &countedCodes{}}
	w.env = newEnv(t, envOptions{clock: w.clk.now, cfg: trustLoopback, invites: loose(cfg), deny: guard.NewDeny(0),
		redeemer: func(r invites.Redeemer) invites.Redeemer { w.codes.Redeemer = r; return w.codes }})
	if shared {
		w.store = newSharedFails(t, w.inviteLimits.Fails.Config())
		w.inviteLimits.Fails.Share(w.store, func(err error) { t.Errorf("store fault: %v", err) })
	}
	return w
}

// work is what one verification asked: attempts begun and ended in the
// store, and codes looked up.
type work struct{ begins, finishes, lookups int }

// refused sends code for email from ip, wants the one face of a refusal
// counted under reason, and returns the work it took.
func (w *workEnv) refused(t *testing.T, r *refusedBody, code, email, ip, reason string) work {
	t.Helper()
	before, b0, f0 := w.codes.checks.Load(), 0, 0
	if w.store != nil {
		b0, f0 = w.store.asked()
	}
	counted := w.inviteRefusals(reason)
	r.wantVerify(t, w.env, code, email, "X-Real-IP", ip)
	if got := w.inviteRefusals(reason); got != counted+1 {
		t.Errorf("%s from %s: refusals counted as %s went from %d to %d, want one more", code, ip, reason, counted, got)
	}
	done := work{lookups: int(w.codes.checks.Load() - before)}
	if w.store != nil {
		b, f := w.store.asked()
		done.begins, done.finishes = b-b0, f-f0
	}
	return done
}

// TestVerifyEveryRefusalDoesTheSameWork: whatever refuses a verification
// (no invite has the code, a malformed code, an expired, used-up or
// revoked invite, the right code during a cooldown, first or repeated,
// the service-wide net), it does the same work: one lookup, and, where a
// store decides the fail limit (postgres, a round trip each), one attempt
// begun or refused and one ended (a failure's, or the stand-in of one the
// limit refused), so that the time of the answer tells no class from
// another. No refusal is answered from the flood cache.
func TestVerifyEveryRefusalDoesTheSameWork(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			w := newWorkEnv(t, shared, invites.Config{})
			right, _ := w.newInvite(3, 0)
			expired, _ := w.newInvite(1, time.Hour)
			usedUp, _ := w.newInvite(1, 0)
			wantValid(t, w.env, usedUp, "first@example.com", "X-Real-IP", "192.0.2.1")
			revoked, info := w.newInvite(3, 0)
			if _, err := w.invites.Revoke(info.ID); err != nil {
				t.Fatal(err)
			}
			w.clk.add(2 * time.Hour)
			want := work{lookups: 1}
			if shared {
				want = work{begins: 1, finishes: 1, lookups: 1}
			}
			var r refusedBody
			check := func(what string, got work) {
				t.Helper()
				if got != want {
					t.Errorf("%s: %+v, want %+v", what, got, want)
				}
			}
			check("unknown", w.refused(t, &r, invites.NewCode(), "a@example.com", "192.0.2.2", reasonInvalid))
			check("malformed", w.refused(t, &r, "not a code", "b@example.com", "192.0.2.3", reasonInvalid))
			check("expired", w.refused(t, &r, expired, "c@example.com", "192.0.2.4", reasonExpired))
			check("used up", w.refused(t, &r, usedUp, "d@example.com", "192.0.2.5", reasonUsedUp))
			check("revoked", w.refused(t, &r, revoked, "e@example.com", "192.0.2.6", reasonRevoked))
			for i := range 5 { // the default fail_limit: the fifth starts the cooldown
				check(fmt.Sprintf("wrong guess %d", i+1), w.refused(t, &r, "WRONG-CODE-ZZZ", "mallory@example.com", "203.0.113.7", reasonInvalid))
			}
			for i := range 3 {
				check(fmt.Sprintf("the right code in a cooldown, %d", i+1), w.refused(t, &r, right, "mallory@example.com", "203.0.113.7", limitReasonCooldown))
			}
			if n := w.srv.floods.Answered(); n != 0 {
				t.Errorf("%d refusals answered from the flood cache, want none", n)
			}
			// The operator lifts the cooldowns: the right code passes at once.
			for _, k := range []string{"ip:203.0.113.7", "email:mallory@example.com"} {
				if !w.inviteLimits.Fails.Clear(k) {
					t.Fatalf("Clear(%s): no state", k)
				}
			}
			wantValid(t, w.env, right, "mallory@example.com", "X-Real-IP", "203.0.113.7")
		})
	}
}

// TestVerifyNetRefusalDoesTheWorkOfAFailure: the service-wide net's
// refusal, of the right code too, does the work of a failure.
func TestVerifyNetRefusalDoesTheWorkOfAFailure(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			w := newWorkEnv(t, shared, invites.Config{GlobalFailPerHour: 2})
			right, _ := w.newInvite(3, 0)
			want := work{lookups: 1}
			if shared {
				want = work{begins: 1, finishes: 1, lookups: 1}
			}
			var r refusedBody
			for i, step := range []struct{ code, reason string }{
				{"WRONG-CODE-AAA", reasonInvalid}, {"WRONG-CODE-BBB", reasonInvalid},
				{right, limitReasonGlobal}, {"WRONG-CODE-CCC", limitReasonGlobal},
			} {
				ip := fmt.Sprintf("192.0.2.%d", i+10)
				if got := w.refused(t, &r, step.code, fmt.Sprintf("n%d@example.com", i), ip, step.reason); got != want {
					t.Errorf("%s (%s): %+v, want %+v", step.code, step.reason, got, want)
				}
			}
		})
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
		edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
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
