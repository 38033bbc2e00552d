package limiter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Reasons a [FailLimiter] refuses an attempt, as in [Refusal.Reason].
const (
	// ReasonCooldown means the key is in a cooldown after too many
	// consecutive failures.
	ReasonCooldown = "cooldown"
	// ReasonInFlight means enough attempts on the key are already being
	// evaluated that, should they all fail, the key would be cooling down.
	ReasonInFlight = "in_flight"
	// ReasonGlobal means the service-wide count of failures in the last
	// hour is past FailConfig.GlobalPerHour.
	ReasonGlobal = "global"
)

// Defaults of a [FailConfig].
const (
	DefaultFailLimit   = 5
	DefaultFailWindow  = 10 * time.Minute
	DefaultCooldown    = 10 * time.Minute
	DefaultMaxCooldown = 24 * time.Hour
	// BackoffMemory is how soon after the end of a cooldown the next one
	// must start to be doubled, when FailConfig.Backoff is set.
	BackoffMemory = 24 * time.Hour
	// globalSpan is the span of FailConfig.GlobalPerHour, counted in
	// one-minute buckets.
	globalSpan = 60
)

// FailConfig configures a [FailLimiter]. A zero field means its default.
type FailConfig struct {
	// Limit is how many consecutive failures start a cooldown. Default 5.
	Limit int
	// Window is the most time between an evaluated attempt and the next
	// failure for the failure to extend the run; a failure later than that
	// starts a new run. Default 10m.
	Window time.Duration
	// Cooldown is how long a key is refused once Limit failures have run
	// up. Default 10m.
	Cooldown time.Duration
	// Backoff doubles a cooldown that starts within BackoffMemory (24h) of
	// the end of the key's previous one, up to MaxCooldown.
	Backoff bool
	// MaxCooldown caps a doubled cooldown. Default 24h; at least Cooldown.
	MaxCooldown time.Duration
	// Decay makes a success take one failure off the run instead of
	// resetting it.
	Decay bool
	// GlobalPerHour is the most failures, over every key, in the last hour
	// (counted in whole minutes) before every attempt is refused. 0 is off.
	GlobalPerHour int
}

// WithDefaults returns c with every zero field that has a default set.
func (c FailConfig) WithDefaults() FailConfig {
	if c.Limit == 0 {
		c.Limit = DefaultFailLimit
	}
	if c.Window == 0 {
		c.Window = DefaultFailWindow
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.MaxCooldown == 0 {
		c.MaxCooldown = max(DefaultMaxCooldown, c.Cooldown)
	}
	return c
}

// Validate reports every invalid field of c, after defaults. The error
// wraps [ErrInvalidConfig].
func (c FailConfig) Validate() error {
	d := c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...)))
	}
	if c.Limit < 0 {
		bad("fail limit must not be negative, got %d", c.Limit)
	}
	if c.Window < 0 || c.Cooldown < 0 || c.MaxCooldown < 0 {
		bad("fail window, cooldown and max cooldown must not be negative")
	}
	if d.MaxCooldown < d.Cooldown {
		bad("max cooldown %s is shorter than cooldown %s", d.MaxCooldown, d.Cooldown)
	}
	if c.GlobalPerHour < 0 {
		bad("global failures per hour must not be negative, got %d", c.GlobalPerHour)
	}
	return errors.Join(errs...)
}

// failKey is one key's run of failures and its cooldown.
type failKey struct {
	fails   int           // consecutive failures in the current run
	pending int           // attempts begun and not yet finished
	last    time.Time     // the last evaluated attempt
	until   time.Time     // end of the latest cooldown, kept after it passes
	length  time.Duration // length of the latest cooldown
}

