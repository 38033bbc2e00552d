package postgres_test

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/storage/postgres"
)

// lt0 is a whole second, so that every time of a test is on a whole
// microsecond, where the memory limiter stores times exactly.
var lt0 = time.Unix(1_800_000_000, 0)

// sameDecision reports whether two answers of Allow or Begin agree: both
// admitted, or both refused for the same reason with the same wait.
func sameDecision(mem error, db *limiter.Refusal) bool {
	if mem == nil || db == nil {
		return mem == nil && db == nil
	}
	var r *limiter.Refusal
	return errors.As(mem, &r) && r.Reason == db.Reason && r.RetryAfter == db.RetryAfter
}

// The database decides a key's requests exactly as the memory limiter
// does: the same sequence of calls at the same times, under random rates,
// windows and bursts, gets the same admissions, the same reasons and the
// same retry-after, the clock stepping back included.
func TestWindowsDecideAsMemory(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	limits := db.Limits()
	rng := rand.New(rand.NewSource(29))
	for sc := range 60 {
		cfg := limiter.Config{
			Rate:   rng.Intn(7),
			Burst:  rng.Intn(5),
			Window: time.Second + time.Duration(rng.Intn(4000))*time.Millisecond,
		}
		mem, err := limiter.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		shared := limits.Windows(fmt.Sprintf("scenario-%d", sc%3)) // names share nothing
		key := fmt.Sprintf("user-%d", sc)
		now := lt0.Add(time.Duration(rng.Intn(1000)) * time.Millisecond)
		edges := []time.Duration{time.Second, cfg.Window, cfg.Window - time.Microsecond, cfg.Window + time.Microsecond, time.Microsecond}
		for step := range 40 {
			switch p := rng.Intn(10); {
			case p < 3: // the same instant
			case p < 6:
				now = now.Add(time.Duration(rng.Intn(1000)) * time.Millisecond)
			case p < 7:
				now = now.Add(edges[rng.Intn(len(edges))])
			case p < 8:
				now = now.Add(-time.Duration(rng.Intn(500)) * time.Millisecond) // a clock stepping back
			default:
				now = now.Add(time.Duration(rng.Int63n(int64(2*cfg.Window)/1000)) * time.Microsecond)
			}
			want := mem.Allow(key, now)
			got, err := shared.Take(key, mem.Config(), now)
			if err != nil {
				t.Fatal(err)
			}
			if !sameDecision(want, got) {
				t.Fatalf("scenario %d %+v, step %d at %s: memory says %v, the database %v", sc, cfg, step, now.Sub(lt0), want, got)
			}
		}
	}
}

// N requests on one key at once, through as many connections, admit
// exactly the rate: the row's lock makes the check and the record one
// step.
func TestWindowsAdmitExactlyTheRateUnderConcurrency(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	w := db.Limits().Windows("user")
	cfg := limiter.Config{Rate: 7, Window: time.Minute}
	const n = 40
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
		waits    []time.Duration
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := w.Take("alice", cfg, lt0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if r == nil {
				admitted++
			} else {
				waits = append(waits, r.RetryAfter)
			}
		}()
	}
	wg.Wait()
	if got, want := admitted, cfg.Rate; got != want {
		t.Fatalf("%d concurrent requests admitted %d, want exactly the rate %d", n, got, want)
	}
	for _, d := range waits {
		if d != time.Minute {
			t.Errorf("a refusal's retry-after %s, want the window (1m): every request came at one instant", d)
		}
	}
}

// failOp is one step of a fail limit's sequence: begin an attempt on
// keys, or finish the open attempt i with an outcome.
type openAttempt struct {
	keys  []string
	mem   *limiter.Attempt
	begun time.Time
}

