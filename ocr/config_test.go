package ocr

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestWithDefaults(t *testing.T) {
	got := Config{}.WithDefaults()
	want := Config{
		Provider:        "gemini",
		Model:           "gemini-3.5-flash-lite",
		BaseURL:         "https://generativelanguage.googleapis.com",
		Timeout:         30 * time.Second,
		SerialPattern:   `^[A-Z0-9][A-Z0-9./-]{3,39}$`,
		IdempotencyTTL:  24 * time.Hour,
		MediaResolution: "high",
		Price:           Price{InputUSDPerMillion: 0.30, OutputUSDPerMillion: 2.50, MaxOutputTokens: 256, perImage: 1120, resolved: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Config{}.WithDefaults() = %+v, want %+v", got, want)
	}

	set := Config{
		Provider: "simulated", Model: "gemini-2.5-flash", BaseURL: "http://x", Timeout: time.Second,
		SerialPattern: "[0-9]+", SimulatedLatency: time.Millisecond, IdempotencyTTL: time.Hour, MediaResolution: "low",
		Price: Price{InputUSDPerMillion: 0.1, OutputUSDPerMillion: 0.4, MaxOutputTokens: 64, perImage: tilesRule},
	}
	set.Price.fixedIn, set.Price.fixedOut, set.Price.resolved = true, true, true // prices the file sets hold on every day
	if got := set.WithDefaults(); !reflect.DeepEqual(got, set) {
		t.Errorf("WithDefaults changed set fields: %+v", got)
	}

	// Prices left out take the model's list price, not another model's.
	if got := (Config{Model: "gemini-3.1-pro-preview"}).WithDefaults().Price; got.InputUSDPerMillion != 2 || got.OutputUSDPerMillion != 12 {
		t.Errorf("gemini-3.1-pro-preview's default price = %+v, want its list price 2 / 12", got)
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"zero is valid", Config{}, ""},
		{"simulated", Config{Provider: "simulated", SimulatedLatency: time.Second}, ""},
		{"http base", Config{BaseURL: "http://127.0.0.1:8080/prefix/"}, ""},
		{"unknown provider", Config{Provider: "x"}, `ocr.provider: unknown provider "x" (want gemini or simulated)`},
		{"negative timeout", Config{Timeout: -time.Second}, "ocr.timeout: must be positive"},
		{"bad pattern", Config{SerialPattern: "(["}, "ocr.serial_pattern: "},
		{"pattern closing the anchor group", Config{SerialPattern: "a)|(b"}, "ocr.serial_pattern: "},
		{"ftp base", Config{BaseURL: "ftp://example.com"}, "ocr.base_url: "},
		{"relative base", Config{BaseURL: "/v1beta"}, "ocr.base_url: "},
		{"base without host", Config{BaseURL: "https://"}, "ocr.base_url: "},
		{"base with query", Config{BaseURL: "https://example.com/?key=x"}, "ocr.base_url: "},
		{"base with user", Config{BaseURL: "https://u:p@example.com"}, "ocr.base_url: "},
		{"unparsable base", Config{BaseURL: "http://[::1"}, "ocr.base_url: "},
		{"negative latency", Config{SimulatedLatency: -1}, "ocr.simulated_latency: "},
		{"negative input price", Config{Price: Price{InputUSDPerMillion: -0.3}}, "ocr.price.input_usd_per_million: "},
		{"negative output price", Config{Price: Price{OutputUSDPerMillion: -1}}, "ocr.price.output_usd_per_million: "},
		{"NaN price", Config{Price: Price{OutputUSDPerMillion: math.NaN()}}, "ocr.price.output_usd_per_million: "},
		{"absurd price", Config{Price: Price{InputUSDPerMillion: 1e9}}, "ocr.price.input_usd_per_million: "},
		{"negative tokens", Config{Price: Price{MaxOutputTokens: -1}}, "ocr.price.max_output_tokens: "},
		{"too many tokens", Config{Price: Price{MaxOutputTokens: 1 << 20}}, "ocr.price.max_output_tokens: "},
		{"unknown media resolution", Config{MediaResolution: "max"}, `ocr.media_resolution: unknown level "max"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestValidateReportsAll(t *testing.T) {
	err := Config{Provider: "x", Timeout: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "ocr.provider") || !strings.Contains(err.Error(), "ocr.timeout") {
		t.Errorf("Validate() = %v, want both ocr.provider and ocr.timeout", err)
	}
}

func TestSerialPatternAnchored(t *testing.T) {
	re, err := compileSerialPattern("[0-9]{4}")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		in   string
		want bool
	}{{"1234", true}, {"12345", false}, {"x1234", false}, {"", false}} {
		if got := re.MatchString(tt.in); got != tt.want {
			t.Errorf("match(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
