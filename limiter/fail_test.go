package limiter_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/limiter"
)

// failStep is one attempt on key "k" at t0+at: begun, then failed (ok
// false), succeeded (ok true) or ended neutral (neutral true). refused, if
// set, is the reason Begin must give instead; until, if set, is the
// cooldown end that Begin must report as RetryAfter from at.
type failStep struct {
	at      time.Duration
	ok      bool
	neutral bool
	refused string
	until   time.Duration
}

func fail(at time.Duration) failStep    { return failStep{at: at} }
func succeed(at time.Duration) failStep { return failStep{at: at, ok: true} }
func neutral(at time.Duration) failStep { return failStep{at: at, neutral: true} }
func cooling(at, until time.Duration) failStep {
	return failStep{at: at, refused: limiter.ReasonCooldown, until: until}
}

func mustNewFail(tb testing.TB, cfg limiter.FailConfig) *limiter.FailLimiter {
	tb.Helper()
	f, err := limiter.NewFail(cfg)
	if err != nil {
		tb.Fatalf("NewFail(%+v): %v", cfg, err)
	}
	return f
}

func runFailSteps(t *testing.T, f *limiter.FailLimiter, steps []failStep) {
	t.Helper()
	for i, s := range steps {
		now := t0.Add(s.at)
		a, err := f.Begin([]string{"k"}, now)
		if s.refused != "" {
			var r *limiter.Refusal
			if !errors.As(err, &r) || r.Reason != s.refused {
				t.Fatalf("step %d at %v: Begin = %v, want refusal %q", i, s.at, err, s.refused)
			}
			if s.until != 0 {
				if got, want := r.RetryAfter, s.until-s.at; got != want {
					t.Fatalf("step %d at %v: RetryAfter %v, want %v", i, s.at, got, want)
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d at %v: Begin = %v, want admitted", i, s.at, err)
		}
		switch {
		case s.neutral:
			a.Neutral()
		case s.ok:
			a.Succeed(now)
		default:
			a.Fail(now)
		}
	}
}

// The fail limiter configurations the steps run under: five failures in
// ten minutes start a ten-minute cooldown; backoff doubles it up to 25
// minutes; decay lets a success take one failure off.
var (
	failBase    = limiter.FailConfig{Limit: 5, Window: 10 * m, Cooldown: 10 * m}
	failBackoff = func() limiter.FailConfig {
		c := failBase
		c.Backoff, c.MaxCooldown = true, 25*m
		return c
	}()
	failDecay = func() limiter.FailConfig {
		c := failBase
		c.Decay = true
		return c
	}()
)

// failCase is one fail limiter configuration and the attempts it sees.
type failCase struct {
	name  string
	cfg   limiter.FailConfig
	steps []failStep
}

// failCases are the steps TestFailLimiterSteps runs.
var failCases = []failCase{
	{"five failures within the window start a cooldown", failBase, []failStep{
		fail(0), fail(m), fail(2 * m), fail(3 * m), fail(4 * m),
		cooling(4*m+time.Second, 14*m), cooling(13*m, 14*m),
	}},
	{"four failures do not", failBase, []failStep{
		fail(0), fail(m), fail(2 * m), fail(3 * m), succeed(4 * m),
	}},
	{"each failure within the window of the previous, not of the first", failBase, []failStep{
		fail(0), fail(9 * m), fail(18 * m), fail(27 * m), fail(36 * m),
		cooling(37*m, 46*m),
	}},
	{"failures 11 minutes apart do not accumulate", failBase, []failStep{
		fail(0), fail(11 * m), fail(22 * m), fail(33 * m), fail(44 * m), fail(55 * m), fail(66 * m),
		fail(77 * m), succeed(78 * m),
	}},
	{"exactly the window apart still counts", failBase, []failStep{
		fail(0), fail(10 * m), fail(20 * m), fail(30 * m), fail(40 * m),
		cooling(40*m, 50*m),
	}},
	{"a gap breaks the run and the count starts again", failBase, []failStep{
		fail(0), fail(m), fail(2 * m), fail(3 * m), // 4 in a run
		fail(14 * m),                                           // 11 minutes later: a run of 1
		fail(15 * m), fail(16 * m), fail(17 * m), fail(18 * m), // 5
		cooling(18*m, 28*m),
	}},
	{"cooldown expiry", failBase, []failStep{
		fail(0), fail(0), fail(0), fail(0), fail(0),
		cooling(10*m-time.Nanosecond, 10*m), succeed(10 * m),
		// after it a fresh run is needed
		fail(11 * m), fail(11 * m), fail(11 * m), fail(11 * m), succeed(11 * m),
	}},
	{"a failure right after a cooldown starts a new run", failBase, []failStep{
		fail(0), fail(0), fail(0), fail(0), fail(0),
		fail(10 * m), fail(10 * m), fail(10 * m), fail(10 * m), succeed(10 * m),
	}},
	{"success resets the run", failBase, []failStep{
		fail(0), fail(0), fail(0), fail(0), succeed(m),
		fail(m), fail(m), fail(m), fail(m), succeed(2 * m),
	}},
	{"decay takes one failure off", failDecay, []failStep{
		fail(0), fail(0), fail(0), fail(0), succeed(m), // run 3
		fail(m), succeed(m), // 4, then 3
		fail(m), fail(m), // 5
		cooling(m+1, 11*m),
	}},
	{"decay: a success after the window has nothing to take", failDecay, []failStep{
		fail(0), fail(0), fail(0), fail(0), succeed(20 * m),
		fail(20 * m), fail(20 * m), fail(20 * m), fail(20 * m), succeed(20 * m),
	}},
	{"a neutral attempt does not reset the run", failBase, []failStep{
		fail(0), neutral(0), fail(0), neutral(0), fail(0), fail(0), neutral(m), fail(m),
		cooling(m, 11*m),
	}},
	{"a neutral attempt does not decay the run", failDecay, []failStep{
		fail(0), fail(0), fail(0), fail(0), neutral(m), neutral(m), fail(m),
		cooling(m, 11*m),
	}},
	{"a neutral attempt does not keep a run alive past the window", failBase, []failStep{
		fail(0), fail(0), fail(0), fail(0), neutral(9 * m), // the window runs from 0, not 9m
		fail(11 * m), fail(11 * m), fail(11 * m), fail(11 * m), succeed(11 * m),
	}},
	{"a neutral attempt during a cooldown is refused like any other", failBase, []failStep{
		fail(0), fail(0), fail(0), fail(0), fail(0),
		{at: m, neutral: true, refused: limiter.ReasonCooldown, until: 10 * m},
	}},
	{"backoff doubles and is capped", failBackoff, []failStep{
		fail(0), fail(0), fail(0), fail(0), fail(0), cooling(0, 10*m), // 10m
		fail(10 * m), fail(10 * m), fail(10 * m), fail(10 * m), fail(10 * m),
		cooling(10*m, 30*m), // 20m
		fail(30 * m), fail(30 * m), fail(30 * m), fail(30 * m), fail(30 * m),
		cooling(30*m, 55*m), // 40m, capped at 25m
	}},
	{"backoff forgets after 24 hours", failBackoff, []failStep{
		fail(0), fail(0), fail(0), fail(0), fail(0), cooling(0, 10*m),
		fail(10*m + 24*time.Hour), fail(10*m + 24*time.Hour), fail(10*m + 24*time.Hour),
		fail(10*m + 24*time.Hour), fail(10*m + 24*time.Hour),
		cooling(10*m+24*time.Hour, 20*m+24*time.Hour), // 10m again
	}},
	{"without backoff every cooldown is the same", failBase, []failStep{
		fail(0), fail(0), fail(0), fail(0), fail(0),
		fail(10 * m), fail(10 * m), fail(10 * m), fail(10 * m), fail(10 * m),
		cooling(10*m, 20*m),
	}},
}

func TestFailLimiterSteps(t *testing.T) {
	for _, c := range failCases {
		t.Run(c.name, func(t *testing.T) {
			runFailSteps(t, mustNewFail(t, c.cfg), c.steps)
		})
	}
}

func TestFailLimiterKeysTogether(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 2})
	for range 2 {
		a, err := f.Begin([]string{"ip:1", "email:a"}, t0)
		if err != nil {
			t.Fatal(err)
		}
		a.Fail(t0)
	}
	// The e-mail cools down from any address; a fresh pair is untouched.
	if _, err := f.Begin([]string{"ip:2", "email:a"}, t0); !errors.Is(err, limiter.ErrLimited) {
		t.Errorf("other address, same e-mail: %v, want refused", err)
	}
	if _, err := f.Begin([]string{"ip:1", "email:b"}, t0); !errors.Is(err, limiter.ErrLimited) {
		t.Errorf("same address, other e-mail: %v, want refused", err)
	}
	a, err := f.Begin([]string{"ip:2", "email:b"}, t0)
	if err != nil {
		t.Fatalf("fresh pair: %v", err)
	}
	a.Cancel()
	// A refused Begin counted nothing on ip:2.
	for range 1 {
		a, _ := f.Begin([]string{"ip:2", "email:c"}, t0)
		a.Fail(t0)
	}
	if _, ok := f.CoolingDown("ip:2", t0); ok {
		t.Error("ip:2 cooling down after one failure")
	}
}

