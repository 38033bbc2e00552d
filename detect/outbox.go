package detect

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// errPermanent marks an answer that a retry cannot change (for a webhook,
// a 4xx other than 408 and 429): an outbox gives such an item up at once.
var errPermanent = errors.New("refused")

// outbox is the delivery machinery the Mailer and each Webhook share: a
// bounded queue that Push never waits on, and one goroutine that delivers
// each item in turn, retrying with doubling waits until it is taken,
// refused for good (errPermanent) or its attempts are used up. Close
// stops taking items, cuts retry waits short and tries each item still
// queued once more, until its ctx ends.
type outbox[T any] struct {
	spec  outboxSpec[T]
	queue *queue[T]
	stop  chan struct{} // cuts retry waits short at Close
	done  chan struct{}
	once  sync.Once
}

// outboxSpec is what an outbox delivers, how often it tries, and how it
// counts and logs. Zero sizes and waits mean the Mailer's defaults.
type outboxSpec[T any] struct {
	send      func(T) error // one delivery attempt
	size      int           // the queue's bound (DefaultMailQueue)
	attempts  int           // tries of one item (DefaultMailAttempts)
	base, max time.Duration // the first wait and the longest (DefaultRetryBase, DefaultRetryMax)

	log   *slog.Logger
	attrs func(T) []any // what every log line says of an item
	text  outboxText

	sent    *atomic.Uint64 // items delivered
	failed  *atomic.Uint64 // failed attempts
	dropped *atomic.Uint64 // items a full or closed queue refused
	givenUp *atomic.Uint64 // items given up; nil: counted in failed alone
}

// outboxText holds an outbox's log messages.
type outboxText struct {
	dropped  string // Push refused an item (error)
	sent     string // an item delivered (info)
	retry    string // an attempt failed, another follows (warn)
	givenUp  string // attempts used up, or refused for good (error)
	shutdown string // the last try at Close failed (error)
}

// newOutbox starts the delivering goroutine of spec.
func newOutbox[T any](spec outboxSpec[T]) *outbox[T] {
	if spec.size <= 0 {
		spec.size = DefaultMailQueue
	}
	if spec.attempts <= 0 {
		spec.attempts = DefaultMailAttempts
	}
	if spec.base <= 0 {
		spec.base = DefaultRetryBase
	}
	if spec.max <= 0 {
		spec.max = DefaultRetryMax
	}
	o := &outbox[T]{spec: spec, queue: newQueue[T](spec.size), stop: make(chan struct{}), done: make(chan struct{})}
	go o.loop()
	return o
}

// Push queues item without waiting; false means it was dropped (a full
// queue or a closed outbox), counted and logged.
func (o *outbox[T]) Push(item T) bool {
	if o.queue.Push(item) {
		return true
	}
	o.spec.dropped.Add(1)
	o.spec.log.Error(o.spec.text.dropped, o.spec.attrs(item)...)
	return false
}

// Close stops taking items, cuts retry waits short and tries each queued
// item once more, until ctx ends.
func (o *outbox[T]) Close(ctx context.Context) error {
	o.once.Do(func() {
		o.queue.Close()
		close(o.stop)
	})
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (o *outbox[T]) loop() {
	defer close(o.done)
	for item := range o.queue.Items() {
		o.deliver(item)
	}
}

// deliver tries item until it is taken, refused for good, its attempts
// are used up, or the outbox stops.
func (o *outbox[T]) deliver(item T) {
	s := &o.spec
	wait := s.base
	for attempt := 1; ; attempt++ {
		err := s.send(item)
		if err == nil {
			s.sent.Add(1)
			s.log.Info(s.text.sent, append(s.attrs(item), "attempt", attempt)...)
			return
		}
		s.failed.Add(1)
		if attempt >= s.attempts || errors.Is(err, errPermanent) {
			o.giveUp()
			s.log.Error(s.text.givenUp, append(s.attrs(item), "attempts", attempt, "err", err)...)
			return
		}
		s.log.Warn(s.text.retry, append(s.attrs(item), "attempt", attempt, "retry_in", wait, "err", err)...)
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-o.stop:
			timer.Stop()
			o.lastTry(item)
			return
		}
		wait = min(wait*2, s.max)
	}
}

// lastTry is the one more attempt an item waiting for a retry gets at
// Close.
func (o *outbox[T]) lastTry(item T) {
	s := &o.spec
	if err := s.send(item); err == nil {
		s.sent.Add(1)
	} else {
		s.failed.Add(1)
		o.giveUp()
		s.log.Error(s.text.shutdown, append(s.attrs(item), "err", err)...)
	}
}

// giveUp counts an item given up, where the spec counts those.
func (o *outbox[T]) giveUp() {
	if o.spec.givenUp != nil {
		o.spec.givenUp.Add(1)
	}
}
