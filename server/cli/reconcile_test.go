package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/budget/reconcile/bigquery"
	"breakwater/budget/reconcile/bigquery/bqtest"
	"breakwater/server/app"
	"breakwater/server/cli"
	"breakwater/storage"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// focusBill is the FOCUS fixture: on 2026-12-01 (UTC) Google billed
// gemini-3.5-flash-lite $0.18 for 1,000,000 input and 200,000 output
// tokens, and gemini-3.5-flash $0.185 for 200,000 and 50,000.
const focusBill = "budget/reconcile/testdata/focus.csv"

// moneyWriter is what both backends write the ledger with.
type moneyWriter interface {
	Lease(ctx context.Context, day string, calls, microUSD int64, giveBack ...budget.LedgerDay) error
	RecordUsage(ctx context.Context, month string, rec budget.UsageRecord, s budget.Settlement) error
	Settle(ctx context.Context, s budget.Settlement) error
}

// boltLedger writes ledgerOfTheBill into a new bolt database at path.
func boltLedger(t *testing.T, path string, factor float64) {
	t.Helper()
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ledgerOfTheBill(t, db, factor)
}

// postgresLedger writes ledgerOfTheBill into the database at url, as an
// instance does.
func postgresLedger(t *testing.T, url string, factor float64) {
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
	ledgerOfTheBill(t, m, factor)
}

// ledgerOfTheBill writes the reads of the bill's day as a server would
// (a lease, then usage rows that settle it), each at factor times what
// Google billed it, and one failed call of $0.001 that left no usage
// row.
func ledgerOfTheBill(t *testing.T, db moneyWriter, factor float64) {
	t.Helper()
	ctx, at := context.Background(), time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	day, month := budget.DayKey(at, time.UTC), budget.MonthKey(at, time.UTC)
	const leased = 100000 // each call's part of the lease
	if err := db.Lease(ctx, day, 6, 6*leased); err != nil {
		t.Fatal(err)
	}
	reads := []budget.UsageRecord{
		{Model: "gemini-3.5-flash", CostMicroUSD: 185000, PromptTokens: 200000, CandidatesTokens: 20000, ThoughtsTokens: 30000},
	}
	for range 4 {
		reads = append(reads, budget.UsageRecord{Model: "gemini-3.5-flash-lite", CostMicroUSD: 45000, PromptTokens: 250000, CandidatesTokens: 50000})
	}
	for i, rec := range reads {
		rec.Time, rec.UserID, rec.KeyID = at.Add(time.Duration(i)*time.Minute), "ann", "key_ann"
		rec.RequestID = "req-" + string(rune('a'+i))
		rec.CostMicroUSD = int64(math.Round(factor * float64(rec.CostMicroUSD)))
		s := budget.Settlement{Day: day, ActualMicroUSD: rec.CostMicroUSD, Leased: true, LeasedMicroUSD: leased}
		if err := db.RecordUsage(ctx, month, rec, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Settle(ctx, budget.Settlement{Day: day, ActualMicroUSD: 1000, Leased: true, LeasedMicroUSD: leased}); err != nil {
		t.Fatal(err)
	}
}

// reconcileOn runs reconcile with args on the config at path; it returns
// what it printed and its exit status.
func reconcileOn(t *testing.T, path string, env func(string) string, args ...string) (string, int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"reconcile", "--config", path}, args...), env, &out, &errOut)
	code := cli.ExitCode(err, &errOut)
	return out.String(), code, errOut.String()
}

