package limiter

import (
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Reasons a request is refused, as in [Refusal.Reason].
const (
	// ReasonRate means Rate requests were already admitted within Window.
	ReasonRate = "rate"
	// ReasonBurst means Burst requests were already admitted within one second.
	ReasonBurst = "burst"
)

// ErrLimited matches every [*Refusal] under errors.Is.
var ErrLimited = errors.New("limiter: limit reached")

// Refusal is the error returned by [Limiter.Allow] when a request is over a
// limit. It carries no threshold, so it is safe to turn into a response.
type Refusal struct {
	// RetryAfter is how long until the request would be admitted, if no
	// other request for the key is admitted meanwhile and the config does
	// not change. Always > 0.
	RetryAfter time.Duration
	// Reason is ReasonRate or ReasonBurst: the limit that frees last.
	Reason string
}

// Error returns a message naming the reason and the wait.
func (r *Refusal) Error() string {
	return "limiter: " + r.Reason + " limit reached, retry after " + r.RetryAfter.String()
}

// Is reports whether target is [ErrLimited].
func (r *Refusal) Is(target error) bool { return target == ErrLimited }

// RetryAfterSeconds returns RetryAfter in whole seconds, rounded up and at
// least 1, for an HTTP Retry-After header.
func (r *Refusal) RetryAfterSeconds() int {
	s := r.RetryAfter / time.Second
	if r.RetryAfter%time.Second > 0 {
		s++
	}
	return int(max(s, 1))
}

// numShards is the number of independently locked parts of the key space.
const numShards = 64

// shard is one lock's worth of keys.
type shard struct {
	mu   sync.Mutex
	keys map[string]*window
	// dirty lists keys changed or evicted since the last Dirty, once the
	// first Dirty call has started tracking (until then nobody reads it).
	dirty    []string
	tracking bool
	_        [64]byte // keep neighbouring shards' locks off one cache line
}

// settings is a Config in the form Allow uses.
type settings struct {
	cfg      Config
	rate     int
	burst    int
	window   int64 // ns
	horizon  int64 // ns; entries at or before now-horizon count for nothing
	capacity int   // entries kept per key; 0 = limiter off
	perShard int   // keys held per shard at most
}

func newSettings(c Config) *settings {
	s := &settings{
		cfg:     c,
		rate:    c.Rate,
		burst:   c.Burst,
		window:  int64(c.Window),
		horizon: int64(max(c.Window, BurstWindow)),
	}
	maxKeys := c.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeys
	}
	s.perShard = max(1, (maxKeys+numShards-1)/numShards)
	s.capacity = max(c.Rate, c.Burst)
	if c.Rate > 0 {
		// Burst > Rate is implied by the rate limit (1s <= Window), so
		// the last Rate entries are all either check needs.
		s.capacity = c.Rate
	}
	return s
}

// check returns how long until a request at t would be admitted to w, and
// why; 0 means now.
func (s *settings) check(w *window, t int64) (wait int64, reason string) {
	if s.rate > 0 {
		if d := w.wait(s.rate, s.window, t); d > 0 {
			wait, reason = d, ReasonRate
		}
	}
	if s.burst > 0 {
		if d := w.wait(s.burst, int64(BurstWindow), t); d > wait {
			wait, reason = d, ReasonBurst
		}
	}
	return wait, reason
}

// Limiter is an exact sliding-window rate limiter with a burst limit, keyed
// by string. It is safe for concurrent use; each key's check-and-record is
// atomic. The zero value is not usable: call [New].
type Limiter struct {
	settings atomic.Pointer[settings]
	seed     maphash.Seed

	started atomic.Bool
	startMu sync.Mutex
	epoch   time.Time // the first now seen; written once, before started

	displaced atomic.Int64 // keys dropped to make room, see Config.MaxKeys

	shared sharedWindows // the store that decides, if any (shared.go)

	shards [numShards]shard
}

// New returns a Limiter for cfg, after applying its defaults. It returns an
// error wrapping [ErrInvalidConfig] if cfg does not validate.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(""); err != nil {
		return nil, err
	}
	l := &Limiter{seed: maphash.MakeSeed()}
	l.settings.Store(newSettings(cfg.WithDefaults()))
	for i := range l.shards {
		l.shards[i].keys = make(map[string]*window)
	}
	return l, nil
}

// Config returns the config in force, with defaults applied.
func (l *Limiter) Config() Config { return l.settings.Load().cfg }

