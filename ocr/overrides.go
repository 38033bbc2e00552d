package ocr

import (
	"errors"
	"fmt"
	"strings"
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
	// USD. Required, above 0.
	InputUSDPerMillion float64 `koanf:"input_usd_per_million"`
	// OutputUSDPerMillion is its list price per million output tokens,
	// thinking included, in USD. Required, above 0.
	OutputUSDPerMillion float64 `koanf:"output_usd_per_million"`
	// ThinkingLevel is sent as thinkingConfig.thinkingLevel to a
	// "media_resolution" model: "minimal", "low", "medium" or "high".
	// Default "low", which every Gemini 3 model accepts.
	ThinkingLevel string `koanf:"thinking_level"`
	// ThinkingBudget is sent as thinkingConfig.thinkingBudget to a "tiles"
	// model. Default 0 (thinking off); Gemini 2.5 Pro needs at least 128.
	ThinkingBudget int `koanf:"thinking_budget"`
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
		for _, p := range []struct {
			key string
			v   float64
		}{{"input_usd_per_million", o.InputUSDPerMillion}, {"output_usd_per_million", o.OutputUSDPerMillion}} {
			switch {
			case p.v != p.v || p.v <= 0: // NaN, missing, zero or negative
				add(fmt.Sprintf("%s: required: set it to the model's list price in USD per million tokens (above 0; a model is never counted as free)", p.key))
			case p.v > maxPriceUSDPerMillion:
				add(fmt.Sprintf("%s: must be at most %d USD per million tokens", p.key, maxPriceUSDPerMillion))
			}
		}
	}
	return errs
}
