package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"breakwater/budget/reconcile"
	"breakwater/budget/reconcile/bigquery"
	"breakwater/server/app"
	"breakwater/server/operator"
)

// ErrDrift is a reconciliation with a day beyond reconcile.max_drift: the
// caller exits with status 3.
var ErrDrift = errors.New("drift beyond reconcile.max_drift")

func reconcileCmd(e *env) *cobra.Command {
	var bill, from, to string
	var asJSON bool
	c := &cobra.Command{
		Use:   "reconcile [--bill FILE] [--from YYYY-MM-DD] [--to YYYY-MM-DD] [--json]",
		Short: "the ledger against Google's bill, per day and model",
		Long: `Compares, per day (budget.timezone) and model, what the ledger counted
(usage rows, and the calls without one) with what Google billed: a Cloud
Billing export as a FOCUS 1.x CSV or the BigQuery usage cost export as
newline-delimited JSON. Without --from and --to, the days the bill covers.
Without --bill, the rows of the export table reconcile.bigquery_table
names, read over BigQuery's API with the service account key file of
GOOGLE_APPLICATION_CREDENTIALS; the days by default from seven to two days
back, as the daily run reconciles them. Exit status 0 when every day is within reconcile.max_drift, 3 when a day is
beyond it, 1 when the bill cannot be read.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			for _, d := range []string{from, to} {
				if _, err := time.Parse(time.DateOnly, d); d != "" && err != nil {
					return usageErrorf(c, "%q: want a day YYYY-MM-DD", d)
				}
			}
			if from != "" && to != "" && to < from {
				return usageErrorf(c, "--to %s is before --from %s", to, from)
			}
			return e.reconcile(c, bill, from, to, asJSON)
		},
	}
	c.Flags().StringVar(&bill, "bill", "", "the Cloud Billing export to read (`FILE`; default reconcile.bigquery_table's rows)")
	c.Flags().StringVar(&from, "from", "", "the first day to compare (`YYYY-MM-DD`; default the bill's first)")
	c.Flags().StringVar(&to, "to", "", "the last day to compare (`YYYY-MM-DD`; default the bill's last)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

// reconcile reads the bill, then the ledger of its days, and prints the
// comparison.
func (e *env) reconcile(c *cobra.Command, path, from, to string, asJSON bool) error {
	cfg, err := e.loadForOperator()
	if err != nil {
		return err
	}
	loc, err := cfg.Budget.Location()
	if err != nil {
		return err
	}
	rc := cfg.Reconcile
	if path == "" && rc.BigQueryTable == "" {
		return usageErrorf(c, "missing --bill FILE (or set reconcile.bigquery_table to read the export from BigQuery)")
	}
	source := path
	if path == "" {
		source = "the BigQuery table " + rc.BigQueryTable
		from, to = reconcile.DefaultDays(time.Now(), loc, from, to)
	}
	b := reconcile.NewBill(reconcile.NewMatcher(cfg.ModelNames(), rc.SKU, rc.Services), loc, from, to)
	if err := e.readBill(c.Context(), path, from, to, rc, b, loc); err != nil {
		return fmt.Errorf("reconcile: %s: %w", source, err)
	}
	if b.Rows == 0 {
		return fmt.Errorf("reconcile: %s: %w", source, reconcile.ErrEmpty)
	}
	from, to = orDefault(from, b.First), orDefault(to, b.Last)
	if err := operator.CheckDays(from, to); err != nil {
		return fmt.Errorf("reconcile: %s covers %s to %s: give --from and --to at most a year apart", source, from, to)
	}
	var ledger reconcile.Ledger
	err = e.operate(func(op operator.Service) error {
		ledger, err = op.Ledger(c.Context(), from, to)
		return err
	})
	if err != nil {
		return err
	}
	rep, err := reconcile.Compare(ledger, b, rc.MaxDrift, from, to, app.ReconcilePrices(cfg))
	if err != nil {
		return fmt.Errorf("reconcile: %s: %w", source, err)
	}
	if err := printReconcile(e.stdout, e.stderr, asJSON, rep); err != nil {
		return err
	}
	if len(rep.Beyond) > 0 {
		return fmt.Errorf("reconcile: %d day(s) beyond reconcile.max_drift %s: %s: %w", len(rep.Beyond), percent(rep.MaxDrift),
			strings.Join(rep.Beyond, ", "), ErrDrift)
	}
	return nil
}

// readBill adds to b the rows of the export file at path or, when path
// is "", the rows of the days from..to of the table rc.BigQueryTable.
func (e *env) readBill(ctx context.Context, path, from, to string, rc reconcile.Config, b *reconcile.Bill, loc *time.Location) error {
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = reconcile.Read(f, b.Add)
		return err
	}
	src, err := bigquery.New(ctx, rc.BigQueryTable, bigquery.Options{Endpoint: rc.BigQueryEndpoint, Getenv: e.getenv})
	if err != nil {
		return err
	}
	first, _ := time.ParseInLocation(time.DateOnly, from, loc) // checked as days by the command
	last, _ := time.ParseInLocation(time.DateOnly, to, loc)
	return src.Rows(ctx, rc.Services, first, last.AddDate(0, 0, 1), b.Add)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// printReconcile prints the report's lines as a table, then the prices
// it suggests and its notes; as JSON, the lines alone (an array), the
// notes on stderr.
func printReconcile(w, stderr io.Writer, asJSON bool, rep reconcile.Report) error {
	if asJSON {
		lines := rep.Lines
		if lines == nil {
			lines = []reconcile.Line{}
		}
		for _, n := range rep.Notes {
			fmt.Fprintln(stderr, "breakwater: note:", n)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(lines)
	}
	err := printOut(w, false, nil, "DAY\tMODEL\tCOUNTED\tBILLED\tDRIFT\tINPUT TOKENS COUNTED/BILLED\tOUTPUT TOKENS COUNTED/BILLED\tNOTE", func(row func(...any)) {
		for _, l := range rep.Lines {
			note := l.Note
			if l.Beyond {
				note = joinNonEmpty(": ", "BEYOND "+percent(rep.MaxDrift)+causeText(l.Cause), note)
			}
			if l.Kind == reconcile.KindDay && l.CreditsUSD != 0 {
				note = joinNonEmpty("; ", note, fmt.Sprintf("credits $%.6f apart", l.CreditsUSD))
			}
			row(l.Day, l.Model, fmt.Sprintf("$%.6f", l.CountedUSD), fmt.Sprintf("$%.6f", l.BilledUSD), driftText(l.Drift),
				tokensText(l.Kind, l.InputTokens, l.BilledInputTokens), tokensText(l.Kind, l.OutputTokens, l.BilledOutputTokens), orDashText(note))
		}
	})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, l := range rep.Lines {
		if l.SuggestedInput != nil && !seen[l.Model] {
			seen[l.Model] = true
			fmt.Fprintf(w, "suggested: %s at $%s input and $%s output per million tokens would make the ledger agree (drift %s, steady)\n",
				l.Model, strconv.FormatFloat(*l.SuggestedInput, 'f', -1, 64), strconv.FormatFloat(*l.SuggestedOutput, 'f', -1, 64), driftText(l.Drift))
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if len(rep.Beyond) == 0 {
		fmt.Fprintf(w, "every day from %s to %s within reconcile.max_drift %s\n", rep.From, rep.To, percent(rep.MaxDrift))
	}
	return nil
}

// driftText is a drift as a signed share, "-" when nothing was counted.
func driftText(d *float64) string {
	if d == nil {
		return "-"
	}
	return fmt.Sprintf("%+.2f", *d)
}

func percent(share float64) string { return strconv.FormatFloat(share*100, 'f', -1, 64) + "%" }

// tokensText is a model line's tokens, counted/billed ("-" for a bill
// without them).
func tokensText(kind string, counted int64, billed *float64) string {
	if kind != reconcile.KindModel {
		return ""
	}
	b := "-"
	if billed != nil {
		b = strconv.FormatFloat(*billed, 'f', -1, 64)
	}
	return fmt.Sprintf("%d/%s", counted, b)
}

func causeText(cause string) string {
	switch cause {
	case reconcile.CausePrice:
		return " (the price)"
	case reconcile.CauseTokens:
		return " (the tokens)"
	}
	return ""
}

// joinNonEmpty joins the parts that are not empty with sep.
func joinNonEmpty(sep string, parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, sep)
}

func orDashText(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
