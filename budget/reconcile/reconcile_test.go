package reconcile

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// models are the names the tests' matcher knows, as the table and the
// overrides would give them.
var models = []string{"gemini-2.5-flash", "gemini-3.5-flash", "gemini-3.5-flash-lite", "gemini-4-argon"}

// The fixtures' day: gemini-3.5-flash-lite billed $0.18 for 1,000,000
// input and 200,000 output tokens ($0.10 and $0.40 per million);
// gemini-3.5-flash $0.185 for 200,000 and 50,000 ($0.30 and $2.50).
const fixtureDay = "2026-12-01"

// ledgerAt is a ledger of the fixtures' day whose prices are factor
// times Google's, with thoughts of gemini-3.5-flash left uncounted when
// dropThoughts, and a failed call of $0.001 without a usage row.
func ledgerAt(factor float64, dropThoughts bool) Ledger {
	var s Summer
	lite := int64(math.Round(factor * 180000))
	for range 4 { // four reads of 250,000 input and 50,000 output tokens
		s.Add(fixtureDay, "gemini-3.5-flash-lite", lite/4, 250000, 50000, 0)
	}
	thoughts, flash := 30000, int64(math.Round(factor*185000))
	if dropThoughts {
		thoughts, flash = 0, int64(math.Round(factor*(60000+20000*2.5)))
	}
	s.Add(fixtureDay, "models/gemini-3.5-flash-001", flash, 200000, 20000, thoughts)
	spend := lite + flash + 1000
	return Ledger{Days: []LedgerDay{{Day: fixtureDay, Calls: 6, SpendMicroUSD: spend}}, Models: s.Counted()}
}

// reconcileFile reads the fixture name and compares it with l.
func reconcileFile(t *testing.T, name string, l Ledger, prices Prices) (Report, Shape) {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := NewBill(NewMatcher(models, nil, DefaultServices), time.UTC, "", "")
	shape, err := Read(f, b.Add)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	rep, err := Compare(l, b, DefaultMaxDrift, "", "", prices)
	if err != nil {
		t.Fatalf("compare %s: %v", name, err)
	}
	return rep, shape
}

