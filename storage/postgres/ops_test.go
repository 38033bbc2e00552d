package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/server/keys"
	"breakwater/storage/backendtest"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// moneyTables are the money path's tables as agreed with it (its
// migrations create them; IF NOT EXISTS leaves theirs alone), so that the
// operator's reads are tested before and after the two meet.
const moneyTables = `
CREATE TABLE IF NOT EXISTS usage_rows (id bigserial PRIMARY KEY, at timestamptz, day text, month text, user_id text, key_id text,
	request_id text, calls int, micro_usd bigint, input_tokens bigint, output_tokens bigint, simulated bool, model text, body bytea);
CREATE TABLE IF NOT EXISTS ledger_days (day text PRIMARY KEY, calls bigint, micro_usd bigint, settled_micro_usd bigint, settled_calls bigint);
CREATE TABLE IF NOT EXISTS ledger_months (month text PRIMARY KEY, micro_usd bigint);
CREATE TABLE IF NOT EXISTS quota_counts (user_id text, month text, used bigint, PRIMARY KEY (user_id, month));`

// withMoney opens a fresh database that holds the money tables, with two
// usage rows (one whose body is the record's JSON, one of columns only,
// its body empty: the column is NOT NULL in the money path's migration)
// and two ledger days.
func withMoney(t *testing.T) (*postgres.DB, string, []budget.UsageRecord) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	db := open(t, url)
	ctx := context.Background()
	if _, err := db.Pool().Exec(ctx, moneyTables); err != nil {
		t.Fatal(err)
	}
	full := budget.UsageRecord{Time: t0, UserID: "alice", KeyID: "k1", RequestID: "r1", Model: "gemini", Outcome: "ok", Bytes: 100,
		PromptTokens: 10, CandidatesTokens: 20, ThoughtsTokens: 5, CostMicroUSD: 700, LatencyMS: 30}
	body, _ := json.Marshal(full)
	columns := budget.UsageRecord{Time: t0.Add(time.Hour), UserID: "bob", KeyID: "k2", RequestID: "r2", Model: "gemini",
		PromptTokens: 1, CandidatesTokens: 2, CostMicroUSD: 9}
	for _, r := range []struct {
		rec  budget.UsageRecord
		body []byte
	}{{full, body}, {columns, []byte{}}} {
		if _, err := db.Pool().Exec(ctx, `INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd,
			input_tokens, output_tokens, simulated, model, body) VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8, $9, false, $10, $11)`,
			r.rec.Time, r.rec.Time.Format(time.DateOnly), r.rec.Time.Format("2006-01"), r.rec.UserID, r.rec.KeyID, r.rec.RequestID,
			r.rec.CostMicroUSD, r.rec.PromptTokens, r.rec.CandidatesTokens, r.rec.Model, r.body); err != nil {
			t.Fatal(err)
		}
	}
	// 2026-03-01 holds a lease's rest of one call and 100 µ$ besides the
	// two calls made.
	if _, err := db.Pool().Exec(ctx, `INSERT INTO ledger_days (day, calls, micro_usd, settled_micro_usd, settled_calls)
		VALUES ('2026-03-01', 3, 2100, 2000, 2), ('2026-03-02', 1, 700, 700, 1), ('2026-04-01', 5, 5, 5, 5)`); err != nil {
		t.Fatal(err)
	}
	return db, url, []budget.UsageRecord{full, columns}
}

// The operator's money figures are read from the shared tables, whichever
// instance asks.
func TestUsageAndBudgetDays(t *testing.T) {
	t.Parallel()
	db, url, want := withMoney(t)
	other := open(t, url)
	got, err := other.Usage(t0, t0.Add(2*time.Hour))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Usage = %+v, %v; want %+v", got, err, want)
	}
	if got, err := db.Usage(t0, t0.Add(time.Hour)); err != nil || len(got) != 1 || got[0].UserID != "alice" {
		t.Errorf("Usage to exclusive = %+v, %v; want alice's only", got, err)
	}
	days, err := other.BudgetDays("2026-03-01", "2026-03-31")
	// The calls made and their cost, without the lease's rest.
	wantDays := []budget.LedgerDay{{Day: "2026-03-01", DayTotals: budget.DayTotals{Requests: 2, SpendMicroUSD: 2000}},
		{Day: "2026-03-02", DayTotals: budget.DayTotals{Requests: 1, SpendMicroUSD: 700}}}
	if err != nil || !reflect.DeepEqual(days, wantDays) {
		t.Errorf("BudgetDays = %+v, %v; want %+v", days, err, wantDays)
	}
	if _, err := db.BudgetDays("March", "2026-03-31"); err == nil {
		t.Error("BudgetDays accepted a bad day")
	}
}