func TestFailLimiterParallelGuesses(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 5})
	var evaluated atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			<-start
			a, err := f.Begin([]string{"ip:1"}, t0)
			if err != nil {
				return
			}
			evaluated.Add(1)
			a.Fail(t0)
		})
	}
	close(start)
	wg.Wait()
	if got := evaluated.Load(); got > 5 || got == 0 {
		t.Errorf("%d guesses evaluated, want 1 to 5", got)
	}
	if _, ok := f.CoolingDown("ip:1", t0); ok != (evaluated.Load() == 5) {
		t.Errorf("cooling down %v after %d failures", ok, evaluated.Load())
	}
}

func TestFailLimiterInFlight(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 2})
	a1, _ := f.Begin([]string{"k"}, t0)
	a2, _ := f.Begin([]string{"k"}, t0)
	var r *limiter.Refusal
	if _, err := f.Begin([]string{"k"}, t0); !errors.As(err, &r) || r.Reason != limiter.ReasonInFlight {
		t.Fatalf("third in flight: %v, want %q", err, limiter.ReasonInFlight)
	}
	a1.Succeed(t0)
	a1.Fail(t0) // finished already: nothing
	a2.Neutral()
	a2.Fail(t0) // finished already: nothing
	a3, err := f.Begin([]string{"k"}, t0)
	if err != nil {
		t.Fatalf("after the two finished: %v", err)
	}
	a3.Cancel()
	var nilAttempt *limiter.Attempt
	nilAttempt.Fail(t0) // a nil attempt is a no-op
	nilAttempt.Succeed(t0)
	nilAttempt.Neutral()
	nilAttempt.Cancel()
}

