package detect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Alert kinds raised by the service itself. Other kinds may be added by
// callers; a kind is a short snake_case name.
const (
	KindBrakeEngaged       = "brake_engaged"        // the global budget brake refused a call
	KindUsageCommitFailed  = "usage_commit_failed"  // a usage record could not be written: 503s
	KindFailOpen           = "layer_failing_open"   // a defense layer failed open repeatedly
	KindInviteNet          = "invite_net_tripped"   // the invite service-wide fail net tripped
	KindUpstreamKeyRefused = "upstream_key_refused" // the upstream refused GEMINI_API_KEY: every read fails
	// KindUpstreamSpendCap: the upstream refused a call because the
	// project's own spend cap is reached: every read fails.
	KindUpstreamSpendCap = "upstream_spend_cap"
	// KindUpstreamCredits: the upstream refused a call because the
	// project's prepaid credit is used up: every read fails.
	KindUpstreamCredits = "upstream_credits_depleted"
	// KindUpstreamModel: the upstream does not know ocr.model (not found
	// or retired): every read fails.
	KindUpstreamModel = "upstream_model_not_found"
	// KindUpstreamBilling: the upstream refused a call because the
	// project's billing is off or not set up: every read fails.
	KindUpstreamBilling = "upstream_billing"
	// KindUpstreamRateLimited: a run of calls refused by the upstream's
	// rate or tier limit (429 RESOURCE_EXHAUSTED); one alone is no alert.
	KindUpstreamRateLimited = "upstream_rate_limited"
	// KindDegraded: a soft ceiling of [budget] is reached, and reads go
	// to ocr.fallback_model (degraded mode).
	KindDegraded = "budget_degraded"
	// KindRestored: no soft ceiling is reached any more (a new day or
	// month, or a raised ceiling), and reads go to ocr.model again.
	KindRestored = "budget_restored"
	// KindLedgerDrift: the daily reconciliation found a day whose bill
	// from Google is beyond reconcile.max_drift of the ledger's count.
	KindLedgerDrift = "ledger_drift"
	// KindTest is the alert of breakwater alerts test.
	KindTest = "test"
)

// Severities of a Notice.
const (
	SeverityCritical = "critical" // reads are refused or failing now
	SeverityWarning  = "warning"  // something to act on soon
	SeverityInfo     = "info"     // a test
)

// criticalKinds stop reads: every call is refused or fails.
var criticalKinds = map[string]bool{
	KindBrakeEngaged: true, KindUsageCommitFailed: true, KindUpstreamKeyRefused: true,
	KindUpstreamSpendCap: true, KindUpstreamCredits: true, KindUpstreamModel: true, KindUpstreamBilling: true,
}

// SeverityOf is the severity of an alert of kind.
func SeverityOf(kind string) string {
	switch {
	case criticalKinds[kind]:
		return SeverityCritical
	case kind == KindTest:
		return SeverityInfo
	}
	return SeverityWarning
}

// Notice is one alert as a channel delivers it.
type Notice struct {
	Kind     string
	Severity string
	Summary  string            // one line, escaped
	Details  map[string]string // the figures, escaped
	Time     time.Time
	// Dashboard is the link to the dashboard ([alerts] dashboard_url);
	// empty without one.
	Dashboard string
	Subject   string // the mail's subject, without the "[breakwater] " prefix
	Text      string // the mail's plain-text body
}

// Notifier delivers an alert on one channel without waiting (a Webhook),
// and reports false when it dropped it.
type Notifier interface {
	Notify(n Notice) bool
}

// DefaultAlertQueue is how many alerts wait to be stored and mailed.
const DefaultAlertQueue = 64

// AlertStore keeps when each kind was last sent: a storage backend.
type AlertStore interface {
	SaveAlertState(st AlertState) error
	AlertStates() ([]AlertState, error)
}

// AlertClaimer is what a store that several instances share may also
// offer: the right to send an alert, claimed in one atomic step, so that
// of the instances that raise the same alert, one sends it. Without it
// (one instance), the state is stored after the check in memory.
type AlertClaimer interface {
	// ClaimAlert stores st unless the stored state of st.Kind holds it
	// back: a sending in the same Period after notBefore. It reports
	// whether st was stored and, when it was not, the state that held it
	// back.
	ClaimAlert(st AlertState, notBefore time.Time) (claimed bool, held AlertState, err error)
}

// AlerterOptions are the Alerter's settings and optional parts.
type AlerterOptions struct {
	// MinInterval is the least time between two alerts of one kind.
	// Default DefaultMinInterval (1h).
	MinInterval time.Duration
	Location    *time.Location // budget.timezone, whose midnight re-arms every kind; required
	// Mail sends the alerts; nil means mail is off (alerts are logged at
	// WARN either way).
	Mail Sender
	// Hooks are the other channels (webhooks); none by default.
	Hooks []Notifier
	// DashboardURL is the link notices carry; empty: none.
	DashboardURL string
	QueueSize    int // default DefaultAlertQueue
	Counters     *Counters
	Logger       *slog.Logger
	Now          func() time.Time
}

