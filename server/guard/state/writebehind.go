package state

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"breakwater/limiter"
)

// State names under which the layers' memory is written behind, and the
// stored name of the operator's kill switch.
const (
	StateUserWindows    = "windows/user"
	stateAttemptsPrefix = "attempts/"
	// BrakeFlag is the stored flag of the manual brake.
	BrakeFlag = "brake"
	// globalKey is the one entry of a fail limiter's service-wide state.
	globalKey = "hour"
)

// AttemptsState names the stored attempt counts of day.
func AttemptsState(day string) string { return stateAttemptsPrefix + day }

// stateRefusalsPrefix begins the names of the transport's stored refusal
// counts, one state per day.
const stateRefusalsPrefix = "refusals/"

// RefusalsState names the stored refusal counts of day (the dashboard's
// "refusals today").
func RefusalsState(day string) string { return stateRefusalsPrefix + day }

// StateStore is what the write-behind needs from storage.
type StateStore interface {
	SaveState(name string, entries map[string][]byte) error
	DropStates(prefix, keep string) error
}

// StateLoader reads written-behind state.
type StateLoader interface {
	LoadState(name string) (map[string][]byte, error)
}

// Change is what one named state gained since the last flush: entries to
// write over the stored ones, either as a map or, from a limiter, as a
// list in key order.
type Change struct {
	Name    string
	Entries map[string][]byte
	// Sorted, if set, holds the entries in key order instead (a nil
	// State deletes its key). The write-behind writes them in chunks of
	// at most MaxChunk, one transaction each, in that order: a second's
	// worth of a flood then never becomes one transaction that touches
	// every page of the state (bbolt keeps each page it changes, and the
	// new copy it writes, in memory until the commit), and no map of
	// every entry is built to hand them over.
	Sorted []limiter.Entry
	// Next, if set, returns the entries that follow Sorted, a part at a
	// time, until it returns none; each part is written as Sorted is.
	Next func() []limiter.Entry
}

// MaxChunk is the most entries of a Change's Sorted list written in one
// transaction.
const MaxChunk = 4096

// Snapshot is one layer's in-memory state as the write-behind copies it.
// A new limiter registers itself by adding its Snapshot to the list the
// App gives NewWriteBehind; Windows, Fails and Attempts build the ones of
// the limiters in this service.
type Snapshot struct {
	// Layer names the layer a failed write fails open, in metrics and
	// logs.
	Layer string
	// Dirty returns what changed since its last call, state by state.
	Dirty func(now time.Time) []Change
	// Evict, if set, drops idle entries from memory; it is called at most
	// every 30 s.
	Evict func(now time.Time)
	// Current, if set, names the one state under Prefix in use (today's
	// attempt counts, say); whenever it changes the others under Prefix
	// are dropped from storage.
	Prefix  string
	Current func() string
}

// WindowSource is what the snapshot of a sliding-window limiter reads:
// limiter.Limiter's entries changed since the last call, and its eviction
// of idle entries.
type WindowSource interface {
	Dirty(now time.Time) []limiter.Entry
	Evict(now time.Time) int
}

// DailySource is what the snapshot of daily counts reads: budget.Attempts'
// day and the counts that changed since the last call.
type DailySource interface {
	Dirty() (day string, entries map[string][]byte)
}

// Windows is the snapshot of a sliding-window limiter's entries, stored
// under name.
func Windows(name, layer string, l WindowSource) Snapshot {
	return Snapshot{
		Layer: layer,
		Dirty: func(now time.Time) []Change { return entriesChange(name, l.Dirty(now)) },
		Evict: func(now time.Time) { l.Evict(now) },
	}
}