func TestFailLimiterGlobalNet(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 5, GlobalPerHour: 10})
	trips := 0
	for i := range 10 {
		a, err := f.Begin([]string{fmt.Sprintf("ip:%d", i)}, t0.Add(time.Duration(i)*time.Minute))
		if err != nil {
			t.Fatalf("guess %d: %v", i, err)
		}
		if a.Fail(t0.Add(time.Duration(i) * time.Minute)) {
			trips++
		}
	}
	if trips != 1 {
		t.Errorf("net tripped %d times, want once", trips)
	}
	var r *limiter.Refusal
	if _, err := f.Begin([]string{"ip:fresh"}, t0.Add(10*time.Minute)); !errors.As(err, &r) || r.Reason != limiter.ReasonGlobal {
		t.Errorf("after 10 failures: %v, want %q", err, limiter.ReasonGlobal)
	}
	// An hour after the first failure, it has left the count.
	a, err := f.Begin([]string{"ip:fresh"}, t0.Add(time.Hour))
	if err != nil {
		t.Fatalf("an hour later: %v", err)
	}
	a.Cancel()
	if got := f.GlobalFailures(t0.Add(time.Hour)); got != 9 {
		t.Errorf("global failures %d, want 9", got)
	}
}

func TestFailLimiterRestartKeepsCooldown(t *testing.T) {
	cfg := limiter.FailConfig{Limit: 3, Backoff: true, GlobalPerHour: 100}
	f := mustNewFail(t, cfg)
	runFailSteps(t, f, []failStep{fail(0), fail(0), fail(0), cooling(time.Minute, 10*time.Minute)})
	// Leave a half run behind on another key.
	a, _ := f.Begin([]string{"other"}, t0)
	a.Fail(t0)

	entries, global := f.Dirty()
	if len(entries) != 2 || global == nil {
		t.Fatalf("dirty %d entries, global %v", len(entries), global)
	}
	if again, g := f.Dirty(); len(again) != 0 || g != nil {
		t.Errorf("second Dirty returned %d entries and %v", len(again), g)
	}

	g := mustNewFail(t, cfg)
	g.Load(entries, global)
	if until, ok := g.CoolingDown("k", t0.Add(5*time.Minute)); !ok || !until.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("after restart cooling down %v until %v, want until t0+10m", ok, until)
	}
	if got := g.GlobalFailures(t0.Add(time.Minute)); got != 4 {
		t.Errorf("global failures after restart %d, want 4", got)
	}
	// The half run on "other" continues: two more failures cool it down.
	runOther := func(at time.Duration) {
		a, err := g.Begin([]string{"other"}, t0.Add(at))
		if err != nil {
			t.Fatalf("other at %v: %v", at, err)
		}
		a.Fail(t0.Add(at))
	}
	runOther(time.Minute)
	runOther(2 * time.Minute)
	if _, ok := g.CoolingDown("other", t0.Add(2*time.Minute)); !ok {
		t.Error("the run on other was lost in the restart")
	}
	// Backoff history survives too: k's next cooldown is doubled.
	for range 3 {
		a, err := g.Begin([]string{"k"}, t0.Add(11*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		a.Fail(t0.Add(11 * time.Minute))
	}
	if until, _ := g.CoolingDown("k", t0.Add(11*time.Minute)); !until.Equal(t0.Add(31 * time.Minute)) {
		t.Errorf("second cooldown until %v, want t0+31m (doubled)", until)
	}
	// Undecodable state is skipped.
	g.Load([]limiter.Entry{{Key: "k", State: []byte{9, 9}}}, []byte{7})
	if _, ok := g.CoolingDown("k", t0.Add(12*time.Minute)); !ok {
		t.Error("garbage replaced a cooldown")
	}
}

func TestFailLimiterEvict(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 2})
	for _, k := range []string{"a", "b", "b"} {
		a, _ := f.Begin([]string{k}, t0)
		a.Fail(t0)
	}
	f.Dirty()
	if n := f.Evict(t0.Add(5 * time.Minute)); n != 0 {
		t.Errorf("evicted %d live keys", n)
	}
	if n := f.Evict(t0.Add(11 * time.Minute)); n != 2 || f.Len() != 0 {
		t.Errorf("evicted %d, %d left; want 2 and 0", n, f.Len())
	}
	entries, _ := f.Dirty()
	if len(entries) != 2 || entries[0].State != nil || entries[1].State != nil {
		t.Errorf("dirty after evict %+v, want two deletions", entries)
	}
}

