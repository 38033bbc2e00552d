package limiter

import (
	"encoding/binary"
	"strings"
	"time"
)

// Entry is one key's state for write-behind persistence.
type Entry struct {
	// Key is the limiter key.
	Key string
	// State is the key's encoded history, or nil when the key was evicted
	// or has nothing left that counts: the stored copy should be deleted.
	State []byte
}

// stateVersion is the first byte of every encoded State.
const stateVersion = 1

// Dirty returns the keys changed or evicted since the previous call, each
// with its state encoded as of now, so that a caller can write them behind
// (for example every second). The first call returns every key held and
// starts change tracking; until then Allow tracks nothing.
//
// The encoding is compact: a version byte, the wall-clock time of the oldest
// request still inside max(Window, 1s) of now as a varint of Unix
// nanoseconds, the count, and the gap from each request to the next in
// microseconds as uvarints: 1 to 3 bytes a request for gaps up to 2s, so a
// key with 100 requests spread over a minute takes about 300 bytes. Requests that no longer count are left out.
func (l *Limiter) Dirty(now time.Time) []Entry {
	s := l.settings.Load()
	t := l.since(now)
	wall := l.epoch.UnixNano()
	var out []Entry
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		if !sh.tracking {
			sh.tracking = true
			for key, w := range sh.keys {
				w.dirty = false
				out = append(out, Entry{Key: key, State: encode(w, t-s.horizon, wall)})
			}
		} else if len(sh.dirty) > 0 {
			// A key evicted and then admitted again is listed twice;
			// its current state is what counts.
			done := make(map[string]struct{}, len(sh.dirty))
			for _, key := range sh.dirty {
				if _, ok := done[key]; ok {
					continue
				}
				done[key] = struct{}{}
				e := Entry{Key: key}
				if w := sh.keys[key]; w != nil {
					w.dirty = false
					e.State = encode(w, t-s.horizon, wall)
				}
				out = append(out, e)
			}
			clear(sh.dirty)
			if cap(sh.dirty) > maxIdleDirty/numShards {
				sh.dirty = nil // let a burst's list go
			} else {
				sh.dirty = sh.dirty[:0]
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// Load restores entries, as returned by Dirty, at now: for example from disk
// at start. An entry replaces the key's state, and a nil State deletes the
// key. Requests at or before now-max(Window, 1s) no longer count and are
// dropped, and of the rest only the newest max(Rate, Burst) are kept. An
// entry whose State cannot be decoded is skipped, leaving the key as it was:
// the rate limit is a defense layer and fails open. Once Dirty has been
// called, loaded keys are not reported by it until they change.
func (l *Limiter) Load(entries []Entry, now time.Time) {
	s := l.settings.Load()
	t := l.since(now)
	wall := l.epoch.UnixNano()
	for _, e := range entries {
		sh := l.shard(e.Key)
		w, ok := &window{}, true
		if e.State != nil {
			w, ok = decode(e.State, t-s.horizon, wall, s.capacity)
		}
		if !ok {
			continue
		}
		sh.mu.Lock()
		if w.n == 0 {
			delete(sh.keys, e.Key)
		} else if old := sh.keys[e.Key]; old != nil {
			w.dirty = old.dirty
			*old = *w
		} else {
			sh.keys[strings.Clone(e.Key)] = w
		}
		sh.mu.Unlock()
	}
}

// encode returns w's entries after cutoff, or nil if there are none. wall is
// the epoch's Unix time in nanoseconds.
func encode(w *window, cutoff, wall int64) []byte {
	first := 0
	for first < int(w.n) && w.at(first) <= cutoff {
		first++
	}
	live := int(w.n) - first
	if live == 0 {
		return nil
	}
	b := make([]byte, 0, 1+binary.MaxVarintLen64+binary.MaxVarintLen32+2*live)
	b = append(b, stateVersion)
	b = binary.AppendVarint(b, wall+w.at(first))
	b = binary.AppendUvarint(b, uint64(live))
	prev := w.off(first)
	for i := first + 1; i < int(w.n); i++ {
		off := w.off(i)
		b = binary.AppendUvarint(b, uint64(off-prev))
		prev = off
	}
	return b
}

// decode is the inverse of encode. It keeps the newest capacity entries
// after cutoff, and reports false if b is not a valid encoding.
func decode(b []byte, cutoff, wall int64, capacity int) (*window, bool) {
	if len(b) == 0 || b[0] != stateVersion {
		return nil, false
	}
	b = b[1:]
	first, k := binary.Varint(b)
	if k <= 0 || first < -maxT || first > maxT {
		return nil, false
	}
	b = b[k:]
	count, k := binary.Uvarint(b)
	if k <= 0 || count == 0 || count-1 > uint64(len(b)-k) {
		return nil, false
	}
	b = b[k:]
	times := make([]int64, 0, count)
	t := first - wall
	times = append(times, t)
	for range count - 1 {
		gap, k := binary.Uvarint(b)
		if k <= 0 || gap > uint64(maxSpan/tick) {
			return nil, false
		}
		b = b[k:]
		t += int64(gap) * tick
		if t > maxT {
			return nil, false
		}
		times = append(times, t)
	}
	if len(b) != 0 {
		return nil, false
	}

	w := &window{}
	for len(times) > 0 && times[0] <= cutoff {
		times = times[1:]
	}
	times = times[max(0, len(times)-capacity):]
	// Only a clock far behind the stored times could spread them wider
	// than a uint32 offset; keep the newest that fit.
	for len(times) > 0 && times[len(times)-1]-times[0] > maxSpan {
		times = times[1:]
	}
	if len(times) == 0 {
		return w, true
	}
	w.base = times[0]
	w.n = uint32(len(times))
	if len(times) == 1 {
		return w, true // one entry, at base: no ring
	}
	ring := make([]uint32, len(times))
	for i, t := range times {
		ring[i] = uint32((t - w.base) / tick)
	}
	w.setRing(ring)
	return w, true
}
