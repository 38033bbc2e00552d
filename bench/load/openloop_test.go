package main

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSearchRate checks the search against fake servers whose p99 is a
// known function of the rate: it finds the highest passing rate to within
// the last bisection's interval, never reports a failing rate, and says
// when the ceiling was reached.
func TestSearchRate(t *testing.T) {
	linear := func(limit float64) func(float64) time.Duration {
		// p99 = 2 ms + rate × (18 ms / limit): exactly 20 ms at limit.
		return func(rate float64) time.Duration {
			return 2*time.Millisecond + time.Duration(rate/limit*float64(18*time.Millisecond))
		}
	}
	for _, tt := range []struct {
		name       string
		limit      float64 // the highest rate within 20 ms
		start, top float64
		bisect     int
		capped     bool
		lo, hi     float64 // the result must fall in [lo, hi]
	}{
		{"found by doubling, then bisected", 18_000, 250, 64_000, 6, false, 18_000 - 16_000/64.0, 18_000},
		{"exactly on a doubling", 4000, 250, 64_000, 4, false, 4000, 4000},
		{"the start fails", 100, 250, 64_000, 6, false, 100 - 250/64.0, 100},
		{"everything passes", 1e9, 250, 8000, 6, true, 8000, 8000},
		{"no bisection", 18_000, 250, 64_000, 0, false, 16_000, 16_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			try := linear(tt.limit)
			var tried []float64
			s := searchRate(func(rate float64) time.Duration { tried = append(tried, rate); return try(rate) }, 20*time.Millisecond, tt.start, tt.top, tt.bisect)
			if s.best < tt.lo || s.best > tt.hi || s.capped != tt.capped {
				t.Errorf("best %v (capped %v), want in [%v, %v] (capped %v); tried %v", s.best, s.capped, tt.lo, tt.hi, tt.capped, tried)
			}
			if len(s.steps) != len(tried) {
				t.Errorf("%d steps recorded for %d tried", len(s.steps), len(tried))
			}
			for _, st := range s.steps {
				if st.ok != (st.rate <= tt.limit) || st.p99 != try(st.rate) {
					t.Errorf("step %+v: the verdict or the p99 is not the fake's", st)
				}
			}
			if most := math.Log2(tt.top/tt.start) + 2 + float64(tt.bisect); float64(len(tried)) > most {
				t.Errorf("%d steps, more than %v: %v", len(tried), most, tried)
			}
			best, over, isOver := s.bestStep()
			if s.best > 0 && (best.rate != s.best || !best.ok) {
				t.Errorf("best step %+v for best %v", best, s.best)
			}
			if isOver == tt.capped || (isOver && (over.ok || over.rate <= s.best)) {
				t.Errorf("first step over %+v (%v) for best %v", over, isOver, s.best)
			}
		})
	}
}