// Fails is the snapshot of a fail limiter: its keys under name, its
// service-wide count under globalName.
func Fails(name, globalName, layer string, f *limiter.FailLimiter) Snapshot {
	return Snapshot{
		Layer: layer,
		Dirty: func(time.Time) []Change {
			entries, global, rest := f.DirtyAtMost(MaxChunk)
			out := entriesChange(name, entries)
			if len(out) > 0 && rest > 0 {
				// The parts after the first are taken while they are
				// written, up to as many keys as were listed now: keys
				// that change meanwhile wait for the next flush.
				out[0].Next = func() []limiter.Entry {
					if rest <= 0 {
						return nil
					}
					part, _, _ := f.DirtyAtMost(min(rest, MaxChunk))
					rest -= len(part)
					return part
				}
			}
			if global != nil {
				out = append(out, Change{Name: globalName, Entries: map[string][]byte{globalKey: global}})
			}
			return out
		},
		Evict: func(now time.Time) { f.Evict(now) },
	}
}

// Attempts is the snapshot of the daily attempt counts: today's under
// AttemptsState(day); older days are dropped once the day turns.
func Attempts(layer string, a DailySource) Snapshot {
	return AttemptsUnder(stateAttemptsPrefix, layer, a)
}

// AttemptsUnder is the snapshot of daily attempt counts stored under
// prefix+day (a guarded route's, say); older days under prefix are
// dropped once the day turns.
func AttemptsUnder(prefix, layer string, a DailySource) Snapshot {
	return daily(prefix, layer, a.Dirty)
}

// Refusals is the snapshot of the transport's refusal counts of today
// (api.Server.DirtyRefusals): today's under RefusalsState(day); older
// days are dropped once the day turns.
func Refusals(layer string, dirty func() (day string, counts map[string][]byte)) Snapshot {
	return daily(stateRefusalsPrefix, layer, dirty)
}

// daily is the snapshot of counts kept for one day at a time: dirty
// returns the day and its counts that changed since its last call, stored
// under prefix+day.
func daily(prefix, layer string, dirty func() (string, map[string][]byte)) Snapshot {
	var day string
	return Snapshot{
		Layer: layer,
		Dirty: func(time.Time) []Change {
			var counts map[string][]byte
			day, counts = dirty()
			if len(counts) == 0 {
				return nil
			}
			return []Change{{Name: prefix + day, Entries: counts}}
		},
		Prefix:  prefix,
		Current: func() string { return prefix + day },
	}
}

// entriesChange is the change of a limiter's dirty entries, put in key
// order.
func entriesChange(name string, dirty []limiter.Entry) []Change {
	if len(dirty) == 0 {
		return nil
	}
	if !slices.IsSortedFunc(dirty, compareEntries) {
		slices.SortFunc(dirty, compareEntries)
	}
	return []Change{{Name: name, Sorted: dirty}}
}

func compareEntries(a, b limiter.Entry) int { return strings.Compare(a.Key, b.Key) }

// LoadWindows restores a sliding-window limiter's entries stored under
// name.
func LoadWindows(store StateLoader, name string, l *limiter.Limiter, now time.Time) error {
	m, err := store.LoadState(name)
	if err != nil {
		return err
	}
	l.Load(entries(m), now)
	return nil
}

// LoadFails restores a fail limiter stored by its Fails snapshot.
func LoadFails(store StateLoader, name, globalName string, f *limiter.FailLimiter) error {
	m, err := store.LoadState(name)
	if err != nil {
		return err
	}
	global, err := store.LoadState(globalName)
	if err != nil {
		return err
	}
	f.Load(entries(m), global[globalKey])
	return nil
}

func entries(m map[string][]byte) []limiter.Entry {
	out := make([]limiter.Entry, 0, len(m))
	for k, v := range m {
		out = append(out, limiter.Entry{Key: k, State: v})
	}
	return out
}

// Options are the write-behind's optional dependencies.
type Options struct {
	// FailedOpen is told of every write that failed, with the layer of
	// its snapshot. Nil: failures are only logged.
	FailedOpen func(layer string, err error)
	Logger     *slog.Logger
	// Now is the clock of the limiters' windows. Nil: time.Now.
	Now func() time.Time
}