// FailLimiter is a fail limit for pre-auth endpoints: Limit consecutive
// failures on a key, each within Window of the previous evaluated attempt,
// start a Cooldown during which every attempt on the key is refused,
// whatever it carries. A success resets the run (or takes one off it); a
// neutral outcome leaves it as it was. It also keeps a service-wide count
// of failures in the last hour and refuses everything past GlobalPerHour.
//
// Checking and recording are one step: [FailLimiter.Begin] counts the
// attempt as pending on every key before the caller evaluates it, and
// refuses a key once its failures plus its pending attempts reach Limit,
// so n parallel wrong guesses are evaluated at most Limit times however
// they interleave.
//
// It is safe for concurrent use; one mutex guards it, which is ample for an
// endpoint that a rate limit already holds to a few requests per second per
// client. Time is an input to every method.
type FailLimiter struct {
	cfg FailConfig

	mu          sync.Mutex
	keys        map[string]*failKey
	dirty       map[string]struct{} // keys changed or dropped since the last Dirty
	buckets     [globalSpan]bucket  // failures per minute, by minute mod 60
	globalDirty bool
	lastTrip    time.Time // when the global net last tripped
}

// bucket counts failures in one minute, since the Unix epoch.
type bucket struct {
	minute int64
	n      int
}

// NewFail returns a FailLimiter for cfg, after applying its defaults.
func NewFail(cfg FailConfig) (*FailLimiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &FailLimiter{cfg: cfg.WithDefaults(), keys: map[string]*failKey{}, dirty: map[string]struct{}{}}, nil
}

// Config returns the config in force, with defaults applied.
func (f *FailLimiter) Config() FailConfig { return f.cfg }

// Attempt is one attempt begun with [FailLimiter.Begin]. Finish it with
// exactly one of Fail, Succeed, Neutral or Cancel; later calls do
// nothing. A nil *Attempt is valid and does nothing, so a caller whose
// limiter failed open need not check.
type Attempt struct {
	f       *FailLimiter
	keys    []string
	done    bool
	started []string // keys whose cooldown Fail started
}

// Begin starts an attempt on every key at now, or refuses it with a
// [*Refusal] (reason ReasonGlobal, ReasonCooldown or ReasonInFlight) and
// records nothing. The keys are checked and counted together: either all
// count the attempt as pending or none does.
func (f *FailLimiter) Begin(keys []string, now time.Time) (*Attempt, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if g := f.cfg.GlobalPerHour; g > 0 && f.globalCount(now) >= g {
		return nil, &Refusal{RetryAfter: time.Minute, Reason: ReasonGlobal}
	}
	for _, k := range keys {
		st := f.keys[k]
		if st == nil {
			continue
		}
		if now.Before(st.until) {
			return nil, &Refusal{RetryAfter: st.until.Sub(now), Reason: ReasonCooldown}
		}
		if f.run(st, now)+st.pending >= f.cfg.Limit {
			return nil, &Refusal{RetryAfter: time.Second, Reason: ReasonInFlight}
		}
	}
	for _, k := range keys {
		st := f.keys[k]
		if st == nil {
			st = &failKey{}
			f.keys[k] = st
		}
		st.pending++
	}
	return &Attempt{f: f, keys: append([]string(nil), keys...)}, nil
}

// run returns st's failures that still count at now: none once Window has
// passed since the last evaluated attempt.
func (f *FailLimiter) run(st *failKey, now time.Time) int {
	if st.fails > 0 && now.Sub(st.last) > f.cfg.Window {
		return 0
	}
	return st.fails
}

// Fail records the attempt as a failure at now on each of its keys,
// starting a cooldown on every key whose run reaches Limit, and counts it
// towards the service-wide net. It reports whether this failure tripped the
// net: true at most once an hour, for the caller to raise an alert.
func (a *Attempt) Fail(now time.Time) (tripped bool) {
	if a == nil || a.done {
		return false
	}
	a.done = true
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range a.keys {
		st := f.keys[k]
		st.pending--
		st.fails = f.run(st, now) + 1
		st.last = now
		if st.fails >= f.cfg.Limit {
			f.startCooldown(st, now)
			a.started = append(a.started, k)
		}
		f.dirty[k] = struct{}{}
	}
	f.addGlobal(now)
	if g := f.cfg.GlobalPerHour; g > 0 && f.globalCount(now) >= g &&
		(f.lastTrip.IsZero() || now.Sub(f.lastTrip) >= time.Hour) {
		f.lastTrip = now
		return true
	}
	return false
}

