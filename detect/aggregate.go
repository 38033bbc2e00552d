package detect

import (
	"maps"
	"slices"
	"strings"
	"time"

	"breakwater/limiter"
)

// Routes whose statistics events detection reads.
const (
	// RouteInvite is the route of invite checks. Their events carry the
	// refusal reason as Outcome ("invalid", "cooldown", ...) or "ok", the
	// client IP and the submitted e-mail as UserID.
	RouteInvite = "/v1/invites/verify"
	// OutcomeCooldownStarted marks the event that a failed invite check
	// started a cooldown: one per cooled-down key, with either IP or
	// UserID (the e-mail) set. It is not a check of its own; the brute-
	// force detector counts these, not the refusals during a cooldown
	// (an attacker who waits each cooldown out makes none of those).
	OutcomeCooldownStarted = "cooldown_started"
	// OutcomeCached marks a read answered from the dedupe window (the same
	// image again), and OutcomeReplayed one answered from its idempotency
	// key: neither reached the upstream. The Recorder stores them as rows
	// per key and minute (RefusalWindow), their number in Count; older
	// versions stored one event apiece.
	OutcomeCached   = "cached"
	OutcomeReplayed = "replayed"
	// OutcomeRefused marks a row that sums the invite refusals of one IP
	// (or of Other) or of one e-mail over a stretch of time, in Count. It
	// counts for that key only; the service's checks are in rows with the
	// refusal reason as Outcome and neither IP nor UserID.
	OutcomeRefused = "refused"
	// RoutePrefix starts the Route of a guarded route of the app's
	// ("route:checkout"): those events are stored for the operator but are
	// not OCR attempts, so the daily figures and detectors leave them out.
	RoutePrefix = "route:"
	// OutcomeLayerRefused marks a row that sums the requests of one key
	// (user or client key, route, layer) that a layer refused before the
	// upstream call, over one minute, in Count; OutcomeShadowRefused one
	// that sums the refusals a layer in shadow mode would have made (those
	// requests went on and have events of their own). Neither is an
	// attempt: the daily aggregate skips them.
	OutcomeLayerRefused  = "layer_refused"
	OutcomeShadowRefused = "shadow_refused"
	// OutcomeDropped marks a row whose Count is the statistics events lost
	// (a full queue or a failed write) since the previous such row.
	OutcomeDropped = "dropped"
)

// DayBounds returns the first instant of day (a "2006-01-02" in loc) and
// the first of the next: 24 hours apart, or 23 or 25 across a change of
// daylight saving time.
func DayBounds(day string, loc *time.Location) (from, to time.Time, err error) {
	d, err := time.ParseInLocation("2006-01-02", day, loc)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	return d, time.Date(d.Year(), d.Month(), d.Day()+1, 0, 0, 0, 0, loc), nil
}

// addDays moves a "2006-01-02" day by n calendar days.
func addDays(day string, n int) string {
	d, err := time.Parse("2006-01-02", day)
	if err != nil {
		return day
	}
	return d.AddDate(0, 0, n).Format("2006-01-02")
}

// Lines are the daily abuse lines in force, for the grey zone.
type Lines struct {
	ByPlan map[string]int64 // plan name to its daily line (0: none)
	// ByUser is each stored user's line by their plan now: the fallback
	// for events that carry no plan (recorded by older versions).
	ByUser map[string]int64
}

// of returns the line for user whose last event of the day was made under
// plan ("" if it carries none). JWT users are known only by their events.
func (l Lines) of(user, plan string) int64 {
	if line, ok := l.ByPlan[plan]; ok && plan != "" {
		return line
	}
	return l.ByUser[user]
}

// Aggregator sums one day's statistics events, one at a time, per user,
// per client IP, per submitted invite e-mail and for the whole service:
// its memory depends on how many users, IPs and e-mails the day saw, not
// on how many events. Users need an API key or a JWT and an upstream call
// per attempt, so they are counted one by one; IPs and e-mails are
// chosen by whoever sends the request, so at most max_keys of each are
// kept, the heaviest (by invite cooldowns, then distinct users, then
// attempts, then invite failures), and the rest are summed under Other.
//
// Every event not on RouteInvite is an OCR attempt that reached the
// upstream; outcome "ok" is a success and anything else a failure. On
// RouteInvite, an event is either one invite check (outcome "ok" or the
// refusal reason; older versions stored each refusal so, with its IP and
// e-mail), or a row that sums several (Count) recorded by the Recorder:
// OutcomeRefused per IP or per e-mail, OutcomeCooldownStarted per IP or
// per e-mail, and the service's refusals by reason with neither.
type Aggregator struct {
	s       DayStats
	lines   Lines
	max     int
	ips     *bounded[ipRow]
	emails  *bounded[IPDay]
	userIPs map[string]map[string]struct{} // user to their distinct IP keys, at most max each
	plans   map[string]string              // user to the plan of their last event
}

// ipRow is one IP's figures while a day is summed: the distinct users
// are a set until Done counts them.
type ipRow struct {
	day   IPDay
	users map[string]struct{}
}

