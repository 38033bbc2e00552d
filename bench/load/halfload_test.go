package main

import (
	"math"
	"strings"
	"testing"
)

func TestParseHistograms(t *testing.T) {
	text := `# HELP breakwater_usage_commit_seconds Time to commit.
# TYPE breakwater_usage_commit_seconds histogram
breakwater_usage_commit_seconds_bucket{le="0.001"} 10
breakwater_usage_commit_seconds_bucket{le="0.002"} 90
breakwater_usage_commit_seconds_bucket{le="0.005"} 99
breakwater_usage_commit_seconds_bucket{le="+Inf"} 100
breakwater_usage_commit_seconds_sum 0.2
breakwater_usage_commit_seconds_count 100
breakwater_other_bucket{le="1"} 5
`
	hs, err := parseHistograms(strings.NewReader(text), []string{"breakwater_usage_commit_seconds"})
	if err != nil {
		t.Fatal(err)
	}
	h := hs["breakwater_usage_commit_seconds"]
	for _, tt := range []struct {
		q    float64
		want float64
	}{{0.05, 0.001}, {0.5, 0.002}, {0.99, 0.005}, {1, math.Inf(1)}} {
		if got := h.quantile(tt.q); got != tt.want {
			t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	before := histogram{bounds: h.bounds, counts: []float64{10, 10, 10, 10}}
	if d := h.minus(before); d.count() != 90 || d.quantile(0.5) != 0.002 {
		t.Errorf("since before: %v observations, p50 %v; want 90 and 0.002", d.count(), d.quantile(0.5))
	}
	if _, err := parseHistograms(strings.NewReader(text), []string{"breakwater_missing_seconds"}); err == nil {
		t.Error("a missing histogram was not reported")
	}
	if got := (histogram{}).quantile(0.5); got != 0 {
		t.Errorf("empty histogram's quantile = %v, want 0", got)
	}
}
