package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/budget/reconcile/bigquery/bqtest"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// halfPricePostgres is halfPriceLedger written as an instance writes it
// into the shared ledger.
func halfPricePostgres(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	db, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := postgres.NewMoney(ctx, db, postgres.MoneyOptions{Location: time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	at := driftDay.Add(10 * time.Hour)
	day, month := budget.DayKey(at, time.UTC), budget.MonthKey(at, time.UTC)
	if err := m.Lease(ctx, day, 4, 400000); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		rec := budget.UsageRecord{Time: at.Add(time.Duration(i) * time.Minute), UserID: "ann", RequestID: fmt.Sprint("r", i),
			Model: "gemini-3.5-flash-lite", CostMicroUSD: 22500, PromptTokens: 250000, CandidatesTokens: 50000}
		if err := m.RecordUsage(ctx, month, rec, budget.Settlement{Day: day, ActualMicroUSD: 22500, Leased: true, LeasedMicroUSD: 100000}); err != nil {
			t.Fatal(err)
		}
	}
}

// On PostgreSQL two instances start on D+2: one of them, elected by the
// detection lock, reconciles (one query to BigQuery, one ledger_drift
// through the webhook), and both dashboards show its result. The first
// query is held until the other instance has tried the day's run, so
// that the two run at once: without the election both would query.
func TestDailyReconciliationOnOneInstance(t *testing.T) {
	url := pgtest.NewDatabase(t)
	halfPricePostgres(t, url)
	fake := bqtest.New(t, billRows(0)...)
	hook := &hookNotices{}
	srv := httptest.NewServer(hook)
	defer srv.Close()
	const token = "reconcile-dashboard-token-0123456789"
	secrets := env(map[string]string{"HOOK_URL": srv.URL, "GOOGLE_APPLICATION_CREDENTIALS": fake.ServiceAccount(t), "BREAKWATER_ADMIN_TOKEN": token,
		postgres.EnvURL: url, "BREAKWATER_SECRET": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"})
	cfg, err := Load(writeConfig(t, "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nbackend = \"postgres\"\n"+
		"[ocr]\nprovider = \"simulated\"\n"+minimal+"[reconcile]\nbigquery_table = \""+bqtest.Project+".billing_export.gcp_billing_export_v1_01A2B3\"\n"+
		"[alerts]\n[[alerts.webhook]]\nformat = \"json\"\nurl_env = \"HOOK_URL\"\n"), secrets)
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return driftDay.AddDate(0, 0, 2).Add(6 * time.Hour) }
	release := fake.Hold()
	defer release()
	var logs strings.Builder
	lw := &lockedWriter{w: &logs}
	logger := slog.New(slog.NewTextHandler(lw, nil))
	skipped := func() bool {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		return strings.Contains(logs.String(), "another instance is running it")
	}
	var apps []*App
	for range 2 {
		a, err := Open(context.Background(), cfg, Options{Getenv: secrets, BigQueryEndpoint: fake.Endpoint(), Now: now, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Close)
		apps = append(apps, a)
	}
	// One query in flight, and the other instance has tried too: skipped
	// under the election, a second query without it.
	deadline := time.Now().Add(20 * time.Second)
	for len(fake.Queries()) < 2 && !skipped() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !skipped() {
		t.Fatalf("no instance was told another runs the day while %d query(ies) to BigQuery were in flight", len(fake.Queries()))
	}
	release()
	deadline = time.Now().Add(20 * time.Second)
	for len(hook.drifts()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if q, n := len(fake.Queries()), len(hook.drifts()); q != 1 || n != 1 {
		t.Fatalf("%d queries to BigQuery and %d ledger_drift notices, want 1 of each", q, n)
	}
	for i, a := range apps {
		if page := dashboardPage(t, a, token); !strings.Contains(page, "1 day(s) beyond 0.05</strong> (2026-12-01)") {
			t.Errorf("instance %d's dashboard does not show the shared reconciliation:\n%s", i, page)
		}
	}
}
