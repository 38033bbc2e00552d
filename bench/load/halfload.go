package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The guard's overhead at half the maximum load (issue 17): the accepted
// path with the ceilings on and one user, paced at half the median rate
// the rounds measured for it, with the server's own histograms read from
// its admin listener before and after. At full load every figure is mostly
// queueing; at half load it is what a request costs.

// The two series most figures read: the guard's overhead, and the usage
// record's commit wait.
const (
	guardSeries = "breakwater_guard_overhead_seconds"
	usageSeries = "breakwater_usage_commit_seconds"
)

// overheadSeries are the histograms read, in the order printed.
var overheadSeries = []struct{ name, label string }{
	{guardSeries, "guard overhead: arrival to committed reservation (upload excluded)"},
	{"breakwater_reservation_commit_seconds", "  of which the reservation's commit wait"},
	{usageSeries, "usage record's commit wait (after the call)"},
	{"breakwater_guard_check_seconds", "the layers' own work, no waits"},
}

// guardOverheadTarget is issue 17's bound on the guard overhead's p99.
const guardOverheadTarget = 3 * time.Millisecond

// histogram is one Prometheus histogram: cumulative counts by upper bound.
type histogram struct {
	bounds []float64 // seconds, increasing, without +Inf
	counts []float64 // cumulative, one per bound, then the +Inf one
}

// quantile is the smallest bucket bound that holds a share q of the
// observations: "p99 ≤ 2 ms" is what a histogram can say, no more. It is
// +Inf when the share falls past the last bound, and 0 without
// observations.
func (h histogram) quantile(q float64) float64 {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	want := q * h.counts[len(h.counts)-1]
	for i, b := range h.bounds {
		if h.counts[i] >= want {
			return b
		}
	}
	return math.Inf(1)
}

func (h histogram) count() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// minus is h's observations since before.
func (h histogram) minus(before histogram) histogram {
	out := histogram{bounds: h.bounds, counts: append([]float64(nil), h.counts...)}
	if len(before.counts) == len(h.counts) {
		for i := range out.counts {
			out.counts[i] -= before.counts[i]
		}
	}
	return out
}

// parseHistograms reads the named histograms from Prometheus's text
// format.
func parseHistograms(r io.Reader, names []string) (map[string]histogram, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]histogram{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "_bucket{le=\"")
		if !ok || !want[name] {
			continue
		}
		le, value, ok := strings.Cut(rest, "\"} ")
		if !ok {
			return nil, fmt.Errorf("metrics: malformed bucket line %q", line)
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		h := out[name]
		if le != "+Inf" {
			b, err := strconv.ParseFloat(le, 64)
			if err != nil {
				return nil, fmt.Errorf("metrics: %q: %w", line, err)
			}
			h.bounds = append(h.bounds, b)
		}
		h.counts = append(h.counts, n)
		out[name] = h
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if h, ok := out[n]; !ok || len(h.counts) != len(h.bounds)+1 {
			return nil, fmt.Errorf("metrics: no complete histogram %s", n)
		}
	}
	return out, nil
}

// metrics reads the instance's /metrics from its admin API.
func (b *breakwater) metrics() ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+b.admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: metrics: %w", b.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: metrics: %s", b.name, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// histograms reads the overhead histograms from the instance's admin API.
func (b *breakwater) histograms() (map[string]histogram, error) {
	body, err := b.metrics()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(overheadSeries))
	for i, s := range overheadSeries {
		names[i] = s.name
	}
	return parseHistograms(bytes.NewReader(body), names)
}

// commitCounts is the storage writer's two counters at one moment.
type commitCounts struct{ commits, writes float64 }

// commitCounts reads the storage writer's counters from the instance's
// admin API.
func (b *breakwater) commitCounts() (commitCounts, error) {
	body, err := b.metrics()
	if err != nil {
		return commitCounts{}, err
	}
	var c commitCounts
	found := 0
	for line := range strings.Lines(string(body)) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		var v *float64
		switch name {
		case "breakwater_storage_commits_total":
			v = &c.commits
		case "breakwater_storage_writes_total":
			v = &c.writes
		default:
			continue
		}
		if *v, err = strconv.ParseFloat(value, 64); err != nil {
			return c, fmt.Errorf("%s: metrics: %q: %w", b.name, line, err)
		}
		found++
	}
	if found != 2 {
		return c, fmt.Errorf("%s: metrics: no breakwater_storage_commits_total and breakwater_storage_writes_total", b.name)
	}
	return c, nil
}

// overheadFigures is what the half-load run measured.
type overheadFigures struct {
	rate     float64 // requests per second asked for
	achieved float64 // answers per second counted
	duration time.Duration
	client   [2]time.Duration // the generator's p50, p99
	expected float64          // share of 200s
	series   map[string]histogram
}

// halfLoad runs the accepted path (ceilings on, one user) at half of max
// requests per second and reads the server's histograms around it.
func (b *bench) halfLoad(c tcase, max float64) (overheadFigures, error) {
	f := overheadFigures{rate: max / 2, duration: 2 * b.plan.duration}
	if f.rate < 1 {
		return f, fmt.Errorf("half load: no rate measured for %q", c.label)
	}
	before, err := c.bw.histograms()
	if err != nil {
		return f, err
	}
	pace := time.Duration(float64(b.plan.clients) / f.rate * float64(time.Second))
	out := generate(load{addr: c.addr, clients: b.plan.clients, warmup: 0, duration: f.duration, pace: pace, request: c.request})
	after, err := c.bw.histograms()
	if err != nil {
		return f, err
	}
	f.achieved, f.expected = out.rps(), out.share(c.expect)
	f.client = [2]time.Duration{out.percentile(0.5), out.percentile(0.99)}
	f.series = map[string]histogram{}
	for name, h := range after {
		f.series[name] = h.minus(before[name])
	}
	return f, nil
}

// printOverhead writes the half-load section of the report.
func (f overheadFigures) print(w io.Writer) {
	if f.series == nil {
		return
	}
	fmt.Fprintf(w, "guard overhead at half load (accepted, 1 user, ceilings on: %s req/s asked, %s answered, %s; %.0f%% 200)\n",
		thousands(f.rate), thousands(f.achieved), f.duration, f.expected*100)
	fmt.Fprintf(w, "%-70s %10s %10s %8s\n", "server histogram (bucket bounds: the share falls at or below)", "p50", "p99", "count")
	for _, s := range overheadSeries {
		h := f.series[s.name]
		fmt.Fprintf(w, "%-70s %10s %10s %8.0f\n", s.label, bound(h.quantile(0.5)), bound(h.quantile(0.99)), h.count())
	}
	p99 := f.series[guardSeries].quantile(0.99)
	fmt.Fprintf(w, "target: guard overhead p99 ≤ %s: %s\n", guardOverheadTarget, metLabel(p99 > 0 && p99 <= guardOverheadTarget.Seconds()))
	fmt.Fprintf(w, "client latency (the generator, whole request): p50 %s, p99 %s\n\n", roundDuration(f.client[0]), roundDuration(f.client[1]))
}

// bound prints a bucket bound.
func bound(s float64) string {
	switch {
	case s == 0:
		return "–"
	case math.IsInf(s, 1):
		return "> 1s"
	}
	return "≤ " + roundDuration(time.Duration(s*float64(time.Second)))
}
