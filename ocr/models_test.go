package ocr

import (
	"strings"
	"testing"
)

func TestLookupModel(t *testing.T) {
	cases := []struct {
		name, family string
	}{
		{"gemini-2.5-flash", "gemini-2.5-flash"},
		{"models/gemini-2.5-flash", "gemini-2.5-flash"},
		{"gemini-2.5-flash-001", "gemini-2.5-flash"},
		{"gemini-2.5-flash-preview-09-2025", "gemini-2.5-flash"},
		{"gemini-2.5-flash-preview-05-20", "gemini-2.5-flash"},
		{"gemini-2.5-flash-lite", "gemini-2.5-flash-lite"},
		{"gemini-2.5-flash-lite-preview-06-17", "gemini-2.5-flash-lite"},
		{"gemini-2.5-pro", "gemini-2.5-pro"},
		{"gemini-2.0-flash", "gemini-2.0-flash"},
		{"gemini-2.0-flash-001", "gemini-2.0-flash"},
		{"gemini-2.0-flash-lite", "gemini-2.0-flash-lite"},
		{"gemini-2.0-flash-exp", "gemini-2.0-flash"},
		// Other models: another tiling, another price.
		{"gemini-3-pro-preview", ""},
		{"gemini-2.5-flash-image", ""},
		{"gemini-2.5-flash-image-preview", ""},
		{"gemini-2.5-flash-live", ""},
		{"gemini-2.5-flashy", ""},
		{"gemini-1.5-flash", ""},
		{"gemini-flash-latest", ""},
		{"gpt-4o", ""},
		{"", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, ok := LookupModel(c.name)
			if got, want := ok, c.family != ""; got != want || m.Family != c.family {
				t.Errorf("LookupModel(%q) = %q, %v; want %q", c.name, m.Family, ok, c.family)
			}
		})
	}
}

func TestValidateUnknownModel(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"default model", Config{}, ""},
		{"known model", Config{Model: "gemini-2.5-pro"}, ""},
		{"unknown model refused", Config{Model: "gemini-3-pro-preview"}, `ocr.model: "gemini-3-pro-preview" is not a model`},
		{"unknown model allowed", Config{Model: "gemini-3-pro-preview", AllowUnknownModel: true}, ""},
		{"simulated needs no known model", Config{Provider: ProviderSimulated, Model: "anything"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("Validate = %v, want nil", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "ocr.allow_unknown_model")):
				t.Errorf("Validate = %v, want %q and the way out", err, c.wantErr)
			}
		})
	}
}

func TestConfigWarnings(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want []string // one substring per warning
	}{
		{"defaults", Config{}, nil},
		{"flash-lite at flash prices", Config{Model: "gemini-2.5-flash-lite"}, nil},
		{"unknown model allowed", Config{Model: "gemini-3-pro-preview", AllowUnknownModel: true},
			[]string{`ocr.model "gemini-3-pro-preview" is not a known model`}},
		{"pro at flash prices", Config{Model: "gemini-2.5-pro"},
			[]string{"ocr.price.input_usd_per_million = 0.3 is below the list price of gemini-2.5-pro", "ocr.price.output_usd_per_million = 2.5 is below"}},
		{"pro at pro prices", Config{Model: "gemini-2.5-pro", Price: Price{InputUSDPerMillion: 1.25, OutputUSDPerMillion: 10}}, nil},
		{"simulated", Config{Provider: ProviderSimulated, Model: "x", AllowUnknownModel: true}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.cfg.Warnings()
			if len(got) != len(c.want) {
				t.Fatalf("Warnings = %q, want %d", got, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q does not say %q", got[i], w)
				}
			}
		})
	}
}
