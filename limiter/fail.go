package limiter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	// ReasonCapacity means the limiter already tracks FailConfig.MaxKeys
	// keys, none of them idle, and the attempt names a key it does not
	// track: it fails closed for new keys rather than forget a run or a
	// cooldown.
	ReasonCapacity = "capacity"
)

// Defaults of a [FailConfig].
const (
	DefaultFailLimit   = 5
	DefaultFailWindow  = 10 * time.Minute
	DefaultCooldown    = 10 * time.Minute
	DefaultMaxCooldown = 24 * time.Hour
	// DefaultFailMaxKeys is the most keys a FailLimiter holds when
	// FailConfig.MaxKeys is zero: at about 130 bytes a key (more for
	// a key in a cooldown), 65 MB at most. An invite attempt names two
	// keys, its IP and its e-mail.
	DefaultFailMaxKeys = 500_000
	// MaxFailLimit is the largest FailConfig.Limit: runs are counted in
	// 32 bits.
	MaxFailLimit = math.MaxInt32
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
	// MaxKeys is the most keys held at once. Default DefaultFailMaxKeys
	// (500,000). Once it is reached, and no key is idle, an attempt on a
	// key not held is refused (ReasonCapacity): forgetting a key would
	// lift its cooldown or reset its run, which is what a guesser with
	// many addresses wants.
	MaxKeys int
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
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultFailMaxKeys
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
	if c.Limit < 0 || c.Limit > MaxFailLimit {
		bad("fail limit must be 0 to %d, got %d", MaxFailLimit, c.Limit)
	}
	if c.MaxKeys < 0 {
		bad("the most keys held must not be negative, got %d", c.MaxKeys)
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

// failKey is one key's run of failures: 16 bytes, held by pointer so
// that the map's slots stay small. Its cooldown, which most keys never
// have (a flood's addresses fail once each), is kept apart in
// FailLimiter.cool. Times are the limiter's clock (see
// FailLimiter.since): Unix nanoseconds, 0 for none.
type failKey struct {
	last    int64  // the last evaluated attempt
	fails   int32  // consecutive failures in the current run
	pending uint16 // attempts begun and not yet finished
	dirty   bool   // changed since the last Dirty, and listed in dirtyKeys
	cooled  bool   // the key has an entry in FailLimiter.cool
}

// cooldown is a key's latest cooldown, kept after it passes for the
// backoff.
type cooldown struct {
	until  int64 // end of the latest cooldown
	length int64 // ns; length of the latest cooldown, 0 for none
}

// maxPending is the most attempts in progress at once on one key; more
// are refused as ReasonInFlight.
const maxPending = math.MaxUint16

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

	mu   sync.Mutex
	keys map[string]*failKey
	// cool holds the cooldowns of the keys whose cooled flag is set.
	cool map[string]cooldown
	// dirtyKeys lists the keys changed (their dirty flag set) or dropped
	// since the last Dirty; a key may be listed more than once.
	dirtyKeys   []string
	buckets     [globalSpan]bucket // failures per minute, by minute mod 60
	globalDirty bool
	lastTrip    time.Time // when the global net last tripped
	lastSweep   time.Time // when Begin last evicted idle keys at MaxKeys

	// The clock: the first now seen, and its Unix nanoseconds. Later
	// times are counted from it on the monotonic clock, so that a step
	// of the wall clock neither lifts nor stretches a cooldown in
	// progress.
	epoch     time.Time
	epochWall int64

	shared atomic.Pointer[shared[SharedFails]] // the store that decides, if any (shared.go)
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
	return &FailLimiter{cfg: cfg.WithDefaults(), keys: map[string]*failKey{}, cool: map[string]cooldown{}}, nil
}

// since returns now on the limiter's clock: Unix nanoseconds, as of the
// first now seen plus the (monotonic, when both carry it) time elapsed
// since. f.mu is held.
func (f *FailLimiter) since(now time.Time) int64 {
	if f.epochWall == 0 {
		f.epoch, f.epochWall = now, max(now.UnixNano(), 1)
	}
	return min(max(f.epochWall+int64(now.Sub(f.epoch)), -maxT), maxT)
}

// wallTime turns a time on the limiter's clock back into a time.Time.
func wallTime(t int64) time.Time { return time.Unix(0, t) }

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
	started []string    // keys whose cooldown Fail started
	shared  *sharedPart // begun in the store, if any (shared.go)
}

