// Package guard runs the layers that stand between a request and the
// expensive call, in the order of the layer table: the rate limit
// (layer 1), the daily abuse line (2), the plan quota (2b), the global
// budget (3), and after the call the durable usage record ($). It knows
// neither HTTP nor the database: the caller has already established who is
// asking (layer 0), and the layers and the usage recorder are interfaces
// that the budget and limiter packages, and storage, implement.
//
// A refusal is an answer, not an error: each step returns a *Refusal (with
// its retry-after) when the request may not pass. The defense layers (1, 2
// and 3) fail open: when a layer's own machinery fails, a panic included,
// the request goes on and the fault is counted. The quota and the usage
// record fail closed.
//
// A Guard is configured with the layers a route uses; a nil layer is
// skipped. The OCR endpoint uses them all; a guarded route of the app may
// use only a rate limit and a daily line. A FailOpen runs one fail-open
// layer whose checks its caller interleaves with its own work (the invite
// limits, a route's fail limit), through the same fail-open code.
package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// Layer names, as in metrics, logs and Refusal.Layer.
const (
	LayerRate     = "rate"
	LayerAttempts = "attempts"
	LayerQuota    = "quota"
	LayerBudget   = "budget"
	LayerUsage    = "usage"
	// LayerClient is no layer: the client went away (Admission.Gone).
	LayerClient = "client"
)

// Modes of a layer that may be shadowed.
const (
	// ModeEnforce refuses what the layer refuses: the default.
	ModeEnforce = "enforce"
	// ModeShadow lets a request the layer would refuse pass, and reports
	// the would-be refusal (Hooks.Shadowed). The layer's state advances
	// exactly as when enforcing: a refusal counts nothing, shadowed or
	// not, so switching to enforce refuses what the shadow predicted.
	ModeShadow = "shadow"
)

// ErrNotShadowable refuses shadow mode for a layer that holds money: the
// plan quota (what the user paid for), the global budget and the usage
// record.
var ErrNotShadowable = errors.New("guard: only the rate limit and the daily line can be shadowed; the quota and the budget are money")

// Refusal says that a request may not pass, and why. It carries no
// threshold, so it is safe to turn into a response.
type Refusal struct {
	Layer string // one of the Layer constants
	// Reason is the precise cause, for metrics and logs: "rate" or
	// "burst" (layer 1), "daily_line" (2), "monthly_quota" (2b), the
	// ceiling's name, "manual", or "daily_usd_in_flight" /
	// "monthly_usd_in_flight" when only calls in flight hold a money
	// ceiling (3), "records_failing" (usage records are failing).
	Reason string
	// RetryAfter is how long until the request may pass; always > 0.
	RetryAfter time.Duration
	// Busy marks a budget refusal that calls in flight cause: the brake
	// is not engaged and a retry in seconds may pass.
	Busy bool
	// Fault is the error behind a KindStorage refusal of a write (a
	// reservation or a usage record the store could not take), for the
	// operator's log and alert; never shown to the client.
	Fault error
}

// Kind is what a refusal is, as the caller answers it.
type Kind uint8

const (
	// KindLimit: the caller's own limits, the rate and burst, the daily
	// line and the monthly quota; their answer is theirs to wait out.
	KindLimit Kind = iota + 1
	// KindBrake: the service's budget (a ceiling, calls in flight, the
	// operator's switch); the brake alerts on it.
	KindBrake
	// KindStorage: the service's storage cannot take or give what the
	// request needs (the quota unreadable, usage records failing, a
	// reservation or record not written); a fault, not a "no".
	KindStorage
	// KindGone: the client went away; no one hears the answer.
	KindGone
)

func (k Kind) String() string {
	switch k {
	case KindLimit:
		return "limit"
	case KindBrake:
		return "brake"
	case KindStorage:
		return "storage"
	case KindGone:
		return "gone"
	}
	return "unknown"
}

// Kind is what r is; it follows from its layer and reason.
func (r *Refusal) Kind() Kind {
	switch {
	case r.Layer == LayerBudget:
		return KindBrake
	case r.Layer == LayerUsage, r.Layer == LayerQuota && r.Reason == ReasonUnavailable:
		return KindStorage
	case r.Layer == LayerClient:
		return KindGone
	}
	return KindLimit
}

