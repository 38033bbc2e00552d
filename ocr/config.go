package ocr

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Defaults for the zero fields of Config and Price.
const (
	DefaultProvider            = ProviderGemini
	DefaultModel               = "gemini-3.5-flash-lite"
	DefaultMediaResolution     = MediaHigh
	DefaultBaseURL             = "https://generativelanguage.googleapis.com"
	DefaultTimeout             = 30 * time.Second
	DefaultSerialPattern       = `^[A-Z0-9][A-Z0-9./-]{3,39}$`
	DefaultInputUSDPerMillion  = 0.30 // DefaultModel's list price
	DefaultOutputUSDPerMillion = 2.50 // DefaultModel's list price
	DefaultMaxOutputTokens     = 256
)

// Provider names accepted in Config.Provider.
const (
	ProviderGemini    = "gemini"
	ProviderSimulated = "simulated"
)

// MaxTimeout is the longest ocr.timeout: with the longest upload it must
// still fit the HTTP server's write timeout, or a paid read would be
// recorded and its answer lost.
const MaxTimeout = 90 * time.Second

// Config is the "[ocr]" section of config.toml.
type Config struct {
	// Provider is "gemini" (the default) or "simulated".
	Provider string `koanf:"provider"`
	// Model is the Gemini model name, without a "models/" prefix.
	// Default "gemini-3.5-flash-lite". With the gemini provider it must be
	// in the model table (LookupModel) or in ModelOverrides: the worst
	// case reserved before each call needs its image-token rule and price.
	Model string `koanf:"model"`
	// AllowUnknownModel is no longer read: it switched the worst-case
	// check off. true is refused with a message that names
	// ModelOverrides, which replaces it; false (its old default) is
	// accepted, so old configs still load.
	AllowUnknownModel bool `koanf:"allow_unknown_model"`
	// FallbackModel is the cheaper model reads go to above a soft ceiling
	// of [budget] (and always for a plan with model = "fallback"). It must
	// be in the model table or in ModelOverrides, and is required when a
	// soft ceiling is set. Default "" (none).
	FallbackModel string `koanf:"fallback_model"`
	// MediaResolution is the media_resolution level sent with every call
	// to a model of Gemini 3 or later: "low" (280 tokens per image at
	// most), "medium" (560), "high" (1120) or "ultra_high" (2240). Default
	// "high", the level Google recommends for reading fine text. Gemini
	// 2.x models count 768-px tiles instead, and it is not sent to them.
	MediaResolution string `koanf:"media_resolution"`
	// ModelOverrides are models the table does not know (or whose table
	// entry the operator corrects, such as after a price change), each
	// with its image-token rule and prices. Default none.
	ModelOverrides []ModelOverride `koanf:"model_overrides"`
	// BaseURL is the http(s) root of the Gemini API; a path is kept, so a
	// proxy prefix works. Default "https://generativelanguage.googleapis.com".
	BaseURL string `koanf:"base_url"`
	// Timeout bounds a whole Read, including the one retry. Default 30s.
	Timeout time.Duration `koanf:"timeout"`
	// SerialPattern is a regular expression (RE2 syntax) that a serial must
	// match entirely; it is anchored at both ends even if written without ^
	// and $. Default `^[A-Z0-9][A-Z0-9./-]{3,39}$`.
	SerialPattern string `koanf:"serial_pattern"`
	// SimulatedLatency is how long the simulated provider waits before it
	// answers. Ignored by the gemini provider. Default 0 (no wait).
	SimulatedLatency time.Duration `koanf:"simulated_latency"`
	// IdempotencyTTL is how long a read made with an Idempotency-Key is
	// answered again, from storage, to a repeat with that key. Default
	// 24h.
	IdempotencyTTL time.Duration `koanf:"idempotency_ttl"`
	// DedupeWindow is how long a user who sends again an image of one of
	// their successful reads gets that read back ("cached": true) without
	// a new call. Left out: DefaultDedupeWindow (10m); an explicit "0s"
	// switches it off.
	DedupeWindow time.Duration `koanf:"dedupe_window"`
	// Price is what the provider charges per token.
	Price Price `koanf:"price"`
}

// Defaults of the answers kept with usage records.
const (
	DefaultIdempotencyTTL = 24 * time.Hour
	DefaultDedupeWindow   = 10 * time.Minute
	// MaxIdempotencyTTL bounds how long answers are kept.
	MaxIdempotencyTTL = 30 * 24 * time.Hour
)

