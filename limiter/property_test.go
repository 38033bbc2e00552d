package limiter_test

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"
	"testing/quick"
	"time"

	"breakwater/limiter"
)

// scenario is a random arrival sequence for one key under a random config.
type scenario struct {
	Rate, Burst int
	Window      time.Duration
	Start       time.Duration // offset of the first arrival from t0
	Gaps        []time.Duration
	// Aligned keeps every time on a whole microsecond from the first
	// arrival, where stored times are exact; otherwise gaps are in
	// nanoseconds and stored times round up by less than 1µs.
	Aligned bool
	// Backwards allows negative gaps: a clock stepping back.
	Backwards bool
}

// Generate implements quick.Generator. Gaps range from 0 to 2*Window, with
// extra weight on 0, on less than a second, and on the exact boundaries.
func (scenario) Generate(r *rand.Rand, size int) reflect.Value {
	sc := scenario{
		Rate:      r.Intn(7),
		Burst:     r.Intn(5),
		Window:    time.Second + time.Duration(r.Intn(4000))*time.Millisecond,
		Start:     time.Duration(r.Int63n(int64(time.Second))),
		Aligned:   r.Intn(2) == 0,
		Backwards: r.Intn(4) == 0,
	}
	if r.Intn(3) == 0 {
		sc.Window = time.Duration(1+r.Intn(3)) * time.Second
	}
	unit := time.Nanosecond
	if sc.Aligned {
		unit = time.Microsecond
	}
	edges := []time.Duration{time.Second, sc.Window, sc.Window - unit, sc.Window + unit, time.Second - unit, time.Second + unit, unit}
	n := 1 + r.Intn(max(1, 3*size))
	for range n {
		var g time.Duration
		switch p := r.Intn(10); {
		case p < 3:
			g = 0
		case p < 5:
			g = time.Duration(r.Int63n(int64(time.Second)))
		case p < 6:
			g = edges[r.Intn(len(edges))]
		default:
			g = time.Duration(r.Int63n(2*int64(sc.Window) + 1))
		}
		g = g / unit * unit
		if sc.Backwards && r.Intn(6) == 0 {
			g = -g
		}
		sc.Gaps = append(sc.Gaps, g)
	}
	return reflect.ValueOf(sc)
}

// over reports whether admitting a request at t, after the admitted ones,
// would put more than rate requests in some interval of length window or
// more than burst in some interval of one second. Every admitted time is
// at most t, so the worst intervals are those ending just after t.
func over(admitted []time.Time, t time.Time, rate int, window time.Duration, burst int) bool {
	inWindow, inSecond := 1, 1
	for _, a := range admitted {
		if a.After(t.Add(-window)) {
			inWindow++
		}
		if a.After(t.Add(-time.Second)) {
			inSecond++
		}
	}
	return (rate > 0 && inWindow > rate) || (burst > 0 && inSecond > burst)
}

// checkIntervals checks by brute force that no half-open interval of
// length window holds more than limit of the sorted times.
func checkIntervals(times []time.Time, window time.Duration, limit int) error {
	if limit == 0 {
		return nil
	}
	for i, a := range times {
		n := 0
		for _, b := range times[i:] {
			if b.Before(a.Add(window)) {
				n++
			}
		}
		if n > limit {
			return fmt.Errorf("%d requests in [%v, +%v), limit %d", n, a.Sub(t0), window, limit)
		}
	}
	return nil
}

// replay runs sc through a Limiter and checks every decision against the
// brute-force model.
func replay(sc scenario) error {
	l, err := limiter.New(limiter.Config{Rate: sc.Rate, Window: sc.Window, Burst: sc.Burst})
	if err != nil {
		return err
	}
	var (
		admitted []time.Time // as seen by the caller
		recorded []time.Time // never earlier than the newest before
		newest   time.Time
	)
	now := t0.Add(sc.Start)
	for i, g := range sc.Gaps {
		now = now.Add(g)
		err := l.Allow("k", now)
		if sc.Backwards {
			// With a clock going backwards the model is the recorded
			// timeline; the checks below cover the caller's one.
			if err == nil {
				if now.After(newest) {
					newest = now
				}
				recorded = append(recorded, newest)
				admitted = append(admitted, now)
			}
			continue
		}
		wouldBreak := over(admitted, now, sc.Rate, sc.Window, sc.Burst)
		if err == nil {
			if wouldBreak {
				return fmt.Errorf("step %d at t0+%v: admitted, but that breaks a limit", i, now.Sub(t0))
			}
			admitted = append(admitted, now)
			continue
		}
		var r *limiter.Refusal
		if !errors.As(err, &r) {
			return fmt.Errorf("step %d: unexpected error %v", i, err)
		}
		if r.RetryAfter <= 0 {
			return fmt.Errorf("step %d: RetryAfter %v, want > 0", i, r.RetryAfter)
		}
		if !wouldBreak {
			// Exact when aligned; otherwise within the 1µs of rounding.
			if sc.Aligned || !over(admitted, now.Add(-limiter.Resolution), sc.Rate, sc.Window, sc.Burst) {
				return fmt.Errorf("step %d at t0+%v: refused (%v), but admitting breaks no limit", i, now.Sub(t0), r)
			}
			continue
		}
		retry := now.Add(r.RetryAfter)
		if over(admitted, retry, sc.Rate, sc.Window, sc.Burst) {
			return fmt.Errorf("step %d at t0+%v: still over a limit after RetryAfter %v", i, now.Sub(t0), r.RetryAfter)
		}
		if sc.Aligned && !over(admitted, retry.Add(-time.Nanosecond), sc.Rate, sc.Window, sc.Burst) {
			return fmt.Errorf("step %d at t0+%v: RetryAfter %v is longer than needed", i, now.Sub(t0), r.RetryAfter)
		}
	}

	// Safety, independently of the step-by-step model.
	sorted := slices.Clone(admitted)
	slices.SortFunc(sorted, time.Time.Compare)
	for _, times := range [][]time.Time{sorted, recorded} {
		if err := checkIntervals(times, sc.Window, sc.Rate); err != nil {
			return fmt.Errorf("rate: %w", err)
		}
		if err := checkIntervals(times, time.Second, sc.Burst); err != nil {
			return fmt.Errorf("burst: %w", err)
		}
	}
	return nil
}

// TestExactness checks, on random arrival sequences, that the limiter never
// admits a request that breaks a limit (strictly, at nanosecond precision)
// and refuses one only when admitting it would break a limit: exactly when
// arrivals are whole microseconds apart, and otherwise within the 1µs that
// rounding stored times up may add. It also checks that RetryAfter is
// enough, and exactly enough when aligned, and that a clock going backwards
// admits nothing extra.
func TestExactness(t *testing.T) {
	count := 3000
	if testing.Short() {
		count = 300
	}
	prop := func(sc scenario) bool {
		if err := replay(sc); err != nil {
			t.Logf("%+v: %v", sc, err)
			return false
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: count}); err != nil {
		t.Error(err)
	}
}
