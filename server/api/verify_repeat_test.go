package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"breakwater/server/invites"
)

// TestVerifyRepeatDoesNotClearTheRun plays the attacker who holds one
// redeemed code: with the defaults, one address sends 50 requests a second
// apart (inside the rate limit and the burst), every fifth its own code
// with its own e-mail and the rest wrong guesses. A repeat is answered
// valid but is neutral, so the cooldown starts at the fifth wrong guess as
// it would without the repeats, and everything after it is refused.
func TestVerifyRepeatDoesNotClearTheRun(t *testing.T) {
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now, cfg: trustLoopback}) // [invites] defaults
	own, _ := e.newInvite(1, 0)
	const ownEmail, attacker = "mallory@example.com", "203.0.113.66"
	wantValid(t, e, own, ownEmail, "X-Real-IP", "198.51.100.1") // redeemed once, elsewhere

	var r refusedBody
	var valid, refused int
	for i := range 50 {
		clk.add(time.Second)
		code, email := "WRONG-CODE-EEE", fmt.Sprintf("guess%d@example.com", i)
		if i%5 == 4 {
			code, email = own, ownEmail
		}
		resp, data := e.verify(code, email, "X-Real-IP", attacker)
		switch resp.StatusCode {
		case http.StatusOK:
			if strings.TrimSpace(string(data)) != `{"valid":true}` {
				t.Fatalf("request %d: 200 %s", i, data)
			}
			valid++
		default:
			r.want(t, resp, data)
			refused++
		}
	}
	if got, want := e.inviteRefusals(reasonInvalid), 5; got != want {
		t.Errorf("%d wrong guesses evaluated, want %d (fail_limit)", got, want)
	}
	// Requests 0-3 and 5 are the five failures; 4 is the one repeat
	// before the cooldown; 6-49 are held by it, the repeats among them.
	if valid != 1 || refused != 49 {
		t.Errorf("%d valid and %d refused, want 1 and 49", valid, refused)
	}
	if got, want := e.inviteRefusals(limitReasonCooldown), 44; got != want {
		t.Errorf("%d refused by the cooldown, want %d", got, want)
	}
	// The repeat took no second use.
	if list, err := e.invites.List(); err != nil || len(list) != 1 || list[0].Uses != 1 {
		t.Errorf("invites %+v (%v), want one with 1 use", list, err)
	}
}

// TestVerifyOnlyANewRedemptionClearsTheRun: from one address, with the
// default fail_limit of 5, a new redemption resets the run (or with
// reset_on_success = false takes one failure off), while a repeat of a
// redemption changes nothing, in either mode.
func TestVerifyOnlyANewRedemptionClearsTheRun(t *testing.T) {
	const (
		wrong  = "wrong"  // a wrong guess: refused, a failure
		fresh  = "new"    // the code for a new e-mail: valid, a success
		repeat = "repeat" // the code for the last new e-mail again: valid, neutral
	)
	type step struct {
		kind string
		ok   bool
	}
	w := step{wrong, false}
	no := false
	cases := []struct {
		name   string
		reset  *bool
		steps  []step
		guessN int // wrong guesses evaluated
	}{
		{"reset: a new redemption clears the run", nil, []step{
			w, w, w, w, {fresh, true}, w, w, w, w, {fresh, true},
			w, w, w, w, w, {fresh, false}, // the fifth in a row starts the cooldown
		}, 13},
		{"reset: repeats do not", nil, []step{
			w, w, {fresh, true}, w, {repeat, true}, w, {repeat, true}, w, {repeat, true}, w,
			{repeat, true}, w, {repeat, false},
		}, 7},
		{"decay: a new redemption takes one failure off", &no, []step{
			w, w, w, w, {fresh, true}, // run 3
			w, {fresh, true}, // 4, then 3
			w, w, {fresh, false}, // 5: cooling down
		}, 7},
		{"decay: repeats do not", &no, []step{
			w, w, w, w, {fresh, true}, {repeat, true}, {repeat, true}, // run 3
			w, w, {repeat, false}, // 5: cooling down
		}, 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOptions{cfg: trustLoopback, invites: loose(invites.Config{ResetOnSuccess: c.reset})})
			code, _ := e.newInvite(100, 0)
			var r refusedBody
			users := 0
			email := func() string { return fmt.Sprintf("user%d@example.com", users) }
			for i, s := range c.steps {
				var resp *http.Response
				var data []byte
				switch s.kind {
				case wrong:
					resp, data = e.verify("WRONG-CODE-FFF", fmt.Sprintf("guess%d@example.com", i), "X-Real-IP", "203.0.113.77")
				case fresh:
					users++
					resp, data = e.verify(code, email(), "X-Real-IP", "203.0.113.77")
				case repeat:
					resp, data = e.verify(code, email(), "X-Real-IP", "203.0.113.77")
				}
				if got := resp.StatusCode == http.StatusOK; got != s.ok {
					t.Fatalf("step %d (%s): status %d %s, want ok %v", i, s.kind, resp.StatusCode, data, s.ok)
				}
				if !s.ok {
					r.want(t, resp, data)
				}
			}
			if got := e.inviteRefusals(reasonInvalid); got != c.guessN {
				t.Errorf("%d wrong guesses evaluated, want %d", got, c.guessN)
			}
		})
	}
}