// Price is the "[ocr.price]" section of config.toml: what a call to one
// model is charged, which moves, so it lives in config, and (set by
// Config.WithDefaults or PriceOf, not by the file) how that model counts
// an image's tokens. A zero field means its default; a price of exactly
// zero cannot be configured.
type Price struct {
	// InputUSDPerMillion is US dollars per million input (prompt and image)
	// tokens, on every day. Default: the list price of Config.Model in
	// force on each day (0.30 for the default model, Gemini 3.5
	// Flash-Lite), which follows the model's announced changes.
	InputUSDPerMillion float64 `koanf:"input_usd_per_million"`
	// OutputUSDPerMillion is US dollars per million output tokens, thinking
	// tokens included, on every day. Default: the list price of
	// Config.Model in force on each day (2.50 for the default model).
	OutputUSDPerMillion float64 `koanf:"output_usd_per_million"`
	// MaxOutputTokens is sent with every call as maxOutputTokens and bounds
	// the output side of WorstCase: it caps thoughts and answer together.
	// Default 256.
	MaxOutputTokens int `koanf:"max_output_tokens"`

	// perImage is how the model this Price belongs to counts an image:
	// tilesRule for Gemini 2.x tiles, else the fixed ceiling of tokens per
	// image of the media_resolution level sent. Config.WithDefaults and
	// PriceOf set it; 0 takes DefaultModel's at DefaultMediaResolution.
	perImage int
	// later are the model's price changes after its first period, which
	// On applies to each price the file does not set (fixedIn, fixedOut:
	// a price set in [ocr.price] holds on every day). Set with perImage.
	later             []PricePeriod
	fixedIn, fixedOut bool
	// resolved is set by the first resolve: a second (WithDefaults of a
	// Config already with defaults) must not take the table's prices it
	// filled in for prices the file set.
	resolved bool
}

