package detect

import (
	"sync"
	"sync/atomic"
)

// queue is the bounded hand-over between a caller that must never wait
// (a request, an alert) and the one goroutine that writes, stores or mails
// what it gets: the Recorder, the Alerter and each outbox (the Mailer's,
// a Webhook's) have one.
// Push drops an item when the queue is full or closed, and counts it;
// the consumer ranges over Items until Close has been called and what was
// queued before it is taken.
type queue[T any] struct {
	mu      sync.RWMutex // Close against a concurrent Push
	closed  bool
	items   chan T
	dropped atomic.Uint64
}

func newQueue[T any](size int) *queue[T] {
	return &queue[T]{items: make(chan T, size)}
}

// Push queues v without waiting, and reports whether it was queued.
func (q *queue[T]) Push(v T) bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if !q.closed {
		select {
		case q.items <- v:
			return true
		default:
		}
	}
	q.dropped.Add(1)
	return false
}

// Items is what the consumer takes from; it is closed, once drained, after
// Close.
func (q *queue[T]) Items() <-chan T { return q.items }

// Close stops taking items; those already queued stay for the consumer.
// Later calls do nothing.
func (q *queue[T]) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.items)
	}
}

// Closed reports whether Close has been called.
func (q *queue[T]) Closed() bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.closed
}

// Dropped counts the items Push could not queue.
func (q *queue[T]) Dropped() uint64 { return q.dropped.Load() }