// Begin starts an attempt on every key at now, or refuses it with a
// [*Refusal] (reason ReasonGlobal, ReasonCooldown or ReasonInFlight) and
// records nothing. The keys are checked and counted together: either all
// count the attempt as pending or none does.
//
// With a store ([FailLimiter.Share]) the store decides and the attempt's
// outcome goes to it; the memory keeps this process's attempts as well,
// and decides alone when the store cannot.
func (f *FailLimiter) Begin(keys []string, now time.Time) (*Attempt, error) {
	if sh := f.shared.Load(); sh != nil {
		return f.beginShared(sh, keys, now)
	}
	return f.beginLocal(keys, now)
}

// Shared reports whether a store decides f's keys ([FailLimiter.Share]).
func (f *FailLimiter) Shared() bool { return f.shared.Load() != nil }

// beginLocal is Begin in memory alone.
func (f *FailLimiter) beginLocal(keys []string, now time.Time) (*Attempt, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if g := f.cfg.GlobalPerHour; g > 0 && f.globalCount(now) >= g {
		return nil, &Refusal{RetryAfter: time.Minute, Reason: ReasonGlobal}
	}
	t := f.since(now)
	added := 0
	for _, k := range keys {
		st := f.keys[k]
		if st == nil {
			added++
			continue
		}
		if c := f.cooldownOf(k, st); t < c.until {
			return nil, &Refusal{RetryAfter: time.Duration(c.until - t), Reason: ReasonCooldown}
		}
		if f.run(st, t)+int(st.pending) >= f.cfg.Limit || st.pending == maxPending {
			return nil, &Refusal{RetryAfter: time.Second, Reason: ReasonInFlight}
		}
	}
	if added > 0 && len(f.keys)+added > f.cfg.MaxKeys {
		// Full: drop what is idle, at most once a second (a sweep
		// visits every key), before refusing a newcomer.
		if now.Sub(f.lastSweep) >= time.Second || now.Before(f.lastSweep) {
			f.lastSweep = now
			f.evict(t)
		}
		if len(f.keys)+added > f.cfg.MaxKeys {
			return nil, &Refusal{RetryAfter: time.Minute, Reason: ReasonCapacity}
		}
	}
	for _, k := range keys {
		st := f.keys[k]
		if st == nil {
			st = &failKey{}
			f.keys[strings.Clone(k)] = st // do not pin the caller's buffer
		}
		st.pending++
	}
	return &Attempt{f: f, keys: append([]string(nil), keys...)}, nil
}

// run returns st's failures that still count at t: none once Window has
// passed since the last evaluated attempt.
func (f *FailLimiter) run(st *failKey, t int64) int {
	if st.fails > 0 && t-st.last > int64(f.cfg.Window) {
		return 0
	}
	return int(st.fails)
}

// cooldownOf returns k's cooldown (zero for none); f.mu is held.
func (f *FailLimiter) cooldownOf(k string, st *failKey) cooldown {
	if !st.cooled {
		return cooldown{}
	}
	return f.cool[k]
}

// setCooldown makes c k's cooldown, none if c is zero; f.mu is held. The
// key is cloned: k may be the caller's.
func (f *FailLimiter) setCooldown(k string, st *failKey, c cooldown) {
	if c == (cooldown{}) {
		if st.cooled {
			delete(f.cool, k)
			st.cooled = false
		}
		return
	}
	f.cool[strings.Clone(k)] = c
	st.cooled = true
}