// SetConfig replaces the thresholds, for a hot reload. Every key keeps its
// history, and the new thresholds apply to it from the next call: lowering
// Rate refuses at once a key that is over the new Rate. A key keeps only the
// timestamps its old thresholds needed (the last max(Rate, Burst)), so after
// raising Rate, or lengthening Window, up to one Window may pass before the
// new limit sees the full history.
//
// cfg should have passed [Config.Validate]; an invalid cfg is ignored and
// the current config stays in force, because a reload must not switch a
// limit off.
func (l *Limiter) SetConfig(cfg Config) {
	if cfg.Validate("") != nil {
		return
	}
	l.settings.Store(newSettings(cfg.WithDefaults()))
}

// Allow decides whether a request for key at now is admitted. It returns nil
// if it is, and records it; otherwise a [*Refusal], and records nothing.
//
// With a store ([Limiter.Share]) the store decides, and the memory keeps
// what this process admitted; when the store cannot decide, the memory
// does, and the fault is reported.
func (l *Limiter) Allow(key string, now time.Time) error {
	s := l.settings.Load()
	if s.capacity == 0 {
		return nil
	}
	if sh := l.shared.Load(); sh != nil {
		return l.allowShared(sh, s, key, now)
	}
	return l.allowLocal(s, key, now)
}

// allowLocal is Allow in memory alone.
func (l *Limiter) allowLocal(s *settings, key string, now time.Time) error {
	t := l.since(now)
	sh := l.shard(key)
	sh.mu.Lock()
	w := sh.keys[key]
	if w == nil {
		if len(sh.keys) >= s.perShard && sh.displace(t-s.horizon) {
			l.displaced.Add(1)
		}
		key = strings.Clone(key) // do not pin the caller's buffer
		w = new(window)
		sh.keys[key] = w
	} else if wait, reason := s.check(w, t); wait > 0 {
		sh.mu.Unlock()
		return &Refusal{RetryAfter: time.Duration(wait), Reason: reason}
	}
	w.push(t, s.capacity, s.horizon)
	if sh.tracking && !w.dirty {
		w.dirty = true
		sh.dirty = append(sh.dirty, key)
	}
	sh.mu.Unlock()
	return nil
}

// Evict drops every key idle for at least max(Window, 1s) at now: such a
// key's history no longer affects any decision, so dropping it changes
// nothing. It returns how many keys it dropped. It is safe to call from a
// ticker while requests are served.
func (l *Limiter) Evict(now time.Time) int {
	s := l.settings.Load()
	cutoff := l.since(now) - s.horizon
	dropped := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for key, w := range sh.keys {
			if w.n > 0 && w.newest() > cutoff {
				continue
			}
			delete(sh.keys, key)
			if sh.tracking && !w.dirty {
				sh.dirty = append(sh.dirty, key)
			}
			dropped++
		}
		sh.mu.Unlock()
	}
	return dropped
}

// displaceSample is how many keys a full shard looks at to find one to
// drop.
const displaceSample = 8

// displace drops one key to make room for another: the first of a few
// sampled (map order is random) whose history counts for nothing after
// cutoff, else the sampled key whose newest request is oldest. sh.mu is
// held. It reports whether it dropped a key that still counted.
func (sh *shard) displace(cutoff int64) (live bool) {
	var (
		victim string
		oldest int64
		seen   int
	)
	for key, w := range sh.keys {
		newest := int64(-maxT - 1)
		if w.n > 0 {
			newest = w.newest()
		}
		if seen == 0 || newest < oldest {
			victim, oldest = key, newest
		}
		if seen++; newest <= cutoff || seen == displaceSample {
			break
		}
	}
	w := sh.keys[victim]
	delete(sh.keys, victim)
	if sh.tracking && !w.dirty {
		sh.dirty = append(sh.dirty, victim)
	}
	return oldest > cutoff
}

// Displaced returns how many keys were dropped while their history still
// counted, to make room within Config.MaxKeys: each such key's window
// started afresh when it came back.
func (l *Limiter) Displaced() int64 { return l.displaced.Load() }

// Len returns the number of keys held.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

func (l *Limiter) shard(key string) *shard {
	return &l.shards[maphash.String(l.seed, key)%numShards]
}

// maxT bounds times, in ns since the epoch, so that t±span cannot overflow.
const maxT = int64(1) << 62

// since returns now as nanoseconds since the Limiter's epoch: the first now
// it saw. now.Sub uses the monotonic clock when both times carry it.
func (l *Limiter) since(now time.Time) int64 {
	if !l.started.Load() {
		l.start(now)
	}
	return min(max(int64(now.Sub(l.epoch)), -maxT), maxT)
}

func (l *Limiter) start(now time.Time) {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	if !l.started.Load() {
		l.epoch = now
		l.started.Store(true)
	}
}
