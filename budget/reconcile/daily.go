package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
)

// Lag and Lookback are the days Daily reconciles: billing data lags up
// to a day, so a day is reconciled two days after it (D on D+2), and
// again on each run for a week, so that rows that arrive late are seen.
const (
	Lag      = 2
	Lookback = 7
)

// StateName is the named state (storage's SaveState) that holds the last
// reconciliation and the days already alerted: shared by every instance
// on PostgreSQL.
const StateName = "reconcile"

// Source reads billing rows of services whose charge period starts in
// [from, to): the BigQuery export.
type Source interface {
	Rows(ctx context.Context, services []string, from, to time.Time, fn func(Row) error) error
}

// StateStore keeps named state: a storage backend.
type StateStore interface {
	SaveState(name string, entries map[string][]byte) error
	LoadState(name string) (map[string][]byte, error)
}

// DailyOptions are what Daily reconciles with.
type DailyOptions struct {
	Config   Config
	Models   []string // the names a row's description is matched against
	Location *time.Location
	Source   Source
	// Ledger reads the ledger of the days from..to.
	Ledger func(ctx context.Context, from, to string) (Ledger, error)
	State  StateStore
	// Alert raises the alert of a drift (ledger_drift), at most once a
	// day; it reports whether it did.
	Alert  func(summary string, details map[string]string) bool
	Prices Prices
	Logger *slog.Logger
	Now    func() time.Time
}

// Daily reconciles the last complete days with the bill, keeps the
// result, and raises an alert for a day beyond max_drift that was not
// raised at the same figures before.
type Daily struct{ o DailyOptions }

// NewDaily returns a Daily with o.
func NewDaily(o DailyOptions) *Daily {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Config = o.Config.WithDefaults()
	return &Daily{o: o}
}

