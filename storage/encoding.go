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

// checkMonth reports whether month is a "2006-01" month. It is checked on
// every paid read, so by hand rather than with time.Parse.
func checkMonth(month string) error {
	if len(month) != len(monthLayout) || month[4] != '-' || digits(month[:4]) < 0 {
		return fmt.Errorf("%w: month %q is not YYYY-MM", ErrInvalid, month)
	}
	if m := digits(month[5:]); m < 1 || m > 12 {
		return fmt.Errorf("%w: month %q is not YYYY-MM", ErrInvalid, month)
	}
	return nil
}

// checkDay reports whether day is a valid "2006-01-02".
func checkDay(day string) error {
	if len(day) != len(dayLayout) || day[7] != '-' || checkMonth(day[:7]) != nil {
		return fmt.Errorf("%w: day %q is not YYYY-MM-DD", ErrInvalid, day)
	}
	y, m, d := digits(day[:4]), digits(day[5:7]), digits(day[8:])
	if d < 1 || d > time.Date(y, time.Month(m)+1, 0, 0, 0, 0, 0, time.UTC).Day() {
		return fmt.Errorf("%w: day %q is not YYYY-MM-DD", ErrInvalid, day)
	}
	return nil
}

// digits returns the decimal number s spells, or -1 if s is empty or has
// anything but ASCII digits.
func digits(s string) int {
	if s == "" {
		return -1
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}
