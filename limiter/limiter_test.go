package limiter_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/limiter"
)

// t0 is an arbitrary start; every step is an offset from it.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// step is one request: at t0+at for key (default "k"). retryAfter 0 means
// it must be admitted; otherwise it must be refused with exactly that
// RetryAfter and, if set, that reason.
type step struct {
	at         time.Duration
	key        string
	retryAfter time.Duration
	reason     string
}

func ok(at time.Duration) step { return step{at: at} }

func no(at, retryAfter time.Duration, reason string) step {
	return step{at: at, retryAfter: retryAfter, reason: reason}
}

func mustNew(tb testing.TB, cfg limiter.Config) *limiter.Limiter {
	tb.Helper()
	l, err := limiter.New(cfg)
	if err != nil {
		tb.Fatalf("New(%+v): %v", cfg, err)
	}
	return l
}

func runSteps(t *testing.T, l *limiter.Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		key := s.key
		if key == "" {
			key = "k"
		}
		err := l.Allow(key, t0.Add(s.at))
		if s.retryAfter == 0 {
			if err != nil {
				t.Fatalf("step %d: Allow(%q, t0+%v) = %v, want admitted", i, key, s.at, err)
			}
			continue
		}
		var r *limiter.Refusal
		if !errors.As(err, &r) {
			t.Fatalf("step %d: Allow(%q, t0+%v) = %v, want refusal", i, key, s.at, err)
		}
		if got, want := r.RetryAfter, s.retryAfter; got != want {
			t.Fatalf("step %d: Allow(%q, t0+%v): RetryAfter = %v, want %v", i, key, s.at, got, want)
		}
		if s.reason != "" {
			if got, want := r.Reason, s.reason; got != want {
				t.Fatalf("step %d: Allow(%q, t0+%v): Reason = %q, want %q", i, key, s.at, got, want)
			}
		}
	}
}

const (
	ns = time.Nanosecond
	us = time.Microsecond
	ms = time.Millisecond
	s  = time.Second
	m  = time.Minute
)

// allowCase is one limiter configuration and the requests it sees, in order.
type allowCase struct {
	name  string
	cfg   limiter.Config
	steps []step
}

