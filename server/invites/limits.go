package invites

import (
	"sync/atomic"
	"time"

	"breakwater/limiter"
	"breakwater/server/guard/state"
)

// Limits are the invite limits and their in-memory state: the per-IP
// rate windows and the fail limit (per IP, per e-mail, and service-wide).
// (The word "guard" belongs to server/guard, the layer pipeline.)
type Limits struct {
	Windows *limiter.Limiter
	Fails   *limiter.FailLimiter
	shadow  atomic.Bool // invites.mode = "shadow"
}

// SetShadow switches the protections to shadow mode (on) or to enforce
// mode, live.
func (g *Limits) SetShadow(on bool) { g.shadow.Store(on) }

// Shadow reports whether the protections are in shadow mode: a
// verification they refuse is counted and goes on.
func (g *Limits) Shadow() bool { return g.shadow.Load() }

// Layer names the invite limits in fail-open metrics and logs.
const Layer = "invites"

// State names under which the invite limits are written behind.
const (
	stateWindows = "invites/windows"
	stateFails   = "invites/fails"
	stateGlobal  = "invites/global"
)

// LoadLimits builds the invite limits for cfg and restores their state
// from store, so that a restart lifts no cooldown and resets no window.
func LoadLimits(store state.StateLoader, cfg Config, now time.Time) (*Limits, error) {
	g, err := NewLimits(cfg)
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

// Snapshots are the limits' state as the write-behind copies it.
func (g *Limits) Snapshots() []state.Snapshot {
	return []state.Snapshot{
		state.Windows(stateWindows, Layer, g.Windows),
		state.Fails(stateFails, stateGlobal, Layer, g.Fails),
	}
}

// NewLimits builds the invite limits for cfg, with empty state.
func NewLimits(cfg Config) (*Limits, error) {
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
	g := &Limits{Windows: w, Fails: f}
	g.SetShadow(cfg.Shadow())
	return g, nil
}
