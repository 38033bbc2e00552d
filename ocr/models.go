package ocr

import (
	"fmt"
	"regexp"
	"strings"
)

// ModelInfo is what Breakwater knows of a Gemini model family: its image
// tokens follow the Gemini 2.x tiling that ImageTokens counts (258 for an
// image with both sides at most 384 px, else 258 per 768×768 tile), so
// WorstCase bounds what a call is billed; and its list price per million
// tokens (prompts up to 200k tokens), against which the configured price
// is compared. Prices move; the configured one is what is charged.
type ModelInfo struct {
	Family              string
	InputUSDPerMillion  float64
	OutputUSDPerMillion float64
}

// knownModels are the families whose image tiling WorstCase assumes.
var knownModels = []ModelInfo{
	{"gemini-2.5-flash", 0.30, 2.50},
	{"gemini-2.5-flash-lite", 0.10, 0.40},
	{"gemini-2.5-pro", 1.25, 10.00},
	{"gemini-2.0-flash", 0.10, 0.40},
	{"gemini-2.0-flash-lite", 0.075, 0.30},
}

// modelVersion matches what may follow a family's name and still be that
// family: a stable version ("-001"), a dated preview ("-preview-09-2025",
// "-preview-05-20"), "-exp" or "-latest". Anything else ("-image",
// "-live", "-tts") is another model with another price.
var modelVersion = regexp.MustCompile(`^(-\d{3}|-preview(-\d{2}-\d{2}|-\d{2}-\d{4})?|-exp|-latest)?$`)

// LookupModel returns the known family of a model name (a "models/"
// prefix is ignored, as the client drops it), or ok false for a model
// whose tiling and price Breakwater does not know.
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

// unknownModelError explains why an unknown model is refused.
func unknownModelError(model string) string {
	return fmt.Sprintf("%q is not a model whose image tokens and price breakwater knows (%s, with a version suffix such as -001 or -preview-09-2025); "+
		"the worst-case cost reserved before each call assumes Gemini 2.x image tiling, which another model may exceed. "+
		"Set ocr.allow_unknown_model = true to use it anyway", model, strings.Join(KnownModels(), ", "))
}

// Warnings returns what an operator should know about c that does not
// stop the start: an unknown model allowed by AllowUnknownModel, whose
// calls may cost more than the budget reserves for them, and a configured
// price below the known model's list price, which makes every count of
// money too low. config check prints them; serve logs them.
func (c Config) Warnings() []string {
	c = c.WithDefaults()
	if c.Provider != ProviderGemini {
		return nil
	}
	m, known := LookupModel(c.Model)
	if !known {
		return []string{fmt.Sprintf("ocr.model %q is not a known model (allowed by ocr.allow_unknown_model): the worst-case cost reserved before each call assumes Gemini 2.x image tiling and may be below what Google bills, so the global budget can be overshot by the calls in flight; each call is still settled at the cost Gemini reports. Check its image token count and set ocr.price to its list price", c.Model)}
	}
	var out []string
	below := func(key string, got, list float64) {
		if got < list {
			out = append(out, fmt.Sprintf("ocr.price.%s = %g is below the list price of %s ($%g per million tokens): costs and the money budget would count less than Google bills", key, got, m.Family, list))
		}
	}
	below("input_usd_per_million", c.Price.InputUSDPerMillion, m.InputUSDPerMillion)
	below("output_usd_per_million", c.Price.OutputUSDPerMillion, m.OutputUSDPerMillion)
	return out
}
