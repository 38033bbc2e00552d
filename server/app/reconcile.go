package app

import (
	"cmp"
	"context"
	"time"

	"breakwater/budget/reconcile"
	"breakwater/budget/reconcile/bigquery"
	"breakwater/detect"
)

// reconcileTimeout bounds one daily reconciliation: a week of export
// rows and of the ledger.
const reconcileTimeout = 5 * time.Minute

// reconcilingRunner is the daily detection's runner that also reconciles
// the ledger with the BigQuery export after each daily run, in the same
// place: under the detection lock on PostgreSQL, so that one instance
// reconciles and stores the result for all.
type reconcilingRunner struct {
	detect.DayRunner
	daily *reconcile.Daily
}

// Digest mails the detection's digest, then reconciles when the run ran
// a day: once a day, on the instance that ran it, and not again at each
// restart that finds nothing due.
func (r reconcilingRunner) Digest(reps []detect.Report) bool {
	ok := r.DayRunner.Digest(reps)
	if len(reps) == 0 {
		return ok
	}
	ctx, cancel := context.WithTimeout(context.Background(), reconcileTimeout)
	defer cancel()
	_, _ = r.daily.Run(ctx) // logs its failure; the next run tries again
	return ok
}

// dailyRunner is the runner the detection scheduler runs: the detection
// alone, or with reconcile.bigquery_table set, the detection and the
// reconciliation with the bill, whose drift raises ledger_drift through
// alerter once a day.
func (a *App) dailyRunner(cfg Config, alerter *detect.Alerter) (detect.DayRunner, error) {
	if cfg.Reconcile.BigQueryTable == "" {
		return a.detect, nil
	}
	src, err := bigquery.New(context.Background(), cfg.Reconcile.BigQueryTable, bigquery.Options{Endpoint: cmp.Or(a.opts.BigQueryEndpoint, cfg.Reconcile.BigQueryEndpoint), Getenv: a.opts.Getenv})
	if err != nil {
		return nil, err
	}
	loc, _ := cfg.Budget.Location() // checked by Load
	day := func(t time.Time) string { return t.In(loc).Format(time.DateOnly) }
	daily := reconcile.NewDaily(reconcile.DailyOptions{
		Config: cfg.Reconcile, Models: cfg.ModelNames(), Location: loc, Source: src, Ledger: a.operator.Ledger, State: a.db,
		Alert: func(summary string, details map[string]string) bool {
			return alerter.AlertOnce(detect.KindLedgerDrift, day, summary, details)
		},
		Prices: ReconcilePrices(cfg), Logger: a.log.With("component", "reconcile"), Now: a.opts.Now,
	})
	return reconcilingRunner{DayRunner: a.detect, daily: daily}, nil
}

// ReconcilePrices is the config's prices on each day (the ones the ledger
// counted that day at), for the suggestions of a bill that does not split
// input from output.
func ReconcilePrices(cfg Config) reconcile.Prices {
	return func(model, day string) (float64, float64, bool) {
		p, ok := cfg.OCR.PriceOf(model)
		p = p.On(day)
		return p.InputUSDPerMillion, p.OutputUSDPerMillion, ok
	}
}
