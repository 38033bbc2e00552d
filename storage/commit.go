package storage

import (
	"context"
	"fmt"
	"runtime"

	"go.etcd.io/bbolt"
)

// Group commit sizing.
const (
	// queueSize is how many writes may wait for the writer goroutine.
	queueSize = 4096
	// maxBatch is the most writes committed in one transaction.
	maxBatch = 1024
)

// commitRequest is one caller's write waiting in the queue.
type commitRequest struct {
	fn   func(tx *bbolt.Tx) error
	done chan error // buffered, so the writer never blocks on a caller
}

// commit runs fn in a read-write transaction shared with concurrent callers
// (group commit) and returns once that transaction is on disk, or failed.
//
// fn must be pure with respect to tx: it may run more than once, in a
// transaction that is then rolled back, so it must not have side effects
// outside tx or keep anything from a run. fn must not call commit (the
// writer would wait for itself). If fn returns an error (or panics), the
// caller gets that error and nothing fn did is kept; the other writes of the
// batch are re-run without it and still commit. If the commit itself fails,
// every caller of the batch gets its error.
//
// ctx bounds only the wait for a place in the queue: once queued, commit
// waits for the outcome, because the caller must know whether its write
// happened. After Close, commit returns ErrClosed.
func (db *DB) commit(ctx context.Context, fn func(tx *bbolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit queue: %w", err)
	}
	req := commitRequest{fn: fn, done: make(chan error, 1)}

	db.mu.RLock()
	if db.closed {
		db.mu.RUnlock()
		return ErrClosed
	}
	select {
	case db.queue <- req:
		db.mu.RUnlock()
	case <-ctx.Done():
		db.mu.RUnlock()
		return fmt.Errorf("commit queue: %w", ctx.Err())
	}
	return <-req.done
}

// writer is the one goroutine that commits queued writes. It takes one
// request (waiting for it), then whatever else is already queued without
// waiting, up to maxBatch, and commits them together. It returns once the
// queue is closed and drained.
//
// After each batch it yields its processor. The callers a commit releases
// are made runnable on the writer's own processor, behind it: without the
// yield they waited while the writer put the next batch together and ran
// it up to its fsync (on a 2-core machine at full load, about 1 ms of a
// request's 5). Yielding lets them answer first; the writer then finds
// what they and the others queued meanwhile, in one batch. With nothing
// else runnable the yield returns at once.
func (db *DB) writer() {
	defer close(db.writerDone)
	batch := make([]commitRequest, 0, maxBatch)
	for req := range db.queue {
		batch = append(batch[:0], req)
	fill:
		for len(batch) < maxBatch {
			select {
			case req, ok := <-db.queue:
				if !ok {
					break fill
				}
				batch = append(batch, req)
			default:
				break fill
			}
		}
		db.runBatch(batch)
		clear(batch)      // drop references to finished functions
		runtime.Gosched() // let the callers just released run first (above)
	}
}

// Transactions is how many group-commit transactions the writer has run,
// rolled-back tries included: beside the writes made, what a batch holds.
func (db *DB) Transactions() int64 { return db.txs.Load() }

// Writes is how many queued writes the writer has answered (committed or
// refused): over Transactions, how many writes a commit carries.
func (db *DB) Writes() int64 { return db.answered.Load() }

// runBatch commits batch in one transaction and answers every request. A
// request whose function fails is answered with its error and the rest is
// re-run without it.
func (db *DB) runBatch(batch []commitRequest) {
	for len(batch) > 0 {
		failed, failErr := -1, error(nil)
		// guard: a damaged page that bbolt meets while committing (a
		// panic) fails the batch with ErrDamaged instead of the process.
		err := guard("writing "+db.path, func() error {
			return db.bolt.Update(func(tx *bbolt.Tx) error {
				if err := db.tail.extend(tx); err != nil {
					db.logger.Warn("commits may be slower", "err", err)
				}
				for i, req := range batch {
					if err := callSafely(req.fn, tx); err != nil {
						failed, failErr = i, err
						return err
					}
				}
				return nil
			})
		})
		db.txs.Add(1)
		if failed >= 0 {
			batch[failed].done <- failErr
			db.answered.Add(1)
			batch = append(batch[:failed], batch[failed+1:]...)
			continue
		}
		if err != nil {
			err = fmt.Errorf("commit of %d writes: %w", len(batch), closedErr(err))
		}
		for _, req := range batch {
			req.done <- err
		}
		db.answered.Add(int64(len(batch)))
		return
	}
}

// callSafely runs fn, turning a panic into an error so that one bad
// function cannot take the writer (and every waiting caller) down.
func callSafely(fn func(tx *bbolt.Tx) error, tx *bbolt.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("storage: commit function panicked: %v", r)
		}
	}()
	return fn(tx)
}
