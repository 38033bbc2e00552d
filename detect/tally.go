package detect

import (
	"time"

	"breakwater/limiter"
)

// Defaults for the Recorder's tally of invite refusals.
const (
	// DefaultTallyWindow is how long invite refusals and cooldown starts
	// are counted in memory before their rows are written. A multiple of
	// 15 minutes, so a window never straddles midnight in any time zone.
	DefaultTallyWindow = 15 * time.Minute
	// DefaultTallyKeys is the most IPs and the most e-mails, each, that
	// get a row of their own per window; the rest share the row of Other.
	DefaultTallyKeys = 64
	// maxTallyReasons bounds the refusal reasons of a window, in case a
	// caller ever passes free text as an outcome.
	maxTallyReasons = 32
)

// tallied reports whether the Recorder counts e in its tally rather than
// storing it: invite refusals and cooldown starts, which anyone can send
// without limit. Invite checks that pass ("ok") and OCR attempts are
// stored one by one.
func tallied(e Event) bool {
	return e.Route == RouteInvite && e.Layer == "" && e.Outcome != "ok" && e.Outcome != OutcomeRefused && e.Count == 0
}

// DefaultRefusalKeys is the most keys per minute whose refusals before
// the upstream call get a row of their own; the rest share the row of
// Other. Reads answered from storage are bounded alike, apart.
const DefaultRefusalKeys = 256

// RefusalWindow is the time resolution of the rows counted per minute:
// refusals by a layer (OutcomeLayerRefused, OutcomeShadowRefused) and
// reads answered from storage (OutcomeCached, OutcomeReplayed), one row
// per key, route, layer and outcome per minute.
const RefusalWindow = time.Minute

// layerTallied reports whether the Recorder counts e into the per-minute
// tally of refusals by a layer.
func layerTallied(e Event) bool {
	return e.Layer != "" && e.Count == 0 && (e.Outcome == OutcomeLayerRefused || e.Outcome == OutcomeShadowRefused)
}

// answerTallied reports whether the Recorder counts e into the per-minute
// tally of reads answered from storage: a key may send one image again
// and again at its rate limit, each answer free, and one row apiece kept
// for the retention would cost more than the reads.
func answerTallied(e Event) bool {
	return e.Layer == "" && e.Count == 0 && e.Route != RouteInvite && (e.Outcome == OutcomeCached || e.Outcome == OutcomeReplayed)
}

// minuteKey is what a per-minute row keeps of a request: who (user, API
// key, client key), where (route, plan), and what became of it (the layer
// that refused it, for real or in shadow, or its outcome and status).
type minuteKey struct{ user, keyID, ip, plan, route, layer, outcome string }

// minuteTally counts one minute of events per minuteKey, at most keys
// rows (the rest summed under Other): however many requests a flood
// sends, a minute writes at most keys+1 rows per outcome and layer.
type minuteTally struct {
	keys   int
	start  time.Time
	counts map[minuteKey]int64
	status map[minuteKey]int   // the HTTP status of each key's events (the last)
	other  map[minuteKey]int64 // keyed by route, layer and outcome only
}

func newMinuteTally(keys int) *minuteTally {
	return &minuteTally{keys: keys, counts: map[minuteKey]int64{}, status: map[minuteKey]int{}, other: map[minuteKey]int64{}}
}

func (t *minuteTally) add(e Event) {
	if t.start.IsZero() {
		t.start = e.Time.Truncate(RefusalWindow)
	}
	k := minuteKey{user: e.UserID, keyID: e.KeyID, ip: limiter.ClientKey(e.IP), plan: e.Plan, route: e.Route, layer: e.Layer, outcome: e.Outcome}
	if _, ok := t.counts[k]; ok || len(t.counts) < t.keys {
		t.counts[k]++
		if e.Status != 0 {
			t.status[k] = e.Status
		}
		return
	}
	t.other[minuteKey{route: k.route, layer: k.layer, outcome: k.outcome}]++
}

// due reports whether the minute counted has ended by now.
func (t *minuteTally) due(now time.Time) bool {
	return !t.start.IsZero() && !now.Before(t.start.Add(RefusalWindow))
}

