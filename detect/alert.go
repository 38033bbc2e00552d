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
)

// DefaultAlertQueue is how many alerts wait to be stored and mailed.
const DefaultAlertQueue = 64

// AlertStore keeps when each kind was last sent: a storage backend.
type AlertStore interface {
	SaveAlertState(st AlertState) error
	AlertStates() ([]AlertState, error)
}

// AlerterOptions are the Alerter's settings and optional parts.
type AlerterOptions struct {
	// MinInterval is the least time between two alerts of one kind.
	// Default DefaultMinInterval (1h).
	MinInterval time.Duration
	Location    *time.Location // budget.timezone, whose midnight re-arms every kind; required
	// Mail sends the alerts; nil means mail is off (alerts are logged at
	// WARN either way).
	Mail      Sender
	QueueSize int // default DefaultAlertQueue
	Counters  *Counters
	Logger    *slog.Logger
	Now       func() time.Time
}

// Alerter raises immediate alerts: each kind at most once per
// MinInterval, and again after the daily reset (midnight in the budget's
// time zone), whatever the interval. When each kind was last sent is
// stored, so a restart sends no duplicate. Alert never waits: the check is
// in memory, and storing, logging and mailing happen on a goroutine of
// its own.
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
	if !kindPattern.MatchString(kind) {
		kind = "alert"
	}
	now := a.o.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.queue.Closed() || a.suppressed(a.last[kind], now) {
		return
	}
	st := AlertState{Kind: kind, SentAt: now, Summary: summary}
	a.last[kind] = st
	if !a.queue.Push(pending{st: st, details: details}) {
		a.o.Counters.AlertFailures.Add(1)
	}
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
		out = append(out, st)
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
		if err := a.store.SaveAlertState(p.st); err != nil {
			a.o.Counters.AlertFailures.Add(1)
			a.log.Error("alert state not stored: a restart may repeat this alert", "kind", p.st.Kind, "err", err)
		}
		a.log.Warn("ALERT "+p.st.Kind, "summary", Escape(p.st.Summary), "details", detailsText(p.details))
		if a.o.Mail != nil {
			a.o.Mail.Send(AlertSubject(p.st.Kind), AlertBody(p.st, p.details, a.o.Location))
		}
	}
}

// AlertSubject is the fixed subject of an alert of kind (a kind matched
// by kindPattern, so no user text reaches a header).
func AlertSubject(kind string) string {
	return "alert: " + strings.ReplaceAll(kind, "_", " ")
}

// AlertBody is an alert's plain-text body: the summary on one line, then
// the details, every value escaped.
func AlertBody(st AlertState, details map[string]string, loc *time.Location) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nkind: %s\ntime: %s\n", Escape(st.Summary), st.Kind, st.SentAt.In(loc).Format("2006-01-02 15:04:05 MST"))
	keys := slices.Sorted(maps.Keys(details))
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\n", Escape(k), Escape(details[k]))
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
