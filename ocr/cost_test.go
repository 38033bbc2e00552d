package ocr

import (
	"math"
	"testing"
)

func TestImageTokens(t *testing.T) {
	for _, tt := range []struct {
		w, h, want int
	}{
		{0, 0, 258},
		{-5, 10, 258},
		{1, 1, 258},
		{384, 384, 258},
		{385, 384, 258},    // one 768 tile
		{768, 768, 258},    // one 768 tile
		{769, 768, 516},    // two tiles
		{1024, 1024, 1032}, // 2×2 tiles
		{4000, 3000, 6192}, // 6×4 tiles
		{100000, 100000, 131 * 131 * 258},
		{math.MaxInt, math.MaxInt, math.MaxInt},
	} {
		if got := ImageTokens(tt.w, tt.h); got != tt.want {
			t.Errorf("ImageTokens(%d, %d) = %d, want %d", tt.w, tt.h, got, tt.want)
		}
	}
}

func TestCost(t *testing.T) {
	lite := Price{InputUSDPerMillion: 0.10, OutputUSDPerMillion: 0.40}
	for _, tt := range []struct {
		name  string
		price Price
		usage Usage
		want  int64
	}{
		{"nothing", Price{}, Usage{}, 0},
		{"documented example", Price{}, Usage{PromptTokens: 298, CandidatesTokens: 24}, 150}, // 89.4 + 60 = 149.4
		{"million input", Price{}, Usage{PromptTokens: 1_000_000}, 300_000},
		{"million output", Price{}, Usage{CandidatesTokens: 1_000_000}, 2_500_000},
		{"thoughts billed as output", Price{}, Usage{ThoughtsTokens: 1_000_000}, 2_500_000},
		{"one output token rounds up", Price{}, Usage{CandidatesTokens: 1}, 3},
		{"one input token rounds up", Price{}, Usage{PromptTokens: 1}, 1},
		{"exact thousand, no float creep", Price{}, Usage{PromptTokens: 1000}, 300},
		{"flash-lite", lite, Usage{PromptTokens: 1000, CandidatesTokens: 100}, 140},
		{"all three", lite, Usage{PromptTokens: 10, CandidatesTokens: 10, ThoughtsTokens: 10}, 9}, // 1 + 8
		{"negative counts", Price{}, Usage{PromptTokens: -100, CandidatesTokens: -1}, 0},
		{"saturates", Price{}, Usage{PromptTokens: math.MaxInt, CandidatesTokens: math.MaxInt, ThoughtsTokens: math.MaxInt}, math.MaxInt64 / 1_000_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.price.Cost(tt.usage); got != tt.want {
				t.Errorf("Cost(%+v) = %d, want %d", tt.usage, got, tt.want)
			}
		})
	}
}

func TestWorstCase(t *testing.T) {
	tiles := Price{perImage: tilesRule} // Gemini 2.x, at the default prices
	for _, tt := range []struct {
		name  string
		price Price
		w, h  int
		want  int64
	}{
		{"small image", tiles, 100, 100, 808},                                                                          // (258+300)×0.30 + 256×2.50 = 807.4
		{"1024 square", tiles, 1024, 1024, 1040},                                                                       // (1032+300)×0.30 + 640 = 1039.6
		{"more output", Price{MaxOutputTokens: 1000, perImage: tilesRule}, 100, 100, 2668},                             // 167.4 + 2500
		{"flash-lite", Price{InputUSDPerMillion: 0.1, OutputUSDPerMillion: 0.4, perImage: tilesRule}, 4000, 3000, 752}, // (6192+300)×0.1 + 102.4 = 751.6
		{"huge", tiles, math.MaxInt, math.MaxInt, math.MaxInt64 / 1_000_000},
		// The zero Price is DefaultModel's at DefaultMediaResolution: 1120
		// tokens an image, whatever its size.
		{"default small", Price{}, 100, 100, 1066}, // (1120+300)×0.30 + 640 = 1066
		{"default huge", Price{}, math.MaxInt, math.MaxInt, 1066},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.price.WorstCase(tt.w, tt.h); got != tt.want {
				t.Errorf("WorstCase(%d, %d) = %d, want %d", tt.w, tt.h, got, tt.want)
			}
		})
	}

	// A successful call on a small image is below the worst case.
	var p Price
	if got, bound := p.Cost(Usage{PromptTokens: 298, CandidatesTokens: 24}), p.WorstCase(3, 2); got > bound {
		t.Errorf("Cost %d above WorstCase %d", got, bound)
	}
}

func TestUsageKnown(t *testing.T) {
	for _, tt := range []struct {
		u    Usage
		want bool
	}{
		{Usage{}, false},                     // no usageMetadata
		{Usage{CandidatesTokens: 24}, false}, // output but no input: not a real bill
		{Usage{PromptTokens: 298}, true},     // an empty answer
		{Usage{PromptTokens: 298, CandidatesTokens: 24}, true},
	} {
		if got := tt.u.Known(); got != tt.want {
			t.Errorf("%+v: Known %v, want %v", tt.u, got, tt.want)
		}
	}
}