// allowCases are the steps TestAllowSteps runs: rate, burst, both, the
// limits switched off, keys, a clock going backwards and stored offsets.
var allowCases = []allowCase{
	{
		name: "rate 5 per minute",
		cfg:  limiter.Config{Rate: 5, Window: m},
		steps: []step{
			ok(0), ok(1 * s), ok(2 * s), ok(3 * s), ok(4 * s),
			no(5*s, 55*s, "rate"), // until the request at t0 leaves
			no(30*s, 30*s, "rate"),
		},
	},
	{
		// The window seen at t is (t-W, t]: the request at t0 is
		// still in it at t0+W-1ns and has left at t0+W.
		name: "boundary W-1ns refused, W admitted",
		cfg:  limiter.Config{Rate: 5, Window: m},
		steps: []step{
			ok(0), ok(1 * s), ok(2 * s), ok(3 * s), ok(4 * s),
			no(m-ns, ns, "rate"),
			ok(m),
			no(m, 1*s, "rate"), // the next oldest is t0+1s
			no(m+s-ns, ns, "rate"),
			ok(m + s),
		},
	},
	{
		name: "rate arrivals at one instant",
		cfg:  limiter.Config{Rate: 3, Window: 10 * s},
		steps: []step{
			ok(7 * ns), ok(7 * ns), ok(7 * ns),
			no(7*ns, 10*s, "rate"),
			no(10*s+6*ns, ns, "rate"),
			ok(10*s + 7*ns), ok(10*s + 7*ns), ok(10*s + 7*ns),
			no(10*s+7*ns, 10*s, "rate"),
		},
	},
	{
		name: "burst 2: third within a second refused, next second ok",
		cfg:  limiter.Config{Burst: 2},
		steps: []step{
			ok(0), ok(500 * ms),
			no(900*ms, 100*ms, "burst"),
			no(s-ns, ns, "burst"),
			ok(s), // [t0, t0+1s) holds two; t0+1s starts the next second
			no(1400*ms, 100*ms, "burst"),
			ok(1500 * ms),
			no(1500*ms, 500*ms, "burst"),
			ok(2 * s),
		},
	},
	{
		name: "rate and burst together",
		cfg:  limiter.Config{Rate: 5, Window: m, Burst: 2},
		steps: []step{
			ok(0), ok(100 * ms),
			no(200*ms, 800*ms, "burst"),
			ok(s), ok(1500 * ms),
			no(1600*ms, 400*ms, "burst"),
			ok(2 * s),
			// five in the window: rate frees at t0+1m, burst at
			// t0+2.5s; the refusal names the later one.
			no(2100*ms, m-2100*ms, "rate"),
			no(3*s, 57*s, "rate"),
			ok(m),
			no(m, 100*ms, "rate"),
			ok(m + 100*ms),
			no(m+200*ms, 800*ms, "rate"), // both free at t0+1m+1s
			ok(m + s),
			no(m+s, 500*ms, "rate"),
		},
	},
	{
		name: "refusal names the limit that frees last",
		cfg:  limiter.Config{Rate: 3, Window: 2 * s, Burst: 2},
		steps: []step{
			ok(0), ok(1200 * ms), ok(1400 * ms),
			no(1900*ms, 300*ms, "burst"), // rate would free in 100ms
			no(2100*ms, 100*ms, "burst"),
			ok(2200 * ms),
		},
	},
	{
		name: "rate 0 is off",
		cfg:  limiter.Config{Rate: 0, Burst: 3},
		steps: []step{
			ok(0), ok(0), ok(0), no(0, s, "burst"),
			ok(s), ok(s), ok(s), ok(2 * s), ok(2 * s), ok(2 * s),
			ok(3 * s), ok(3 * s), ok(3 * s), no(3*s, s, "burst"),
		},
	},
	{
		name: "burst 0 is off",
		cfg:  limiter.Config{Rate: 3, Window: m, Burst: 0},
		steps: []step{
			ok(0), ok(0), ok(0), no(0, m, "rate"),
		},
	},
	{
		name: "burst above rate is implied by rate",
		cfg:  limiter.Config{Rate: 2, Window: 2 * s, Burst: 5},
		steps: []step{
			ok(0), ok(0), no(0, 2*s, "rate"), ok(2 * s),
		},
	},
	{
		name: "keys are independent",
		cfg:  limiter.Config{Rate: 1, Window: m},
		steps: []step{
			{at: 0, key: "a"}, {at: 0, key: "b"},
			{at: s, key: "a", retryAfter: 59 * s},
			{at: 2 * s, key: "b", retryAfter: 58 * s},
			{at: 2 * s, key: "c"},
		},
	},
	{
		// A clock step backwards admits nothing extra: the request
		// at "t0" is recorded at t0+10s, the newest one.
		name: "clock goes backwards",
		cfg:  limiter.Config{Rate: 2, Window: m},
		steps: []step{
			ok(10 * s),
			ok(0),
			no(5*s, 65*s, "rate"),
			no(70*s-ns, ns, "rate"),
			ok(70 * s),
			no(-time.Hour, time.Hour+70*s, "rate"),
		},
	},
	{
		// Offsets from a key's first request are stored in
		// microseconds, rounded up: t0+1s+500ns is stored as
		// t0+1s+1µs, and leaves its window 500ns late.
		name: "sub-microsecond times round up, never down",
		cfg:  limiter.Config{Rate: 1, Window: s},
		steps: []step{
			ok(0),
			ok(s + 500*ns),
			no(2*s+500*ns, 500*ns, "rate"),
			no(2*s+999*ns, ns, "rate"),
			ok(2*s + us),
		},
	},
	{
		// Past 2^32µs (about 71 minutes) from a key's base the
		// offsets are rebased; nothing that counts is lost.
		name: "long-lived key rebases its offsets",
		cfg:  limiter.Config{Rate: 2, Window: time.Hour},
		steps: []step{
			ok(0), ok(30 * m),
			no(59*m, m, "rate"),
			ok(60 * m),
			no(75*m, 15*m, "rate"),
			ok(90 * m), // base passes 71.6 minutes here
			no(119*m, m, "rate"),
			no(120*m-ns, ns, "rate"),
			ok(120 * m),
			no(120*m, 30*m, "rate"),
			ok(1000 * time.Hour), // long idle: a fresh start
			ok(1000 * time.Hour),
			no(1000*time.Hour+m, 59*m, "rate"),
		},
	},
}

