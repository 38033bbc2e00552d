package api

import (
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"breakwater/detect"
	"breakwater/limiter"
)

// The defense layers a request meets before the upstream call. Layers 1, 2
// and 3 fail open: each is one of several, so when its own machinery fails
// (a panic, a persistence error) the request goes on and the fault is
// counted. Money integrity (quota, usage record) fails closed elsewhere.
// The guard runs every fail-open check (guard.Guard for the layers of
// POST /v1/ocr and of the guarded routes, guard.FailOpen for the invite
// limits and the routes' fail limits); its FailedOpen hook is failOpens.note.

// Defaults of [limits.user], layer 1: what a key left out of config.toml
// means. Only an explicit 0 switches the rate or the burst limit off.
const (
	DefaultUserRate   = 60
	DefaultUserWindow = time.Minute
	DefaultUserBurst  = 5
)

// DefaultUserLimits is [limits.user] when config.toml leaves every key out.
// Decode config.toml over it, so that an absent key keeps its default.
func DefaultUserLimits() limiter.Config {
	return limiter.Config{Rate: DefaultUserRate, Window: DefaultUserWindow, Burst: DefaultUserBurst, Mode: limiter.ModeEnforce}
}

// failOpens counts fail-open events and logs each layer's at most once a
// minute, so a broken disk cannot flood the log.
type failOpens struct {
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time

	alerts Alerter

	mu     sync.Mutex
	logged map[string]time.Time
	missed map[string]int
	recent map[string][]time.Time // each layer's faults within failOpenAlertWindow
}

const failOpenLogEvery = time.Minute

// A layer that fails open failOpenAlertAfter times within
// failOpenAlertWindow raises an alert: one fault is noise, a run of them
// means the layer is not protecting anything.
const (
	failOpenAlertAfter  = 5
	failOpenAlertWindow = time.Minute
)

// ErrDecidedAlone wraps the fault of a limit shared on PostgreSQL that
// this instance decided in memory, the database not answering (the
// wiring wraps the shared limits' faults with it).
var ErrDecidedAlone = errors.New("decided by this instance alone: the database did not answer")

// refusedClosed is an error that says the request it concerns was
// refused, not let through: a fail-open check decided in one write with
// one that fails closed (on PostgreSQL, the daily line's attempt with the
// quota slot), whose failure refused the request.
type refusedClosed interface{ RefusedClosed() bool }

// faultLine is the log line of a fail-open layer's fault err: what
// became of the request.
func faultLine(err error) string {
	var rc refusedClosed
	switch {
	case errors.As(err, &rc) && rc.RefusedClosed():
		return "defense layer failed, and the request was refused (503 usage_unavailable): the quota slot, written with it, fails closed"
	case errors.Is(err, ErrDecidedAlone):
		return "defense layer failed open: a shared limit decided by this instance alone, the database not answering"
	}
	return "defense layer failed open: request let through"
}

func (f *failOpens) note(layer string, err error) {
	f.metrics.failOpen.WithLabelValues(layer).Inc()
	now := f.now()
	f.mu.Lock()
	recent := append(f.recent[layer], now)
	for len(recent) > 0 && now.Sub(recent[0]) > failOpenAlertWindow {
		recent = recent[1:]
	}
	if len(recent) >= failOpenAlertAfter {
		f.metrics.alertsRaised.WithLabelValues(detect.KindFailOpen).Inc()
		f.alerts.Alert(detect.KindFailOpen, "a defense layer is failing open repeatedly: requests are let through unchecked, or a limit shared on PostgreSQL is decided by this instance alone",
			map[string]string{"layer": layer, "faults_last_minute": strconv.Itoa(len(recent)), "last_error": err.Error()})
		recent = recent[:0]
	}
	f.recent[layer] = recent
	last, seen := f.logged[layer]
	if seen && now.Sub(last) < failOpenLogEvery {
		f.missed[layer]++
		f.mu.Unlock()
		return
	}
	missed := f.missed[layer]
	f.logged[layer], f.missed[layer] = now, 0
	f.mu.Unlock()
	f.log.Error(faultLine(err), "layer", layer, "err", err, "unlogged_since_last", missed)
}
