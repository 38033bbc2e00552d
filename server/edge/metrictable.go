package edge

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// maxCounterTable bounds a counterTable; label sets past it are resolved
// by the vector on each use, as if there were no table.
const maxCounterTable = 1024

// counterTable resolves a CounterVec's label sets once each: a request
// finds its counter with one map look-up, without hashing the label
// values or formatting a status. It is read without a lock; a label set
// not seen before copies the map, which is rare (the sets are route
// patterns, statuses, layers and reasons, a few dozen in all).
type counterTable[K comparable] struct {
	vec    *prometheus.CounterVec
	labels func(K) []string
	mu     sync.Mutex // serialises copies
	m      atomic.Pointer[map[K]prometheus.Counter]
}

func newCounterTable[K comparable](vec *prometheus.CounterVec, labels func(K) []string) *counterTable[K] {
	return &counterTable[K]{vec: vec, labels: labels}
}

// get is k's counter.
func (t *counterTable[K]) get(k K) prometheus.Counter {
	if m := t.m.Load(); m != nil {
		if c, ok := (*m)[k]; ok {
			return c
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var old map[K]prometheus.Counter
	if m := t.m.Load(); m != nil {
		old = *m
	}
	if c, ok := old[k]; ok {
		return c
	}
	c := t.vec.WithLabelValues(t.labels(k)...)
	if len(old) >= maxCounterTable {
		return c
	}
	m := make(map[K]prometheus.Counter, len(old)+1)
	for key, v := range old {
		m[key] = v
	}
	m[k] = c
	t.m.Store(&m)
	return c
}
