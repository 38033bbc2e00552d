package ocr

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"
)

// Defaults for the zero fields of Config and Price.
const (
	DefaultProvider            = ProviderGemini
	DefaultModel               = "gemini-2.5-flash"
	DefaultBaseURL             = "https://generativelanguage.googleapis.com"
	DefaultTimeout             = 30 * time.Second
	DefaultSerialPattern       = `^[A-Z0-9][A-Z0-9./-]{3,39}$`
	DefaultInputUSDPerMillion  = 0.30
	DefaultOutputUSDPerMillion = 2.50
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
	// Default "gemini-2.5-flash". With the gemini provider it must be one
	// of the families LookupModel knows (whose image tiling WorstCase
	// assumes), unless AllowUnknownModel is set.
	Model string `koanf:"model"`
	// AllowUnknownModel lets Model name a model LookupModel does not know;
	// Warnings then says that the worst case reserved before each call may
	// be below what it is billed. Default false: such a model is refused.
	AllowUnknownModel bool `koanf:"allow_unknown_model"`
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

// Price is the "[ocr.price]" section of config.toml: the provider's list
// prices, which move, so they live in config. A zero field means its
// default; a price of exactly zero cannot be configured.
type Price struct {
	// InputUSDPerMillion is US dollars per million input (prompt and image)
	// tokens. Default 0.30 (Gemini 2.5 Flash).
	InputUSDPerMillion float64 `koanf:"input_usd_per_million"`
	// OutputUSDPerMillion is US dollars per million output tokens, thinking
	// tokens included. Default 2.50 (Gemini 2.5 Flash).
	OutputUSDPerMillion float64 `koanf:"output_usd_per_million"`
	// MaxOutputTokens is sent with every call as maxOutputTokens and bounds
	// the output side of WorstCase. Default 256.
	MaxOutputTokens int `koanf:"max_output_tokens"`
}

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
	c.Price = c.Price.withDefaults()
	return c
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
	if _, known := LookupModel(c.Model); c.Provider == ProviderGemini && !known && !c.AllowUnknownModel {
		add("model", unknownModelError(c.Model))
	}
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