// markDirty lists k for the next Dirty; f.mu is held.
func (f *FailLimiter) markDirty(k string, st *failKey) {
	if !st.dirty {
		st.dirty = true
		f.dirtyKeys = append(f.dirtyKeys, k)
	}
}

// Fail records the attempt as a failure at now on each of its keys,
// starting a cooldown on every key whose run reaches Limit, and counts it
// towards the service-wide net. It reports whether this failure tripped the
// net: true at most once an hour, for the caller to raise an alert.
func (a *Attempt) Fail(now time.Time) (tripped bool) {
	if a == nil || a.done {
		return false
	}
	if a.shared != nil {
		return a.finishShared(OutcomeFail, now)
	}
	a.done = true
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.since(now)
	for _, k := range a.keys {
		st := f.keys[k]
		st.pending--
		st.fails = int32(f.run(st, t) + 1)
		st.last = t
		if int(st.fails) >= f.cfg.Limit {
			f.startCooldown(k, st, t)
			a.started = append(a.started, k)
		}
		f.markDirty(k, st)
	}
	f.addGlobal(now)
	if g := f.cfg.GlobalPerHour; g > 0 && f.globalCount(now) >= g &&
		(f.lastTrip.IsZero() || now.Sub(f.lastTrip) >= time.Hour) {
		f.lastTrip = now
		return true
	}
	return false
}

// startCooldown puts key k in a cooldown from t and starts a new run.
func (f *FailLimiter) startCooldown(k string, st *failKey, t int64) {
	length := int64(f.cfg.Cooldown)
	if c := f.cooldownOf(k, st); f.cfg.Backoff && c.length > 0 && t-c.until < int64(BackoffMemory) {
		length = min(2*c.length, int64(f.cfg.MaxCooldown))
	}
	f.setCooldown(k, st, cooldown{until: min(t+length, maxT), length: length})
	st.fails = 0
}

