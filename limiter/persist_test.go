package limiter_test

import (
	"slices"
	"testing"
	"time"

	"breakwater/limiter"
)

func keysOf(entries []limiter.Entry) []string {
	var keys []string
	for _, e := range entries {
		keys = append(keys, e.Key)
	}
	slices.Sort(keys)
	return keys
}

func stateOf(t *testing.T, entries []limiter.Entry, key string) []byte {
	t.Helper()
	for _, e := range entries {
		if e.Key == key {
			return e.State
		}
	}
	t.Fatalf("no entry for %q in %v", key, keysOf(entries))
	return nil
}

func TestDirtyLoadRoundTrip(t *testing.T) {
	cfg := limiter.Config{Rate: 3, Window: m}
	a := mustNew(t, cfg)
	runSteps(t, a, []step{
		{at: 0, key: "u"}, {at: s, key: "u"}, {at: 2 * s, key: "u"},
		{at: 0, key: "v"},
	})
	entries := a.Dirty(t0.Add(2 * s))
	if got, want := keysOf(entries), []string{"u", "v"}; !slices.Equal(got, want) {
		t.Fatalf("first Dirty() keys = %v, want %v", got, want)
	}
	if got := a.Dirty(t0.Add(2 * s)); len(got) != 0 {
		t.Errorf("second Dirty() = %v, want nothing", keysOf(got))
	}

	// Another process, with another epoch, a second later: "u" is still
	// in its cooldown, until its oldest request leaves at t0+1m.
	b := mustNew(t, cfg)
	b.Load(entries, t0.Add(3*s))
	if got, want := b.Len(), 2; got != want {
		t.Errorf("Len() after Load = %d, want %d", got, want)
	}
	runSteps(t, b, []step{
		{at: 3 * s, key: "u", retryAfter: 57 * s, reason: "rate"},
		{at: m - ns, key: "u", retryAfter: ns, reason: "rate"},
		{at: m, key: "u"},
		{at: m, key: "u", retryAfter: s, reason: "rate"},
		{at: 3 * s, key: "v"}, {at: 3 * s, key: "v"},
		{at: 3 * s, key: "v", retryAfter: 57 * s, reason: "rate"},
	})
	if got := b.Dirty(t0.Add(m)); len(got) != 2 {
		t.Errorf("Dirty() after Load and Allow = %v, want u and v", keysOf(got))
	}
}

func TestLoadDropsStale(t *testing.T) {
	cfg := limiter.Config{Rate: 3, Window: m}
	a := mustNew(t, cfg)
	runSteps(t, a, []step{ok(0), ok(s), ok(2 * s)})
	entries := a.Dirty(t0.Add(2 * s))

	// At t0+61s only the request at t0+2s still counts.
	b := mustNew(t, cfg)
	b.Load(entries, t0.Add(61*s))
	runSteps(t, b, []step{ok(61 * s), ok(61 * s), no(61*s, s, "rate")})

	// At t0+62s nothing counts, and the key is not even created.
	c := mustNew(t, cfg)
	c.Load(entries, t0.Add(62*s))
	if got, want := c.Len(), 0; got != want {
		t.Errorf("Len() after loading only stale state = %d, want %d", got, want)
	}
}

func TestLoadClockBehind(t *testing.T) {
	// The state was written by a clock an hour ahead; after the restart
	// those requests still count, so nothing extra is admitted.
	cfg := limiter.Config{Rate: 1, Window: m}
	a := mustNew(t, cfg)
	runSteps(t, a, []step{ok(time.Hour)})
	b := mustNew(t, cfg)
	b.Load(a.Dirty(t0.Add(time.Hour)), t0)
	runSteps(t, b, []step{no(0, time.Hour+m, "rate"), ok(time.Hour + m)})
}

func TestLoadKeepsNewestWithinCapacity(t *testing.T) {
	a := mustNew(t, limiter.Config{Rate: 5, Window: m})
	runSteps(t, a, []step{ok(0), ok(s), ok(2 * s), ok(3 * s), ok(4 * s)})
	b := mustNew(t, limiter.Config{Rate: 2, Window: m})
	b.Load(a.Dirty(t0.Add(4*s)), t0.Add(4*s))
	runSteps(t, b, []step{no(5*s, 58*s, "rate"), ok(63 * s), no(63*s, s, "rate")})
}

