package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/budget/reconcile"
	"breakwater/budget/reconcile/bigquery/bqtest"
	"breakwater/detect"
	"breakwater/storage"
)

// driftDay is the day of the test's ledger and bill.
var driftDay = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// halfPriceLedger writes into the bolt database at path four reads of
// gemini-3.5-flash-lite on driftDay at $0.0225 each: half what the bill
// says Google charged for their tokens.
func halfPriceLedger(t *testing.T, path string) {
	t.Helper()
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, at := context.Background(), driftDay.Add(10*time.Hour)
	day, month := budget.DayKey(at, time.UTC), budget.MonthKey(at, time.UTC)
	if err := db.Lease(ctx, day, 4, 400000); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		rec := budget.UsageRecord{Time: at.Add(time.Duration(i) * time.Minute), UserID: "ann", RequestID: fmt.Sprint("r", i),
			Model: "gemini-3.5-flash-lite", CostMicroUSD: 22500, PromptTokens: 250000, CandidatesTokens: 50000}
		if err := db.RecordUsage(ctx, month, rec, budget.Settlement{Day: day, ActualMicroUSD: 22500, Leased: true, LeasedMicroUSD: 100000}); err != nil {
			t.Fatal(err)
		}
	}
}

// billRows is Google's bill of driftDay: the four reads' tokens at
// $0.10 and $0.40 per million, input plus extra.
func billRows(extra float64) []bqtest.Row {
	in, out := 1e6, 2e5
	row := func(sku string, cost float64, amount *float64) bqtest.Row {
		return bqtest.Row{Start: driftDay.Add(10 * time.Hour), End: driftDay.Add(11 * time.Hour), Cost: cost, Currency: "USD", Service: "Gemini API",
			SKU: sku, Amount: amount, Unit: "count"}
	}
	return []bqtest.Row{row("Gemini 3.5 Flash Lite Input Tokens", 0.10+extra, &in), row("Gemini 3.5 Flash Lite Output Tokens", 0.08, &out)}
}

// hookNotices collects what a json webhook is posted.
type hookNotices struct {
	mu  sync.Mutex
	got []detect.JSONNotice
}

func (h *hookNotices) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var n detect.JSONNotice
	if json.Unmarshal(b, &n) == nil {
		h.mu.Lock()
		h.got = append(h.got, n)
		h.mu.Unlock()
	}
}

// drifts are the ledger_drift notices received so far.
func (h *hookNotices) drifts() []detect.JSONNotice {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []detect.JSONNotice
	for _, n := range h.got {
		if n.Kind == detect.KindLedgerDrift {
			out = append(out, n)
		}
	}
	return out
}

