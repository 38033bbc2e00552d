package api

import (
	"context"
	"sync/atomic"
	"time"
)

// recordEpoch is how long one record context is handed out: a paid read
// waits between recordTimeout-recordEpoch and recordTimeout to be
// recorded.
const recordEpoch = time.Second

// recordContexts hand out the context that bounds a paid read's wait to
// be recorded (its usage record, or the settlement of a failed call). The
// reads that reach that point within one recordEpoch share one context
// with one deadline, recordTimeout after the first of them: a context and
// a timer per read cost a tenth of the handler's own CPU. The context
// carries no value of the request: nothing below the guard reads one. Safe
// for concurrent use.
type recordContexts struct {
	now func() time.Time // real time: the deadline is a timer's
	cur atomic.Pointer[recordContext]
}

type recordContext struct {
	ctx    context.Context
	cancel context.CancelFunc // never called: its deadline ends it, read or no read
	until  time.Time          // handed out before this
}

// get returns a context whose deadline is at most recordTimeout and at
// least recordTimeout-recordEpoch away.
func (r *recordContexts) get() context.Context {
	now := r.now()
	if c := r.cur.Load(); c != nil && now.Before(c.until) {
		return c.ctx
	}
	c := &recordContext{until: now.Add(recordEpoch)}
	c.ctx, c.cancel = context.WithDeadline(context.Background(), now.Add(recordTimeout))
	r.cur.Store(c) // two reads at an epoch's turn may each make one: both are good
	return c.ctx
}
