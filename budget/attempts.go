package budget

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// ErrDailyLine is wrapped by every *LineError.
var ErrDailyLine = errors.New("budget: daily line reached")

// LineError refuses a request whose user has reached the plan's daily
// abuse line. Its figures are never shown to users.
type LineError struct {
	RetryAfter time.Duration // until midnight in the configured zone
}

func (e *LineError) Error() string {
	return fmt.Sprintf("budget: daily line reached, resets in %s", e.RetryAfter.Round(time.Second))
}

func (e *LineError) Unwrap() error { return ErrDailyLine }

// Attempts is layer 2: each user's attempts today, counted before the
// upstream call whatever follows (success, upstream failure, a fail-closed
// 503, a refusal by the global budget), because the provider bills the
// attempt. A line that counted only successes could be walked around by
// failing on purpose.
//
// The counts live in memory; Dirty and Load let the caller write them
// behind and reload them, so a restart does not reset a line (a crash loses
// what changed since the last write-behind).
type Attempts struct {
	loc *time.Location
	cal *Calendar

	mu    sync.Mutex
	day   string
	count map[string]int64
	dirty map[string]bool

	shared sharedAttempts // the store that counts, if any (shared.go)
}

// NewAttempts returns the counter for day ("2006-01-02" in loc) starting
// from counts loaded from storage (nil for none).
func NewAttempts(loc *time.Location, day string, counts map[string]int64) *Attempts {
	a := &Attempts{loc: loc, cal: NewCalendar(loc), day: day, count: map[string]int64{}, dirty: map[string]bool{}}
	for u, n := range counts {
		a.count[u] = n
	}
	return a
}

// Take counts one attempt by user against line (0 = no line), or refuses
// with a *LineError when the line is reached. A refusal counts nothing.
// With a store ([Attempts.Share]) the store decides, every process's
// attempts counted.
func (a *Attempts) Take(user string, line int64, now time.Time) error {
	if sh := a.shared.Load(); sh != nil {
		return a.takeShared(sh, user, line, now)
	}
	return a.takeLocal(user, line, now)
}

// takeLocal is Take in memory alone.
func (a *Attempts) takeLocal(user string, line int64, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(user, line, now); err != nil {
		return err
	}
	a.count[user]++
	a.dirty[user] = true
	return nil
}

// Check refuses, as Take would, a user at the line, without counting
// anything: a cheap look before the request body is read.
func (a *Attempts) Check(user string, line int64, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.check(user, line, now)
}

func (a *Attempts) check(user string, line int64, now time.Time) error {
	a.rollover(a.cal.Day(now))
	if line > 0 && a.count[user] >= line {
		return &LineError{RetryAfter: nextDay(now, a.loc).Sub(now)}
	}
	return nil
}

// Count returns user's attempts on the day holding now.
func (a *Attempts) Count(user string, now time.Time) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rollover(a.cal.Day(now))
	return a.count[user]
}

// Dirty returns the day and the counts changed since the last call,
// encoded for storage, and forgets them.
func (a *Attempts) Dirty() (day string, entries map[string][]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	entries = make(map[string][]byte, len(a.dirty))
	for u := range a.dirty {
		entries[u] = binary.BigEndian.AppendUint64(nil, uint64(a.count[u]))
	}
	// A Go map keeps its table after clear: one burst of many users would
	// hold its peak until the day ends. A large one is dropped instead.
	if len(a.dirty) > dirtyKeep {
		a.dirty = map[string]bool{}
	} else {
		clear(a.dirty)
	}
	return a.day, entries
}

// dirtyKeep is the most changed users whose map Dirty clears for reuse.
const dirtyKeep = 1024

// DecodeCounts turns stored counts back into numbers; malformed values are
// skipped (the layer fails open). A negative count is malformed too: Dirty
// never writes one, and believed it would grant attempts past the line.
func DecodeCounts(entries map[string][]byte) map[string]int64 {
	out := make(map[string]int64, len(entries))
	for u, v := range entries {
		if len(v) != 8 {
			continue
		}
		if n := int64(binary.BigEndian.Uint64(v)); n >= 0 {
			out[u] = n
		}
	}
	return out
}

// rollover starts a new day; days only move forward (see Quotas.rollover).
func (a *Attempts) rollover(day string) {
	if day <= a.day {
		return
	}
	a.day = day
	a.count = map[string]int64{}
	a.dirty = map[string]bool{}
}

// nextDay is the first instant of the day after the one holding t, in loc.
// It is DST-safe: the date is advanced, not 24 hours added.
func nextDay(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, loc)
}

// UserCount is one user's attempts today.
type UserCount struct {
	User  string
	Count int64
}

// Top returns the n users with the most attempts on the day holding now,
// most first.
func (a *Attempts) Top(n int, now time.Time) []UserCount {
	a.mu.Lock()
	a.rollover(a.cal.Day(now))
	out := make([]UserCount, 0, len(a.count))
	for u, c := range a.count {
		out = append(out, UserCount{User: u, Count: c})
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].User < out[j].User
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