// checkReconcile reconciles the fixture with a ledger at Google's price
// (exit 0) and one at half of it (drift 1.00, exit 3, Google's prices
// suggested), through the command line; ledger makes a service whose
// ledger is at a factor of Google's price, and returns its config and
// environment.
func checkReconcile(t *testing.T, ledger func(factor float64) (path string, env func(string) string)) (path string, env func(string) string) {
	t.Helper()
	path, env = ledger(1)
	out, code, stderr := reconcileOn(t, path, env, "--bill", focusBill)
	if code != 0 || !strings.Contains(out, "every day from 2026-12-01 to 2026-12-01 within reconcile.max_drift 5%") {
		t.Fatalf("the bill at the ledger's price: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{`\(unattributed\) +\$0\.001000`, `1000000/1000000`, `credits \$-0\.010000 apart`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("the table has no %s:\n%s", want, out)
		}
	}
	path, env = ledger(0.5)
	out, code, stderr = reconcileOn(t, path, env, "--bill", focusBill)
	if code != 3 || !strings.Contains(stderr, "1 day(s) beyond reconcile.max_drift 5%: 2026-12-01") {
		t.Fatalf("the bill at twice the ledger's price: exit %d, want 3\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"+1.00", "suggested: gemini-3.5-flash-lite at $0.1 input and $0.4 output per million tokens", "BEYOND 5% (the price)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table has no %q:\n%s", want, out)
		}
	}
	out, code, _ = reconcileOn(t, path, env, "--bill", focusBill, "--json")
	var lines []struct {
		Day        string   `json:"day"`
		Model      string   `json:"model"`
		CountedUSD float64  `json:"counted_usd"`
		BilledUSD  float64  `json:"billed_usd"`
		Drift      *float64 `json:"drift"`
	}
	if err := json.Unmarshal([]byte(out), &lines); err != nil || code != 3 {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	found := false
	for _, l := range lines {
		if l.Day == "2026-12-01" && l.Model == "gemini-3.5-flash-lite" {
			found = l.Drift != nil && math.Abs(*l.Drift-1) < 1e-9 && math.Abs(l.CountedUSD-0.09) < 1e-9 && math.Abs(l.BilledUSD-0.18) < 1e-9
		}
	}
	if !found {
		t.Errorf("--json has no line of gemini-3.5-flash-lite at $0.09 counted, $0.18 billed, drift 1:\n%s", out)
	}
	return path, env
}

func TestReconcileOnBolt(t *testing.T) {
	path, _ := checkReconcile(t, func(factor float64) (string, func(string) string) {
		db := filepath.Join(t.TempDir(), "bw.db")
		boltLedger(t, db, factor)
		return operatorConfig(t, freeAddr(t), db, ""), envFrom(nil)
	})
	// While serving, the command reads the ledger through the admin API.
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "reconcile-test-token"})
	startApp(t, path, env)
	if out, code, stderr := reconcileOn(t, path, env, "--bill", focusBill); code != 3 || !strings.Contains(out, "+1.00") {
		t.Errorf("while serving: exit %d, want 3 as stopped\n%s%s", code, out, stderr)
	}
}

func TestReconcileOnPostgres(t *testing.T) {
	path := writeConfig(t, instancesTOML(t)+"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n")
	checkReconcile(t, func(factor float64) (string, func(string) string) {
		url := pgtest.NewDatabase(t) // a fresh database each time
		postgresLedger(t, url, factor)
		return path, envFrom(map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": migrateSecret})
	})
}

// A bill the command cannot read exits 1 and says why, with its line.
func TestReconcileBadBill(t *testing.T) {
	db := filepath.Join(t.TempDir(), "bw.db")
	path := operatorConfig(t, freeAddr(t), db, "")
	boltLedger(t, db, 1)
	bill := writeConfig(t, "ChargePeriodStart,ChargePeriodEnd,BilledCost,BillingCurrency,ServiceName,ChargeDescription,ConsumedQuantity\n")
	if _, code, stderr := reconcileOn(t, path, envFrom(nil), "--bill", bill); code != 1 || !strings.Contains(stderr, "line 1: the FOCUS header lacks the column ConsumedUnit") {
		t.Errorf("a missing column: exit %d\n%s", code, stderr)
	}
	empty := writeConfig(t, "")
	if _, code, stderr := reconcileOn(t, path, envFrom(nil), "--bill", empty); code != 1 || !strings.Contains(stderr, "the bill is empty") {
		t.Errorf("an empty bill: exit %d\n%s", code, stderr)
	}
	if _, code, _ := reconcileOn(t, path, envFrom(nil)); code != 2 {
		t.Errorf("no --bill: exit %d, want 2", code)
	}
	if out, code, stderr := reconcileOn(t, path, envFrom(nil), "--bill", focusBill, "--from", "2026-12-02", "--to", "2026-12-03"); code != 0 || !strings.Contains(out, "rows of days outside") {
		t.Errorf("days the bill does not cover: exit %d\n%s%s", code, out, stderr)
	}
}

// The [reconcile] block of docs/CONFIGURATION.md, as written, names the
// model of rows that name none: without it they are unmatched.
func TestReconcileDocumentedSKU(t *testing.T) {
	doc, err := os.ReadFile("docs/CONFIGURATION.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(doc), "## Reconciling with the bill")
	_, block, ok := strings.Cut(after, "```toml\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed || !strings.Contains(block, "[[reconcile.sku]]") {
		t.Fatal("docs/CONFIGURATION.md has no toml block with a [[reconcile.sku]] under Reconciling with the bill")
	}
	fixture, err := os.ReadFile(focusBill)
	if err != nil {
		t.Fatal(err)
	}
	bill := writeConfig(t, strings.ReplaceAll(string(fixture), "Gemini 3.5 Flash Lite", "Gemini Flash Lite 3.5"))
	db := filepath.Join(t.TempDir(), "bw.db")
	boltLedger(t, db, 1)
	for _, tt := range []struct {
		extra     string
		unmatched bool
	}{{"", true}, {block, false}} {
		out, code, stderr := reconcileOn(t, operatorConfig(t, freeAddr(t), db, tt.extra), envFrom(nil), "--bill", bill)
		if strings.Contains(out, "(unmatched)") != tt.unmatched || code != 0 {
			t.Errorf("with %q: exit %d, unmatched rows %v, want %v:\n%s%s", tt.extra, code, !tt.unmatched, tt.unmatched, out, stderr)
		}
	}
}

// A [reconcile] mistake stops the start with the key named; an explicit
// max_drift = 0 is refused, not taken for the default.
func TestReconcileConfigRefused(t *testing.T) {
	for extra, want := range map[string]string{
		"[reconcile]\nmax_drift = 0\n":                                            "reconcile.max_drift",
		"[[reconcile.sku]]\nmatch = \"x\"\nmodel = \"gpt-9\"\n":                   `reconcile.sku[0].model: "gpt-9"`,
		"[reconcile]\nbigquery_table = \"billing_export\"\n":                      "reconcile.bigquery_table",
		"[reconcile]\nbigquery_endpoint = \"http://proxy.example/bigquery/v2\"\n": "reconcile.bigquery_endpoint",
		"[[reconcile.sku]]\nmatch = \"Flash\"\nmodel = \"gemini-2.5-flash\"\n":    "",
	} {
		_, err := app.Load(simulatedConfig(t, "[plans.free]\nmonthly_quota = 10\n"+extra), envFrom(nil))
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: %v, want an error naming %q", extra, err, want)
		}
	}
	// The daily reconciliation needs its credentials: config check says
	// so, as serve would refuse.
	path := simulatedConfig(t, "[plans.free]\nmonthly_quota = 10\n[reconcile]\nbigquery_table = \"ocr-billing.billing_export.gcp_billing_export_v1_01A2B3\"\n")
	var out bytes.Buffer
	err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(nil), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "GOOGLE_APPLICATION_CREDENTIALS is not set") {
		t.Errorf("config check without the key file: %v\n%s", err, out.String())
	}
}

