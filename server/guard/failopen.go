package guard

import "fmt"

// FailOpen runs one fail-open layer on its own, outside a Guard's
// pipeline: the invite limits (their IP rate limit and fail limit) and a
// guarded route's fail limit, whose checks the caller interleaves with its
// own work. Its checks fail open exactly as the pipeline's layers 1 and 3
// do, through the same code: a typed refusal is an answer; anything else
// that goes wrong, a panic included, is reported to Hooks.FailedOpen and
// the request let through. It is safe for concurrent use.
type FailOpen struct {
	layer string
	hooks Hooks
}

// NewFailOpen returns the fail-open runner of layer, the name its faults
// and refusals carry ("invites", "route:NAME"). Only hooks.FailedOpen is
// called: refusals are the caller's to count, and it has no shadow mode
// of its own.
func NewFailOpen(layer string, hooks Hooks) *FailOpen {
	return &FailOpen{layer: layer, hooks: hooks}
}

// Check runs check, which returns a typed refusal (*limiter.Refusal) when
// the request may not pass. The refusal comes back with the runner's
// layer, its reason and its retry-after; any other error, a panic
// included, is reported as the layer failing open, and Check returns nil.
func (f *FailOpen) Check(check func() error) *Refusal {
	r := f.hooks.try(f.layer, check)
	if r != nil {
		r.Layer = f.layer
	}
	return r
}

// try runs one fail-open layer's check, for a Guard and a FailOpen alike:
// a typed refusal is returned; anything else that goes wrong, a panic
// included, is reported to FailedOpen and let through.
func (h *Hooks) try(layer string, check func() error) (r *Refusal) {
	defer func() {
		if p := recover(); p != nil {
			h.failedOpen(layer, fmt.Errorf("panic: %v", p))
			r = nil
		}
	}()
	err := check()
	if err == nil {
		return nil
	}
	if r := refusalOf(err); r != nil {
		return r
	}
	h.failedOpen(layer, err)
	return nil
}

func (h *Hooks) failedOpen(layer string, err error) {
	if h.FailedOpen != nil {
		h.FailedOpen(layer, err)
	}
}