// line is rep's line of model on day; it fails the test without one.
func line(t *testing.T, rep Report, day, model string) Line {
	t.Helper()
	for _, l := range rep.Lines {
		if l.Day == day && l.Model == model {
			return l
		}
	}
	t.Fatalf("no line for %s %s in %+v", day, model, rep.Lines)
	return Line{}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestLongestModelNameWins(t *testing.T) {
	m := NewMatcher(models, []SKU{{Match: "Gemini Four Argon", Model: "gemini-4-argon"}}, DefaultServices)
	for desc, want := range map[string]string{
		"Gemini 3.5 Flash Lite Input Tokens": "gemini-3.5-flash-lite",
		"gemini-3.5-flash-lite output":       "gemini-3.5-flash-lite",
		"GEMINI 3.5 FLASH Output Tokens":     "gemini-3.5-flash",
		"Gemini 4 Argon Thinking Tokens":     "gemini-4-argon",
		"Gemini Four Argon input":            "gemini-4-argon",
		"Gemini 3.5 Flashy Input Tokens":     "",
		"Gemini 2.5 Pro Input Tokens":        "",
	} {
		got, ok := m.Model(desc)
		if got != want || ok != (want != "") {
			t.Errorf("Model(%q) = %q, %v; want %q", desc, got, ok, want)
		}
	}
	if !m.Gemini("generative language api") || m.Gemini("Vertex AI") {
		t.Error("the Gemini API's services are not told from others")
	}
	if got := m.Canonical("models/gemini-2.5-flash-preview-09-2025"); got != "gemini-2.5-flash" {
		t.Errorf("Canonical = %q", got)
	}
}

func TestExactMatchBothShapes(t *testing.T) {
	for _, name := range []string{"focus.csv", "export.ndjson"} {
		t.Run(name, func(t *testing.T) {
			rep, shape := reconcileFile(t, name, ledgerAt(1, false), nil)
			if want := map[string]Shape{"focus.csv": ShapeFOCUS, "export.ndjson": ShapeBigQuery}[name]; shape != want {
				t.Errorf("shape %q, want %q", shape, want)
			}
			if len(rep.Beyond) != 0 {
				t.Errorf("days beyond the drift: %v; lines %+v", rep.Beyond, rep.Lines)
			}
			for _, model := range []string{"gemini-3.5-flash-lite", "gemini-3.5-flash"} {
				l := line(t, rep, fixtureDay, model)
				if l.Drift == nil || !near(*l.Drift, 0) || l.SuggestedInput != nil {
					t.Errorf("%s: drift %v, suggested %v; want 0 and none", model, l.Drift, l.SuggestedInput)
				}
			}
			lite := line(t, rep, fixtureDay, "gemini-3.5-flash-lite")
			if lite.BilledInputTokens == nil || *lite.BilledInputTokens != 1e6 || lite.InputTokens != 1e6 || *lite.BilledOutputTokens != 2e5 {
				t.Errorf("tokens: %+v", lite)
			}
			if u := line(t, rep, fixtureDay, Unattributed); !near(u.CountedUSD, 0.001) {
				t.Errorf("unattributed $%v, want the failed call's $0.001", u.CountedUSD)
			}
			day := line(t, rep, fixtureDay, AllModels)
			if !near(day.BilledUSD, 0.365) || !near(day.CountedUSD, 0.366) || !near(day.CreditsUSD, -0.01) {
				t.Errorf("day: billed %v counted %v credits %v; want 0.365, 0.366, -0.01 apart", day.BilledUSD, day.CountedUSD, day.CreditsUSD)
			}
			if !strings.Contains(strings.Join(rep.Notes, "\n"), "1 rows of other services") {
				t.Errorf("notes: %q", rep.Notes)
			}
		})
	}
}

func TestTwiceTheCountedPrice(t *testing.T) {
	rep, _ := reconcileFile(t, "focus.csv", ledgerAt(0.5, false), nil)
	if len(rep.Beyond) != 1 || rep.Beyond[0] != fixtureDay {
		t.Fatalf("beyond: %v", rep.Beyond)
	}
	l := line(t, rep, fixtureDay, "gemini-3.5-flash-lite")
	if l.Drift == nil || !near(*l.Drift, 1) || l.Cause != CausePrice || !l.Beyond {
		t.Fatalf("drift %v cause %q beyond %v; want 1.00, price", l.Drift, l.Cause, l.Beyond)
	}
	if l.SuggestedInput == nil || !near(*l.SuggestedInput, 0.10) || !near(*l.SuggestedOutput, 0.40) {
		t.Errorf("suggested %v / %v, want Google's $0.10 / $0.40 per million", l.SuggestedInput, l.SuggestedOutput)
	}
}

func TestTwiceWithoutTokensScalesThePrice(t *testing.T) {
	csv := "ChargePeriodStart,ChargePeriodEnd,BilledCost,BillingCurrency,ServiceName,ChargeDescription,ConsumedQuantity,ConsumedUnit\n" +
		"2026-12-01T08:00:00Z,2026-12-01T09:00:00Z,0.5,USD,Gemini API,Gemini 4 Argon,,\n"
	var s Summer
	s.Add(fixtureDay, "gemini-4-argon", 250000, 1000, 100, 0)
	l := Ledger{Days: []LedgerDay{{Day: fixtureDay, SpendMicroUSD: 250000}}, Models: s.Counted()}
	b := NewBill(NewMatcher(models, nil, DefaultServices), time.UTC, "", "")
	if _, err := Read(strings.NewReader(csv), b.Add); err != nil {
		t.Fatal(err)
	}
	rep, err := Compare(l, b, DefaultMaxDrift, "", "", func(model, day string) (float64, float64, bool) { return 1.25, 10, model == "gemini-4-argon" })
	if err != nil {
		t.Fatal(err)
	}
	got := line(t, rep, fixtureDay, "gemini-4-argon")
	if got.SuggestedInput == nil || !near(*got.SuggestedInput, 2.5) || !near(*got.SuggestedOutput, 20) {
		t.Errorf("suggested %v / %v, want the price in force doubled, $2.50 / $20", got.SuggestedInput, got.SuggestedOutput)
	}
}

func TestThinkingTokensUnderCounted(t *testing.T) {
	rep, _ := reconcileFile(t, "export.ndjson", ledgerAt(1, true), nil)
	l := line(t, rep, fixtureDay, "gemini-3.5-flash")
	if !l.Beyond || l.Cause != CauseTokens || l.SuggestedInput != nil {
		t.Fatalf("beyond %v cause %q suggested %v; want the tokens blamed, no price", l.Beyond, l.Cause, l.SuggestedInput)
	}
	if !strings.Contains(l.Note, "Google billed 50000 output tokens, Breakwater counted 20000") || !strings.Contains(l.Note, "thinking") {
		t.Errorf("note %q", l.Note)
	}
}

func TestCreditsAndCurrenciesApart(t *testing.T) {
	rows := "ChargePeriodStart,ChargePeriodEnd,BilledCost,BillingCurrency,ServiceName,ChargeDescription,ConsumedQuantity,ConsumedUnit,ChargeCategory\n" +
		"2026-12-01T08:00:00Z,2026-12-01T09:00:00Z,0.25,USD,Gemini API,Gemini 4 Argon Input Tokens,1000,count,Usage\n" +
		"2026-12-01T08:00:00Z,2026-12-01T09:00:00Z,-0.05,USD,Gemini API,Refund,,,Adjustment\n" +
		"2026-12-01T08:00:00Z,2026-12-01T09:00:00Z,0.20,EUR,Gemini API,Gemini 4 Argon Input Tokens,1000,count,Usage\n" +
		"2026-12-01T08:00:00Z,2026-12-01T09:00:00Z,0.07,USD,Gemini API,Gemini Live Audio,1,count,Usage\n"
	var s Summer
	s.Add(fixtureDay, "gemini-4-argon", 250000, 1000, 0, 0)
	l := Ledger{Days: []LedgerDay{{Day: fixtureDay, SpendMicroUSD: 250000}}, Models: s.Counted()}
	b := NewBill(NewMatcher(models, nil, DefaultServices), time.UTC, "", "")
	if _, err := Read(strings.NewReader(rows), b.Add); err != nil {
		t.Fatal(err)
	}
	rep, err := Compare(l, b, DefaultMaxDrift, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	day := line(t, rep, fixtureDay, AllModels)
	if !near(day.CreditsUSD, -0.05) || !near(day.OtherCurrencies["EUR"], 0.2) || !near(day.BilledUSD, 0.32) {
		t.Errorf("day %+v: want credits -0.05 and EUR 0.20 apart, billed 0.25 + 0.07 unmatched", day)
	}
	if u := line(t, rep, fixtureDay, Unmatched); !near(u.BilledUSD, 0.07) || !strings.Contains(u.Note, "Gemini Live Audio") {
		t.Errorf("unmatched %+v", u)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "0.200000 EUR") {
		t.Errorf("notes %q do not name the EUR rows", rep.Notes)
	}
}

func TestBadBills(t *testing.T) {
	header := "ChargePeriodStart,ChargePeriodEnd,BilledCost,BillingCurrency,ServiceName,ChargeDescription,ConsumedQuantity,ConsumedUnit"
	good := `{"usage_start_time":"2026-12-01 08:00:00 UTC","usage_end_time":"2026-12-01 09:00:00 UTC","cost":0.1,"currency":"USD","service":{"description":"Gemini API"},"sku":{"description":"Gemini 4 Argon"},"usage":{"amount":1,"unit":"count"},"credits":[]}`
	for _, tt := range []struct {
		name, text string
		line       int
		want       string
	}{
		{"empty", "", 0, "the bill is empty"},
		{"blank", "\n\n  \n", 0, "the bill is empty"},
		{"missing column", strings.Replace(header, ",ConsumedUnit", "", 1) + "\n", 1, "lacks the column ConsumedUnit"},
		{"another shape", "date,amount\n2026-12-01,3\n", 1, "neither a FOCUS"},
		{"a JSON array", "[" + good + "]", 1, "a JSON array"},
		{"missing field", good + "\n" + good + "\n" + strings.Replace(good, `"cost":0.1,`, "", 1) + "\n", 3, "lacks the field cost"},
		{"bad time", header + "\nyesterday,2026-12-01T09:00:00Z,0.1,USD,Gemini API,x,1,count\n", 2, "ChargePeriodStart"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.text), func(Row) error { return nil })
			var ie *InputError
			if !errors.As(err, &ie) || ie.Line != tt.line || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v; want an InputError of line %d saying %q", err, tt.line, tt.want)
			}
		})
	}
}

