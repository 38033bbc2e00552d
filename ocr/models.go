package ocr

import (
	"fmt"
	"regexp"
	"strings"
)

// ModelsChecked is the day the model table below was last checked against
// Google's models, pricing, media-resolution and thinking pages. config
// check prints it: a table that falls behind Google's prices miscounts
// money.
const ModelsChecked = "2026-12-06"

// ImageRule is how a model counts the input tokens of an image.
type ImageRule string

// The image-token rules of the Gemini generations.
const (
	// ImageTiles is Gemini 2.x's rule: 258 tokens for an image with both
	// sides at most 384 px, else 258 for each 768×768 tile (ImageTokens).
	ImageTiles ImageRule = "tiles"
	// ImageMediaResolution is the rule of Gemini 3 and later: at most a
	// fixed number of tokens per image, set by the media_resolution level
	// sent with the call (MediaResolutionTokens), whatever its size.
	ImageMediaResolution ImageRule = "media_resolution"
)

// The media_resolution levels of ocr.media_resolution.
const (
	MediaLow       = "low"
	MediaMedium    = "medium"
	MediaHigh      = "high"
	MediaUltraHigh = "ultra_high"
)

// mediaLevel is a media_resolution level: its token ceiling per image, as
// Google documents it for Gemini 3 and later, and its name on the wire.
type mediaLevel struct {
	tokens int
	wire   string
}

var mediaLevels = map[string]mediaLevel{
	MediaLow:       {280, "MEDIA_RESOLUTION_LOW"},
	MediaMedium:    {560, "MEDIA_RESOLUTION_MEDIUM"},
	MediaHigh:      {1120, "MEDIA_RESOLUTION_HIGH"},
	MediaUltraHigh: {2240, "MEDIA_RESOLUTION_ULTRA_HIGH"}, // per part only
}

// MediaResolutionTokens is the documented ceiling of tokens per image at
// a media_resolution level ("low", "medium", "high", "ultra_high"), or 0
// for a level that is not one of them.
func MediaResolutionTokens(level string) int { return mediaLevels[level].tokens }

// ModelInfo is what Breakwater knows of a Gemini model family: how it
// counts an image's tokens, its list price per million tokens in time
// (prompts up to 200k tokens; thinking is billed as output), where that
// was read and when, and the thinking setting
// sent with every call, the least the model accepts, so that thinking
// stays within maxOutputTokens, which caps thoughts and answer together.
type ModelInfo struct {
	Family string
	Image  ImageRule
	// InputUSDPerMillion and OutputUSDPerMillion are the first period's
	// list prices, which hold until the first of Later (PriceOn).
	InputUSDPerMillion  float64
	OutputUSDPerMillion float64
	// Later are the announced changes of the list price, by first day.
	Later []PricePeriod
	// Source is the page of Google's the entry was read from, Checked the
	// day it was last read there ("" for an override).
	Source, Checked string
	// ThinkingLevel is sent as thinkingConfig.thinkingLevel (Gemini 3 and
	// later); empty for a model that takes ThinkingBudget instead.
	ThinkingLevel string
	// ThinkingBudget is sent as thinkingConfig.thinkingBudget when
	// ThinkingLevel is empty (Gemini 2.5): 0 turns thinking off; 2.5 Pro
	// cannot turn it off and takes at least 128.
	ThinkingBudget int
	// Note is what Google has announced for the model that an operator
	// should know (a price change on a date); config check prints it.
	Note string
	// Override is true for a model given in ocr.model_overrides.
	Override bool
}