// The layers, as the guard uses them. Each returns a typed refusal
// (*limiter.Refusal, *budget.LineError, *budget.QuotaError,
// *budget.PausedError) when the request may not pass; any other error is
// its machinery failing.
type (
	// RateLimiter is layer 1: limiter.Limiter.
	RateLimiter interface {
		Allow(key string, now time.Time) error
	}
	// AttemptCounter is layer 2: budget.Attempts.
	AttemptCounter interface {
		Check(key string, line int64, now time.Time) error
		Take(key string, line int64, now time.Time) error
	}
	// Quotas is layer 2b: budget.Quotas.
	Quotas interface {
		Check(user string, limit int64, now time.Time) error
		Reserve(user string, limit int64, now time.Time) (budget.Slot, error)
		Confirm(s budget.Slot) (used int64)
		Release(s budget.Slot)
		Used(user string, now time.Time) int64
	}
	// Brake is layer 3: budget.Global.
	Brake interface {
		Check(now time.Time) error
		Claim(worst int64, now time.Time) (budget.Reservation, error)
		ClaimSoft(primary, fallback int64, now time.Time) (budget.Reservation, error)
		Commit(ctx context.Context, r *budget.Reservation) error
		Settle(ctx context.Context, r budget.Reservation, actual int64) error
		Settled(r budget.Reservation, actual int64)
	}
	// UsageRecorder is "$": it commits a successful read (its quota
	// increment, its usage row and its budget settlement) durably,
	// returning only once it is on disk.
	UsageRecorder interface {
		RecordUsage(ctx context.Context, month string, rec budget.UsageRecord, s budget.Settlement) error
	}
)

// Layers are the parts a Guard runs; a nil layer is skipped.
type Layers struct {
	Rate     RateLimiter
	Attempts AttemptCounter
	Quotas   Quotas
	Brake    Brake
	// Usage is required when Quotas is set: a read counted against the
	// quota is only confirmed by its usage record.
	Usage UsageRecorder
	// Deny remembers exact refusals until their retry-after and answers
	// their repeats from memory (deny.go); nil: every request is decided.
	Deny *Deny
}

// Hooks tell the caller what the guard did, for metrics and logs; a nil
// hook is not called.
type Hooks struct {
	// Refused is called once for every refusal.
	Refused func(r *Refusal)
	// FailedOpen is called when a layer's machinery failed and the
	// request was let through.
	FailedOpen func(layer string, err error)
	// Shadowed is called once per request and layer for a refusal that a
	// layer in shadow mode would have made; the request went on.
	Shadowed func(req Request, r *Refusal)
}

// Guard runs the layers for one kind of protected request. It is safe for
// concurrent use.
type Guard struct {
	layers Layers
	hooks  Hooks
	// records pauses paid calls after a usage record failed: a failing
	// disk would otherwise have every read paid for and withheld.
	records pause
	// shadow holds the layers in shadow mode for every request.
	shadow atomic.Pointer[map[string]bool]
}

// New returns a guard over layers.
func New(layers Layers, hooks Hooks) (*Guard, error) {
	if (layers.Quotas == nil) != (layers.Usage == nil) {
		return nil, errors.New("guard: a quota needs a usage recorder to confirm its reads, and a usage record a quota")
	}
	return &Guard{layers: layers, hooks: hooks}, nil
}

// SetShadow puts layers (LayerRate, LayerAttempts) in shadow mode for
// every request, and every other layer in enforce mode; none: all
// enforce. It may be called while requests are served (a hot reload); it
// refuses a layer that holds money with ErrNotShadowable.
func (g *Guard) SetShadow(layers ...string) error {
	set := make(map[string]bool, len(layers))
	for _, l := range layers {
		if l != LayerRate && l != LayerAttempts {
			return fmt.Errorf("%w: %q", ErrNotShadowable, l)
		}
		set[l] = true
	}
	g.shadow.Store(&set)
	g.layers.Deny.Clear() // a refusal remembered may now be shadowed
	return nil
}

// shadowed reports whether layer is in shadow mode for req.
func (g *Guard) shadowed(layer string, req Request) bool {
	if layer == LayerAttempts && req.ShadowDaily {
		return true
	}
	if set := g.shadow.Load(); set != nil {
		return (*set)[layer]
	}
	return false
}

// Request is who asks, with the lines their plan or route sets.
type Request struct {
	Key          string // the user id, or the client key of an anonymous route
	DailyLine    int64  // layer 2's line; 0: none
	MonthlyQuota int64  // layer 2b's quota
	// ShadowDaily puts layer 2 in shadow mode for this request (the
	// plan's daily_mode).
	ShadowDaily bool
	// Client, Route and Plan say where the request came from, for the
	// hooks (statistics); no layer reads them.
	Client, Route, Plan string
}

