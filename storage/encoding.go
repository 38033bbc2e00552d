package storage

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// Key encoding. Keys are fixed width and sort in time order under bytes
// comparison, so a cursor Seek finds a time range:
//
//	timeKey:  8 bytes big-endian UnixNano with the sign bit flipped
//	          + 8 bytes big-endian bucket sequence
//	month:    "2006-01"
//	counters: 8 bytes big-endian uint64

const (
	monthLayout = "2006-01"
	dayLayout   = "2006-01-02"
	timeKeyLen  = 16
)

// Bounds of the times a timeKey can hold: UnixNano's range.
var (
	minKeyTime = time.Unix(0, math.MinInt64)
	maxKeyTime = time.Unix(0, math.MaxInt64)
)

// encodeUint64 returns v as 8 bytes, big-endian.
func encodeUint64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// appendOnlyFill is the FillPercent of buckets keyed by timeKey: they grow
// at their end, so a page split there keeps the old page nine-tenths full
// instead of bbolt's default half, and the file grows (and the writer
// writes pages) about half as fast.
const appendOnlyFill = 0.9

// timeKey returns the 16-byte key for t and a bucket sequence number. The
// flipped sign bit keeps times before 1970 in order.
func timeKey(t time.Time, seq uint64) []byte {
	b := make([]byte, timeKeyLen)
	binary.BigEndian.PutUint64(b, uint64(t.UnixNano())^(1<<63))
	binary.BigEndian.PutUint64(b[8:], seq)
	return b
}

// checkKeyTime reports whether t can be stored in a timeKey.
func checkKeyTime(t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("%w: zero time", ErrInvalid)
	}
	if t.Before(minKeyTime) || t.After(maxKeyTime) {
		return fmt.Errorf("%w: time %s out of range", ErrInvalid, t)
	}
	return nil
}

// rangeKeys returns the cursor bounds for from <= t < to. A zero from means
// the first key; a zero to means no upper bound (nil). Bounds outside the
// storable range are clamped.
func rangeKeys(from, to time.Time) (lo, hi []byte) {
	switch {
	case from.IsZero(), from.Before(minKeyTime):
		lo = make([]byte, timeKeyLen)
	case from.After(maxKeyTime):
		lo = timeKey(maxKeyTime, math.MaxUint64)
	default:
		lo = timeKey(from, 0)
	}
	switch {
	case to.IsZero(), to.After(maxKeyTime):
		hi = nil
	case to.Before(minKeyTime):
		hi = make([]byte, timeKeyLen)
	default:
		hi = timeKey(to, 0)
	}
	return lo, hi
}

// checkMonth reports whether month is a "2006-01" month.
func checkMonth(month string) error {
	t, err := time.Parse(monthLayout, month)
	if err != nil || t.Format(monthLayout) != month {
		return fmt.Errorf("%w: month %q is not YYYY-MM", ErrInvalid, month)
	}
	return nil
}

// checkDay reports whether day is a valid "2006-01-02".
func checkDay(day string) error {
	t, err := time.Parse(dayLayout, day)
	if err != nil || t.Format(dayLayout) != day {
		return fmt.Errorf("%w: day %q is not YYYY-MM-DD", ErrInvalid, day)
	}
	return nil
}