// Alerter raises immediate alerts: each kind at most once per
// MinInterval, and again after the daily reset (midnight in the budget's
// time zone), whatever the interval. When each kind was last sent is
// stored, so a restart sends no duplicate. Alert never waits: the check is
// in memory, and storing, logging and mailing happen on a goroutine of
// its own. On a store shared by several instances (an AlertClaimer) that
// goroutine claims each alert before sending it, so the service sends it
// once, whichever instances raise it.
type Alerter struct {
	store AlertStore
	o     AlerterOptions
	log   *slog.Logger
	queue *queue[pending]
	done  chan struct{}

	mu   sync.Mutex
	last map[string]AlertState
}

type pending struct {
	st      AlertState
	details map[string]string
	// silent: only store st (a lower share of an early warning, covered
	// by the alert of a higher one).
	silent bool
	// claim: st is a sending, claimed on a shared store unless one in
	// its period after notBefore holds it back; false for a re-arming.
	claim     bool
	notBefore time.Time
}

// NewAlerter loads the alert state from store and starts the Alerter.
// Close it to drain what is queued.
func NewAlerter(store AlertStore, o AlerterOptions) (*Alerter, error) {
	if store == nil || o.Location == nil {
		return nil, errors.New("detect: the alerter needs a store and a time zone")
	}
	if o.MinInterval <= 0 {
		o.MinInterval = DefaultMinInterval
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultAlertQueue
	}
	if o.Counters == nil {
		o.Counters = &Counters{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	states, err := store.AlertStates()
	if err != nil {
		return nil, err
	}
	a := &Alerter{
		store: store, o: o, log: o.Logger.With("component", "alerts"),
		queue: newQueue[pending](o.QueueSize), done: make(chan struct{}),
		last: map[string]AlertState{},
	}
	for _, st := range states {
		a.last[st.Kind] = st
	}
	go a.loop()
	return a, nil
}

var kindPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

// Alert raises an alert of kind, unless one was raised within
// MinInterval on the same day. summary is one line; details are figures
// or names, shown in the body only, escaped (they may come from users).
// It never blocks: a full queue drops the alert and counts it.
func (a *Alerter) Alert(kind, summary string, details map[string]string) {
	a.AlertWith(kind, func() (string, map[string]string) { return summary, details })
}

// AlertWith is Alert with the summary and details made by build, called
// only when the alert is raised: a caller that would raise the same alert
// on every refused request (the brake) makes its text once per
// MinInterval, not once per request. build runs without the Alerter's
// lock held.
func (a *Alerter) AlertWith(kind string, build func() (summary string, details map[string]string)) {
	if !kindPattern.MatchString(kind) {
		kind = "alert"
	}
	now := a.o.Now()
	a.mu.Lock()
	if a.queue.Closed() || a.suppressed(a.last[kind], now) {
		a.mu.Unlock()
		return
	}
	a.last[kind] = AlertState{Kind: kind, SentAt: now} // holds back the same kind while the text is made
	a.mu.Unlock()
	summary, details := build()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := AlertState{Kind: kind, SentAt: now, Summary: summary, Period: a.day(now)}
	a.last[kind] = st
	if !a.queue.Push(pending{st: st, details: details, claim: true, notBefore: now.Add(-a.o.MinInterval)}) {
		a.o.Counters.AlertFailures.Add(1)
	}
}

// day is the period of an immediate alert: its day in the budget's time
// zone, whose midnight re-arms every kind.
func (a *Alerter) day(t time.Time) string { return t.In(a.o.Location).Format("2006-01-02") }

// AlertOnce raises an alert of kind once per period, whatever
// MinInterval: unless the last alert of kind was sent in the same period,
// as period names the times (a day or a month key). The kinds in covers
// are stored as sent too, without an alert of their own: lower shares
// crossed at the same time as this one. It reports whether the alert was
// raised; like Alert, it never blocks.
func (a *Alerter) AlertOnce(kind string, period func(time.Time) string, summary string, details map[string]string, covers ...string) bool {
	now := a.o.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.queue.Closed() || a.sentIn(kind, period, now) {
		return false
	}
	for _, c := range covers {
		if a.sentIn(c, period, now) {
			continue
		}
		st := AlertState{Kind: c, SentAt: now, Summary: "covered by " + kind, Period: period(now)}
		a.last[c] = st
		a.queue.Push(pending{st: st, silent: true, claim: true})
	}
	st := AlertState{Kind: kind, SentAt: now, Summary: summary, Period: period(now)}
	a.last[kind] = st
	if !a.queue.Push(pending{st: st, details: details, claim: true}) {
		a.o.Counters.AlertFailures.Add(1)
	}
	return true
}

// Rearm forgets that alerts of kinds were sent, in memory and in the
// store (a state with no SentAt), so that each may be sent again: the
// early warnings of a ceiling the operator raised.
func (a *Alerter) Rearm(kinds ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range kinds {
		if last, ok := a.last[k]; !ok || last.SentAt.IsZero() || a.queue.Closed() {
			continue
		}
		st := AlertState{Kind: k}
		a.last[k] = st
		a.queue.Push(pending{st: st, silent: true})
	}
}

// SentIn reports whether an alert of kind was sent in the period of now.
func (a *Alerter) SentIn(kind string, period func(time.Time) string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sentIn(kind, period, now)
}

func (a *Alerter) sentIn(kind string, period func(time.Time) string, now time.Time) bool {
	last := a.last[kind]
	return !last.SentAt.IsZero() && period(last.SentAt) == period(now)
}

// suppressed reports whether an alert sent as last holds back one at now.
func (a *Alerter) suppressed(last AlertState, now time.Time) bool {
	if last.SentAt.IsZero() {
		return false
	}
	sameDay := last.SentAt.In(a.o.Location).Format("2006-01-02") == now.In(a.o.Location).Format("2006-01-02")
	return sameDay && now.Sub(last.SentAt) < a.o.MinInterval
}

// Recent returns the last alert of each kind, newest first.
func (a *Alerter) Recent() []AlertState {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]AlertState, 0, len(a.last))
	for _, st := range a.last {
		if !st.SentAt.IsZero() { // not a re-armed warning
			out = append(out, st)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SentAt.After(out[j].SentAt) })
	return out
}

