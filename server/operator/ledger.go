package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"breakwater/budget/reconcile"
)

// MaxLedgerDays is the longest span Ledger reads at once: a year.
const MaxLedgerDays = 366

// ErrBadDays refuses a span of days that is not two days ("2006-01-02"),
// the first not after the second, at most MaxLedgerDays long.
var ErrBadDays = errors.New("operator: want two days YYYY-MM-DD, the first not after the second, at most a year apart")

// CheckDays checks a span of days for Ledger.
func CheckDays(from, to string) error {
	f, err1 := time.Parse(time.DateOnly, from)
	t, err2 := time.Parse(time.DateOnly, to)
	if err1 != nil || err2 != nil || t.Before(f) || t.Sub(f) >= MaxLedgerDays*24*time.Hour {
		return fmt.Errorf("%w: %q to %q", ErrBadDays, from, to)
	}
	return nil
}

// Ledger is what the ledger counted on the days from..to (inclusive,
// days of budget.timezone), for reconcile: the ledger's day totals, and
// the usage rows summed per day and model, read one day at a time so
// that a month of rows is never held at once.
func (o *Operator) Ledger(ctx context.Context, from, to string) (reconcile.Ledger, error) {
	if err := CheckDays(from, to); err != nil {
		return reconcile.Ledger{}, err
	}
	days, err := o.store.BudgetDays(from, to)
	if err != nil {
		return reconcile.Ledger{}, err
	}
	var l reconcile.Ledger
	for _, d := range days {
		l.Days = append(l.Days, reconcile.LedgerDay{Day: d.Day, Calls: d.Requests, SpendMicroUSD: d.SpendMicroUSD})
	}
	var sum reconcile.Summer
	start, _ := time.ParseInLocation(time.DateOnly, from, o.loc) // checked above
	for day := start; day.Format(time.DateOnly) <= to; day = day.AddDate(0, 0, 1) {
		if err := ctx.Err(); err != nil {
			return reconcile.Ledger{}, err
		}
		recs, err := o.store.Usage(day, day.AddDate(0, 0, 1))
		if err != nil {
			return reconcile.Ledger{}, err
		}
		name := day.Format(time.DateOnly)
		for _, r := range recs {
			sum.Add(name, r.Model, r.CostMicroUSD, r.PromptTokens, r.CandidatesTokens, r.ThoughtsTokens)
		}
	}
	l.Models = sum.Counted()
	return l, nil
}

// LastReconciliation is the daily reconciliation's last result, as the
// instance that ran it kept it (shared on PostgreSQL); ok false when none
// ran.
func (o *Operator) LastReconciliation() (last reconcile.Last, ok bool, err error) {
	state, err := o.store.LoadState(reconcile.StateName)
	if err != nil || state["last"] == nil {
		return reconcile.Last{}, false, err
	}
	if err := json.Unmarshal(state["last"], &last); err != nil {
		return reconcile.Last{}, false, fmt.Errorf("the last reconciliation: %w", err)
	}
	return last, true, nil
}

// Ledger asks the running server for the ledger of from..to.
func (a *AdminClient) Ledger(ctx context.Context, from, to string) (reconcile.Ledger, error) {
	if err := CheckDays(from, to); err != nil {
		return reconcile.Ledger{}, err
	}
	var out reconcile.Ledger
	err := a.call(ctx, http.MethodGet, "/api/ledger?from="+url.QueryEscape(from)+"&to="+url.QueryEscape(to), nil, &out)
	return out, err
}
