package reconcile

import (
	"strings"
	"time"
)

// Bill sums billing rows per day and model as Read gives them, in
// bounded memory: a few figures per day and model, and per description
// of the rows no model matched.
type Bill struct {
	m        *Matcher
	loc      *time.Location
	from, to string // "" : every day

	days map[string]*billDay
	// First and Last are the days the rows cover, whatever their
	// service; "" before the first row.
	First, Last string
	// Rows counts every row read; OtherService those of other services,
	// ignored; Outside those of days outside from..to, ignored.
	Rows, OtherService, Outside int64
}

// billDay is one day of the Gemini API's rows.
type billDay struct {
	models    map[string]*billed
	unmatched map[string]int64 // description -> micro-USD
	credits   int64            // credits, refunds, adjustments: micro-USD, negative
	other     map[string]int64 // currency -> millionths, for currencies other than USD
}

// billed is one day and model of the bill.
type billed struct {
	costMicro int64
	// in and out are the rows that bill input and output tokens (by
	// their description) with a quantity in tokens.
	in, out side
}

// side is the token rows of one side (input or output) of a model's day.
type side struct {
	tokens    float64
	costMicro int64
	rows      int
}

// NewBill sums rows of the Gemini API (as m tells them) into days of loc;
// with from and to ("2006-01-02", either may be ""), only rows of days
// between them.
func NewBill(m *Matcher, loc *time.Location, from, to string) *Bill {
	return &Bill{m: m, loc: loc, from: from, to: to, days: map[string]*billDay{}}
}

// Add counts one row: into its day (its charge period's start, in loc),
// under its model; a row of another service is only counted as read.
func (b *Bill) Add(r Row) error {
	b.Rows++
	day := r.Start.In(b.loc).Format(time.DateOnly)
	if b.First == "" || day < b.First {
		b.First = day
	}
	if day > b.Last {
		b.Last = day
	}
	if (b.from != "" && day < b.from) || (b.to != "" && day > b.to) {
		b.Outside++
		return nil
	}
	if !b.m.Gemini(r.Service) {
		b.OtherService++
		return nil
	}
	d := b.day(day)
	if !strings.EqualFold(r.Currency, "USD") {
		d.other[strings.ToUpper(r.Currency)] += r.CostMicro + r.CreditsMicro
		return nil
	}
	d.credits += r.CreditsMicro
	if r.CostMicro < 0 || (r.Category != "" && !strings.EqualFold(r.Category, "Usage")) {
		d.credits += r.CostMicro
		return nil
	}
	model, ok := b.m.Model(r.Description)
	if !ok {
		d.unmatched[r.Description] += r.CostMicro
		return nil
	}
	bm := d.models[model]
	if bm == nil {
		bm = &billed{}
		d.models[model] = bm
	}
	bm.costMicro += r.CostMicro
	if r.HasQuantity && tokenUnit(r.Unit) {
		switch sideOf(r.Description) {
		case "input":
			bm.in.add(r)
		case "output":
			bm.out.add(r)
		}
	}
	return nil
}

func (s *side) add(r Row) {
	s.tokens += r.Quantity
	s.costMicro += r.CostMicro
	s.rows++
}

func (b *Bill) day(day string) *billDay {
	d := b.days[day]
	if d == nil {
		d = &billDay{models: map[string]*billed{}, unmatched: map[string]int64{}, other: map[string]int64{}}
		b.days[day] = d
	}
	return d
}

// tokenUnit reports whether a row's quantity counts tokens: its unit
// names tokens, or is a plain count.
func tokenUnit(unit string) bool {
	u := strings.ToLower(unit)
	return strings.Contains(u, "token") || u == "count"
}

// sideOf is the side of the call a row's description bills: "input",
// "output" (thinking is billed as output), or "".
func sideOf(description string) string {
	d := strings.ToLower(description)
	switch {
	case strings.Contains(d, "input") || strings.Contains(d, "prompt"):
		return "input"
	case strings.Contains(d, "output") || strings.Contains(d, "thinking") || strings.Contains(d, "reasoning"):
		return "output"
	}
	return ""
}
