package postgres

import (
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/limiter"
)

// Window decisions share round trips. Every request is decided against a
// shared window, so a round trip each would make the windows the busiest
// part of the database under load. The decisions waiting when the
// previous round trip ends go together in one pipeline (one implicit
// transaction, of UNLOGGED tables: no disk wait), in the order of their
// rows, so that two instances' batches never wait on each other in a
// circle; the decisions of one key keep their order of arrival. A
// statement that the server refuses would fail the whole batch: the batch
// is then run again one decision at a time, so that only that one
// decides in memory.

// maxWindowBatch is the most decisions one round trip carries.
const maxWindowBatch = 256

// windowCall is one decision waiting for its batch.
type windowCall struct {
	name, key string
	cfg       limiter.Config
	now       time.Time
	refusal   *limiter.Refusal
	err       error
	done      chan struct{}
}

// windowQueue is the decisions waiting, and whether a sender runs.
type windowQueue struct {
	mu      sync.Mutex
	pending []*windowCall
	sending bool
}

// decide waits for c's decision in the next batch.
func (l *Limits) decide(c *windowCall) {
	c.done = make(chan struct{})
	q := &l.windows
	q.mu.Lock()
	q.pending = append(q.pending, c)
	if !q.sending {
		q.sending = true
		go l.sendWindows()
	}
	q.mu.Unlock()
	<-c.done
}

// sendWindows sends batches until none is waiting, then ends.
func (l *Limits) sendWindows() {
	q := &l.windows
	for {
		q.mu.Lock()
		calls := q.pending
		if len(calls) > maxWindowBatch {
			calls, q.pending = calls[:maxWindowBatch:maxWindowBatch], calls[maxWindowBatch:]
		} else {
			q.pending = nil
		}
		if len(calls) == 0 {
			q.sending = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		l.sendBatch(calls)
	}
}

// sendBatch decides calls in one round trip, or one at a time if the
// server refused a statement of theirs.
func (l *Limits) sendBatch(calls []*windowCall) {
	sort.SliceStable(calls, func(i, j int) bool {
		if calls[i].name != calls[j].name {
			return calls[i].name < calls[j].name
		}
		return calls[i].key < calls[j].key
	})
	err := l.runWindows(calls)
	var pgErr *pgconn.PgError
	if err != nil && len(calls) > 1 && errors.As(err, &pgErr) {
		for _, c := range calls {
			c.err = l.runWindows([]*windowCall{c})
			close(c.done)
		}
		return
	}
	for _, c := range calls {
		c.err = err
		close(c.done)
	}
}

// runWindows is one round trip of calls' decisions.
func (l *Limits) runWindows(calls []*windowCall) error {
	l.trips.Add(1)
	b := &pgx.Batch{}
	for _, c := range calls {
		c.refusal = nil
		queueWindow(b, c.name, c.key, c.cfg, c.now, func(r *limiter.Refusal) { c.refusal = r })
	}
	return l.run(b)
}