func TestAllowSteps(t *testing.T) {
	for _, tt := range allowCases {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, mustNew(t, tt.cfg), tt.steps)
		})
	}
}

func TestAllowOffLimiterKeepsNothing(t *testing.T) {
	l := mustNew(t, limiter.Config{})
	for i := range 1000 {
		if err := l.Allow(fmt.Sprint("k", i%7), t0); err != nil {
			t.Fatalf("Allow with rate and burst off = %v, want nil", err)
		}
	}
	if got, want := l.Len(), 0; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
}

func TestAllowConcurrentOneKey(t *testing.T) {
	const rate, callers = 50, 1000
	l := mustNew(t, limiter.Config{Rate: rate, Window: m, Burst: 0})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
		refused  int
		start    = make(chan struct{})
	)
	for range callers {
		wg.Go(func() {
			<-start
			err := l.Allow("hot", t0)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				admitted++
			} else if errors.Is(err, limiter.ErrLimited) {
				refused++
			}
		})
	}
	close(start)
	wg.Wait()
	if got, want := admitted, rate; got != want {
		t.Errorf("admitted = %d, want %d", got, want)
	}
	if got, want := refused, callers-rate; got != want {
		t.Errorf("refused = %d, want %d", got, want)
	}
}

// TestConcurrentMaintenance runs Allow on many keys alongside Evict, Dirty,
// Load, Len and SetConfig, for the race detector.
func TestConcurrentMaintenance(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 5, Window: s, Burst: 3})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				now := t0.Add(time.Duration(i) * ms)
				_ = l.Allow(fmt.Sprint("k", (g*7+i)%100), now)
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			now := t0.Add(time.Duration(i*10) * ms)
			l.Evict(now)
			l.Load(l.Dirty(now), now)
			_ = l.Len()
			l.SetConfig(limiter.Config{Rate: 5 + i%3, Window: s, Burst: 3})
		}
	})
	wg.Wait()
}

func TestRefusal(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		want       int
	}{
		{"1ns rounds up to 1s", ns, 1},
		{"zero is still at least 1", 0, 1},
		{"exactly 1s", s, 1},
		{"1s+1ns", s + ns, 2},
		{"59.5s", 59*s + 500*ms, 60},
		{"exactly 1m", m, 60},
		{"huge", time.Duration(1<<63 - 1), int((1<<63-1)/int64(s)) + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &limiter.Refusal{RetryAfter: tt.retryAfter, Reason: limiter.ReasonRate}
			if got, want := r.RetryAfterSeconds(), tt.want; got != want {
				t.Errorf("RetryAfterSeconds() = %d, want %d", got, want)
			}
		})
	}

	var err error = &limiter.Refusal{RetryAfter: 1500 * ms, Reason: limiter.ReasonBurst}
	if !errors.Is(err, limiter.ErrLimited) {
		t.Errorf("errors.Is(%v, ErrLimited) = false, want true", err)
	}
	if got, want := err.Error(), "limiter: burst limit reached, retry after 1.5s"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestSetConfigKeepsHistory(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 5, Window: m})
	runSteps(t, l, []step{ok(0), ok(1 * s), ok(2 * s), ok(3 * s), ok(4 * s)})

	// Lowering the rate refuses at once: the last 3 are t0+2s..t0+4s.
	l.SetConfig(limiter.Config{Rate: 3, Window: m})
	runSteps(t, l, []step{no(10*s, 52*s, "rate"), ok(62 * s)})

	// Raising it admits again, still counting what is in the window:
	// at t0+63s that is t0+4s, t0+62s and what is admitted now.
	l.SetConfig(limiter.Config{Rate: 6, Window: m})
	runSteps(t, l, []step{ok(63 * s), ok(63 * s), ok(63 * s), ok(63 * s), no(63*s, s, "rate")})

	// Adding a burst limit applies to the same history.
	l.SetConfig(limiter.Config{Rate: 100, Window: m, Burst: 3})
	runSteps(t, l, []step{no(63*s, s, "burst"), ok(64 * s), ok(64 * s), ok(64 * s), no(64*s, s, "burst"), ok(65 * s)})

	// An invalid config is ignored, so a typo never switches a limit off.
	before := l.Config()
	l.SetConfig(limiter.Config{Rate: -1})
	if got, want := l.Config(), before; got != want {
		t.Errorf("after invalid SetConfig, Config() = %+v, want %+v", got, want)
	}
	if got, want := l.Config().Window, m; got != want {
		t.Errorf("Config().Window = %v, want %v", got, want)
	}
}

