package ocr

import (
	"strings"
	"testing"
)

func TestLookupModel(t *testing.T) {
	cases := []struct {
		name, family string
	}{
		{"gemini-3.5-flash-lite", "gemini-3.5-flash-lite"},
		{"models/gemini-3.5-flash-lite", "gemini-3.5-flash-lite"},
		{"gemini-3.5-flash", "gemini-3.5-flash"},
		{"gemini-3.8-flash", "gemini-3.8-flash"},
		{"gemini-3.1-flash-lite", "gemini-3.1-flash-lite"},
		{"gemini-3.1-flash-lite-preview", "gemini-3.1-flash-lite"},
		{"gemini-3.1-pro-preview", "gemini-3.1-pro-preview"},
		{"gemini-3-flash-preview", "gemini-3-flash-preview"},
		{"gemini-2.5-flash", "gemini-2.5-flash"},
		{"models/gemini-2.5-flash", "gemini-2.5-flash"},
		{"gemini-2.5-flash-001", "gemini-2.5-flash"},
		{"gemini-2.5-flash-preview-09-2025", "gemini-2.5-flash"},
		{"gemini-2.5-flash-preview-05-20", "gemini-2.5-flash"},
		{"gemini-2.5-flash-lite", "gemini-2.5-flash-lite"},
		{"gemini-2.5-flash-lite-preview-06-17", "gemini-2.5-flash-lite"},
		{"gemini-2.5-pro", "gemini-2.5-pro"},
		// Other models: another image rule, another price, or shut down.
		{"gemini-3.7-flash", ""},
		{"gemini-3.1-flash-image", ""},
		{"gemini-3.1-flash-live-preview", ""},
		{"gemini-3-pro-image", ""},
		{"gemini-2.0-flash", ""},
		{"gemini-2.5-flash-image", ""},
		{"gemini-2.5-flash-live", ""},
		{"gemini-2.5-flashy", ""},
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

// TestModelTable: every entry has a rule, prices above zero and the
// thinking setting its rule takes.
func TestModelTable(t *testing.T) {
	for _, m := range knownModels {
		if m.InputUSDPerMillion <= 0 || m.OutputUSDPerMillion <= 0 {
			t.Errorf("%s: price %g / %g, want both above 0", m.Family, m.InputUSDPerMillion, m.OutputUSDPerMillion)
		}
		switch m.Image {
		case ImageMediaResolution:
			if !thinkingLevels[m.ThinkingLevel] || m.ThinkingBudget != 0 {
				t.Errorf("%s: thinking %q / %d, want a level and no budget", m.Family, m.ThinkingLevel, m.ThinkingBudget)
			}
		case ImageTiles:
			if m.ThinkingLevel != "" {
				t.Errorf("%s: thinking level %q on a budget model", m.Family, m.ThinkingLevel)
			}
		default:
			t.Errorf("%s: image rule %q", m.Family, m.Image)
		}
	}
	if _, ok := LookupModel(DefaultModel); !ok {
		t.Errorf("DefaultModel %s is not in the table", DefaultModel)
	}
}

// TestWorstCaseMediaResolution: the worst case reserved for a Gemini 3
// model at each media_resolution level counts the level's documented
// ceiling of tokens per image, whatever the image's size, plus the prompt
// bound and the output cap.
func TestWorstCaseMediaResolution(t *testing.T) {
	for _, tt := range []struct {
		level  string
		tokens int
		want   int64 // micro-dollars at gemini-3.5-flash-lite's 0.30 / 2.50
	}{
		{MediaLow, 280, 814},         // (280+300)×0.30 + 256×2.50 = 174 + 640
		{MediaMedium, 560, 898},      // (560+300)×0.30 + 640 = 258 + 640
		{MediaHigh, 1120, 1066},      // (1120+300)×0.30 + 640 = 426 + 640
		{MediaUltraHigh, 2240, 1402}, // (2240+300)×0.30 + 640 = 762 + 640
	} {
		t.Run(tt.level, func(t *testing.T) {
			p, ok := Config{Model: "gemini-3.5-flash-lite", MediaResolution: tt.level}.PriceOf("gemini-3.5-flash-lite")
			if !ok {
				t.Fatal("PriceOf: not known")
			}
			for _, size := range [][2]int{{1, 1}, {384, 384}, {1024, 768}, {8000, 8000}} {
				if got := p.ImageTokens(size[0], size[1]); got != tt.tokens {
					t.Errorf("ImageTokens(%d×%d) = %d, want the documented ceiling %d", size[0], size[1], got, tt.tokens)
				}
				if got := p.WorstCase(size[0], size[1]); got != tt.want {
					t.Errorf("WorstCase(%d×%d) = %d, want %d", size[0], size[1], got, tt.want)
				}
			}
			// A call billed at the ceiling with the whole output cap
			// (thoughts and answer together) is within the worst case.
			billed := p.Cost(Usage{PromptTokens: tt.tokens + promptTokenBound, CandidatesTokens: 200, ThoughtsTokens: 56})
			if worst := p.WorstCase(640, 480); billed > worst {
				t.Errorf("a call billed %d is above the worst case %d", billed, worst)
			}
		})
	}
}

func TestPriceOf(t *testing.T) {
	cfg := Config{
		Model: "gemini-3.5-flash-lite", Price: Price{InputUSDPerMillion: 0.35, MaxOutputTokens: 100}, MediaResolution: MediaMedium,
		ModelOverrides: []ModelOverride{{Name: "gemini-9-flash", ImageTokens: "tiles", InputUSDPerMillion: 7, OutputUSDPerMillion: 9}},
	}
	for _, tt := range []struct {
		model        string
		ok           bool
		in, out      float64
		imageTokens  int // of a 1024×1024 image
		maxOutTokens int
	}{
		{"gemini-3.5-flash-lite", true, 0.35, 2.50, 560, 100}, // ocr.model: [ocr.price] over the list price
		{"models/gemini-3.5-flash-lite", true, 0.35, 2.50, 560, 100},
		{"gemini-3.5-flash", true, 1.50, 9.00, 560, 100},       // another: its list price, the same cap and level
		{"gemini-2.5-flash-lite", true, 0.10, 0.40, 1032, 100}, // tiles: 2×2
		{"gemini-9-flash", true, 7, 9, 1032, 100},              // an override
		{"gemini-3.7-flash", false, 0, 0, 0, 0},
	} {
		t.Run(tt.model, func(t *testing.T) {
			p, ok := cfg.PriceOf(tt.model)
			if ok != tt.ok {
				t.Fatalf("PriceOf ok = %v, want %v", ok, tt.ok)
			}
			if !ok {
				return
			}
			if p.InputUSDPerMillion != tt.in || p.OutputUSDPerMillion != tt.out || p.MaxOutputTokens != tt.maxOutTokens {
				t.Errorf("PriceOf = %+v, want %g / %g, cap %d", p, tt.in, tt.out, tt.maxOutTokens)
			}
			if got := p.ImageTokens(1024, 1024); got != tt.imageTokens {
				t.Errorf("ImageTokens(1024×1024) = %d, want %d", got, tt.imageTokens)
			}
		})
	}
}

func TestValidateUnknownModel(t *testing.T) {
	override := ModelOverride{Name: "gemini-3.7-flash", ImageTokens: "media_resolution", InputUSDPerMillion: 0.75, OutputUSDPerMillion: 3.75}
	cases := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none for valid
	}{
		{"default model", Config{}, nil},
		{"known model", Config{Model: "gemini-2.5-pro"}, nil},
		{"unknown model refused with what to set", Config{Model: "gemini-3.7-flash"},
			[]string{`ocr.model: "gemini-3.7-flash" is not a model`, "[[ocr.model_overrides]]", `name = "gemini-3.7-flash"`,
				`image_tokens = "media_resolution"`, "input_usd_per_million", "output_usd_per_million", ModelsChecked}},
		{"unknown model with an override", Config{Model: "gemini-3.7-flash", ModelOverrides: []ModelOverride{override}}, nil},
		{"allow_unknown_model is refused and names its replacement", Config{Model: "gemini-3.7-flash", AllowUnknownModel: true},
			[]string{"ocr.allow_unknown_model: is no longer read", "[[ocr.model_overrides]]"}},
		{"simulated needs no known model", Config{Provider: ProviderSimulated, Model: "anything"}, nil},
		{"override without prices", Config{Model: "gemini-3.7-flash", ModelOverrides: []ModelOverride{{Name: "gemini-3.7-flash", ImageTokens: "media_resolution"}}},
			[]string{`ocr.model_overrides "gemini-3.7-flash": input_usd_per_million: required: set it to the model's list price`,
				`ocr.model_overrides "gemini-3.7-flash": output_usd_per_million: required`}},
		{"override at zero", Config{ModelOverrides: []ModelOverride{{Name: "x", ImageTokens: "tiles", InputUSDPerMillion: 0, OutputUSDPerMillion: 1}}},
			[]string{`"x": input_usd_per_million: required`}},
		{"override without a rule", Config{ModelOverrides: []ModelOverride{{Name: "x", InputUSDPerMillion: 1, OutputUSDPerMillion: 1}}},
			[]string{`"x": image_tokens: "" is not a rule: set "media_resolution"`}},
		{"override without a name", Config{ModelOverrides: []ModelOverride{{ImageTokens: "tiles", InputUSDPerMillion: 1, OutputUSDPerMillion: 1}}},
			[]string{"ocr.model_overrides[0]: name: required"}},
		{"override twice", Config{ModelOverrides: []ModelOverride{override, override}}, []string{"name: given twice"}},
		{"thinking of the wrong kind", Config{ModelOverrides: []ModelOverride{
			{Name: "a", ImageTokens: "tiles", InputUSDPerMillion: 1, OutputUSDPerMillion: 1, ThinkingLevel: "low"},
			{Name: "b", ImageTokens: "media_resolution", InputUSDPerMillion: 1, OutputUSDPerMillion: 1, ThinkingLevel: "deep"}}},
			[]string{`"a": thinking_level: a tiles model`, `"b": thinking_level: unknown level "deep"`}},
		{"prices in time", Config{Model: "m", ModelOverrides: []ModelOverride{{Name: "m", ImageTokens: "media_resolution", Prices: []OverridePrice{
			{From: "2026-01-01", InputUSDPerMillion: 1, OutputUSDPerMillion: 4}, {From: "2027-01-01", InputUSDPerMillion: 2, OutputUSDPerMillion: 8}}}}}, nil},
		{"prices out of order, bad days, a free period", Config{ModelOverrides: []ModelOverride{{Name: "m", ImageTokens: "media_resolution", Prices: []OverridePrice{
			{From: "2027-01-01", InputUSDPerMillion: 1, OutputUSDPerMillion: 4}, {From: "2026-01-01", InputUSDPerMillion: 2, OutputUSDPerMillion: 8},
			{From: "next year", InputUSDPerMillion: 2, OutputUSDPerMillion: 8}, {From: "2028-01-01", InputUSDPerMillion: 0, OutputUSDPerMillion: 8}}}}},
			[]string{`"m": prices[1].from: 2026-01-01 is not after the period before it (2027-01-01)`, `prices[2].from: "next year" is not a day`,
				`prices[3].input_usd_per_million: required`}},
		{"prices given both ways", Config{ModelOverrides: []ModelOverride{{Name: "m", ImageTokens: "tiles", InputUSDPerMillion: 1, OutputUSDPerMillion: 1,
			Prices: []OverridePrice{{From: "2026-01-01", InputUSDPerMillion: 1, OutputUSDPerMillion: 4}}}}}, []string{"give the prices one way"}},
		{"gemini 4 takes levels only", Config{ModelOverrides: []ModelOverride{
			{Name: "gemini-4-neon", ImageTokens: "tiles", InputUSDPerMillion: 1, OutputUSDPerMillion: 1, ThinkingBudget: 128},
			{Name: "gemini-4-xenon", ImageTokens: "media_resolution", InputUSDPerMillion: 1, OutputUSDPerMillion: 1, ThinkingLevel: "minimal"}}},
			[]string{`"gemini-4-neon": image_tokens: a Gemini 4 model takes thinking_level`, `"gemini-4-xenon": thinking_level: a Gemini 4 model refuses "minimal"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Errorf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %v\nwant it to say %q", err, w)
				}
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
		{"list price taken by default", Config{Model: "gemini-2.5-pro"}, nil},
		{"pro at flash-lite prices", Config{Model: "gemini-2.5-pro", Price: Price{InputUSDPerMillion: 0.30, OutputUSDPerMillion: 2.50}},
			[]string{"ocr.price.input_usd_per_million = 0.3 is below the list price of gemini-2.5-pro", "ocr.price.output_usd_per_million = 2.5 is below"}},
		{"pro at pro prices", Config{Model: "gemini-2.5-pro", Price: Price{InputUSDPerMillion: 1.25, OutputUSDPerMillion: 10}}, nil},
		{"price change over 14 days away", Config{Model: "gemini-3.8-flash"}, nil},
		{"[ocr.price] below an announced price", Config{Model: "gemini-3.8-flash", Price: Price{InputUSDPerMillion: 0.75, OutputUSDPerMillion: 3.75}},
			[]string{"ocr.price sets $0.75 in / $3.75 out for gemini-3.8-flash, but its list price is $1.5 / $7.5 from 2027-01-01"}},
		{"simulated", Config{Provider: ProviderSimulated, Model: "x"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.cfg.Warnings(checkDay)
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

// A change of a price the ledger counts is warned of 14 days before it,
// for the model and the fallback, and not after it; the price in force
// and the next change are said every day.
func TestPriceChangeWarnings(t *testing.T) {
	cfg := Config{Model: "gemini-3.8-flash", FallbackModel: "gemini-3.5-flash-lite"}
	for _, c := range []struct {
		day  string
		want []string
	}{
		{"2026-12-17", nil},
		{"2026-12-18", []string{"price change: gemini-3.8-flash on 2026-12-18: $0.75 in / $3.75 out per million tokens; from 2027-01-01 (in 14 days): $1.5 in / $7.5 out"}},
		{"2026-12-31", []string{"(in 1 days)"}},
		{"2027-01-01", nil},
	} {
		got := cfg.Warnings(c.day)
		if len(got) != len(c.want) {
			t.Errorf("on %s: Warnings = %q, want %d", c.day, got, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("on %s: warning %q does not say %q", c.day, got[i], w)
			}
		}
	}
	rules := strings.Join(cfg.Rules("2027-01-01"), "\n")
	for _, want := range []string{"list price $1.5 in / $7.5 out per million tokens on 2027-01-01", "charged at $1.5 in / $7.5 out",
		"price of gemini-3.8-flash on 2027-01-01: $1.5 in / $7.5 out per million tokens; no change known",
		"price of gemini-3.5-flash-lite on 2027-01-01: $0.3 in / $2.5 out per million tokens; no change known"} {
		if !strings.Contains(rules, want) {
			t.Errorf("Rules on 2027-01-01 = %q\nwant it to say %q", rules, want)
		}
	}
	if rules := strings.Join(cfg.Rules(checkDay), "\n"); !strings.Contains(rules, "from 2027-01-01 (in 26 days): $1.5 in / $7.5 out") {
		t.Errorf("Rules on %s do not name the next change: %q", checkDay, rules)
	}
}

// A price is the period's in force on the day asked: before the first
// change the first period's, from its day the change's, and a price the
// file sets holds on every day while the other follows the table.
func TestPriceOn(t *testing.T) {
	p, ok := Config{Model: "gemini-3.8-flash"}.PriceOf("gemini-3.8-flash")
	if !ok {
		t.Fatal("gemini-3.8-flash unknown")
	}
	for day, want := range map[string][2]float64{"2026-01-01": {0.75, 3.75}, "2026-12-31": {0.75, 3.75}, "2027-01-01": {1.5, 7.5}, "2030-06-01": {1.5, 7.5}} {
		if got := p.On(day); got.InputUSDPerMillion != want[0] || got.OutputUSDPerMillion != want[1] {
			t.Errorf("on %s: $%g / $%g, want $%g / $%g", day, got.InputUSDPerMillion, got.OutputUSDPerMillion, want[0], want[1])
		}
	}
	// Output tokens cost twice from the change: a call's worst case too.
	if before, after := p.On("2026-12-31").WorstCase(100, 100), p.On("2027-01-01").WorstCase(100, 100); after != 2*before && after != 2*before-1 {
		t.Errorf("worst case %d µ$ on the last day, %d from the change: want twice", before, after)
	}
	half, _ := Config{Model: "gemini-3.8-flash", Price: Price{InputUSDPerMillion: 0.9}}.PriceOf("gemini-3.8-flash")
	if got := half.On("2027-01-01"); got.InputUSDPerMillion != 0.9 || got.OutputUSDPerMillion != 7.5 {
		t.Errorf("input set in the file, on the change: $%g / $%g, want the file's 0.9 and the table's 7.5", got.InputUSDPerMillion, got.OutputUSDPerMillion)
	}
	argon, _ := Config{Model: "gemini-4-argon"}.PriceOf("gemini-4-argon")
	if got := argon.On(checkDay); got.InputUSDPerMillion != 4 || got.OutputUSDPerMillion != 20 {
		t.Errorf("gemini-4-argon on %s: $%g / $%g, want $4 / $20 (its price from 2026-12-01)", checkDay, got.InputUSDPerMillion, got.OutputUSDPerMillion)
	}
	over := Config{Model: "m9", ModelOverrides: []ModelOverride{{Name: "m9", ImageTokens: "media_resolution", Prices: []OverridePrice{
		{From: "2026-01-01", InputUSDPerMillion: 1, OutputUSDPerMillion: 4}, {From: "2027-01-01", InputUSDPerMillion: 2, OutputUSDPerMillion: 8}}}}}
	if err := over.Validate(); err != nil {
		t.Fatal(err)
	}
	op, _ := over.PriceOf("m9")
	for day, want := range map[string]float64{"2025-06-01": 1, "2026-12-31": 1, "2027-01-01": 2} {
		if got := op.On(day).InputUSDPerMillion; got != want {
			t.Errorf("override on %s: $%g in, want $%g", day, got, want)
		}
	}
}

func TestConfigRules(t *testing.T) {
	got := strings.Join(Config{}.Rules(checkDay), "\n")
	for _, want := range []string{"model gemini-3.5-flash-lite (from the model table checked " + ModelsChecked + "; its entry from " + pagePricing,
		"image tokens by media_resolution, at most 1120 per image", "list price $0.3 in / $2.5 out",
		"charged at $0.3 in / $2.5 out", `maxOutputTokens 256 and thinkingLevel "minimal"`} {
		if !strings.Contains(got, want) {
			t.Errorf("Rules = %q\nwant it to say %q", got, want)
		}
	}
	cfg := Config{Model: "m9", ModelOverrides: []ModelOverride{{Name: "m9", ImageTokens: "tiles", InputUSDPerMillion: 2, OutputUSDPerMillion: 3}}}
	got = strings.Join(cfg.Rules(checkDay), "\n")
	for _, want := range []string{"model m9 (from ocr.model_overrides)", "768-px tiles", "thinkingBudget 0", "charged at $2 in / $3 out"} {
		if !strings.Contains(got, want) {
			t.Errorf("Rules = %q\nwant it to say %q", got, want)
		}
	}
}

// checkDay is the day the tests look the table's prices up on.
const checkDay = "2026-12-06"
