package invites

import (
	"sync/atomic"
	"time"

	"breakwater/limiter"
	"breakwater/server/guard/state"
)

// Guard is the in-memory state of the invite protections: the
// per-IP rate windows and the fail limit (per IP, per e-mail, and
// service-wide).
type Guard struct {
	Windows *limiter.Limiter
	Fails   *limiter.FailLimiter
	shadow  atomic.Bool // invites.mode = "shadow"
}

// SetShadow switches the protections to shadow mode (on) or to enforce
// mode, live.
func (g *Guard) SetShadow(on bool) { g.shadow.Store(on) }

// Shadow reports whether the protections are in shadow mode: a
// verification they refuse is counted and goes on.
func (g *Guard) Shadow() bool { return g.shadow.Load() }

// Layer names the invite guard in fail-open metrics and logs.
const Layer = "invites"

// State names under which the invite guard is written behind.
const (
	stateWindows = "invites/windows"
	stateFails   = "invites/fails"
	stateGlobal  = "invites/global"
)

// LoadGuard builds the invite guard for cfg and restores its state
// from store, so that a restart lifts no cooldown and resets no window.
func LoadGuard(store state.StateLoader, cfg Config, now time.Time) (*Guard, error) {
	g, err := NewGuard(cfg)
	if err != nil {
		return nil, err
	}
	if err := state.LoadWindows(store, stateWindows, g.Windows, now); err != nil {
		return nil, err
	}
	if err := state.LoadFails(store, stateFails, stateGlobal, g.Fails); err != nil {
		return nil, err
	}
	return g, nil
}

// Snapshots are the guard's state as the write-behind copies it.
func (g *Guard) Snapshots() []state.Snapshot {
	return []state.Snapshot{
		state.Windows(stateWindows, Layer, g.Windows),
		state.Fails(stateFails, stateGlobal, Layer, g.Fails),
	}
}

// NewGuard builds an empty invite guard for cfg.
func NewGuard(cfg Config) (*Guard, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w, err := limiter.New(cfg.Limits())
	if err != nil {
		return nil, err
	}
	f, err := limiter.NewFail(cfg.Fail())
	if err != nil {
		return nil, err
	}
	g := &Guard{Windows: w, Fails: f}
	g.SetShadow(cfg.Shadow())
	return g, nil
}
