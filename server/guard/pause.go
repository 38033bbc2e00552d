package guard

import (
	"sync/atomic"
	"time"
)

// UsagePause is how long paid calls stop after a usage record could not be
// written. A failing or full disk would otherwise have every read paid for
// and then withheld (503).
const UsagePause = 10 * time.Second

// pause holds paid calls off after a usage record failed. When it is over,
// one request alone goes through as a probe while the others keep waiting:
// its record succeeding ends the pause, failing starts the next. The probe
// comes before the pause's end when the store says it answers again
// (Guard.StoreBack). Safe for concurrent use.
type pause struct{ until atomic.Pointer[time.Time] } // nil: no pause

// StoreBack tells the guard that the store of its usage records answers
// again after it did not (PostgreSQL stopped and started again): if paid
// calls are paused, the next request goes through as the probe now
// rather than at the pause's end. The probe's record decides, as at the
// end of a pause.
func (g *Guard) StoreBack(now time.Time) { g.records.probe(now) }

func (p *pause) start(now time.Time) {
	until := now.Add(UsagePause)
	p.until.Store(&until)
}

// end lifts the pause, if there is one: a usage record was written.
func (p *pause) end() {
	if p.until.Load() != nil {
		p.until.Store(nil)
	}
}

// probe lets the next request in as the probe now, if paid calls are
// paused: the pause's end comes early.
func (p *pause) probe(now time.Time) {
	for {
		until := p.until.Load()
		if until == nil || !until.After(now) {
			return
		}
		if p.until.CompareAndSwap(until, &now) {
			return
		}
	}
}

// enter returns how long a request at now must wait; 0 lets it in. Times
// are compared on Go's monotonic clock, so a wall clock stepped back does
// not stretch the pause.
func (p *pause) enter(now time.Time) time.Duration {
	for {
		until := p.until.Load()
		if until == nil {
			return 0
		}
		if left := until.Sub(now); left > 0 {
			return min(left, UsagePause)
		}
		next := now.Add(UsagePause) // the others wait while the probe runs
		if p.until.CompareAndSwap(until, &next) {
			return 0
		}
	}
}
