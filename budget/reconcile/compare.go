package reconcile

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// The kinds of Line.
const (
	KindModel        = "model"        // one model's usage rows against its billing rows
	KindUnattributed = "unattributed" // the ledger's calls without a usage row
	KindUnmatched    = "unmatched"    // Gemini API rows that name no known model
	KindDay          = "day"          // the day's totals, which decide the exit status
)

// The causes a Line gives for its drift.
const (
	CausePrice  = "price"  // the tokens agree: the ledger's price is not Google's
	CauseTokens = "tokens" // Google billed other token counts than the ledger counted
)

// Unattributed and Unmatched are the Model of those kinds of Line.
const (
	Unattributed = "(unattributed)"
	Unmatched    = "(unmatched)"
	AllModels    = "(day)"
)

// Line is one day and model of a Report (or one of the day's other
// lines, by Kind): what Breakwater counted, what Google billed.
type Line struct {
	Day        string   `json:"day"`
	Model      string   `json:"model"`
	Kind       string   `json:"kind"`
	CountedUSD float64  `json:"counted_usd"`
	BilledUSD  float64  `json:"billed_usd"`
	Drift      *float64 `json:"drift"` // billed ÷ counted − 1; null when nothing was counted
	Beyond     bool     `json:"beyond"`
	Reads      int64    `json:"reads,omitempty"`

	InputTokens        int64    `json:"input_tokens,omitempty"`
	OutputTokens       int64    `json:"output_tokens,omitempty"`
	BilledInputTokens  *float64 `json:"billed_input_tokens,omitempty"`
	BilledOutputTokens *float64 `json:"billed_output_tokens,omitempty"`

	Cause string `json:"cause,omitempty"`
	// SuggestedInput and SuggestedOutput are the prices per million
	// tokens that would make the ledger agree, when the model's drift is
	// steady and its cause the price.
	SuggestedInput  *float64 `json:"suggested_input_usd_per_million,omitempty"`
	SuggestedOutput *float64 `json:"suggested_output_usd_per_million,omitempty"`

	// The day line's: credits, refunds and adjustments (negative), and
	// costs in other currencies, none of them added to BilledUSD.
	CreditsUSD      float64            `json:"credits_usd,omitempty"`
	OtherCurrencies map[string]float64 `json:"other_currencies,omitempty"`
	Note            string             `json:"note,omitempty"`

	// billedInMicro and billedOutMicro are the costs of the token rows
	// behind BilledInputTokens and BilledOutputTokens.
	billedInMicro, billedOutMicro int64
}

// Report is a reconciliation: its lines, day by day, and what the
// comparison left out.
type Report struct {
	From, To string // the days compared
	MaxDrift float64
	Lines    []Line
	// Beyond lists the days whose drift passes MaxDrift (or that Google
	// billed and the ledger holds no call of).
	Beyond []string
	// Notes say what the bill held that is not compared: rows of other
	// services or days, days without a ledger.
	Notes []string
}

// ErrNoLedger is a bill none of whose days the ledger holds.
var ErrNoLedger = errors.New("the ledger holds no call on any day the bill covers")

// Prices gives the price of model in force on day, USD per million
// input and output tokens; ok false when unknown. Compare uses it to
// suggest a price when the bill does not split input from output.
type Prices func(model, day string) (in, out float64, ok bool)

// Compare reconciles the ledger with the bill, day by day over from..to
// (either "" : the bill's first or last day), each day's drift against
// maxDrift.
func Compare(l Ledger, b *Bill, maxDrift float64, from, to string, prices Prices) (Report, error) {
	if from == "" {
		from = b.First
	}
	if to == "" {
		to = b.Last
	}
	rep := Report{From: from, To: to, MaxDrift: maxDrift}
	if b.Rows == 0 {
		return rep, &InputError{Err: ErrEmpty}
	}
	spend := map[string]LedgerDay{}
	for _, d := range l.Days {
		spend[d.Day] = d
	}
	counted := map[string]map[string]*Counted{}
	for _, c := range l.Models {
		model := b.m.Canonical(c.Model)
		if counted[c.Day] == nil {
			counted[c.Day] = map[string]*Counted{}
		}
		sum := counted[c.Day][model]
		if sum == nil {
			sum = &Counted{Day: c.Day, Model: model}
			counted[c.Day][model] = sum
		}
		sum.Reads += c.Reads
		sum.CostMicroUSD += c.CostMicroUSD
		sum.InputTokens += c.InputTokens
		sum.OutputTokens += c.OutputTokens
	}
	anyLedger, anyBilled := false, false
	for day := range days(from, to) {
		lines, billedNoLedger := compareDay(day, spend[day], counted[day], b.days[day], maxDrift)
		if len(lines) == 0 {
			continue
		}
		total := lines[len(lines)-1]
		anyLedger = anyLedger || total.CountedUSD != 0
		anyBilled = anyBilled || total.BilledUSD != 0
		if total.Beyond {
			rep.Beyond = append(rep.Beyond, day)
		}
		if billedNoLedger {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: Google billed $%.6f and the ledger holds no call that day: another key or service on the project, or another database?", day, total.BilledUSD))
		}
		rep.Lines = append(rep.Lines, lines...)
	}
	if anyBilled && !anyLedger {
		return rep, &InputError{Err: fmt.Errorf("%w (%s to %s): is it this service's database, and the bill of the project its key belongs to?", ErrNoLedger, from, to)}
	}
	suggest(rep.Lines, maxDrift, prices)
	rep.Notes = append(rep.Notes, b.notes()...)
	return rep, nil
}

// days iterates the days from..to, both "2006-01-02".
func days(from, to string) func(func(string) bool) {
	return func(yield func(string) bool) {
		d, err := time.Parse(time.DateOnly, from)
		if err != nil {
			return
		}
		for day := d.Format(time.DateOnly); day <= to; day = d.Format(time.DateOnly) {
			if !yield(day) {
				return
			}
			d = d.AddDate(0, 0, 1)
		}
	}
}

// usd is micro-dollars as dollars.
func usd(micro int64) float64 { return float64(micro) / 1e6 }

// drift is billed ÷ counted − 1, nil when counted is 0.
func drift(counted, billed int64) *float64 {
	if counted == 0 {
		return nil
	}
	d := float64(billed)/float64(counted) - 1
	return &d
}

// beyond reports whether d passes max either way.
func beyond(d *float64, max float64) bool { return d != nil && math.Abs(*d) > max+1e-9 }

// notes say what the bill held that was not compared.
func (b *Bill) notes() []string {
	var out []string
	if b.OtherService > 0 {
		out = append(out, fmt.Sprintf("%d rows of other services than the Gemini API were left out (reconcile.services names the API's)", b.OtherService))
	}
	if b.Outside > 0 {
		out = append(out, fmt.Sprintf("%d rows of days outside %s..%s were left out", b.Outside, b.from, b.to))
	}
	for _, day := range slices.Sorted(maps.Keys(b.days)) {
		d := b.days[day]
		for _, cur := range slices.Sorted(maps.Keys(d.other)) {
			out = append(out, fmt.Sprintf("%s: %.6f %s of Gemini API rows in %s, not compared: export the bill in USD", day, usd(d.other[cur]), cur, cur))
		}
	}
	return out
}