// NewAggregator starts the aggregate of day. Each user's daily abuse line
// comes from the plan of their last event that day, or, for events
// without one, from lines.ByUser (missing or 0: none). maxKeys bounds the
// IPs and the e-mails kept (0: DefaultMaxKeys).
func NewAggregator(day string, lines Lines, maxKeys int) *Aggregator {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	ips := newBounded(maxKeys, func(a, b *ipRow) bool {
		return outranks(
			[4]int64{a.day.InviteCooldowns, int64(len(a.users)), a.day.Attempts, a.day.InviteFailures},
			[4]int64{b.day.InviteCooldowns, int64(len(b.users)), b.day.Attempts, b.day.InviteFailures})
	}, func(into, from *ipRow) {
		into.day.Attempts += from.day.Attempts
		into.day.InviteFailures += from.day.InviteFailures
		into.day.InviteCooldowns += from.day.InviteCooldowns
		for u := range from.users {
			addKey(&into.users, u)
		}
	})
	emails := newBounded(maxKeys, func(a, b *IPDay) bool {
		return outranks([4]int64{a.InviteCooldowns, a.InviteFailures}, [4]int64{b.InviteCooldowns, b.InviteFailures})
	}, func(into, from *IPDay) {
		into.InviteFailures += from.InviteFailures
		into.InviteCooldowns += from.InviteCooldowns
	})
	return &Aggregator{
		s:     DayStats{Day: day, Users: map[string]UserDay{}},
		lines: lines, max: maxKeys, ips: ips, emails: emails,
		userIPs: map[string]map[string]struct{}{}, plans: map[string]string{},
	}
}

// Add counts one event.
func (a *Aggregator) Add(e Event) {
	if strings.HasPrefix(e.Route, RoutePrefix) || e.Layer != "" || e.Outcome == OutcomeDropped {
		return // a guarded route's; refusals before the call, shadow counts, losses: no attempt
	}
	if e.Route == RouteInvite {
		a.addInvite(e)
		return
	}
	if e.Outcome == OutcomeCached || e.Outcome == OutcomeReplayed {
		// Answered from storage: no attempt reached the upstream, but a
		// user sending one image again and again shows here. The
		// Recorder stores them per key and minute (Count); the row of
		// Other, past its keys, is the service's only.
		a.s.Service.Cached += e.N()
		if e.UserID != "" && e.UserID != Other {
			u := a.s.Users[e.UserID]
			u.Cached += e.N()
			a.s.Users[e.UserID] = u
		}
		return
	}
	s := &a.s.Service
	s.Attempts++
	s.CostMicroUSD += e.CostMicroUSD
	ok := e.Outcome == "ok"
	if ok {
		s.Successes++
	} else {
		s.Failures++
	}
	ip := limiter.ClientKey(e.IP)
	var row *ipRow
	if ip != "" {
		row = a.ips.get(ip)
		if row.day.Attempts == 0 {
			s.IPs++ // exact while the IPs fit max_keys; past it, a folded IP seen again counts again
		}
		row.day.Attempts++
	}
	if e.UserID == "" {
		return
	}
	if e.Plan != "" {
		a.plans[e.UserID] = e.Plan
	}
	u := a.s.Users[e.UserID]
	u.Attempts++
	if ok {
		u.Successes++
	} else {
		u.Failures++
	}
	u.Bytes += e.Bytes
	u.PromptTokens += int64(e.PromptTokens)
	u.OutputTokens += int64(e.OutputTokens)
	u.CostMicroUSD += e.CostMicroUSD
	a.s.Users[e.UserID] = u
	if row != nil {
		addKey(&row.users, e.UserID)
		set := a.userIPs[e.UserID]
		if len(set) < a.max {
			addKey(&set, ip)
			a.userIPs[e.UserID] = set
		}
	}
}

// addInvite counts an event of RouteInvite.
func (a *Aggregator) addInvite(e Event) {
	n := e.N()
	ip := limiter.ClientKey(e.IP)
	switch e.Outcome {
	case OutcomeCooldownStarted:
		if ip != "" {
			a.ips.get(ip).day.InviteCooldowns += n
		}
		if e.UserID != "" {
			a.emails.get(e.UserID).InviteCooldowns += n
		}
	case OutcomeRefused:
		if ip != "" {
			a.ips.get(ip).day.InviteFailures += n
		}
		if e.UserID != "" {
			a.emails.get(e.UserID).InviteFailures += n
		}
	default: // checks: one per event, or the service's refusals of a reason
		a.s.Service.Invites += n
		if e.Outcome == "ok" {
			return
		}
		if ip != "" {
			a.ips.get(ip).day.InviteFailures += n
		}
		if e.UserID != "" {
			a.emails.get(e.UserID).InviteFailures += n
		}
	}
}

// Done returns the day's aggregate. The Aggregator is not used after it.
func (a *Aggregator) Done() DayStats {
	s := a.s
	for id, u := range s.Users {
		u.IPs = int64(len(a.userIPs[id]))
		u.Line = a.lines.of(id, a.plans[id])
		s.Users[id] = u
	}
	s.IPs = map[string]IPDay{}
	a.ips.each(func(key string, r *ipRow) {
		d := r.day
		d.Users = int64(len(r.users))
		if len(r.users) > 1 { // a shared IP: name its users, a bounded few
			d.UserIDs = slices.Sorted(maps.Keys(r.users))[:min(len(r.users), MaxNamedUsers)]
		}
		s.IPs[key] = d
	})
	s.Emails = map[string]IPDay{}
	a.emails.each(func(key string, d *IPDay) { s.Emails[key] = *d })
	s.Service.Users = int64(len(s.Users))
	return s
}

// Aggregate sums events with an Aggregator bounded at DefaultMaxKeys.
func Aggregate(day string, events []Event, lines Lines) DayStats {
	a := NewAggregator(day, lines, 0)
	for _, e := range events {
		a.Add(e)
	}
	return a.Done()
}

// addKey adds k to the set *m, making it if need be.
func addKey(m *map[string]struct{}, k string) {
	if *m == nil {
		*m = map[string]struct{}{}
	}
	(*m)[k] = struct{}{}
}