// Succeed records the attempt as a success at now: each key's run is reset
// (or, with Decay, shortened by one).
func (a *Attempt) Succeed(now time.Time) {
	if a == nil || a.done {
		return
	}
	if a.shared != nil {
		a.finishShared(OutcomeSucceed, now)
		return
	}
	a.done = true
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.since(now)
	for _, k := range a.keys {
		st := f.keys[k]
		st.pending--
		st.fails = int32(f.run(st, t))
		if f.cfg.Decay {
			st.fails = max(st.fails-1, 0)
		} else {
			st.fails = 0
		}
		st.last = t
		f.markDirty(k, st)
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
	if a.shared != nil {
		a.finishShared(OutcomeRelease, time.Time{})
		return
	}
	a.done = true
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	for _, k := range a.keys {
		a.f.keys[k].pending--
	}
}

// readKeys reads what Fail reads of keys at now (each key's run and
// cooldown, the service-wide count) and changes nothing: the work of
// EndRefused in memory.
func (f *FailLimiter) readKeys(keys []string, now time.Time) (runs int, cooling bool, global int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.since(now)
	for _, k := range keys {
		if st := f.keys[k]; st != nil {
			runs += f.run(st, t)
			cooling = cooling || t < f.cooldownOf(k, st).until
		}
	}
	return runs, cooling, f.globalCount(now)
}

// CoolingDown reports whether key is in a cooldown at now, and until when.
func (f *FailLimiter) CoolingDown(key string, now time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.keys[key]
	if st == nil {
		return time.Time{}, false
	}
	c := f.cooldownOf(key, st)
	if f.since(now) >= c.until {
		return time.Time{}, false
	}
	return wallTime(c.until), true
}

// Cooldown is a key in a cooldown, and when the cooldown ends.
type Cooldown struct {
	Key   string
	Until time.Time
}

// Cooling lists the keys in a cooldown at now, sorted by key.
// With a store, the store's (every process's); memory's if it cannot say.
func (f *FailLimiter) Cooling(now time.Time) []Cooldown {
	if sh := f.shared.Load(); sh != nil {
		out, err := sh.store.Cooling(now)
		if err == nil {
			return out
		}
		sh.fault(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.since(now)
	var out []Cooldown
	for k, c := range f.cool {
		if t < c.until {
			out = append(out, Cooldown{Key: k, Until: wallTime(c.until)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Clear lifts key's cooldown and forgets its run of failures and its
// backoff, as for a key never seen, for an operator who knows the client
// is legitimate; false if key has no state. Attempts in progress on key
// still finish. The write-behind stores the change.
//
// With a store, the key is cleared in the store as well; the result is
// the store's, or memory's if the store cannot answer.
func (f *FailLimiter) Clear(key string) bool {
	if sh := f.shared.Load(); sh != nil {
		local := f.clearLocal(key)
		ok, err := sh.store.Clear(key)
		if err != nil {
			sh.fault(err)
			return local
		}
		return ok || local
	}
	return f.clearLocal(key)
}

func (f *FailLimiter) clearLocal(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.keys[key]
	if st == nil {
		return false
	}
	st.fails = 0
	f.setCooldown(key, st, cooldown{})
	f.markDirty(key, st)
	return true
}

// GlobalFailures returns the failures over every key in the last hour at
// now, counted in whole minutes.
// With a store, the store's count (every process's), or memory's if it
// cannot say.
func (f *FailLimiter) GlobalFailures(now time.Time) int {
	if sh := f.shared.Load(); sh != nil {
		n, err := sh.store.GlobalFailures(now)
		if err == nil {
			return n
		}
		sh.fault(err)
	}
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

// idle reports whether key k no longer affects any decision at t.
func (f *FailLimiter) idle(k string, st *failKey, t int64) bool {
	if st.pending > 0 || f.run(st, t) > 0 {
		return false
	}
	c := f.cooldownOf(k, st)
	return c.length == 0 || t >= c.until+int64(BackoffMemory) ||
		(!f.cfg.Backoff && t >= c.until)
}

// drop forgets key k; f.mu is held.
func (f *FailLimiter) drop(k string, st *failKey) {
	if st.cooled {
		delete(f.cool, k)
	}
	delete(f.keys, k)
}

// Evict drops every key whose state no longer affects any decision at now,
// and returns how many it dropped. Dirty reports them as deleted.
func (f *FailLimiter) Evict(now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.evict(f.since(now))
}

func (f *FailLimiter) evict(t int64) int {
	n := 0
	for k, st := range f.keys {
		if f.idle(k, st, t) {
			f.drop(k, st)
			f.dirtyKeys = append(f.dirtyKeys, k)
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
// previous call (a dropped key has a nil State), in key order, and the
// service-wide counts if they changed (else nil). Pending attempts are not
// part of the state: after a restart nothing is in flight.
func (f *FailLimiter) Dirty() (entries []Entry, global []byte) {
	entries, global, _ = f.DirtyAtMost(0)
	return entries, global
}

// DirtyAtMost is Dirty in parts: it returns at most limit of the keys
// changed or dropped (0: every one), the first in key order, and leaves
// the rest listed for the next call; rest is how many remain listed (a
// key may be counted twice). A write-behind that takes a flood's changes
// a part at a time never holds all their encodings at once.
func (f *FailLimiter) DirtyAtMost(limit int) (entries []Entry, global []byte, rest int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := f.dirtyKeys
	slices.Sort(keys)
	keys = slices.Compact(keys)
	take := keys
	if limit > 0 && len(take) > limit {
		take = keys[:limit]
	}
	if len(take) > 0 {
		entries = make([]Entry, 0, len(take))
	}
	// One buffer holds every encoding: a write-behind of many keys
	// allocates once, not once a key.
	size := 0
	for _, k := range take {
		if st := f.keys[k]; st != nil {
			size += f.encodedLen(k, st)
		}
	}
	buf := make([]byte, 0, size)
	for _, k := range take {
		e := Entry{Key: k}
		if st := f.keys[k]; st != nil {
			st.dirty = false
			n := len(buf)
			buf = f.encodeFail(buf, k, st)
			e.State = buf[n:len(buf):len(buf)]
		}
		entries = append(entries, e)
	}
	left := copy(f.dirtyKeys, keys[len(take):])
	clear(f.dirtyKeys[left:])
	if left == 0 && cap(f.dirtyKeys) > maxIdleDirty {
		f.dirtyKeys = nil // let a burst's list go
	} else {
		f.dirtyKeys = f.dirtyKeys[:left]
	}
	if f.globalDirty {
		global = f.encodeGlobal()
		f.globalDirty = false
	}
	return entries, global, left
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
		old := f.keys[e.Key]
		if e.State == nil {
			if old != nil {
				f.drop(e.Key, old)
			}
			continue
		}
		st, c, ok := decodeFail(e.State)
		if !ok {
			continue
		}
		if old != nil {
			st.pending, st.dirty, st.cooled = old.pending, old.dirty, old.cooled
			*old = st
			f.setCooldown(e.Key, old, c)
			continue
		}
		p := &st
		f.keys[strings.Clone(e.Key)] = p
		f.setCooldown(e.Key, p, c)
	}
	if global != nil {
		f.decodeGlobal(global)
	}
}

// maxIdleDirty is the capacity of a dirty list kept between calls to
// Dirty; a longer one, left by a burst, is dropped.
const maxIdleDirty = 1024

// encodeFail appends to b a version byte, then the run length as a uvarint
// and the last attempt, the cooldown's end and its length as varints (Unix
// nanoseconds and nanoseconds; 0 for none). f.mu is held.
func (f *FailLimiter) encodeFail(b []byte, k string, st *failKey) []byte {
	c := f.cooldownOf(k, st)
	b = append(b, failVersion)
	b = binary.AppendUvarint(b, uint64(st.fails))
	b = binary.AppendVarint(b, st.last)
	until := c.until
	if c.length == 0 {
		until = 0 // none
	}
	b = binary.AppendVarint(b, until)
	b = binary.AppendVarint(b, c.length)
	return b
}

// encodedLen is the length of st's encoding by encodeFail.
func (f *FailLimiter) encodedLen(k string, st *failKey) int {
	c := f.cooldownOf(k, st)
	until := c.until
	if c.length == 0 {
		until = 0
	}
	return 1 + uvarintLen(uint64(st.fails)) + varintLen(st.last) + varintLen(until) + varintLen(c.length)
}

// uvarintLen is the length of x as a uvarint.
func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// varintLen is the length of x as a varint (zig-zag encoded).
func varintLen(x int64) int {
	return uvarintLen(uint64(x<<1) ^ uint64(x>>63))
}

func decodeFail(b []byte) (failKey, cooldown, bool) {
	if len(b) == 0 || b[0] != failVersion {
		return failKey{}, cooldown{}, false
	}
	b = b[1:]
	fails, k := binary.Uvarint(b)
	if k <= 0 || fails > 1<<20 {
		return failKey{}, cooldown{}, false
	}
	b = b[k:]
	var v [3]int64
	for i := range v {
		v[i], k = binary.Varint(b)
		if k <= 0 || v[i] < -maxT || v[i] > maxT {
			return failKey{}, cooldown{}, false
		}
		b = b[k:]
	}
	if len(b) != 0 || v[2] < 0 {
		return failKey{}, cooldown{}, false
	}
	st, c := failKey{fails: int32(fails), last: v[0]}, cooldown{until: v[1], length: v[2]}
	if c.until == 0 {
		// No cooldown yet. A length without an end, which no version
		// writes, is dropped with it: it would only double the next.
		c.length = 0
	} else if c.length == 0 {
		// An end without a length: a cooldown all the same, and
		// remembered for the backoff, as the time.Time form held it.
		c.length = 1
	}
	return st, c, true
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