func TestBillOfDaysWithoutLedger(t *testing.T) {
	b := NewBill(NewMatcher(models, nil, DefaultServices), time.UTC, "", "")
	f, err := os.Open("testdata/focus.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Read(f, b.Add); err != nil {
		t.Fatal(err)
	}
	_, err = Compare(Ledger{}, b, DefaultMaxDrift, "", "", nil)
	if !errors.Is(err, ErrNoLedger) || !strings.Contains(err.Error(), "2026-12-01 to 2026-12-01") {
		t.Fatalf("err %v, want ErrNoLedger naming the days", err)
	}
	// One day with a ledger, one without: reported, and beyond.
	l := ledgerAt(1, false)
	l.Days[0].Day, l.Models[0].Day, l.Models[1].Day = "2026-11-30", "2026-11-30", "2026-11-30"
	rep, err := Compare(l, b, DefaultMaxDrift, "2026-11-30", "2026-12-01", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Beyond) != 2 || !strings.Contains(strings.Join(rep.Notes, "\n"), "2026-12-01: Google billed $0.365000 and the ledger holds no call") {
		t.Errorf("beyond %v notes %q", rep.Beyond, rep.Notes)
	}
}

func TestDaysInTheBudgetTimezone(t *testing.T) {
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	csv := "ChargePeriodStart,ChargePeriodEnd,BilledCost,BillingCurrency,ServiceName,ChargeDescription,ConsumedQuantity,ConsumedUnit\n" +
		"2026-12-02T03:00:00Z,2026-12-02T04:00:00Z,0.1,USD,Gemini API,Gemini 4 Argon,,\n" +
		"2026-12-02T05:00:00Z,2026-12-02T06:00:00Z,0.2,USD,Gemini API,Gemini 4 Argon,,\n"
	b := NewBill(NewMatcher(models, nil, DefaultServices), loc, "", "")
	if _, err := Read(strings.NewReader(csv), b.Add); err != nil {
		t.Fatal(err)
	}
	if b.First != "2026-12-01" || b.Last != "2026-12-02" {
		t.Errorf("days %s..%s, want 2026-12-01..2026-12-02 in New York", b.First, b.Last)
	}
}

func TestConfig(t *testing.T) {
	known := func(m string) bool { return m == "gemini-4-argon" }
	if err := DefaultConfig().WithDefaults().Validate(known); err != nil {
		t.Fatal(err)
	}
	bad := Config{MaxDrift: 0, SKU: []SKU{{Match: "", Model: "gpt-9"}}, BigQueryTable: "just-a-table", Services: []string{" "}}
	err := bad.Validate(known)
	for _, want := range []string{"reconcile.max_drift", "reconcile.sku[0].match", `reconcile.sku[0].model: "gpt-9"`, "reconcile.bigquery_table", "reconcile.services[0]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	if err := (Config{MaxDrift: 0.1, BigQueryTable: "my-project.billing.gcp_billing_export_v1_01A2B3_C4D5E6_F7A8B9"}).Validate(known); err != nil {
		t.Error(err)
	}
}