// Last is a reconciliation as kept: when, the days, those beyond, and
// the day and model lines (or why it failed).
type Last struct {
	At       time.Time `json:"at"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	MaxDrift float64   `json:"max_drift"`
	Beyond   []string  `json:"beyond,omitempty"`
	Lines    []Line    `json:"lines,omitempty"`
	Notes    []string  `json:"notes,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// DefaultDays fills an empty from or to with the days Run reconciles on
// now's day in loc: from Lookback to Lag days before it.
func DefaultDays(now time.Time, loc *time.Location, from, to string) (string, string) {
	l := now.In(loc)
	if from == "" {
		from = time.Date(l.Year(), l.Month(), l.Day()-Lookback, 0, 0, 0, 0, loc).Format(time.DateOnly)
	}
	if to == "" {
		to = time.Date(l.Year(), l.Month(), l.Day()-Lag, 0, 0, 0, 0, loc).Format(time.DateOnly)
	}
	return from, to
}

// Run reconciles the days from Lookback to Lag days before today, keeps
// the result as the last reconciliation and alerts the days beyond.
func (d *Daily) Run(ctx context.Context) (Last, error) {
	now := d.o.Now()
	l := now.In(d.o.Location)
	first := time.Date(l.Year(), l.Month(), l.Day()-Lookback, 0, 0, 0, 0, d.o.Location)
	end := time.Date(l.Year(), l.Month(), l.Day()-Lag+1, 0, 0, 0, 0, d.o.Location)
	last := Last{At: now, From: first.Format(time.DateOnly), To: end.AddDate(0, 0, -1).Format(time.DateOnly), MaxDrift: d.o.Config.MaxDrift}
	rep, err := d.compare(ctx, first, end, last.From, last.To)
	if err != nil {
		last.Error = err.Error()
		d.o.Logger.Error("reconciliation with the bill failed", "from", last.From, "to", last.To, "err", err)
	} else {
		last.Beyond, last.Notes = rep.Beyond, rep.Notes
		for _, line := range rep.Lines {
			if line.Kind == KindDay || line.Kind == KindModel {
				last.Lines = append(last.Lines, line)
			}
		}
		d.o.Logger.Info("reconciled the ledger with the bill", "from", last.From, "to", last.To, "beyond", len(rep.Beyond))
	}
	entries := map[string][]byte{}
	if err == nil {
		d.alert(rep, entries)
	}
	b, merr := json.Marshal(last)
	if merr == nil {
		entries["last"] = b
		if serr := d.o.State.SaveState(StateName, entries); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	return last, err
}

// compare reads the bill of [first, end) and the ledger of its days.
func (d *Daily) compare(ctx context.Context, first, end time.Time, from, to string) (Report, error) {
	c := d.o.Config
	bill := NewBill(NewMatcher(d.o.Models, c.SKU, c.Services), d.o.Location, from, to)
	if err := d.o.Source.Rows(ctx, c.Services, first, end, bill.Add); err != nil {
		return Report{}, err
	}
	if bill.Rows == 0 {
		return Report{From: from, To: to, MaxDrift: c.MaxDrift, Notes: []string{"the export holds no Gemini API row of these days yet"}}, nil
	}
	ledger, err := d.o.Ledger(ctx, from, to)
	if err != nil {
		return Report{}, err
	}
	return Compare(ledger, bill, c.MaxDrift, from, to, d.o.Prices)
}

// alert raises ledger_drift for the days beyond whose billed total was
// not alerted before, and records them in entries when it did.
func (d *Daily) alert(rep Report, entries map[string][]byte) {
	state, err := d.o.State.LoadState(StateName)
	if err != nil {
		d.o.Logger.Error("reconciliation: the days alerted are unknown", "err", err)
		return
	}
	var news []Line
	for _, line := range rep.Lines {
		if line.Kind != KindDay || !line.Beyond {
			continue
		}
		if string(state["alerted/"+line.Day]) != figure(line.BilledUSD) {
			news = append(news, line)
		}
	}
	if len(news) == 0 {
		return
	}
	summary, details := alertText(rep, news)
	if !d.o.Alert(summary, details) {
		return // one went out today: the next run tells of these
	}
	for _, line := range news {
		entries["alerted/"+line.Day] = []byte(figure(line.BilledUSD))
	}
}

func figure(usd float64) string { return strconv.FormatFloat(usd, 'f', 6, 64) }

// alertText says, of the days beyond, the model that drifts most on the
// first ("Google billed $4.12 for gemini-3.8-flash on 2027-01-01;
// Breakwater counted $2.06: the ledger's price is half Google's"), and
// lists every line beyond in the details.
func alertText(rep Report, days []Line) (string, map[string]string) {
	details := map[string]string{}
	var worst *Line
	for i, line := range rep.Lines {
		if !line.Beyond {
			continue
		}
		if line.Kind == KindModel && line.Day == days[0].Day && (worst == nil || math.Abs(*line.Drift) > math.Abs(*worst.Drift)) {
			worst = &rep.Lines[i]
		}
		key := line.Day + " " + line.Model
		details[key] = fmt.Sprintf("counted $%.6f, billed $%.6f, drift %s", line.CountedUSD, line.BilledUSD, driftWords(line.Drift))
		if line.Cause != "" {
			details[key] += ", cause: " + line.Cause
		}
		if line.SuggestedInput != nil {
			details[key] += fmt.Sprintf(", agreeing price $%s input and $%s output per million tokens",
				strconv.FormatFloat(*line.SuggestedInput, 'f', -1, 64), strconv.FormatFloat(*line.SuggestedOutput, 'f', -1, 64))
		}
		if line.Note != "" {
			details[key] += " (" + line.Note + ")"
		}
	}
	if worst == nil {
		d := days[0]
		return fmt.Sprintf("Google billed $%.2f on %s; Breakwater counted $%.2f (%d day(s) beyond %s)", d.BilledUSD, d.Day, d.CountedUSD,
			len(days), strconv.FormatFloat(rep.MaxDrift*100, 'f', -1, 64)+"%"), details
	}
	return fmt.Sprintf("Google billed $%.2f for %s on %s; Breakwater counted $%.2f: %s", worst.BilledUSD, worst.Model, worst.Day, worst.CountedUSD,
		verdict(*worst)), details
}

// verdict says in words what a line beyond means.
func verdict(l Line) string {
	if l.Cause == CauseTokens {
		return "the token counts differ (" + l.Note + ")"
	}
	ratio := 1 + *l.Drift
	switch {
	case math.Abs(ratio-2) < 0.01:
		return "the ledger's price is half Google's"
	case math.Abs(ratio-0.5) < 0.005:
		return "the ledger's price is twice Google's"
	}
	return fmt.Sprintf("Google's price is %s times the ledger's", strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", ratio), "0"), "."))
}

func driftWords(d *float64) string {
	if d == nil {
		return "none counted"
	}
	return fmt.Sprintf("%+.2f", *d)
}