// startCooldown puts st in a cooldown from now and starts a new run.
func (f *FailLimiter) startCooldown(st *failKey, now time.Time) {
	length := f.cfg.Cooldown
	if f.cfg.Backoff && !st.until.IsZero() && now.Sub(st.until) < BackoffMemory {
		length = min(2*st.length, f.cfg.MaxCooldown)
	}
	st.until, st.length, st.fails = now.Add(length), length, 0
}

// Succeed records the attempt as a success at now: each key's run is reset
// (or, with Decay, shortened by one).
func (a *Attempt) Succeed(now time.Time) {
	if a == nil || a.done {
		return
	}
	a.done = true
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range a.keys {
		st := f.keys[k]
		st.pending--
		st.fails = f.run(st, now)
		if f.cfg.Decay {
			st.fails = max(st.fails-1, 0)
		} else {
			st.fails = 0
		}
		st.last = now
		f.dirty[k] = struct{}{}
	}
}

// CooldownsStarted lists the keys whose cooldown this attempt's failure
// started, for statistics: detection counts cooldowns, not refusals.
func (a *Attempt) CooldownsStarted() []string {
	if a == nil {
		return nil
	}
	return a.started
}

// Cancel ends the attempt without an outcome, as if it had not been made:
// for an attempt whose evaluation could not be completed.
func (a *Attempt) Cancel() { a.release() }

// Neutral ends an evaluated attempt whose answer is neither a success nor
// a failure: the run, the time of the last evaluated attempt and any
// cooldown stay as they were, so it neither resets, shortens, extends nor
// lengthens the run. It is for an answer that grants nothing new, such as
// an e-mail verifying again a code it has already redeemed: counted as a
// success, one good answer would clear the run at will between guesses.
func (a *Attempt) Neutral() { a.release() }

// release takes the attempt off its keys' pending counts and changes
// nothing else.
func (a *Attempt) release() {
	if a == nil || a.done {
		return
	}
	a.done = true
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	for _, k := range a.keys {
		a.f.keys[k].pending--
	}
}

// CoolingDown reports whether key is in a cooldown at now, and until when.
func (f *FailLimiter) CoolingDown(key string, now time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.keys[key]
	if st == nil || !now.Before(st.until) {
		return time.Time{}, false
	}
	return st.until, true
}

// Cooldown is a key in a cooldown, and when the cooldown ends.
type Cooldown struct {
	Key   string
	Until time.Time
}

// Cooling lists the keys in a cooldown at now, sorted by key.
func (f *FailLimiter) Cooling(now time.Time) []Cooldown {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Cooldown
	for k, st := range f.keys {
		if now.Before(st.until) {
			out = append(out, Cooldown{Key: k, Until: st.until})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Clear lifts key's cooldown and forgets its run of failures and its
// backoff, as for a key never seen, for an operator who knows the client
// is legitimate; false if key has no state. Attempts in progress on key
// still finish. The write-behind stores the change.
func (f *FailLimiter) Clear(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.keys[key]
	if st == nil {
		return false
	}
	st.fails, st.until, st.length = 0, time.Time{}, 0
	f.dirty[key] = struct{}{}
	return true
}

// GlobalFailures returns the failures over every key in the last hour at
// now, counted in whole minutes.
func (f *FailLimiter) GlobalFailures(now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.globalCount(now)
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

func (f *FailLimiter) globalCount(now time.Time) int {
	m, n := minuteOf(now), 0
	for _, b := range f.buckets {
		if b.minute > m-globalSpan && b.minute <= m {
			n += b.n
		}
	}
	return n
}

func (f *FailLimiter) addGlobal(now time.Time) {
	m := minuteOf(now)
	b := &f.buckets[((m%globalSpan)+globalSpan)%globalSpan]
	if b.minute != m {
		*b = bucket{minute: m}
	}
	b.n++
	f.globalDirty = true
}

// idle reports whether st no longer affects any decision at now.
func (f *FailLimiter) idle(st *failKey, now time.Time) bool {
	if st.pending > 0 || f.run(st, now) > 0 {
		return false
	}
	return st.until.IsZero() || !now.Before(st.until.Add(BackoffMemory)) ||
		(!f.cfg.Backoff && !now.Before(st.until))
}

// Evict drops every key whose state no longer affects any decision at now,
// and returns how many it dropped. Dirty reports them as deleted.
func (f *FailLimiter) Evict(now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, st := range f.keys {
		if f.idle(st, now) {
			delete(f.keys, k)
			f.dirty[k] = struct{}{}
			n++
		}
	}
	return n
}

// Len returns the number of keys held.
func (f *FailLimiter) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}

// failVersion is the first byte of every encoded fail state.
const failVersion = 1

// Dirty returns, for write-behind, the keys changed or dropped since the
// previous call (a dropped key has a nil State) and the service-wide
// counts if they changed (else nil). Pending attempts are not part of the
// state: after a restart nothing is in flight.
func (f *FailLimiter) Dirty() (entries []Entry, global []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.dirty))
	for k := range f.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		e := Entry{Key: k}
		if st := f.keys[k]; st != nil {
			e.State = encodeFail(st)
		}
		entries = append(entries, e)
	}
	clear(f.dirty)
	if f.globalDirty {
		global = f.encodeGlobal()
		f.globalDirty = false
	}
	return entries, global
}