// knownModels are the text-out families Google documents on ModelsChecked,
// Gemini 4 and 3 first, then the 2.5 families still served (2.0 was shut
// down on 2026-06-01). Image, live, TTS and translation models read no
// labels and are left out. Gemini 3.6 and 3.7 Flash are left out too: no
// list price of Google's own for them could be confirmed on ModelsChecked
// (only resellers' prices); an operator who uses one gives its prices in
// ocr.model_overrides.
var knownModels = []ModelInfo{
	// Gemini 4 takes thinkingLevel only, and low at least ("minimal" is
	// refused); no thinkingBudget.
	{Family: "gemini-4-argon", Image: ImageMediaResolution, InputUSDPerMillion: 2.00, OutputUSDPerMillion: 10.00, ThinkingLevel: "low",
		Later:  []PricePeriod{{From: "2026-12-01", InputUSDPerMillion: 4.00, OutputUSDPerMillion: 20.00}},
		Source: pageLatestModel, Checked: "2026-12-06"},
	{Family: "gemini-3.8-flash", Image: ImageMediaResolution, InputUSDPerMillion: 0.75, OutputUSDPerMillion: 3.75, ThinkingLevel: "minimal",
		Later:  []PricePeriod{{From: "2027-01-01", InputUSDPerMillion: 1.50, OutputUSDPerMillion: 7.50}},
		Source: pagePricing, Checked: "2026-12-06"},
	{Family: "gemini-3.5-flash", Image: ImageMediaResolution, InputUSDPerMillion: 1.50, OutputUSDPerMillion: 9.00, ThinkingLevel: "minimal",
		Source: pagePricing, Checked: "2026-12-06"},
	{Family: "gemini-3.5-flash-lite", Image: ImageMediaResolution, InputUSDPerMillion: 0.30, OutputUSDPerMillion: 2.50, ThinkingLevel: "minimal",
		Source: pagePricing, Checked: "2026-12-06"},
	{Family: "gemini-3.1-flash-lite", Image: ImageMediaResolution, InputUSDPerMillion: 0.25, OutputUSDPerMillion: 1.50, ThinkingLevel: "minimal",
		Source: pagePricing, Checked: "2026-12-03"},
	{Family: "gemini-3.1-pro-preview", Image: ImageMediaResolution, InputUSDPerMillion: 2.00, OutputUSDPerMillion: 12.00, ThinkingLevel: "low",
		Source: pagePricing, Checked: "2026-12-06"},
	{Family: "gemini-3-flash-preview", Image: ImageMediaResolution, InputUSDPerMillion: 0.50, OutputUSDPerMillion: 3.00, ThinkingLevel: "minimal",
		Source: pagePricing, Checked: "2026-12-03"},
	{Family: "gemini-2.5-flash", Image: ImageTiles, InputUSDPerMillion: 0.30, OutputUSDPerMillion: 2.50, Source: pagePricing, Checked: "2026-12-06"},
	{Family: "gemini-2.5-flash-lite", Image: ImageTiles, InputUSDPerMillion: 0.10, OutputUSDPerMillion: 0.40, Source: pagePricing, Checked: "2026-12-06"},
	{Family: "gemini-2.5-pro", Image: ImageTiles, InputUSDPerMillion: 1.25, OutputUSDPerMillion: 10.00, ThinkingBudget: 128, Source: pagePricing, Checked: "2026-12-06"},
}

// The pages of Google's the table is read from.
const (
	pagePricing     = "ai.google.dev/gemini-api/docs/pricing"
	pageLatestModel = "ai.google.dev/gemini-api/docs/generate-content/latest-model"
)

// modelVersion matches what may follow a family's name and still be that
// family: a stable version ("-001"), a dated preview ("-preview-09-2025",
// "-preview-05-20"), "-exp" or "-latest". Anything else ("-image",
// "-live", "-tts") is another model with another price.
var modelVersion = regexp.MustCompile(`^(-\d{3}|-preview(-\d{2}-\d{2}|-\d{2}-\d{4})?|-exp|-latest)?$`)

// LookupModel returns the known family of a model name (a "models/"
// prefix is ignored, as the client drops it), or ok false for a model
// whose image tokens and price Breakwater does not know. It does not see
// ocr.model_overrides; Config.Lookup does.
func LookupModel(name string) (ModelInfo, bool) {
	name = strings.TrimPrefix(name, "models/")
	for _, m := range knownModels {
		if rest, found := strings.CutPrefix(name, m.Family); found && modelVersion.MatchString(rest) {
			return m, true
		}
	}
	return ModelInfo{}, false
}

// KnownModels lists the families LookupModel knows, for messages.
func KnownModels() []string {
	out := make([]string, len(knownModels))
	for i, m := range knownModels {
		out[i] = m.Family
	}
	return out
}

// Lookup returns what c knows of model: its entry in ModelOverrides (by
// exact name) if it has one, else its family in the built-in table.
func (c Config) Lookup(model string) (ModelInfo, bool) {
	model = strings.TrimPrefix(model, "models/")
	for _, o := range c.ModelOverrides {
		if strings.TrimPrefix(o.Name, "models/") == model {
			return o.info(), true
		}
	}
	return LookupModel(model)
}

// unknownModelError explains why an unknown model is refused, and what to
// set to use it.
func unknownModelError(model string) string {
	return fmt.Sprintf("%q is not a model whose image tokens and price breakwater knows (its table, checked %s: %s, with a version suffix such as -001 or -preview-09-2025); "+
		"the worst case reserved before each call needs both. To use it, give them in config.toml: "+
		"[[ocr.model_overrides]] with name = %q, image_tokens = \"media_resolution\" (Gemini 3 and later) or \"tiles\" (Gemini 2.x), "+
		"and input_usd_per_million and output_usd_per_million set to its list prices",
		model, ModelsChecked, strings.Join(KnownModels(), ", "), model)
}