// The database's fail limit decides as the memory's: the same attempts
// and outcomes at the same times give the same refusals (reason and
// retry-after), the same cooldowns started and the same trips of the
// service-wide net, with backoff, decay and the net at random.
func TestFailsDecideAsMemory(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	limits := db.Limits()
	rng := rand.New(rand.NewSource(2929))
	pool := []string{"ip:192.0.2.1", "ip:192.0.2.2", "email:a@example.com", "email:b@example.com"}
	for sc := range 25 {
		cfg := limiter.FailConfig{
			Limit:         2 + rng.Intn(3),
			Window:        time.Duration(1+rng.Intn(5)) * time.Minute,
			Cooldown:      time.Duration(1+rng.Intn(5)) * time.Minute,
			Backoff:       rng.Intn(2) == 0,
			MaxCooldown:   time.Duration(6+rng.Intn(20)) * time.Minute,
			Decay:         rng.Intn(2) == 0,
			GlobalPerHour: []int{0, 0, 6, 12}[rng.Intn(4)],
		}.WithDefaults()
		mem, err := limiter.NewFail(cfg)
		if err != nil {
			t.Fatal(err)
		}
		shared := limits.Fails(fmt.Sprintf("fails-%d", sc))
		now := lt0
		var open []openAttempt
		for step := range 60 {
			// An attempt left in progress past PendingTTL no longer counts
			// in the database (memory has no crashed instances to
			// forget): every attempt finishes within 9 minutes.
			now = now.Add(time.Duration(rng.Int63n(int64(3*time.Minute)/1e6)) * time.Millisecond)
			oldest := -1
			for i, o := range open {
				if oldest < 0 || o.begun.Before(open[oldest].begun) {
					oldest = i
				}
			}
			if oldest >= 0 && now.Sub(open[oldest].begun) > 9*time.Minute {
				now = open[oldest].begun.Add(9 * time.Minute)
			}
			if oldest < 0 || (now.Sub(open[oldest].begun) < 8*time.Minute && rng.Intn(3) == 0) {
				keys := []string{pool[rng.Intn(2)], pool[2+rng.Intn(2)]}
				if rng.Intn(4) == 0 {
					keys = keys[:1]
				}
				a, want := mem.Begin(keys, now)
				got, err := shared.Begin(keys, cfg, now)
				if err != nil {
					t.Fatal(err)
				}
				if !sameDecision(want, got) {
					t.Fatalf("scenario %d %+v, step %d: Begin(%q) at %s: memory %v, the database %v", sc, cfg, step, keys, now.Sub(lt0), want, got)
				}
				if a != nil {
					open = append(open, openAttempt{keys: keys, mem: a, begun: now})
				}
				continue
			}
			i := rng.Intn(len(open))
			if now.Sub(open[oldest].begun) >= 8*time.Minute {
				i = oldest
			}
			o := open[i]
			open = slices.Delete(open, i, i+1)
			outcome := []limiter.FailOutcome{limiter.OutcomeFail, limiter.OutcomeFail, limiter.OutcomeSucceed, limiter.OutcomeRelease}[rng.Intn(4)]
			var wantTripped bool
			switch outcome {
			case limiter.OutcomeFail:
				wantTripped = o.mem.Fail(now)
			case limiter.OutcomeSucceed:
				o.mem.Succeed(now)
			default:
				o.mem.Neutral()
			}
			started, tripped, err := shared.Finish(o.keys, outcome, cfg, o.begun, now)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(started, o.mem.CooldownsStarted()) || tripped != wantTripped {
				t.Fatalf("scenario %d %+v, step %d: %s of %q at %s: memory started %q, tripped %v; the database %q, %v",
					sc, cfg, step, outcome, o.keys, now.Sub(lt0), o.mem.CooldownsStarted(), wantTripped, started, tripped)
			}
			if got, want := mustGlobal(t, shared, now), mem.GlobalFailures(now); got != want {
				t.Fatalf("scenario %d, step %d: global failures %d, memory %d", sc, step, got, want)
			}
		}
	}
}