// TestGenerateOpenCountsTheQueue checks that the open-loop generator
// keeps its schedule while the server stalls and measures each request
// from when it was due: one connection at 100 requests a second, and one
// request held for 300 ms, must show the about 30 requests due during the
// stall as slow, where a closed-loop client would show one. It also
// checks that every request due is either answered or missed.
func TestGenerateOpenCountsTheQueue(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 10 {
			time.Sleep(300 * time.Millisecond)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	req := oneOf(fmt.Appendf(nil, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", addr))
	out := generateOpen(openLoad{addrs: []string{addr}, rate: 100, span: time.Second, conns: 1, request: req, expect: http.StatusOK})
	if out.due != 100 || int64(len(out.latencies))+out.missed != out.due || out.missed != 0 {
		t.Fatalf("%d due, %d answered, %d missed (%v)", out.due, len(out.latencies), out.missed, out.firstErr)
	}
	slow := 0
	for _, d := range out.latencies {
		if d >= 100*time.Millisecond {
			slow++
		}
	}
	if slow < 15 {
		t.Errorf("%d requests measured at 100 ms or more, want about 30: the stall's queue is not counted", slow)
	}
	if p99 := out.p99(); p99 < 250*time.Millisecond {
		t.Errorf("p99 %s, want the stall's 300 ms or about", p99)
	}
}

// TestOpenOutcomeQuantile checks that a request missed counts as slower
// than any answered.
func TestOpenOutcomeQuantile(t *testing.T) {
	lat := make([]time.Duration, 99)
	for i := range lat {
		lat[i] = time.Duration(i+1) * time.Millisecond
	}
	if got := (openOutcome{due: 100, latencies: lat, missed: 1}).p99(); got != 99*time.Millisecond {
		t.Errorf("1 missed in 100: p99 %s, want 99ms", got)
	}
	if got := (openOutcome{due: 100, latencies: lat[:98], missed: 2}).p99(); got != time.Duration(math.MaxInt64) {
		t.Errorf("2 missed in 100: p99 %s, want past any bound", got)
	}
	if got := (openOutcome{}).p99(); got != 0 {
		t.Errorf("nothing due: p99 %s, want 0", got)
	}
}

// TestGenerateOpenGivesUp checks that a step the server cannot keep up
// with ends soon after its requests fall more than giveUp behind, every
// request left counted as missed: one connection to a server taking
// 100 ms a request, at 200 requests a second for a second, would
// otherwise take 20 s.
func TestGenerateOpenGivesUp(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	req := oneOf(fmt.Appendf(nil, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", addr))
	start := time.Now()
	out := generateOpen(openLoad{addrs: []string{addr}, rate: 200, span: time.Second, conns: 1, giveUp: 500 * time.Millisecond,
		request: req, expect: http.StatusOK})
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("the step took %s: it did not give up", elapsed)
	}
	if out.due != 200 || out.missed == 0 || int64(len(out.latencies))+out.missed != out.due {
		t.Errorf("%d due, %d answered, %d missed", out.due, len(out.latencies), out.missed)
	}
	if out.p99() != time.Duration(math.MaxInt64) {
		t.Errorf("p99 %s, want past any bound", out.p99())
	}
}

// TestMedianTry checks that a rate's p99 is its median try's: one slow
// try, or one lucky one, does not decide the step.
func TestMedianTry(t *testing.T) {
	for _, tt := range []struct {
		tries int
		p99s  []time.Duration
		want  time.Duration
	}{
		{0, []time.Duration{7}, 7},
		{1, []time.Duration{7}, 7},
		{3, []time.Duration{5, 90, 6}, 6},
		{3, []time.Duration{30, 4, 25}, 25},
	} {
		calls := 0
		got := medianTry(tt.tries, func() time.Duration { calls++; return tt.p99s[calls-1] })
		if got != tt.want || calls != len(tt.p99s) {
			t.Errorf("tries %d of %v: %v after %d calls, want %v after %d", tt.tries, tt.p99s, got, calls, tt.want, len(tt.p99s))
		}
	}
}

// TestTurnsAlternate runs searches of different lengths through turns: the
// steps go one search at a time, each search's steps alternating with the
// others' while they last, and a search left alone goes on without
// waiting for the ended ones.
func TestTurnsAlternate(t *testing.T) {
	for _, steps := range [][]int{{3, 3}, {5, 2}, {1, 4}, {2, 0, 3}, {4}} {
		tr := newTurns(len(steps))
		var (
			order   []int
			running atomic.Int32
			wg      sync.WaitGroup
		)
		for i, n := range steps {
			wg.Go(func() {
				defer tr.done(i)
				for range n {
					tr.take(i, func() {
						if running.Add(1) != 1 {
							t.Errorf("%v: two steps at once", steps)
						}
						order = append(order, i) // one step at a time: no race
						time.Sleep(time.Millisecond)
						running.Add(-1)
					})
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: the searches never ended (order so far %v)", steps, order)
		}
		// The expected order: round after round, every search with a step
		// left takes one, in index order.
		var want []int
		left := slices.Clone(steps)
		for slices.ContainsFunc(left, func(n int) bool { return n > 0 }) {
			for i := range left {
				if left[i] > 0 {
					want = append(want, i)
					left[i]--
				}
			}
		}
		if !slices.Equal(order, want) {
			t.Errorf("%v: steps in order %v, want %v", steps, order, want)
		}
	}
}