// Close stops taking alerts and waits, until ctx ends, for the queued
// ones to be stored and handed to the mailer.
func (a *Alerter) Close(ctx context.Context) error {
	a.queue.Close()
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Alerter) loop() {
	defer close(a.done)
	for p := range a.queue.Items() {
		if !a.record(p) || p.silent {
			continue
		}
		a.log.Warn("ALERT "+p.st.Kind, "summary", Escape(p.st.Summary), "details", detailsText(p.details))
		n := NewNotice(p.st, p.details, a.o.Location, a.o.DashboardURL)
		if a.o.Mail != nil {
			a.o.Mail.Send(n.Subject, n.Text)
		}
		for _, h := range a.o.Hooks {
			h.Notify(n)
		}
	}
}

// record stores p's state, and reports whether p is still to be sent:
// false when another instance sent it (claimed it first on the shared
// store). The in-memory state then takes the stored one, which holds the
// kind back here too. A store that fails does not stop the alert: better
// twice than not at all.
func (a *Alerter) record(p pending) bool {
	claimer, shared := a.store.(AlertClaimer)
	if !shared || !p.claim {
		if err := a.store.SaveAlertState(p.st); err != nil {
			a.o.Counters.AlertFailures.Add(1)
			a.log.Error("alert state not stored: a restart may repeat this alert", "kind", p.st.Kind, "err", err)
		}
		return true
	}
	claimed, held, err := claimer.ClaimAlert(p.st, p.notBefore)
	switch {
	case err != nil:
		a.o.Counters.AlertFailures.Add(1)
		a.log.Error("alert not claimed in the shared state: sent from here, another instance may send it too", "kind", p.st.Kind, "err", err)
		return true
	case claimed:
		return true
	}
	a.mu.Lock()
	if cur := a.last[p.st.Kind]; cur.SentAt.Equal(p.st.SentAt) && !held.SentAt.IsZero() {
		a.last[p.st.Kind] = held
	}
	a.mu.Unlock()
	if !p.silent {
		a.log.Info("alert already sent by another instance: not sent again", "kind", p.st.Kind, "sent_at", held.SentAt)
	}
	return false
}

// NewNotice is the alert st with its details as every channel delivers
// it: its mail's subject and body, and the fields of a webhook's body.
func NewNotice(st AlertState, details map[string]string, loc *time.Location, dashboard string) Notice {
	esc := make(map[string]string, len(details))
	for k, v := range details {
		esc[Escape(k)] = Escape(v)
	}
	return Notice{
		Kind: st.Kind, Severity: SeverityOf(st.Kind), Summary: Escape(st.Summary), Details: esc,
		Time: st.SentAt, Dashboard: dashboard, Subject: AlertSubject(st.Kind), Text: AlertBody(st, details, loc, dashboard),
	}
}

// AlertSubject is the fixed subject of an alert of kind (a kind matched
// by kindPattern, so no user text reaches a header).
func AlertSubject(kind string) string {
	return "alert: " + strings.ReplaceAll(kind, "_", " ")
}

// AlertBody is an alert's plain-text body: the summary on one line, then
// the details, every value escaped, then what the operator can do (fixed
// text per kind) and the dashboard's link when there is one.
func AlertBody(st AlertState, details map[string]string, loc *time.Location, dashboard string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nkind: %s\ntime: %s\n", Escape(st.Summary), st.Kind, st.SentAt.In(loc).Format("2006-01-02 15:04:05 MST"))
	keys := slices.Sorted(maps.Keys(details))
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\n", Escape(k), Escape(details[k]))
	}
	if act := actionsOf(st.Kind); len(act) > 0 {
		b.WriteString("\nWhat to do:\n")
		for _, line := range act {
			b.WriteString("- " + line + "\n")
		}
	}
	if dashboard != "" {
		fmt.Fprintf(&b, "\ndashboard: %s\n", dashboard)
	}
	return b.String()
}

func detailsText(details map[string]string) string {
	keys := slices.Sorted(maps.Keys(details))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = Escape(k) + "=" + Escape(details[k])
	}
	return strings.Join(parts, " ")
}
