package bigquery

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"breakwater/budget/reconcile"
	"breakwater/budget/reconcile/bigquery/bqtest"
)

const table = bqtest.Project + ".billing_export.gcp_billing_export_v1_01A2B3_C4D5E6_F7A8B9"

// TestQueryPagesThroughTheFake reads 7 rows 3 a page through the fake:
// the job left unfinished by jobs.query, then three pages of
// getQueryResults, every row decoded as the export wrote it.
func TestQueryPagesThroughTheFake(t *testing.T) {
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	amount := 2.5e6
	var rows []bqtest.Row
	for h := range 7 {
		rows = append(rows, bqtest.Row{Start: day.Add(time.Duration(h) * time.Hour), End: day.Add(time.Duration(h+1) * time.Hour), Cost: 0.25, Currency: "USD",
			Service: "Gemini API", SKU: "Gemini 3.5 Flash Lite Input Tokens", Amount: &amount, Unit: "count", Credits: -0.05})
	}
	rows[6].Amount, rows[6].Credits = nil, 0 // a row without usage
	fake := bqtest.New(t, rows...)
	path := fake.ServiceAccount(t)
	c, err := New(context.Background(), table, Options{Endpoint: fake.Endpoint(), Getenv: func(k string) string { return map[string]string{CredentialsEnv: path}[k] }})
	if err != nil {
		t.Fatal(err)
	}
	var got []reconcile.Row
	err = c.Rows(context.Background(), reconcile.DefaultServices, day, day.AddDate(0, 0, 1), func(r reconcile.Row) error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 7 || fake.Pages() != 3 {
		t.Fatalf("%d rows in %d pages, want 7 in 3", len(got), fake.Pages())
	}
	r := got[2]
	if !r.Start.Equal(day.Add(2*time.Hour)) || r.CostMicro != 250000 || r.CreditsMicro != -50000 || r.Quantity != 2.5e6 || !r.HasQuantity ||
		r.Service != "Gemini API" || r.Description != "Gemini 3.5 Flash Lite Input Tokens" || r.Unit != "count" || r.Currency != "USD" {
		t.Errorf("row 3: %+v", r)
	}
	if got[6].HasQuantity {
		t.Error("a null usage.amount read as a quantity")
	}
	q := fake.Queries()
	if len(q) != 1 || !strings.Contains(q[0]["query"].(string), "`"+table+"`") || q[0]["useLegacySql"] != false || q[0]["parameterMode"] != "NAMED" {
		t.Errorf("the query sent: %+v", q)
	}
}

// A refused token or query is an error that says what BigQuery said.
func TestQueryRefused(t *testing.T) {
	fake := bqtest.New(t)
	if _, err := New(context.Background(), table, Options{Getenv: func(string) string { return "" }}); err == nil || !strings.Contains(err.Error(), CredentialsEnv) {
		t.Errorf("no credentials: %v", err)
	}
	path := fake.ServiceAccount(t)
	c, err := New(context.Background(), table, Options{Endpoint: fake.Endpoint(), Getenv: func(string) string { return path }})
	if err != nil {
		t.Fatal(err)
	}
	c.hc.Transport = http.DefaultTransport // no token: the fake refuses
	err = c.Rows(context.Background(), reconcile.DefaultServices, time.Now(), time.Now(), func(reconcile.Row) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "missing required authentication") {
		t.Errorf("refused: %v", err)
	}
}