// paused refuses while usage records are failing: a read now would be
// paid for and withheld. Nothing is counted, not even a rate slot.
func (g *Guard) paused(now time.Time) *Refusal {
	if wait := g.records.enter(now); wait > 0 {
		return g.refuse(&Refusal{Layer: LayerUsage, Reason: "records_failing", RetryAfter: wait})
	}
	return nil
}

// open runs one fail-open layer's check: a refusal is returned (and
// reported); anything else that goes wrong, a panic included, is reported
// and let through. A refusal of a layer in shadow mode is reported as
// shadowed, once per request (reported notes the layers reported so far;
// nil for a layer met once), and let through.
func (g *Guard) open(layer string, req Request, reported *shadows, check func() error) *Refusal {
	r := g.try(layer, check)
	switch {
	case r == nil:
		return nil
	case !g.shadowed(layer, req):
		return g.refuse(r)
	}
	g.reportShadowed(req, reported, layer, r)
	return nil
}

// reportShadowed reports r, a refusal of layer in shadow mode that let
// req through, once per request (see open).
func (g *Guard) reportShadowed(req Request, reported *shadows, layer string, r *Refusal) {
	if reported != nil {
		if reported.has(layer) {
			return
		}
		reported.add(layer)
	}
	if g.hooks.Shadowed != nil {
		g.hooks.Shadowed(req, r)
	}
}

// shadows are the layers whose shadowed refusal of one request has been
// reported.
type shadows uint8

func (s *shadows) add(layer string)     { *s |= shadowBit(layer) }
func (s shadows) has(layer string) bool { return s&shadowBit(layer) != 0 }

func shadowBit(layer string) shadows {
	if layer == LayerAttempts {
		return 1
	}
	return 2
}

// try is open without reporting the refusal.
func (g *Guard) try(layer string, check func() error) *Refusal {
	return g.hooks.try(layer, check)
}

// ReasonUnavailable is the reason of a quota refusal when the quota
// could not be read or reserved (the database did not answer): a 503 to
// the client, not a used-up quota.
const ReasonUnavailable = "unavailable"

// unavailableRetry is the Retry-After of a ReasonUnavailable refusal: a
// database that restarts is back within a few seconds.
const unavailableRetry = 3 * time.Second

// closed turns a fail-closed layer's answer into a refusal: the quota
// refuses, it never fails open.
func (g *Guard) closed(err error) *Refusal {
	if err == nil {
		return nil
	}
	if r := refusalOf(err); r != nil {
		return g.refuse(r)
	}
	return g.refuse(&Refusal{Layer: LayerQuota, Reason: ReasonUnavailable, RetryAfter: unavailableRetry})
}

func (g *Guard) refuse(r *Refusal) *Refusal {
	if g.hooks.Refused != nil {
		g.hooks.Refused(r)
	}
	return r
}

// Used is key's confirmed reads of the quota this month; 0 without a
// quota.
func (g *Guard) Used(key string, now time.Time) int64 {
	if g.layers.Quotas == nil {
		return 0
	}
	return g.layers.Quotas.Used(key, now)
}

// refusalOf reads a layer's typed refusal; nil if err is none.
func refusalOf(err error) *Refusal {
	if rl, ok := err.(*limiter.Refusal); ok { // a flood's refusal, unwrapped
		return &Refusal{Layer: LayerRate, Reason: rl.Reason, RetryAfter: rl.RetryAfter}
	}
	return wrappedRefusalOf(err)
}

// wrappedRefusalOf is refusalOf for any other error: its targets escape
// to errors.As, one allocation each.
func wrappedRefusalOf(err error) *Refusal {
	var (
		rl *limiter.Refusal
		le *budget.LineError
		qe *budget.QuotaError
		pe *budget.PausedError
	)
	switch {
	case errors.As(err, &rl):
		return &Refusal{Layer: LayerRate, Reason: rl.Reason, RetryAfter: rl.RetryAfter}
	case errors.As(err, &le):
		return &Refusal{Layer: LayerAttempts, Reason: "daily_line", RetryAfter: le.RetryAfter}
	case errors.As(err, &qe):
		return &Refusal{Layer: LayerQuota, Reason: "monthly_quota", RetryAfter: qe.RetryAfter}
	case errors.As(err, &pe) && pe.Busy:
		return &Refusal{Layer: LayerBudget, Reason: pe.Ceiling + "_in_flight", RetryAfter: pe.RetryAfter, Busy: true}
	case errors.As(err, &pe):
		return &Refusal{Layer: LayerBudget, Reason: pe.Ceiling, RetryAfter: pe.RetryAfter}
	}
	return nil
}
