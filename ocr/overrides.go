package ocr

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ModelOverride is one "[[ocr.model_overrides]]" entry: a model the table
// does not know, or whose entry the operator corrects, with what the worst
// case needs. Its prices are required and never zero: a model counted at $0
// would let the budget run without a trace.
type ModelOverride struct {
	// Name is the model's name as sent to Gemini ("gemini-3.7-flash"),
	// matched exactly. Required.
	Name string `koanf:"name"`
	// ImageTokens is the model's image-token rule: "media_resolution"
	// (Gemini 3 and later: ocr.media_resolution's ceiling per image) or
	// "tiles" (Gemini 2.x: 258 tokens per 768×768 tile). Required.
	ImageTokens string `koanf:"image_tokens"`
	// InputUSDPerMillion is its list price per million input tokens, in
	// USD, on every day. Required, above 0, unless Prices is given.
	InputUSDPerMillion float64 `koanf:"input_usd_per_million"`
	// OutputUSDPerMillion is its list price per million output tokens,
	// thinking included, in USD, on every day. Required, above 0, unless
	// Prices is given.
	OutputUSDPerMillion float64 `koanf:"output_usd_per_million"`
	// Prices are its list prices in time, instead of the two above: each
	// from its first day on (the first one also before it), the days in
	// order.
	Prices []OverridePrice `koanf:"prices"`
	// ThinkingLevel is sent as thinkingConfig.thinkingLevel to a
	// "media_resolution" model: "minimal", "low", "medium" or "high".
	// Default "low", which every Gemini 3 model accepts.
	ThinkingLevel string `koanf:"thinking_level"`
	// ThinkingBudget is sent as thinkingConfig.thinkingBudget to a "tiles"
	// model. Default 0 (thinking off); Gemini 2.5 Pro needs at least 128.
	ThinkingBudget int `koanf:"thinking_budget"`
}

// OverridePrice is one period of an override's Prices.
type OverridePrice struct {
	// From is the first day the prices hold, "2006-01-02" in
	// budget.timezone, quoted. Required.
	From string `koanf:"from"`
	// InputUSDPerMillion and OutputUSDPerMillion are as in ModelOverride.
	InputUSDPerMillion  float64 `koanf:"input_usd_per_million"`
	OutputUSDPerMillion float64 `koanf:"output_usd_per_million"`
}

// DefaultOverrideThinkingLevel is the thinking level of an override that
// names none.
const DefaultOverrideThinkingLevel = "low"

var thinkingLevels = map[string]bool{"minimal": true, "low": true, "medium": true, "high": true}

// info is what the override says of its model.
func (o ModelOverride) info() ModelInfo {
	m := ModelInfo{
		Family: strings.TrimPrefix(o.Name, "models/"), Image: ImageRule(o.ImageTokens),
		InputUSDPerMillion: o.InputUSDPerMillion, OutputUSDPerMillion: o.OutputUSDPerMillion, Override: true,
	}
	if len(o.Prices) > 0 {
		m.InputUSDPerMillion, m.OutputUSDPerMillion = o.Prices[0].InputUSDPerMillion, o.Prices[0].OutputUSDPerMillion
		for _, p := range o.Prices[1:] {
			m.Later = append(m.Later, PricePeriod(p))
		}
	}
	switch m.Image {
	case ImageMediaResolution:
		m.ThinkingLevel = o.ThinkingLevel
		if m.ThinkingLevel == "" {
			m.ThinkingLevel = DefaultOverrideThinkingLevel
		}
	default:
		m.ThinkingBudget = o.ThinkingBudget
	}
	return m
}

// validateOverrides reports every problem in the overrides, each naming
// its entry and what to set.
func validateOverrides(list []ModelOverride) []error {
	var errs []error
	seen := map[string]bool{}
	for i, o := range list {
		key := fmt.Sprintf("ocr.model_overrides[%d]", i)
		if o.Name != "" {
			key = fmt.Sprintf("ocr.model_overrides %q", o.Name)
		}
		add := func(msg string) { errs = append(errs, errors.New(key+": "+msg)) }
		name := strings.TrimPrefix(o.Name, "models/")
		switch {
		case name == "":
			add("name: required, the model's name as sent to Gemini")
		case seen[name]:
			add("name: given twice")
		}
		seen[name] = true
		switch ImageRule(o.ImageTokens) {
		case ImageMediaResolution:
			if o.ThinkingLevel != "" && !thinkingLevels[o.ThinkingLevel] {
				add(fmt.Sprintf("thinking_level: unknown level %q (want minimal, low, medium or high)", o.ThinkingLevel))
			}
			if o.ThinkingBudget != 0 {
				add("thinking_budget: a media_resolution model (Gemini 3 and later) takes thinking_level instead")
			}
		case ImageTiles:
			if o.ThinkingLevel != "" {
				add("thinking_level: a tiles model (Gemini 2.x) takes thinking_budget instead")
			}
			if o.ThinkingBudget < 0 {
				add("thinking_budget: must not be negative (0 turns thinking off)")
			}
		default:
			add(fmt.Sprintf("image_tokens: %q is not a rule: set \"media_resolution\" (Gemini 3 and later) or \"tiles\" (Gemini 2.x)", o.ImageTokens))
		}
		if gemini4(name) && ImageRule(o.ImageTokens) == ImageTiles {
			add("image_tokens: a Gemini 4 model takes thinking_level (low, medium or high), never thinking_budget: set \"media_resolution\"")
		}
		if gemini4(name) && o.ThinkingLevel == "minimal" {
			add("thinking_level: a Gemini 4 model refuses \"minimal\": set low, medium or high")
		}
		checkPrice := func(key string, v float64) {
			switch {
			case v != v || v <= 0: // NaN, missing, zero or negative
				add(fmt.Sprintf("%s: required: set it to the model's list price in USD per million tokens (above 0; a model is never counted as free)", key))
			case v > maxPriceUSDPerMillion:
				add(fmt.Sprintf("%s: must be at most %d USD per million tokens", key, maxPriceUSDPerMillion))
			}
		}
		if len(o.Prices) == 0 {
			checkPrice("input_usd_per_million", o.InputUSDPerMillion)
			checkPrice("output_usd_per_million", o.OutputUSDPerMillion)
			continue
		}
		if o.InputUSDPerMillion != 0 || o.OutputUSDPerMillion != 0 {
			add("prices: given with input_usd_per_million or output_usd_per_million: give the prices one way, the list of periods or the two keys")
		}
		prev := ""
		for j, p := range o.Prices {
			at := fmt.Sprintf("prices[%d]", j)
			if _, err := time.Parse(dayLayout, p.From); err != nil {
				add(fmt.Sprintf("%s.from: %q is not a day: write its first day quoted, as \"2027-01-01\"", at, p.From))
			} else if p.From <= prev {
				add(fmt.Sprintf("%s.from: %s is not after the period before it (%s): list the periods in order, each day once", at, p.From, prev))
			}
			prev = max(prev, p.From)
			checkPrice(at+".input_usd_per_million", p.InputUSDPerMillion)
			checkPrice(at+".output_usd_per_million", p.OutputUSDPerMillion)
		}
	}
	return errs
}

// gemini4 reports whether name is a Gemini 4 model, which takes
// thinking_level only.
func gemini4(name string) bool { return strings.HasPrefix(name, "gemini-4") }