func TestFailConfigValidate(t *testing.T) {
	for _, bad := range []limiter.FailConfig{
		{Limit: -1}, {Window: -time.Second}, {Cooldown: 2 * time.Hour, MaxCooldown: time.Hour}, {GlobalPerHour: -1},
	} {
		if err := bad.Validate(); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
	if got := (limiter.FailConfig{Cooldown: 48 * time.Hour}).WithDefaults().MaxCooldown; got != 48*time.Hour {
		t.Errorf("max cooldown defaults to %v under a 48h cooldown", got)
	}
}

// Cooling lists the keys in a cooldown with its end; Clear lifts one at
// once, forgets its run, and is written behind.
func TestFailLimiterCoolingAndClear(t *testing.T) {
	f, err := limiter.NewFail(limiter.FailConfig{Limit: 2, Window: time.Minute, Cooldown: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	fail := func(key string, at time.Time) {
		t.Helper()
		a, err := f.Begin([]string{key}, at)
		if err != nil {
			t.Fatalf("begin %s: %v", key, err)
		}
		a.Fail(at)
	}
	fail("ip:a", t0)
	fail("ip:a", t0.Add(time.Second))
	fail("email:b", t0)
	f.Dirty()
	got := f.Cooling(t0.Add(time.Minute))
	if len(got) != 1 || got[0].Key != "ip:a" || !got[0].Until.Equal(t0.Add(time.Second+10*time.Minute)) {
		t.Fatalf("Cooling = %+v, want ip:a until 10 min after its second failure", got)
	}
	if f.Clear("ip:nobody") {
		t.Error("Clear of a key never seen reported true")
	}
	if !f.Clear("ip:a") {
		t.Fatal("Clear(ip:a) = false")
	}
	if got := f.Cooling(t0.Add(time.Minute)); len(got) != 0 {
		t.Errorf("Cooling after Clear = %+v", got)
	}
	if _, cooling := f.CoolingDown("ip:a", t0.Add(time.Minute)); cooling {
		t.Error("ip:a still cooling down after Clear")
	}
	// Its run is forgotten: one more failure starts no cooldown.
	fail("ip:a", t0.Add(2*time.Minute))
	if _, cooling := f.CoolingDown("ip:a", t0.Add(2*time.Minute)); cooling {
		t.Error("one failure after Clear started a cooldown")
	}
	if entries, _ := f.Dirty(); len(entries) != 1 || entries[0].Key != "ip:a" {
		t.Errorf("Dirty after Clear = %+v, want ip:a", entries)
	}
}

// TestFailLimiterDirtyAtMost: the changed keys come in parts of at most
// the limit, in key order, each key once with its state as of the call;
// a key that changes after its part was taken is listed again, and the
// parts restore what Dirty would have.
func TestFailLimiterDirtyAtMost(t *testing.T) {
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		keys  int
		limit int
		parts []int // entries per part, then an empty one
	}{
		{name: "fewer than the limit", keys: 3, limit: 10, parts: []int{3}},
		{name: "exactly the limit", keys: 10, limit: 10, parts: []int{10}},
		{name: "several parts", keys: 25, limit: 10, parts: []int{10, 10, 5}},
		{name: "no limit", keys: 25, limit: 0, parts: []int{25}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mustNewFail(t, limiter.FailConfig{})
			for i := range tc.keys {
				a, err := f.Begin([]string{fmt.Sprintf("k%03d", i)}, now)
				if err != nil {
					t.Fatal(err)
				}
				a.Fail(now)
			}
			var all []limiter.Entry
			left := tc.keys
			for i, want := range tc.parts {
				part, global, rest := f.DirtyAtMost(tc.limit)
				if got := len(part); got != want {
					t.Fatalf("part %d: %d entries, want %d", i, got, want)
				}
				if (global != nil) != (i == 0) {
					t.Errorf("part %d: service-wide counts %v, want them with the first part only", i, global)
				}
				left -= want
				if rest != left {
					t.Errorf("part %d: %d left, want %d", i, rest, left)
				}
				all = append(all, part...)
			}
			if part, _, rest := f.DirtyAtMost(tc.limit); len(part) != 0 || rest != 0 {
				t.Errorf("after the parts: %d more entries, %d left, want none", len(part), rest)
			}
			for i, e := range all {
				if want := fmt.Sprintf("k%03d", i); e.Key != want || e.State == nil {
					t.Errorf("entry %d: %q (state %v), want %q with a state", i, e.Key, e.State, want)
				}
			}
			restored := mustNewFail(t, limiter.FailConfig{})
			restored.Load(all, nil)
			if got, want := restored.Len(), tc.keys; got != want {
				t.Errorf("%d keys restored from the parts, want %d", got, want)
			}
		})
	}

	t.Run("changed again after its part", func(t *testing.T) {
		f := mustNewFail(t, limiter.FailConfig{})
		for _, k := range []string{"a", "b", "c"} {
			a, err := f.Begin([]string{k}, now)
			if err != nil {
				t.Fatal(err)
			}
			a.Fail(now)
		}
		if part, _, _ := f.DirtyAtMost(1); len(part) != 1 || part[0].Key != "a" {
			t.Fatalf("first part %v, want a alone", part)
		}
		a, err := f.Begin([]string{"a"}, now)
		if err != nil {
			t.Fatal(err)
		}
		a.Fail(now)
		part, _, rest := f.DirtyAtMost(0)
		var keys []string
		for _, e := range part {
			keys = append(keys, e.Key)
		}
		if got, want := fmt.Sprint(keys), "[a b c]"; got != want || rest != 0 {
			t.Errorf("the rest: %s, %d left; want %s, 0 left", got, rest, want)
		}
	})
}

// Shared reports whether a store decides the keys: off by default, on
// with Share, off again with a nil store.
func TestFailLimiterShared(t *testing.T) {
	f, err := limiter.NewFail(limiter.FailConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Shared() {
		t.Error("a new fail limiter is shared")
	}
	f.Share(&fakeFails{}, nil)
	if !f.Shared() {
		t.Error("with a store: not shared")
	}
	f.Share(nil, nil)
	if f.Shared() {
		t.Error("with the store taken away: still shared")
	}
}