// Warnings returns what an operator should know about c on day
// ("2006-01-02", budget.timezone's today) that does not stop the start: a
// configured price below the model's list price that day, or below the
// price of a change announced for it, either of which makes every count of
// money too low, and a change of a price it counts within
// ChangeWarningDays. config check prints them; serve logs them.
func (c Config) Warnings(day string) []string {
	c = c.WithDefaults()
	if c.Provider != ProviderGemini {
		return nil
	}
	m, known := c.Lookup(c.Model)
	if !known {
		return nil // Validate refuses it
	}
	var out []string
	in, outPrice := m.PriceOn(day)
	below := func(key string, got, list float64) {
		if got < list {
			out = append(out, fmt.Sprintf("ocr.price.%s = %g is below the list price of %s ($%g per million tokens): costs and the money budget would count less than Google bills", key, got, m.Family, list))
		}
	}
	cur := c.Price.On(day)
	below("input_usd_per_million", cur.InputUSDPerMillion, in)
	below("output_usd_per_million", cur.OutputUSDPerMillion, outPrice)
	for _, p := range m.Later {
		if p.From <= day {
			continue
		}
		if (c.Price.fixedIn && c.Price.InputUSDPerMillion < p.InputUSDPerMillion) || (c.Price.fixedOut && c.Price.OutputUSDPerMillion < p.OutputUSDPerMillion) {
			out = append(out, fmt.Sprintf("ocr.price sets $%g in / $%g out for %s, but its list price is $%g / $%g from %s: "+
				"from that day costs and the money budget would count less than Google bills; leave the prices out of [ocr.price] "+
				"and the ledger follows the list price by itself", c.Price.InputUSDPerMillion, c.Price.OutputUSDPerMillion, m.Family,
				p.InputUSDPerMillion, p.OutputUSDPerMillion, p.From))
			break
		}
	}
	for _, model := range []string{c.Model, c.FallbackModel} {
		if model == "" {
			continue
		}
		if line, warn, _ := c.PriceOutlook(model, day); warn {
			out = append(out, "price change: "+line)
		}
	}
	if m.Note != "" {
		out = append(out, fmt.Sprintf("ocr.model %s: %s", m.Family, m.Note))
	}
	return out
}

// Rules says which image-token rule, prices on day and thinking setting
// apply to the calls c makes, for config check.
func (c Config) Rules(day string) []string {
	c = c.WithDefaults()
	m, known := c.Lookup(c.Model)
	if !known {
		return []string{fmt.Sprintf("model %s: not in the model table (checked %s) nor in ocr.model_overrides; simulated reads count as %s", c.Model, ModelsChecked, DefaultModel)}
	}
	source := "the model table checked " + ModelsChecked
	if m.Override {
		source = "ocr.model_overrides"
	} else if m.Source != "" {
		source += fmt.Sprintf("; its entry from %s, read %s", m.Source, m.Checked)
	}
	listIn, listOut := m.PriceOn(day)
	price := c.Price.On(day)
	thinking := fmt.Sprintf("thinkingLevel %q", m.ThinkingLevel)
	if m.Image == ImageTiles {
		thinking = fmt.Sprintf("thinkingBudget %d", m.ThinkingBudget)
	}
	out := []string{
		fmt.Sprintf("model %s (from %s): %s; list price $%g in / $%g out per million tokens on %s", c.Model, source, c.Price.ImageRule(), listIn, listOut, day),
		fmt.Sprintf("charged at $%g in / $%g out per million tokens (thinking billed as output); each call sends maxOutputTokens %d and %s, "+
			"so a call costs at most its image and prompt tokens plus %d output tokens", price.InputUSDPerMillion, price.OutputUSDPerMillion,
			c.Price.MaxOutputTokens, thinking, c.Price.MaxOutputTokens),
	}
	if p, ok := c.PriceOf(c.FallbackModel); ok && c.FallbackModel != "" {
		p = p.On(day)
		out = append(out, fmt.Sprintf("fallback model %s (above a soft ceiling of [budget]): %s; charged at $%g in / $%g out per million tokens",
			c.FallbackModel, p.ImageRule(), p.InputUSDPerMillion, p.OutputUSDPerMillion))
	}
	for _, model := range []string{c.Model, c.FallbackModel} {
		if line, _, ok := c.PriceOutlook(model, day); ok && model != "" {
			out = append(out, "price of "+line)
		}
	}
	return out
}