// WriteBehind copies the defense layers' in-memory state (rate windows,
// daily attempt counts, the invite guard's windows and fail limits, and
// today's refusal counts) to storage every interval, so that a restart
// neither resets a daily line nor lifts a rate limit or a cooldown. Only
// what changed is written, at most once per interval: a request refused by
// the rate limits changes only the refusal counts (a few dozen entries at
// most), and a failed invite guess only updates the fail limiter's entry for its
// keys, so an attack costs at most one write a second for each 4,096 keys
// it changed (MaxChunk), in key order. A failed write is a fail-open event
// of the layer.
type WriteBehind struct {
	store     StateStore
	snapshots []Snapshot
	failOpen  func(layer string, err error)
	log       *slog.Logger
	now       func() time.Time

	current   []string // each snapshot's Current at the last flush
	lastEvict time.Time
	chunk     map[string][]byte // reused for each chunk of a Sorted change
}

// DefaultWriteBehindInterval is how often defense state reaches the disk.
const DefaultWriteBehindInterval = time.Second

// evictEvery is how often idle rate-limit keys are dropped from memory.
const evictEvery = 30 * time.Second

// NewWriteBehind returns the writer of snapshots into store; they are
// written in their order.
func NewWriteBehind(store StateStore, snapshots []Snapshot, o Options) (*WriteBehind, error) {
	if store == nil {
		return nil, errors.New("defense: the write-behind needs a store")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.FailedOpen == nil {
		log := o.Logger
		o.FailedOpen = func(layer string, err error) { log.Error("defense state not written", "layer", layer, "err", err) }
	}
	return &WriteBehind{
		store: store, snapshots: snapshots, failOpen: o.FailedOpen, log: o.Logger, now: o.Now,
		current: make([]string, len(snapshots)),
	}, nil
}

// Run flushes every interval until ctx ends, then once more.
func (w *WriteBehind) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.Flush()
			return
		case <-t.C:
			w.Flush()
		}
	}
}

// Flush writes what changed since the last flush.
func (w *WriteBehind) Flush() {
	now := w.now()
	if now.Sub(w.lastEvict) >= evictEvery {
		for _, s := range w.snapshots {
			if s.Evict != nil {
				s.Evict(now)
			}
		}
		w.lastEvict = now
	}
	for i, s := range w.snapshots {
		for _, c := range s.Dirty(now) {
			if err := w.save(c); err != nil {
				w.failOpen(s.Layer, err)
			}
		}
		if s.Current == nil {
			continue
		}
		if cur := s.Current(); cur != w.current[i] {
			if err := w.store.DropStates(s.Prefix, cur); err != nil {
				w.log.Warn("old defense state not pruned", "layer", s.Layer, "keep", cur, "err", err)
			}
			w.current[i] = cur
		}
	}
}

// save writes c: its Entries in one transaction, its Sorted list in
// chunks of at most MaxChunk. After a chunk fails the rest of c is not
// tried: the write-behind fails open, and one event per state is enough.
func (w *WriteBehind) save(c Change) error {
	if c.Sorted == nil && c.Next == nil {
		return w.store.SaveState(c.Name, c.Entries)
	}
	if w.chunk == nil {
		w.chunk = make(map[string][]byte, MaxChunk)
	}
	defer clear(w.chunk) // hold no state between flushes
	for part := c.Sorted; ; {
		for len(part) > 0 {
			n := min(len(part), MaxChunk)
			clear(w.chunk)
			for _, e := range part[:n] {
				w.chunk[e.Key] = e.State
			}
			if err := w.store.SaveState(c.Name, w.chunk); err != nil {
				return err
			}
			clear(part[:n]) // let the written states go before the next chunk
			part = part[n:]
		}
		if c.Next == nil {
			return nil
		}
		if part = c.Next(); len(part) == 0 {
			return nil
		}
	}
}
