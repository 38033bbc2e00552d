package limiter_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"breakwater/limiter"
)

// TestMaxKeysBoundsAFlood: a flood of distinct keys (one request from
// each of many client addresses) holds at most MaxKeys of them; a new key
// displaces the quietest, whose window starts afresh when it comes back:
// the rate limit fails open for it, not for the keys still active.
func TestMaxKeysBoundsAFlood(t *testing.T) {
	const maxKeys = 128 // two a shard
	l := mustNew(t, limiter.Config{Rate: 1, Window: time.Hour, MaxKeys: maxKeys})
	if err := l.Allow("ip:quiet", t0); err != nil {
		t.Fatal(err)
	}
	if err := l.Allow("ip:quiet", t0.Add(time.Second)); err == nil {
		t.Fatal("second request within the hour admitted")
	}
	for i := range 10_000 {
		at := t0.Add(time.Minute + time.Duration(i)*time.Millisecond)
		if err := l.Allow(fmt.Sprintf("ip:flood-%d", i), at); err != nil {
			t.Fatalf("flood key %d refused: %v", i, err)
		}
		if n := l.Len(); n > maxKeys {
			t.Fatalf("after %d flood keys %d held, want at most %d", i+1, n, maxKeys)
		}
	}
	if got := l.Displaced(); got < 10_000-maxKeys {
		t.Errorf("Displaced() = %d, want at least %d", got, 10_000-maxKeys)
	}
	// The quiet key went first: it is admitted again within its hour.
	if err := l.Allow("ip:quiet", t0.Add(2*time.Minute)); err != nil {
		t.Errorf("the quietest key was kept over the flood: %v", err)
	}
}

// TestMaxKeysPrefersIdleKeys: a full shard drops a key whose history no
// longer counts before one that does, and that is not counted as
// displaced.
func TestMaxKeysPrefersIdleKeys(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 1, Window: time.Second, MaxKeys: 64}) // one a shard
	for i := range 1_000 {
		// Each key is idle (past its 1s window) by the next one.
		if err := l.Allow(fmt.Sprintf("k%d", i), t0.Add(time.Duration(i)*2*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Displaced(); got != 0 {
		t.Errorf("Displaced() = %d with every held key idle, want 0", got)
	}
	if n := l.Len(); n > 64 {
		t.Errorf("%d keys held, want at most 64", n)
	}
}

func TestMaxKeysValidate(t *testing.T) {
	if err := (limiter.Config{Rate: 1, MaxKeys: -1}).Validate("limits.user"); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("MaxKeys -1: %v, want ErrInvalidConfig", err)
	}
	if err := (limiter.FailConfig{MaxKeys: -1}).Validate(); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("FailConfig.MaxKeys -1: %v, want ErrInvalidConfig", err)
	}
	if got := (limiter.FailConfig{}).WithDefaults().MaxKeys; got != limiter.DefaultFailMaxKeys {
		t.Errorf("default FailConfig.MaxKeys %d, want %d", got, limiter.DefaultFailMaxKeys)
	}
}

// TestFailMaxKeysFailsClosed: a full fail limiter refuses an attempt on a
// key it does not hold (ReasonCapacity) rather than forget a run or a
// cooldown; keys it holds go on as before, and once held keys are idle
// they make room.
func TestFailMaxKeysFailsClosed(t *testing.T) {
	f := mustNewFail(t, limiter.FailConfig{Limit: 2, Window: 10 * time.Minute, Cooldown: 30 * time.Minute, MaxKeys: 4})
	failAt := func(at time.Time, keys ...string) {
		t.Helper()
		a, err := f.Begin(keys, at)
		if err != nil {
			t.Fatalf("begin %v: %v", keys, err)
		}
		a.Fail(at)
	}
	failAt(t0, "ip:a", "email:a")
	failAt(t0, "ip:a", "email:a") // a cooldown of 30 minutes on both
	failAt(t0, "ip:b", "email:b") // a run of one on both
	var rl *limiter.Refusal
	if _, err := f.Begin([]string{"ip:c", "email:c"}, t0.Add(time.Second)); !errors.As(err, &rl) || rl.Reason != limiter.ReasonCapacity {
		t.Fatalf("a new key while full: %v, want a %q refusal", err, limiter.ReasonCapacity)
	}
	if _, err := f.Begin([]string{"ip:b", "email:c"}, t0.Add(time.Second)); !errors.As(err, &rl) || rl.Reason != limiter.ReasonCapacity {
		t.Fatalf("a held and a new key while full: %v, want a %q refusal", err, limiter.ReasonCapacity)
	}
	if f.Len() != 4 {
		t.Fatalf("%d keys held, want 4", f.Len())
	}
	// A held key still gets its attempt.
	a, err := f.Begin([]string{"ip:b"}, t0.Add(time.Second))
	if err != nil {
		t.Fatalf("a held key while full: %v", err)
	}
	a.Succeed(t0.Add(time.Second))
	// Past the fail window b's runs count for nothing: room for c,
	// while a's cooldown stays.
	later := t0.Add(11 * time.Minute)
	a, err = f.Begin([]string{"ip:c", "email:c"}, later)
	if err != nil {
		t.Fatalf("a new key once others are idle: %v", err)
	}
	a.Cancel()
	if _, err := f.Begin([]string{"ip:a"}, later); !errors.As(err, &rl) || rl.Reason != limiter.ReasonCooldown {
		t.Errorf("ip:a after the sweep: %v, want its cooldown kept", err)
	}
}

// TestFailStateOldFormLoads: states written before the compact in-memory
// form (the same encoding: version 1, run, last attempt, cooldown end and
// length as Unix nanoseconds) load with their cooldown and run, and are
// written back byte for byte.
func TestFailStateOldFormLoads(t *testing.T) {
	enc := func(fails uint64, last, until time.Time, length time.Duration) []byte {
		b := []byte{1}
		b = binary.AppendUvarint(b, fails)
		for _, v := range []int64{unixOrZero(last), unixOrZero(until), int64(length)} {
			b = binary.AppendVarint(b, v)
		}
		return b
	}
	cool := enc(0, t0, t0.Add(10*time.Minute), 10*time.Minute)
	run := enc(4, t0, time.Time{}, 0)
	f := mustNewFail(t, limiter.FailConfig{Limit: 5, Backoff: true})
	f.Load([]limiter.Entry{{Key: "ip:cool", State: cool}, {Key: "ip:run", State: run}}, nil)
	if until, ok := f.CoolingDown("ip:cool", t0.Add(time.Minute)); !ok || !until.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("CoolingDown(ip:cool) = %v %v, want until %v", until, ok, t0.Add(10*time.Minute))
	}
	// One more failure completes ip:run's run of five.
	a, err := f.Begin([]string{"ip:run"}, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	a.Fail(t0.Add(time.Minute))
	if _, ok := f.CoolingDown("ip:run", t0.Add(time.Minute)); !ok {
		t.Error("the loaded run of four did not count: no cooldown after a fifth failure")
	}
	f.Clear("ip:run")
	f.Load([]limiter.Entry{{Key: "ip:cool", State: cool}}, nil)
	f.Clear("ip:cool")
	f.Load([]limiter.Entry{{Key: "ip:cool", State: cool}}, nil)
	a, err = f.Begin([]string{"ip:cool"}, t0.Add(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	a.Cancel()
	entries, _ := f.Dirty()
	for _, e := range entries {
		if e.Key == "ip:cool" && string(e.State) != string(cool) {
			t.Errorf("ip:cool written back as %x, loaded as %x", e.State, cool)
		}
	}
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
