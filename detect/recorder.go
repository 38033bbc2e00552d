package detect

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for RecorderOptions.
const (
	DefaultQueueSize     = 8192
	DefaultBatchSize     = 512
	DefaultFlushInterval = 200 * time.Millisecond
)

// EventWriter stores a batch of statistics events.
type EventWriter interface {
	AppendEvents(events []Event) error
}

// RecorderOptions tunes a Recorder. Zero fields mean the defaults.
type RecorderOptions struct {
	QueueSize     int           // events waiting to be written; more are dropped
	BatchSize     int           // most events per write
	FlushInterval time.Duration // how long a partial batch waits for company
	// TallyWindow is how long invite refusals and cooldown starts are
	// counted in memory before their rows are written (default
	// DefaultTallyWindow); TallyKeys the most IPs and e-mails, each, with
	// a row of their own per window (default DefaultTallyKeys).
	TallyWindow time.Duration
	TallyKeys   int
	// RefusalKeys is the most keys per minute whose refusals by a layer
	// (OutcomeLayerRefused, OutcomeShadowRefused) get a row of their own
	// (default DefaultRefusalKeys), and apart from them the most whose
	// reads answered from storage (OutcomeCached, OutcomeReplayed) do;
	// the rest share the row of Other.
	RefusalKeys int
	Logger      *slog.Logger
	Now         func() time.Time // when a tally window has ended; default time.Now
}

// Recorder queues statistics events and writes them in batches. Invite
// refusals and cooldown starts are not stored one by one: anyone can send
// them without end, so the writer counts them per window of TallyWindow
// and then writes one row per IP and per e-mail (bounded by TallyKeys,
// the rest under Other) and one per refusal reason, each with its Count.
// Refusals by a layer before the upstream call, real or in shadow mode,
// are counted the same way per minute (RefusalWindow) and per key, route
// and layer (bounded by RefusalKeys), and so are reads answered from
// storage (the same image again, a repeated idempotency key): rows of
// OutcomeCached and OutcomeReplayed with their Count. Events lost to a full queue or a
// failed write are counted in a row of OutcomeDropped. A crash loses the
// counts of the window under way.
type Recorder struct {
	w     EventWriter
	opts  RecorderOptions
	log   *slog.Logger
	queue *queue[Event]
	done  chan struct{}

	// refusals is the minute of refusals by a layer being counted, which
	// PendingRefusals reads while the writer's loop fills it.
	mu       sync.Mutex
	refusals *minuteTally

	written atomic.Uint64
	lost    atomic.Uint64 // events of batches whose write failed
	failed  atomic.Uint64
	// reported is Dropped as of the last OutcomeDropped row.
	reported atomic.Uint64
}

// NewRecorder starts the batched writer. Call Close to flush and stop it.
func NewRecorder(w EventWriter, opts RecorderOptions) *Recorder {
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	if opts.TallyWindow <= 0 {
		opts.TallyWindow = DefaultTallyWindow
	}
	if opts.TallyKeys <= 0 {
		opts.TallyKeys = DefaultTallyKeys
	}
	if opts.RefusalKeys <= 0 {
		opts.RefusalKeys = DefaultRefusalKeys
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Recorder{
		w:        w,
		opts:     opts,
		log:      opts.Logger.With("component", "detect"),
		queue:    newQueue[Event](opts.QueueSize),
		done:     make(chan struct{}),
		refusals: newMinuteTally(opts.RefusalKeys),
	}
	go r.loop()
	return r
}

// Record queues e without waiting. A full queue, or a stopped recorder,
// drops the event and counts it. Invite refusals and cooldown starts are
// counted into the tally rather than stored one by one.
func (r *Recorder) Record(e Event) { r.queue.Push(e) }

// PendingRefusals returns the rows of refusals by a layer (real or in
// shadow mode) counted in memory and not handed to the writer yet: up to
// a minute's worth, which a reader of the stored events adds to see
// today's figures as they are.
func (r *Recorder) PendingRefusals() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refusals.rows(nil)
}

// Dropped is the number of events lost to a full queue or a failed write.
func (r *Recorder) Dropped() uint64 { return r.queue.Dropped() + r.lost.Load() }

// Written is the number of events stored.
func (r *Recorder) Written() uint64 { return r.written.Load() }