// tilesRule is Price.perImage for a model that counts 768-px tiles.
const tilesRule = -1

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Provider == "" {
		c.Provider = DefaultProvider
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.SerialPattern == "" {
		c.SerialPattern = DefaultSerialPattern
	}
	if c.IdempotencyTTL == 0 {
		c.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if c.MediaResolution == "" {
		c.MediaResolution = DefaultMediaResolution
	}
	c.Price = c.resolve(c.Model, c.Price)
	return c
}

// resolve fills the zero prices of p with model's list prices, with their
// changes in time (Price.On), and sets its image-token rule; a model c
// does not know takes DefaultModel's.
func (c Config) resolve(model string, p Price) Price {
	m, ok := c.Lookup(model)
	if !ok {
		m, _ = LookupModel(DefaultModel)
	}
	if !p.resolved {
		p.fixedIn, p.fixedOut, p.resolved = p.InputUSDPerMillion != 0, p.OutputUSDPerMillion != 0, true
	}
	if !p.fixedIn {
		p.InputUSDPerMillion = m.InputUSDPerMillion
	}
	if !p.fixedOut {
		p.OutputUSDPerMillion = m.OutputUSDPerMillion
	}
	p.later = m.Later
	p.perImage = tilesRule
	if m.Image == ImageMediaResolution {
		p.perImage = MediaResolutionTokens(c.MediaResolution)
	}
	return p.withDefaults()
}

// PriceOf is the Price a call to model is reserved and settled at: for
// ocr.model, Price (its [ocr.price] keys over the model's list price);
// for another model, its entry in ModelOverrides or in the table, at its
// list price. Either way with Price's output cap and MediaResolution's
// image tokens. ok is false for a model neither knows: no call may go to
// it. The budget and the guard look a call's price up here by the name of
// the model it goes to.
func (c Config) PriceOf(model string) (Price, bool) {
	c = c.WithDefaults()
	if strings.TrimPrefix(model, "models/") == strings.TrimPrefix(c.Model, "models/") {
		return c.Price, true
	}
	if _, ok := c.Lookup(model); !ok {
		return Price{}, false
	}
	return c.resolve(model, Price{MaxOutputTokens: c.Price.MaxOutputTokens}), true
}

func (p Price) withDefaults() Price {
	if p.InputUSDPerMillion == 0 {
		p.InputUSDPerMillion = DefaultInputUSDPerMillion
	}
	if p.OutputUSDPerMillion == 0 {
		p.OutputUSDPerMillion = DefaultOutputUSDPerMillion
	}
	if p.MaxOutputTokens == 0 {
		p.MaxOutputTokens = DefaultMaxOutputTokens
	}
	if p.perImage == 0 {
		p.perImage = MediaResolutionTokens(DefaultMediaResolution)
	}
	return p
}

// maxPriceUSDPerMillion bounds a configured price so that Cost stays far
// from int64 overflow and a typo (a price per token, per thousand) shows.
const maxPriceUSDPerMillion = 1000

// maxMaxOutputTokens is the largest output cap any Gemini model accepts.
const maxMaxOutputTokens = 65536

// Validate reports every problem in c, zero fields taking their defaults.
// Each message names its config key, e.g. "ocr.timeout: must be positive".
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	add := func(key, msg string) { errs = append(errs, errors.New("ocr."+key+": "+msg)) }

	switch c.Provider {
	case ProviderGemini, ProviderSimulated:
	default:
		add("provider", fmt.Sprintf("unknown provider %q (want gemini or simulated)", c.Provider))
	}
	if c.AllowUnknownModel {
		add("allow_unknown_model", "is no longer read: it switched off the worst-case check that keeps the budget exact. "+
			"Remove it, and give the model's image-token rule and prices in [[ocr.model_overrides]] (name, image_tokens, "+
			"input_usd_per_million, output_usd_per_million; see docs/CONFIGURATION.md)")
	}
	if _, known := c.Lookup(c.Model); c.Provider == ProviderGemini && !known {
		add("model", unknownModelError(c.Model))
	}
	if _, known := c.Lookup(c.FallbackModel); c.FallbackModel != "" && !known {
		add("fallback_model", unknownModelError(c.FallbackModel))
	}
	if MediaResolutionTokens(c.MediaResolution) == 0 {
		add("media_resolution", fmt.Sprintf("unknown level %q (want low, medium, high or ultra_high)", c.MediaResolution))
	}
	errs = append(errs, validateOverrides(c.ModelOverrides)...)
	if err := checkBaseURL(c.BaseURL); err != nil {
		add("base_url", err.Error())
	}
	if c.Timeout < 0 {
		add("timeout", "must be positive")
	}
	if c.Timeout > MaxTimeout {
		add("timeout", fmt.Sprintf("must be at most %s, so the answer still fits the server's write timeout", MaxTimeout))
	}
	if _, err := compileSerialPattern(c.SerialPattern); err != nil {
		add("serial_pattern", err.Error())
	}
	if c.SimulatedLatency < 0 {
		add("simulated_latency", "must not be negative")
	}
	if c.IdempotencyTTL < 0 || c.IdempotencyTTL > MaxIdempotencyTTL {
		add("idempotency_ttl", fmt.Sprintf("must be between 1s and %s", MaxIdempotencyTTL))
	}
	if c.DedupeWindow < 0 || c.DedupeWindow > MaxIdempotencyTTL {
		add("dedupe_window", fmt.Sprintf("must be between 0s (off) and %s", MaxIdempotencyTTL))
	}
	checkPrice := func(key string, v float64) {
		switch {
		case v != v: // NaN
			add(key, "must be a number")
		case v < 0:
			add(key, "must not be negative")
		case v > maxPriceUSDPerMillion:
			add(key, fmt.Sprintf("must be at most %d USD per million tokens", maxPriceUSDPerMillion))
		}
	}
	checkPrice("price.input_usd_per_million", c.Price.InputUSDPerMillion)
	checkPrice("price.output_usd_per_million", c.Price.OutputUSDPerMillion)
	switch {
	case c.Price.MaxOutputTokens < 0:
		add("price.max_output_tokens", "must not be negative")
	case c.Price.MaxOutputTokens > maxMaxOutputTokens:
		add("price.max_output_tokens", fmt.Sprintf("must be at most %d", maxMaxOutputTokens))
	}
	return errors.Join(errs...)
}

func checkBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("has no host")
	}
	if u.User != nil {
		return errors.New("must not hold credentials")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return errors.New("must not have a query or fragment")
	}
	return nil
}

// compileSerialPattern anchors pattern at both ends so that a serial must
// match it entirely.
func compileSerialPattern(pattern string) (*regexp.Regexp, error) {
	if _, err := regexp.Compile(pattern); err != nil {
		return nil, err
	}
	return regexp.Compile(`^(?:` + pattern + `)$`)
}
