// Package detect is layer 4: it keeps the statistics that abuse detection
// reads, aggregates them once a day, runs the detectors over the
// aggregates, and sends alerts by e-mail and webhook.
//
// Statistics are one event per attempt, apart from billing data, so that
// refunds and plan changes can never distort them; invite refusals, which
// anyone can send without end, are counted per window into bounded rows
// instead. Recording is fail-open and silent: Record never blocks and
// never fails a response. Events go through a bounded queue to one
// batched writer; when the queue is full an event is dropped and counted,
// never waited for. A day's run streams its events into an Aggregator
// that keeps at most max_keys IPs and e-mails, so neither its memory nor
// the stored day grows with the traffic, and a day whose runs keep
// crashing the process is given up rather than run at every start.
//
// Detection does not block anyone; it makes sure a person notices. The
// Scheduler runs the Runner at [detect] run_at for the day before, and
// catches up missed days at start. The Alerter sends immediate alerts, each
// kind at most once per [alerts] min_interval; the Warner raises early
// warnings when a global budget figure first crosses a share of its
// ceiling (once per share and day or month), read from memory, never per
// request; each Webhook posts them to one URL; and the Mailer delivers them
// from a bounded queue with retries. None of it ever delays or fails a
// request: every fault is counted in Counters and logged. Detection
// thresholds are secret: nothing here is ever shown to API users.
package detect