// Close writes what is queued and stops the writer. It gives up when ctx
// ends; what was still queued then is lost and counted as dropped.
func (r *Recorder) Close(ctx context.Context) error {
	r.queue.Close()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Recorder) loop() {
	defer close(r.done)
	batch := make([]Event, 0, r.opts.BatchSize)
	t := newTally(r.opts.TallyWindow, r.opts.TallyKeys)
	rt := r.refusals
	// The per-minute tallies: refusals by a layer (shared with
	// PendingRefusals, so under r.mu), reads answered from storage.
	answers := newMinuteTally(r.opts.RefusalKeys)
	drainMinutes := func(batch []Event, now time.Time, all bool) []Event {
		r.mu.Lock()
		if all || rt.due(now) {
			batch = rt.drain(batch)
		}
		r.mu.Unlock()
		if all || answers.due(now) {
			batch = answers.drain(batch)
		}
		return batch
	}
	timer := time.NewTimer(r.opts.FlushInterval)
	defer timer.Stop()
	// The timer runs only while something waits to be written (a partial
	// batch, a tally, a count of lost events): an idle service is not woken
	// five times a second for nothing.
	armed := true
	idle := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(batch) == 0 && t.start.IsZero() && rt.start.IsZero() && answers.start.IsZero() &&
			r.Dropped() == r.reported.Load()
	}
	// take files one event into the batch or a tally, and writes a full
	// batch.
	take := func(e Event) {
		switch {
		case layerTallied(e):
			r.mu.Lock()
			if !rt.start.IsZero() && e.Time.Truncate(RefusalWindow).After(rt.start) {
				batch = rt.drain(batch)
			}
			rt.add(e)
			r.mu.Unlock()
		case answerTallied(e):
			if !answers.start.IsZero() && e.Time.Truncate(RefusalWindow).After(answers.start) {
				batch = answers.drain(batch)
			}
			answers.add(e)
		case tallied(e):
			if !t.start.IsZero() && t.windowOf(e.Time).After(t.start) {
				batch = t.drain(batch)
			}
			t.add(e)
		default:
			batch = append(batch, e)
		}
		if len(batch) >= r.opts.BatchSize {
			batch = r.flush(batch)
		}
	}
	items := r.queue.Items()
	for {
		select {
		case e, ok := <-items:
			// Take it and what else is queued, then let the next events
			// gather in the queue for a moment: a request that hands its
			// event to a waiting recorder wakes it, and under load that
			// was a goroutine switch (often a thread woken) per request.
			// The queue holds far more than a pause's worth of events.
			for more := ok; more; {
				take(e)
				select {
				case e, ok = <-items:
					more = ok
				default:
					more = false
				}
			}
			if !ok {
				r.flush(r.dropped(drainMinutes(t.drain(batch), time.Time{}, true)))
				return
			}
			if !armed {
				timer.Reset(r.opts.FlushInterval)
				armed = true
			}
			time.Sleep(gatherPause)
		case <-timer.C:
			now := r.opts.Now()
			if t.due(now) {
				batch = t.drain(batch)
			}
			batch = drainMinutes(batch, now, false)
			batch = r.flush(r.dropped(batch))
			if armed = !idle(); armed {
				timer.Reset(r.opts.FlushInterval)
			}
		}
	}
}

// gatherPause is how long the recorder lets events gather in its queue
// after taking all that were there: at most 500 wake-ups a second however
// many requests there are, and a default queue of 8,192 events holds 2 ms
// of four million requests a second.
const gatherPause = 2 * time.Millisecond

// dropped appends a row of OutcomeDropped counting the events lost since
// the last such row, if any were, so that a replay of the stored events
// knows what it misses. A row that is lost itself is counted again.
func (r *Recorder) dropped(batch []Event) []Event {
	lost := r.Dropped()
	if n := lost - r.reported.Load(); n > 0 {
		r.reported.Store(lost)
		batch = append(batch, Event{Time: r.opts.Now(), Outcome: OutcomeDropped, Count: int64(n)})
	}
	return batch
}

// flush writes batch and returns it emptied for reuse.
func (r *Recorder) flush(batch []Event) []Event {
	if len(batch) == 0 {
		return batch
	}
	// A row of OutcomeDropped is no event of its own: it is not counted
	// as written or lost, and a lost one is reported again.
	events, losses := uint64(len(batch)), uint64(0)
	for _, e := range batch {
		if e.Outcome == OutcomeDropped && e.Route == "" {
			events--
			losses += uint64(e.Count)
		}
	}
	if err := r.w.AppendEvents(batch); err != nil {
		r.reported.Add(-losses)
		r.lost.Add(events)
		if r.failed.Add(1) == 1 || r.failed.Load()%100 == 0 {
			r.log.Warn("statistics events dropped", "events", len(batch), "failures", r.failed.Load(), "err", err)
		}
	} else {
		r.written.Add(events)
	}
	return batch[:0]
}