// Without --bill, with reconcile.bigquery_table set, the command reads the
// export's rows of the days asked over BigQuery's API (a local fake that
// speaks it, a service account's key file): the same rows as the FOCUS
// fixture's, so the same answer, exit 0; the days at twice the price,
// exit 3. Without --bill and without a table it says what to give.
func TestReconcileFromBigQuery(t *testing.T) {
	hour := func(h int) time.Time { return time.Date(2026, 12, 1, h, 0, 0, 0, time.UTC) }
	row := func(h int, cost float64, sku string, tokens float64) bqtest.Row {
		return bqtest.Row{Start: hour(h), End: hour(h + 1), Cost: cost, Currency: "USD", Service: "Gemini API", SKU: sku, Amount: &tokens, Unit: "count"}
	}
	rows := []bqtest.Row{
		row(8, 0.06, "Gemini 3.5 Flash Lite Input Tokens", 600000), row(8, 0.048, "Gemini 3.5 Flash Lite Output Tokens", 120000),
		row(14, 0.04, "Gemini 3.5 Flash Lite Input Tokens", 400000), row(14, 0.032, "Gemini 3.5 Flash Lite Output Tokens", 80000),
		row(10, 0.06, "Gemini 3.5 Flash Input Tokens", 200000), row(10, 0.125, "Gemini 3.5 Flash Output Tokens", 50000),
	}
	fake := bqtest.New(t, rows...)
	db := filepath.Join(t.TempDir(), "bw.db")
	boltLedger(t, db, 1)
	path := operatorConfig(t, freeAddr(t), db, fmt.Sprintf("[reconcile]\nbigquery_table = \"%s.billing.gcp_billing_export_v1_X\"\nbigquery_endpoint = %q\n", bqtest.Project, fake.Endpoint()))
	env := envFrom(map[string]string{bigquery.CredentialsEnv: fake.ServiceAccount(t)})
	out, code, stderr := reconcileOn(t, path, env, "--from", "2026-12-01", "--to", "2026-12-01")
	if code != 0 || !strings.Contains(out, "every day from 2026-12-01 to 2026-12-01 within reconcile.max_drift 5%") {
		t.Fatalf("from BigQuery at the ledger's price: exit %d\n%s%s", code, out, stderr)
	}
	if q := fake.Queries(); len(q) != 1 || !strings.Contains(fmt.Sprint(q[0]), "gcp_billing_export_v1_X") {
		t.Errorf("the queries sent: %v", q)
	}
	for i := range rows {
		rows[i].Cost *= 2
	}
	fake.SetRows(rows...)
	if out, code, stderr := reconcileOn(t, path, env, "--from", "2026-12-01", "--to", "2026-12-01"); code != 3 || !strings.Contains(out, "+1.00") {
		t.Errorf("from BigQuery at twice the ledger's price: exit %d, want 3\n%s%s", code, out, stderr)
	}
	bare := operatorConfig(t, freeAddr(t), db, "")
	if _, code, stderr := reconcileOn(t, bare, envFrom(nil)); code == 0 || !strings.Contains(stderr, "missing --bill FILE (or set reconcile.bigquery_table") {
		t.Errorf("no bill, no table: exit %d\n%s", code, stderr)
	}
}