// Load restores state as returned by Dirty, for example from disk at start.
// An entry replaces its key's state; an entry that does not decode is
// skipped (the limit fails open). A nil global leaves the service-wide
// counts as they are. Loaded state is not reported by Dirty until it
// changes.
func (f *FailLimiter) Load(entries []Entry, global []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range entries {
		if e.State == nil {
			delete(f.keys, e.Key)
			continue
		}
		st, ok := decodeFail(e.State)
		if !ok {
			continue
		}
		if old := f.keys[e.Key]; old != nil {
			st.pending = old.pending
		}
		f.keys[e.Key] = st
	}
	if global != nil {
		f.decodeGlobal(global)
	}
}

// unixNano encodes t, with the zero time as 0.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// encodeFail writes a version byte, then the run length as a uvarint and
// the last attempt, the cooldown's end and its length as varints (Unix
// nanoseconds and nanoseconds; 0 for none).
func encodeFail(st *failKey) []byte {
	b := make([]byte, 0, 1+4*binary.MaxVarintLen64)
	b = append(b, failVersion)
	b = binary.AppendUvarint(b, uint64(st.fails))
	b = binary.AppendVarint(b, unixNano(st.last))
	b = binary.AppendVarint(b, unixNano(st.until))
	b = binary.AppendVarint(b, int64(st.length))
	return b
}

func decodeFail(b []byte) (*failKey, bool) {
	if len(b) == 0 || b[0] != failVersion {
		return nil, false
	}
	b = b[1:]
	fails, k := binary.Uvarint(b)
	if k <= 0 || fails > 1<<20 {
		return nil, false
	}
	b = b[k:]
	var v [3]int64
	for i := range v {
		v[i], k = binary.Varint(b)
		if k <= 0 {
			return nil, false
		}
		b = b[k:]
	}
	if len(b) != 0 || v[2] < 0 {
		return nil, false
	}
	return &failKey{fails: int(fails), last: fromUnixNano(v[0]), until: fromUnixNano(v[1]), length: time.Duration(v[2])}, true
}

// encodeGlobal writes a version byte and, for each non-empty minute, its
// number since the epoch as a varint and its count as a uvarint.
func (f *FailLimiter) encodeGlobal() []byte {
	b := []byte{failVersion}
	for _, bk := range f.buckets {
		if bk.n > 0 {
			b = binary.AppendVarint(b, bk.minute)
			b = binary.AppendUvarint(b, uint64(bk.n))
		}
	}
	return b
}

func (f *FailLimiter) decodeGlobal(b []byte) {
	if len(b) == 0 || b[0] != failVersion {
		return
	}
	var buckets [globalSpan]bucket
	for b = b[1:]; len(b) > 0; {
		m, k := binary.Varint(b)
		if k <= 0 {
			return
		}
		b = b[k:]
		n, k := binary.Uvarint(b)
		if k <= 0 || n > 1<<40 {
			return
		}
		b = b[k:]
		buckets[((m%globalSpan)+globalSpan)%globalSpan] = bucket{minute: m, n: int(n)}
	}
	f.buckets = buckets
}