func TestDirtyTracksChangesAndEvictions(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 1, Window: m})
	if got := l.Dirty(t0); len(got) != 0 {
		t.Fatalf("Dirty() on an empty limiter = %v, want nothing", keysOf(got))
	}
	runSteps(t, l, []step{{at: 0, key: "a"}, {at: 0, key: "b"}})
	if got, want := keysOf(l.Dirty(t0)), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("Dirty() = %v, want %v", got, want)
	}

	// A refusal changes nothing, so there is nothing to write.
	runSteps(t, l, []step{{at: s, key: "a", retryAfter: 59 * s}})
	if got := l.Dirty(t0.Add(s)); len(got) != 0 {
		t.Errorf("Dirty() after a refusal = %v, want nothing", keysOf(got))
	}

	// Evicted keys come back with a nil State, once each; a key evicted
	// and admitted again comes back once, with its new state.
	runSteps(t, l, []step{{at: 30 * s, key: "b", retryAfter: 30 * s}})
	if got, want := l.Evict(t0.Add(m)), 2; got != want {
		t.Fatalf("Evict() = %d, want %d", got, want)
	}
	runSteps(t, l, []step{{at: m, key: "b"}})
	got := l.Dirty(t0.Add(m))
	if keys, want := keysOf(got), []string{"a", "b"}; !slices.Equal(keys, want) {
		t.Fatalf("Dirty() after Evict = %v, want %v", keys, want)
	}
	if st := stateOf(t, got, "a"); st != nil {
		t.Errorf("evicted key a: State = %x, want nil", st)
	}
	if st := stateOf(t, got, "b"); st == nil {
		t.Errorf("re-admitted key b: State = nil, want its state")
	}

	// Loading a nil State deletes the key.
	l.Load([]limiter.Entry{{Key: "b"}}, t0.Add(m))
	if got, want := l.Len(), 0; got != want {
		t.Errorf("Len() after loading a deletion = %d, want %d", got, want)
	}
}

func TestDirtyDropsWhatNoLongerCounts(t *testing.T) {
	l := mustNew(t, limiter.Config{Rate: 2, Window: m})
	runSteps(t, l, []step{ok(0)})
	if got := l.Dirty(t0.Add(m)); len(got) != 1 || got[0].State != nil {
		t.Errorf("Dirty() a window later = %+v, want one entry with nil State", got)
	}
}

func TestStateIsCompact(t *testing.T) {
	const rate = 100
	l := mustNew(t, limiter.Config{Rate: rate, Window: m})
	for i := range rate {
		if err := l.Allow("k", t0.Add(time.Duration(i)*599*ms)); err != nil {
			t.Fatal(err)
		}
	}
	st := stateOf(t, l.Dirty(t0.Add(m)), "k")
	// Version, time and count, then one uvarint per gap: 3 bytes for a
	// gap of up to about 2s in microseconds.
	if got, want := len(st), 1+9+1+3*(rate-1); got > want {
		t.Errorf("len(State) = %d, want at most %d", got, want)
	}
	t.Logf("state of a full history at rate %d: %d bytes", rate, len(st))
}

func TestLoadSkipsCorruptState(t *testing.T) {
	cfg := limiter.Config{Rate: 1, Window: m}
	a := mustNew(t, cfg)
	runSteps(t, a, []step{ok(0)})
	good := stateOf(t, a.Dirty(t0), "k")

	tests := []struct {
		name  string
		state []byte
	}{
		{"empty", []byte{}},
		{"wrong version", append([]byte{9}, good[1:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing bytes", append(slices.Clone(good), 0)},
		{"zero count", []byte{1, 0, 0}},
		{"count beyond data", []byte{1, 0, 0xff, 0x01}},
		{"huge gap", []byte{1, 0, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, cfg)
			runSteps(t, b, []step{{at: 0, key: "other"}})
			b.Load([]limiter.Entry{{Key: "k", State: tt.state}, {Key: "other", State: tt.state}}, t0)
			// Skipped: "k" stays absent, "other" keeps its own state.
			runSteps(t, b, []step{ok(0), {at: 0, key: "other", retryAfter: m}})
		})
	}
}
