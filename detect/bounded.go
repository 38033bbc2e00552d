package detect

import (
	"maps"
	"slices"
	"strings"
)

// Other is the key under which an aggregate sums the client IPs and
// e-mails beyond its bound ([detect] max_keys): they are attacker-chosen,
// so their number must not decide how much memory or disk a day takes.
// "other" is neither an address nor an e-mail, so it names no real key.
const Other = "other"

// bounded is a table of rows by key that holds at most 2*max rows: when
// it is full it folds all but the max heaviest into the row of Other.
// Heavy hitters, the keys a detector can flag, stay; keys seen a few
// times each are summed. A key folded and seen again starts a new row,
// so a light key's figures may be split between its row and Other.
type bounded[V any] struct {
	max     int
	rows    map[string]*V
	other   V
	used    bool                // the Other row holds something
	heavier func(a, b *V) bool  // a outranks b
	merge   func(into, from *V) // adds from's figures to into
}

func newBounded[V any](max int, heavier func(a, b *V) bool, merge func(into, from *V)) *bounded[V] {
	return &bounded[V]{max: max, rows: map[string]*V{}, heavier: heavier, merge: merge}
}

// get returns key's row, making it if need be.
func (b *bounded[V]) get(key string) *V {
	if key == Other {
		b.used = true
		return &b.other
	}
	if r, ok := b.rows[key]; ok {
		return r
	}
	if len(b.rows) >= 2*b.max {
		b.trim()
	}
	r := new(V)
	b.rows[key] = r
	return r
}

// trim folds all but the max heaviest rows into Other; ties go to the
// smaller key, so the result does not depend on map order.
func (b *bounded[V]) trim() {
	if len(b.rows) <= b.max {
		return
	}
	keys := slices.SortedFunc(maps.Keys(b.rows), func(x, y string) int {
		switch {
		case b.heavier(b.rows[x], b.rows[y]):
			return -1
		case b.heavier(b.rows[y], b.rows[x]):
			return 1
		}
		return strings.Compare(x, y)
	})
	for _, k := range keys[b.max:] {
		b.merge(&b.other, b.rows[k])
		delete(b.rows, k)
	}
	b.used = true
}

// each trims the table to max rows and calls fn with every row, Other's
// last if it holds anything.
func (b *bounded[V]) each(fn func(key string, r *V)) {
	b.trim()
	for k, r := range b.rows {
		fn(k, r)
	}
	if b.used {
		fn(Other, &b.other)
	}
}

// outranks compares figures in order of importance: the first that
// differs decides whether a outranks b.
func outranks(a, b [4]int64) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return false
}
