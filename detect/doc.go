// Package detect keeps the statistics that abuse detection reads: one event
// per attempt, apart from billing data, so that refunds and plan changes can
// never distort it.
//
// Recording is fail-open and silent: Record never blocks and never fails a
// response. Events go through a bounded queue to one batched writer; when
// the queue is full an event is dropped and counted, never waited for.
package detect