// With reconcile.bigquery_table set, the daily run reconciles the last
// complete days from the export and raises ledger_drift through the
// webhook once: not again the same day, nor on a later day at the same
// figures; again when late rows change a day's bill. Each run's result
// is kept for the dashboard.
func TestDailyReconciliationAlertsOnce(t *testing.T) {
	fake := bqtest.New(t, billRows(0)...)
	hook := &hookNotices{}
	srv := httptest.NewServer(hook)
	defer srv.Close()
	db := filepath.Join(t.TempDir(), "bw.db")
	halfPriceLedger(t, db)
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n%s"+
		"[reconcile]\nbigquery_table = \"%s.billing_export.gcp_billing_export_v1_01A2B3\"\n"+
		"[alerts]\n[[alerts.webhook]]\nformat = \"json\"\nurl_env = \"HOOK_URL\"\n", db, minimal, bqtest.Project))
	const token = "reconcile-dashboard-token-0123456789"
	secrets := env(map[string]string{"HOOK_URL": srv.URL, "GOOGLE_APPLICATION_CREDENTIALS": fake.ServiceAccount(t), "BREAKWATER_ADMIN_TOKEN": token})
	cfg, err := Load(path, secrets)
	if err != nil {
		t.Fatal(err)
	}
	// openAt opens the service at now and lets its daily run go.
	openAt := func(now time.Time, queries int) *App {
		t.Helper()
		a, err := Open(context.Background(), cfg, Options{Getenv: secrets, BigQueryEndpoint: fake.Endpoint(), Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for len(fake.Queries()) < queries && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond) // the alert's delivery, or its absence
		if len(fake.Queries()) < queries {
			a.Close()
			t.Fatalf("at %s: %d reconciliations, want %d", now, len(fake.Queries()), queries)
		}
		return a
	}
	runAt := func(now time.Time, queries int) { openAt(now, queries).Close() }
	d2 := driftDay.AddDate(0, 0, 2).Add(6 * time.Hour) // D+2, after detect.run_at
	runAt(d2, 1)
	got := hook.drifts()
	if len(got) != 1 {
		t.Fatalf("ledger_drift notices on D+2: %d, want 1", len(got))
	}
	want := "Google billed $0.18 for gemini-3.5-flash-lite on 2026-12-01; Breakwater counted $0.09: the ledger's price is half Google's"
	if got[0].Summary != want || !strings.Contains(got[0].Details["2026-12-01 gemini-3.5-flash-lite"], "drift +1.00, cause: price, agreeing price $0.1 input and $0.4 output per million tokens") {
		t.Errorf("notice %q %v, want %q", got[0].Summary, got[0].Details, want)
	}
	if !strings.Contains(got[0].Text, "What to do:\n- See every day and model on the dashboard") {
		t.Errorf("the notice's text says not what to do:\n%s", got[0].Text)
	}
	runAt(d2.Add(time.Hour), 1)   // a restart the same day: nothing due, no second run
	runAt(d2.AddDate(0, 0, 1), 2) // the next day, the same figures
	if n := len(hook.drifts()); n != 1 {
		t.Fatalf("ledger_drift notices after two more runs at the same figures: %d, want still 1", n)
	}
	fake.SetRows(billRows(0.02)...) // late rows: the day's bill grows
	runAt(d2.AddDate(0, 0, 2), 3)
	if n := len(hook.drifts()); n != 2 {
		t.Fatalf("ledger_drift notices after late rows: %d, want 2", n)
	}
	a := openAt(d2.AddDate(0, 0, 2).Add(time.Hour), 3)
	page := dashboardPage(t, a, token)
	a.Close()
	for _, want := range []string{"days 2026-11-28 to 2026-12-03", "1 day(s) beyond 0.05</strong> (2026-12-01)",
		"<td>2026-12-01</td><td>gemini-3.5-flash-lite</td><td class=\"n\">$0.090000</td><td class=\"n\">$0.200000</td><td class=\"n\">&#43;1.22</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the dashboard has no %q:\n%s", want, page)
		}
	}
	st, err := openLast(t, db)
	if err != nil || st.From != "2026-11-28" || st.To != "2026-12-03" || len(st.Beyond) != 1 || st.Beyond[0] != "2026-12-01" {
		t.Errorf("the last reconciliation kept: %+v %v", st, err)
	}
}

// dashboardPage is the admin dashboard of a.
func dashboardPage(t *testing.T, a *App, token string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+a.AdminAddr()+"/", nil)
	req.SetBasicAuth("admin", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %d %s", resp.StatusCode, b)
	}
	i := strings.Index(string(b), "The ledger against")
	if i < 0 {
		t.Fatalf("the dashboard has no reconciliation:\n%s", b)
	}
	return string(b[i:min(len(b), i+3000)])
}

// openLast reads the last reconciliation the database keeps.
func openLast(t *testing.T, path string) (reconcile.Last, error) {
	t.Helper()
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		return reconcile.Last{}, err
	}
	defer db.Close()
	state, err := db.LoadState(reconcile.StateName)
	if err != nil {
		return reconcile.Last{}, err
	}
	var last reconcile.Last
	err = json.Unmarshal(state["last"], &last)
	return last, err
}