func mustGlobal(t *testing.T, f *postgres.Fails, now time.Time) int {
	t.Helper()
	n, err := f.GlobalFailures(now)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// N wrong guesses on one key at once are evaluated at most Limit times:
// each Begin counts as in progress, under the row's lock.
func TestFailsBeginAtMostTheLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	f := db.Limits().Fails("invites")
	cfg := limiter.FailConfig{Limit: 5}.WithDefaults()
	const n = 30
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		begun int
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.Begin([]string{"ip:192.0.2.9", "email:x@example.com"}, cfg, lt0)
			if err != nil {
				t.Error(err)
				return
			}
			if r == nil {
				mu.Lock()
				begun++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if begun != cfg.Limit {
		t.Fatalf("%d concurrent attempts begun %d, want exactly the limit %d", n, begun, cfg.Limit)
	}
	// Each fails: the fifth starts the cooldown, on both keys.
	var started []string
	for i := range cfg.Limit {
		s, _, err := f.Finish([]string{"ip:192.0.2.9", "email:x@example.com"}, limiter.OutcomeFail, cfg, lt0, lt0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		started = append(started, s...)
	}
	if want := []string{"ip:192.0.2.9", "email:x@example.com"}; !slices.Equal(started, want) {
		t.Errorf("cooldowns started %q, want %q", started, want)
	}
	r, err := f.Begin([]string{"email:x@example.com"}, cfg, lt0.Add(5*time.Second))
	if err != nil || r == nil || r.Reason != limiter.ReasonCooldown || r.RetryAfter != cfg.Cooldown-time.Second {
		t.Errorf("Begin in the cooldown = %v, %v; want a cooldown refusal of %s", r, err, cfg.Cooldown-time.Second)
	}
}

// A release with a zero start (limiter.FailLimiter.EndRefused's stand-in
// for the end of an attempt Begin refused) ends no attempt and changes
// nothing: the attempt in progress still counts, the run and the
// service-wide count stay, and no cooldown starts.
func TestFailsReleaseOfNothingChangesNothing(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	f := db.Limits().Fails("invites")
	cfg := limiter.FailConfig{Limit: 3}.WithDefaults()
	keys := []string{"ip:192.0.2.8", "email:y@example.com"}
	for i := range 2 {
		at := lt0.Add(time.Duration(i) * time.Second)
		if r, err := f.Begin(keys, cfg, at); r != nil || err != nil {
			t.Fatalf("Begin %d = %v, %v", i, r, err)
		}
		if _, _, err := f.Finish(keys, limiter.OutcomeFail, cfg, at, at); err != nil {
			t.Fatal(err)
		}
	}
	pending := lt0.Add(2 * time.Second)
	if r, err := f.Begin(keys, cfg, pending); r != nil || err != nil {
		t.Fatalf("third Begin = %v, %v", r, err)
	}
	for range 3 {
		started, tripped, err := f.Finish(keys, limiter.OutcomeRelease, cfg, time.Time{}, lt0.Add(3*time.Second))
		if err != nil || started != nil || tripped {
			t.Fatalf("release of nothing = %v, %v, %v; want nothing started", started, tripped, err)
		}
	}
	if got := mustGlobal(t, f, lt0.Add(3*time.Second)); got != 2 {
		t.Errorf("global failures %d after releases of nothing, want 2", got)
	}
	// Two failures and one attempt in progress: the limit of 3 is held.
	if r, err := f.Begin(keys, cfg, lt0.Add(4*time.Second)); err != nil || r == nil || r.Reason != limiter.ReasonInFlight {
		t.Errorf("Begin beside the attempt in progress = %v, %v; want in_flight", r, err)
	}
	// The third failure starts the cooldown: the run of two was kept.
	started, _, err := f.Finish(keys, limiter.OutcomeFail, cfg, pending, lt0.Add(5*time.Second))
	if err != nil || len(started) != 2 {
		t.Errorf("third failure started %q (%v), want both keys' cooldowns", started, err)
	}
}

// An attempt in progress that an instance never finishes (it crashed)
// stops counting after PendingTTL.
func TestFailsForgetAnAttemptLeftInProgress(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	f := db.Limits().Fails("route:login")
	cfg := limiter.FailConfig{Limit: 1}.WithDefaults()
	if r, err := f.Begin([]string{"ip:192.0.2.7"}, cfg, lt0); r != nil || err != nil {
		t.Fatalf("first Begin = %v, %v", r, err)
	}
	if r, err := f.Begin([]string{"ip:192.0.2.7"}, cfg, lt0.Add(time.Second)); err != nil || r == nil || r.Reason != limiter.ReasonInFlight {
		t.Fatalf("Begin beside an attempt in progress = %v, %v; want in_flight", r, err)
	}
	if r, err := f.Begin([]string{"ip:192.0.2.7"}, cfg, lt0.Add(postgres.PendingTTL+time.Second)); r != nil || err != nil {
		t.Fatalf("Begin after PendingTTL = %v, %v; want begun", r, err)
	}
}

// A limiter shared through the database: two limiters (two instances)
// on one database give one limit; with the database closed, each decides
// in memory and reports the fault, and the database is then left alone
// for a while (no wait per request).
func TestSharedLimiterFallsBackToMemory(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	cfg := limiter.Config{Rate: 3, Window: time.Minute}
	var faults []error
	a, b := mustLimiter(t, cfg), mustLimiter(t, cfg)
	a.Share(db.Limits().Windows("user"), func(err error) { faults = append(faults, err) })
	b.Share(db.Limits().Windows("user"), func(err error) { faults = append(faults, err) })
	admitted := 0
	for i := range 8 {
		l := a
		if i%2 == 1 {
			l = b
		}
		if l.Allow("bob", lt0.Add(time.Duration(i)*time.Millisecond)) == nil {
			admitted++
		}
	}
	if admitted != cfg.Rate || len(faults) != 0 {
		t.Fatalf("8 requests alternating between two instances admitted %d (faults %v), want %d", admitted, faults, cfg.Rate)
	}
	db.Close()
	start := time.Now()
	for i := range 3 {
		if err := a.Allow(fmt.Sprintf("new-%d", i), lt0.Add(time.Second)); err != nil {
			t.Errorf("a new key with the database closed: %v, want admitted in memory", err)
		}
	}
	if len(faults) != 3 {
		t.Errorf("faults reported %d, want one per decision made in memory (3)", len(faults))
	}
	if !errors.Is(faults[len(faults)-1], postgres.ErrLimitsDown) {
		t.Errorf("the last fault = %v, want ErrLimitsDown (the database left alone after a failure)", faults[len(faults)-1])
	}
	if d := time.Since(start); d > postgres.LimitTimeout+time.Second {
		t.Errorf("three decisions with the database closed took %s", d)
	}
	// Memory kept what this instance admitted while shared: bob, at the
	// rate on this instance's own count (2 of its 4 requests), gets one more.
	if err := a.Allow("bob", lt0.Add(2*time.Second)); err != nil {
		t.Errorf("bob on a in memory: %v, want admitted (a admitted 2 of 3)", err)
	}
	if err := a.Allow("bob", lt0.Add(2*time.Second)); err == nil {
		t.Error("bob on a in memory again: admitted, want refused (a's memory is at the rate)")
	}
}

func mustLimiter(t *testing.T, cfg limiter.Config) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A window keeps only the times that may still count: under a rate far
// above its traffic, once pruned, a key holds the last window and a minute
// of requests, not the last rate of them; a key whose newest request no
// longer counts is deleted with its times; and the key kept still decides
// as memory does.
func TestWindowsKeepOnlyLiveTimes(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	w := db.Limits().Windows("user")
	cfg := limiter.Config{Rate: 100_000, Window: time.Minute}
	mem := mustLimiter(t, cfg)
	now := lt0
	for i := range 300 { // one a second for five minutes, and an idle key
		if i == 0 {
			if r, err := w.Take("idle", cfg, now); r != nil || err != nil {
				t.Fatalf("Take(idle) = %v, %v", r, err)
			}
		}
		if r, err := w.Take("heavy", cfg, now); r != nil || err != nil || mem.Allow("heavy", now) != nil {
			t.Fatalf("Take = %v, %v", r, err)
		}
		now = now.Add(time.Second)
	}
	// The newest time is in the head, the others in slots.
	if got, want := windowRows(t, db, "heavy"), [2]int{1, 299}; got != want {
		t.Fatalf("heavy's head and slots before the prune: %v, want %v", got, want)
	}
	n, err := w.PruneWindows(t.Context(), cfg, now)
	if err != nil || n != 1 {
		t.Fatalf("PruneWindows = %d, %v; want the idle key's window (1)", n, err)
	}
	if got := windowRows(t, db, "idle"); got != [2]int{} {
		t.Errorf("the idle key's head and slots after the prune: %v, want none", got)
	}
	// Kept: the times after now - 1m (the window) - 1m (the clocks'
	// margin), 181s to 298s in slots and 299s in the head.
	if got, want := windowRows(t, db, "heavy"), [2]int{1, 118}; got != want {
		t.Errorf("heavy's head and slots after the prune: %v, want %v (the last window and a minute)", got, want)
	}
	// A tighter config (the ring is rebuilt from what is left) and then
	// a flood: the decisions are memory's.
	cfg = limiter.Config{Rate: 150, Window: time.Minute, Burst: 40}
	mem.SetConfig(cfg)
	for step := range 400 {
		want := mem.Allow("heavy", now)
		got, err := w.Take("heavy", cfg, now)
		if err != nil {
			t.Fatal(err)
		}
		if !sameDecision(want, got) {
			t.Fatalf("step %d at %s: memory says %v, the database %v", step, now.Sub(lt0), want, got)
		}
		now = now.Add(10 * time.Millisecond)
	}
}

// windowRows counts key's head and slots under the windows named "user".
func windowRows(t *testing.T, db *postgres.DB, key string) [2]int {
	t.Helper()
	var n [2]int
	err := db.Pool().QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM limit_window_heads WHERE name = 'user' AND key = $1),
		(SELECT count(*) FROM limit_window_slots WHERE name = 'user' AND key = $1)`, key).Scan(&n[0], &n[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A reload that changes the rate or the burst (the ring's size shrinks or
// grows, once it has wrapped or not) leaves the database deciding as
// memory does under SetConfig: the key keeps its history.
func TestWindowsFollowAConfigChange(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	shared := db.Limits().Windows("user")
	rng := rand.New(rand.NewSource(2929))
	random := func() limiter.Config {
		return limiter.Config{
			Rate:   rng.Intn(9),
			Burst:  rng.Intn(6),
			Window: time.Second + time.Duration(rng.Intn(3000))*time.Millisecond,
		}
	}
	changes := 0
	for sc := range 30 {
		mem := mustLimiter(t, random())
		key := fmt.Sprintf("user-%d", sc)
		now := lt0
		for step := range 80 {
			if rng.Intn(6) == 0 {
				mem.SetConfig(random())
				changes++
			}
			switch p := rng.Intn(10); {
			case p < 3:
			case p < 8:
				now = now.Add(time.Duration(rng.Intn(600)) * time.Millisecond)
			case p < 9:
				now = now.Add(-time.Duration(rng.Intn(300)) * time.Millisecond)
			default:
				now = now.Add(time.Duration(rng.Intn(3000)) * time.Millisecond)
			}
			want := mem.Allow(key, now)
			got, err := shared.Take(key, mem.Config(), now)
			if err != nil {
				t.Fatal(err)
			}
			if !sameDecision(want, got) {
				t.Fatalf("scenario %d, step %d at %s under %+v: memory says %v, the database %v", sc, step, now.Sub(lt0), mem.Config(), want, got)
			}
		}
	}
	if changes < 100 {
		t.Fatalf("only %d config changes: the scenarios test little", changes)
	}
}

// A large rate decides as memory does, retry-after included: thousands of
// requests of one key, the ring wrapping, each limit
// refusing in turn, and the clients coming back at the exact retry-after
// (admitted) or a microsecond before it (refused).
func TestWindowsDecideAsMemoryAtALargeRate(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	shared := db.Limits().Windows("user")
	cfg := limiter.Config{Rate: 5_000, Window: 2 * time.Second, Burst: 3_000}
	mem := mustLimiter(t, cfg)
	rng := rand.New(rand.NewSource(5000))
	now := lt0
	var last *limiter.Refusal
	admitted, reasons := 0, map[string]int{}
	for step := range 14_000 {
		switch p := rng.Intn(20); {
		case last != nil && p < 2:
			now = now.Add(last.RetryAfter)
		case last != nil && p < 4:
			now = now.Add(last.RetryAfter - time.Microsecond)
		case p < 5:
			now = now.Add(-time.Duration(rng.Intn(3000)) * time.Microsecond)
		default:
			now = now.Add(time.Duration(rng.Intn(400)) * time.Microsecond)
		}
		want := mem.Allow("heavy", now)
		got, err := shared.Take("heavy", cfg, now)
		if err != nil {
			t.Fatal(err)
		}
		if !sameDecision(want, got) {
			t.Fatalf("step %d at %s: memory says %v, the database %v", step, now.Sub(lt0), want, got)
		}
		last = got
		if got == nil {
			admitted++
		} else {
			reasons[got.Reason]++
		}
	}
	if admitted <= cfg.Rate || reasons[limiter.ReasonRate] == 0 || reasons[limiter.ReasonBurst] == 0 {
		t.Fatalf("admitted %d, refused %v: want the ring wrapped (over %d admitted) and both limits refusing", admitted, reasons, cfg.Rate)
	}
}

// A shared daily line counts every instance's attempts: N at once on one
// key take exactly the line, and the next day starts from none.
func TestDailyTakesExactlyTheLine(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	d := db.Limits().Daily("route:login")
	const n, line = 25, 7
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		taken int
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := d.Take("ip:192.0.2.1", "2026-12-03", line)
			if err != nil {
				t.Error(err)
				return
			}
			if ok {
				mu.Lock()
				taken++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if taken != line {
		t.Fatalf("%d attempts at once took %d, want exactly the line %d", n, taken, line)
	}
	if ok, err := d.Take("ip:192.0.2.1", "2026-12-04", line); !ok || err != nil {
		t.Errorf("the next day: %v, %v; want taken", ok, err)
	}
	if ok, err := d.Take("ip:192.0.2.1", "2026-12-03", 0); !ok || err != nil {
		t.Errorf("no line: %v, %v; want taken", ok, err)
	}
}

// Decisions that arrive together share round trips, and stay exact: of
// 200 concurrent requests over 40 keys, each key admits exactly its rate,
// in far fewer round trips than decisions. A decision the server refuses
// (a key that is not valid UTF-8) fails alone: the others of its batch
// are decided.
func TestWindowDecisionsShareRoundTrips(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	limits := db.Limits()
	w := limits.Windows("user")
	cfg := limiter.Config{Rate: 3, Window: time.Minute}
	var (
		wg       sync.WaitGroup
		admitted [40]atomic.Int64
	)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := w.Take(fmt.Sprintf("user%d", i%40), cfg, lt0)
			if err != nil {
				t.Error(err)
			} else if r == nil {
				admitted[i%40].Add(1)
			}
		}()
	}
	wg.Wait()
	for k := range admitted {
		if n := admitted[k].Load(); n != 3 {
			t.Errorf("user%d: %d admitted, want exactly 3", k, n)
		}
	}
	if trips := limits.WindowTrips(); trips >= 200 {
		t.Errorf("200 decisions took %d round trips, want fewer", trips)
	} else {
		t.Logf("200 decisions in %d round trips", trips)
	}

	refusals, errs := w.DecideTogether([]string{"bob", "\xff", "carol"}, cfg, lt0)
	if errs[0] != nil || errs[2] != nil || refusals[0] != nil || refusals[2] != nil {
		t.Errorf("the valid keys of a batch with a refused statement: %v, %v / %v, %v; want both admitted", refusals[0], errs[0], refusals[2], errs[2])
	}
	if errs[1] == nil {
		t.Error("a key that is not UTF-8 was decided, want the server's refusal")
	}
}