func TestPathHidesThePassword(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	p := db.Path()
	if !strings.HasPrefix(p, "postgres://postgres@127.0.0.1:") || strings.Contains(p, "sslmode") {
		t.Errorf("Path() = %q, want postgres://user@host:port/db", p)
	}
	cfg := db.Pool().Config().ConnConfig
	if !strings.HasSuffix(p, "/"+cfg.Database) {
		t.Errorf("Path() = %q does not name the database %s", p, cfg.Database)
	}
}

// psql finds the client that restores a backup; the test fails without it.
func psql(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql"); len(m) > 0 {
		return m[len(m)-1]
	}
	t.Fatal("psql is needed to restore a backup (apt-get install postgresql-client)")
	return ""
}

// restore runs the backup script with psql into the database at url.
func restore(t *testing.T, url string, script []byte) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backup.sql")
	if err := os.WriteFile(path, script, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(psql(t), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-f", path, url).CombinedOutput()
	if err != nil {
		t.Logf("psql: %s", out)
	}
	return err
}

// A backup restored into a new, empty database gives back every record
// at the same schema; new rows go on after the restored ones; a database
// that holds Breakwater's tables refuses it whole.
func TestBackupRestores(t *testing.T) {
	t.Parallel()
	db, _, usage := withMoney(t)
	ctx := context.Background()
	if err := db.CreateKey(newKey("k1", "alice", t0), keys.User{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	inv := backendtest.NewInvite("inv_1", 2)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(ctx, inv.Hash, "a@x", t0); err != nil {
		t.Fatal(err)
	}
	events := []detect.Event{{Time: t0, Route: "a", IP: "192.0.2.1"}, {Time: t0, Route: "b"}}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	if err := db.SetFlag("brake", true); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveState("windows", map[string][]byte{"alice": {0, 1, 0xff}}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := db.Backup(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("Backup = %d, %v; wrote %d", n, err, buf.Len())
	}

	// The script makes the schema itself, in a database with none: a
	// database an instance has started on holds rows of its own already.
	url := pgtest.NewDatabase(t)
	if err := restore(t, url, buf.Bytes()); err != nil {
		t.Fatalf("restore: %v", err)
	}
	restored := open(t, url)
	if restored.Schema() != db.Schema() {
		t.Errorf("restored schema %d, want %d", restored.Schema(), db.Schema())
	}
	if list, err := restored.Keys(); err != nil || len(list) != 1 || list[0] != newKey("k1", "alice", t0) {
		t.Errorf("restored keys = %+v, %v", list, err)
	}
	if red, err := restored.Redemptions(inv.Hash); err != nil || len(red) != 1 || red[0].Email != "a@x" {
		t.Errorf("restored redemptions = %+v, %v", red, err)
	}
	if got, err := restored.Events(time.Time{}, time.Time{}); err != nil || !reflect.DeepEqual(got, events) {
		t.Errorf("restored events = %+v, %v", got, err)
	}
	if on, err := restored.Flag("brake"); err != nil || !on {
		t.Errorf("restored brake = %v, %v", on, err)
	}
	if st, err := restored.LoadState("windows"); err != nil || !bytes.Equal(st["alice"], []byte{0, 1, 0xff}) {
		t.Errorf("restored state = %v, %v", st, err)
	}
	if got, err := restored.Usage(time.Time{}, time.Time{}); err != nil || !reflect.DeepEqual(got, usage) {
		t.Errorf("restored usage = %+v, %v", got, err)
	}
	// The sequences go on past the restored rows.
	if err := restored.AppendEvents([]detect.Event{{Time: t0.Add(time.Hour), Route: "c"}}); err != nil {
		t.Fatalf("an event after the restore: %v", err)
	}
	if got, _ := restored.Events(time.Time{}, time.Time{}); routes(got) != "[a b c]" {
		t.Errorf("events after the restore = %s, want [a b c]", routes(got))
	}
	// Restoring again onto rows fails and changes nothing.
	if err := restore(t, url, buf.Bytes()); err == nil {
		t.Error("a backup restored onto a database that holds rows")
	}
	if got, _ := restored.Events(time.Time{}, time.Time{}); len(got) != 3 {
		t.Errorf("a refused restore left %d events, want 3", len(got))
	}
}