func TestEvict(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 2, Window: m})
	runSteps(t, l, []step{
		{at: 0, key: "a"},
		{at: 30 * s, key: "b"}, {at: 40 * s, key: "b"},
	})
	if got, want := l.Evict(t0.Add(m-ns)), 0; got != want {
		t.Errorf("Evict(t0+1m-1ns) = %d, want %d", got, want)
	}
	// "a" has been idle for a whole window: nothing of it counts.
	if got, want := l.Evict(t0.Add(m)), 1; got != want {
		t.Errorf("Evict(t0+1m) = %d, want %d", got, want)
	}
	if got, want := l.Len(), 1; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
	// "b" is still at its limit.
	runSteps(t, l, []step{{at: m, key: "b", retryAfter: 30 * s, reason: "rate"}})
	if got, want := l.Evict(t0.Add(100*s)), 1; got != want {
		t.Errorf("Evict(t0+100s) = %d, want %d", got, want)
	}
	if got, want := l.Len(), 0; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
}

func TestEvictBurstOnly(t *testing.T) {
	// With the rate off the default Window still bounds idleness, which
	// is longer than the 1s that burst needs, so nothing that counts goes.
	l := mustNew(t, limiter.Config{Burst: 1})
	runSteps(t, l, []step{ok(0)})
	if got, want := l.Evict(t0.Add(2*s)), 0; got != want {
		t.Errorf("Evict(t0+2s) = %d, want %d", got, want)
	}
	if got, want := l.Evict(t0.Add(m)), 1; got != want {
		t.Errorf("Evict(t0+1m) = %d, want %d", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  limiter.Config
		want []string // substrings of the error; none means valid
	}{
		{"zero is valid (off)", limiter.Config{}, nil},
		{"typical", limiter.Config{Rate: 60, Window: m, Burst: 5}, nil},
		{"default window", limiter.Config{Rate: 60}, nil},
		{"max", limiter.Config{Rate: limiter.MaxRate, Window: limiter.MaxWindow, Burst: limiter.MaxRate}, nil},
		{"short window without rate", limiter.Config{Window: ms, Burst: 1}, nil},
		{"negative rate", limiter.Config{Rate: -1}, []string{"limits.user.rate must not be negative"}},
		{"negative burst", limiter.Config{Burst: -2}, []string{"limits.user.burst must not be negative"}},
		{"negative window", limiter.Config{Window: -s}, []string{"limits.user.window must not be negative"}},
		{"rate too high", limiter.Config{Rate: limiter.MaxRate + 1}, []string{"limits.user.rate must be at most 100000"}},
		{"burst too high", limiter.Config{Burst: limiter.MaxRate + 1}, []string{"limits.user.burst must be at most 100000"}},
		{"window too short", limiter.Config{Rate: 1, Window: s - ns}, []string{"limits.user.window must be at least 1s"}},
		{"window too long", limiter.Config{Rate: 1, Window: time.Hour + ns}, []string{"limits.user.window must be at most 1h0m0s"}},
		{"all at once", limiter.Config{Rate: -1, Window: -1, Burst: -1}, []string{"limits.user.rate", "limits.user.window", "limits.user.burst"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate("limits.user")
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if _, err := limiter.New(tt.cfg); err != nil {
					t.Fatalf("New() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, limiter.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
			if _, err := limiter.New(tt.cfg); !errors.Is(err, limiter.ErrInvalidConfig) {
				t.Errorf("New() = %v, want ErrInvalidConfig", err)
			}
		})
	}

	if got, want := (limiter.Config{Rate: 1}).WithDefaults().Window, limiter.DefaultWindow; got != want {
		t.Errorf("WithDefaults().Window = %v, want %v", got, want)
	}
	if got, want := (limiter.Config{Rate: 1}).Validate(""), error(nil); got != want {
		t.Errorf("Validate(\"\") = %v", got)
	}
	if err := (limiter.Config{Rate: -1}).Validate(""); err == nil || !strings.Contains(err.Error(), ": rate must") {
		t.Errorf("Validate(\"\") = %v, want the bare field name", err)
	}
}