// drain appends the minute's rows to batch and empties the tally.
func (t *minuteTally) drain(batch []Event) []Event {
	if t.start.IsZero() {
		return batch
	}
	batch = t.rows(batch)
	t.start = time.Time{}
	clear(t.counts)
	clear(t.status)
	clear(t.other)
	return batch
}

// rows appends the minute's rows to batch, leaving the tally as it is.
func (t *minuteTally) rows(batch []Event) []Event {
	if t.start.IsZero() {
		return batch
	}
	for k, n := range t.counts {
		batch = append(batch, Event{Time: t.start, UserID: k.user, KeyID: k.keyID, IP: k.ip, Plan: k.plan, Route: k.route,
			Layer: k.layer, Outcome: k.outcome, Status: t.status[k], Count: n})
	}
	for k, n := range t.other {
		batch = append(batch, Event{Time: t.start, UserID: Other, Route: k.route, Layer: k.layer, Outcome: k.outcome, Count: n})
	}
	return batch
}

// inviteCount is one key's figures in a tally window.
type inviteCount struct{ refused, cooldowns int64 }

// tally counts one window of invite refusals and cooldown starts: per
// IP key and per e-mail, bounded, and for the service by reason. Its rows
// (see OutcomeRefused) are at most 4*(keys+1) plus the reasons, however
// many refusals the window saw.
type tally struct {
	window  time.Duration
	keys    int
	start   time.Time // the window counted; zero while empty
	ips     *bounded[inviteCount]
	emails  *bounded[inviteCount]
	reasons map[string]int64
}

func newTally(window time.Duration, keys int) *tally {
	t := &tally{window: window, keys: keys}
	t.reset()
	return t
}

func (t *tally) reset() {
	heavier := func(a, b *inviteCount) bool {
		return outranks([4]int64{a.cooldowns, a.refused}, [4]int64{b.cooldowns, b.refused})
	}
	merge := func(into, from *inviteCount) {
		into.refused += from.refused
		into.cooldowns += from.cooldowns
	}
	t.start = time.Time{}
	t.ips = newBounded(t.keys, heavier, merge)
	t.emails = newBounded(t.keys, heavier, merge)
	t.reasons = map[string]int64{}
}

// windowOf is the start of the window that holds at.
func (t *tally) windowOf(at time.Time) time.Time { return at.Truncate(t.window) }

// due reports whether the window counted has ended by now.
func (t *tally) due(now time.Time) bool {
	return !t.start.IsZero() && !now.Before(t.start.Add(t.window))
}

// add counts e into the current window (an event from an older window,
// late by a moment, is counted into the current one).
func (t *tally) add(e Event) {
	if t.start.IsZero() {
		t.start = t.windowOf(e.Time)
	}
	ip := limiter.ClientKey(e.IP)
	if e.Outcome == OutcomeCooldownStarted {
		if ip != "" {
			t.ips.get(ip).cooldowns++
		}
		if e.UserID != "" {
			t.emails.get(e.UserID).cooldowns++
		}
		return
	}
	reason := e.Outcome
	if _, ok := t.reasons[reason]; !ok && len(t.reasons) >= maxTallyReasons {
		reason = Other
	}
	t.reasons[reason]++
	if ip != "" {
		t.ips.get(ip).refused++
	}
	if e.UserID != "" {
		t.emails.get(e.UserID).refused++
	}
}

// drain appends the window's rows to batch and empties the tally.
func (t *tally) drain(batch []Event) []Event {
	if t.start.IsZero() {
		return batch
	}
	at := t.start
	for reason, n := range t.reasons {
		batch = append(batch, Event{Time: at, Route: RouteInvite, Outcome: reason, Count: n})
	}
	rows := func(b *bounded[inviteCount], row func(key string) Event) {
		b.each(func(key string, c *inviteCount) {
			for _, r := range []struct {
				outcome string
				n       int64
			}{{OutcomeRefused, c.refused}, {OutcomeCooldownStarted, c.cooldowns}} {
				if r.n > 0 {
					e := row(key)
					e.Time, e.Route, e.Outcome, e.Count = at, RouteInvite, r.outcome, r.n
					batch = append(batch, e)
				}
			}
		})
	}
	rows(t.ips, func(key string) Event { return Event{IP: key} })
	rows(t.emails, func(key string) Event { return Event{UserID: key} })
	t.reset()
	return batch
}
