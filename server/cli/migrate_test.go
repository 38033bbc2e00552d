package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.etcd.io/bbolt"

	"breakwater/budget"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/storage"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

const migrateSecret = "0123456789abcdef0123456789abcdef"

// boltToMigrate writes a bolt database as a server would leave it: two
// users with a key each (one revoked), an invite redeemed once, three paid
// reads of today with their ledger day, and the brake on.
func boltToMigrate(t *testing.T, path string, now time.Time) (secret string) {
	t.Helper()
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i, user := range []string{"alice", "bob"} {
		k := keys.Key{ID: "key_" + user, Hash: sha256.Sum256([]byte("bw_secret_of_" + user)), UserID: user, CreatedAt: now.Add(-time.Hour)}
		if i == 1 {
			k.RevokedAt = now.Add(-time.Minute)
		}
		if err := db.CreateKey(k, keys.User{ID: user, Plan: "free", CreatedAt: now.Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	key, err := invites.NewKey([]byte(migrateSecret))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RekeyInvites(key.Mark(), key.Rekey); err != nil {
		t.Fatal(err)
	}
	inv := invites.Invite{ID: "inv_1", Hash: key.Rekey(sha256.Sum256([]byte("CODE-1"))), MaxUses: 3, CreatedAt: now.Add(-time.Hour)}
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(context.Background(), inv.Hash, "carol@example.com", now.Add(-30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	day, month := budget.DayKey(now, time.UTC), budget.MonthKey(now, time.UTC)
	if err := db.Lease(context.Background(), day, 3, 3000); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		rec := budget.UsageRecord{Time: sameDay(now, time.Duration(10-i)*time.Minute), UserID: "alice", KeyID: "key_alice",
			RequestID: "req-" + string(rune('a'+i)), Model: "gemini-3.5-flash-lite", CostMicroUSD: 700}
		s := budget.Settlement{Day: day, ActualMicroUSD: 700, Leased: true, LeasedMicroUSD: 1000}
		if err := db.RecordUsage(context.Background(), month, rec, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.SetFlag(state.BrakeFlag, true); err != nil {
		t.Fatal(err)
	}
	return migrateSecret
}

// sameDay is ago before now, or now's midnight if that is sooner: a
// server files a read's row and settles its call on the day the read
// began, so a fixture's reads of today must have begun today (a run just
// after midnight would otherwise file them on yesterday).
func sameDay(now time.Time, ago time.Duration) time.Time {
	midnight := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, now.Location())
	if t := now.Add(-ago); t.After(midnight) {
		return t
	}
	return midnight
}

// migrate --from copies every kind once: a second run copies nothing, the
// keys keep their hashes (so they keep working), and the money records
// (usage, quotas, the ledger) and the brake arrive whole.
func TestMigrateFromBolt(t *testing.T) {
	dir := t.TempDir()
	now := time.Now().UTC()
	boltPath := filepath.Join(dir, "old.db")
	secret := boltToMigrate(t, boltPath, now)
	// A file written before bolt files had an identity: migrate gives it
	// one, with which a rerun knows what it brought.
	raw, err := bbolt.Open(boltPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("meta")).Delete([]byte("database_id")) }); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	url := pgtest.NewDatabase(t)
	cfg := writeConfig(t, instancesTOML(t)+"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n")
	env := envFrom(map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": secret})
	migrate := func() string {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"migrate", "--from", boltPath, "--config", cfg}, env, &out, &errOut); err != nil {
			t.Fatalf("migrate: %v\n%s%s", err, out.String(), errOut.String())
		}
		return out.String()
	}
	first := migrate()
	for kind, want := range map[string]string{"users": "2 copied of 2", "keys": "2 copied of 2", "invites": "1 copied of 1",
		"usage rows": "3 copied of 3", "ledger days": "1 copied of 1", "quotas": "1 copied of 1", "brake": "1 copied of 1"} {
		if !regexp.MustCompile(`(?m)^` + kind + ` +` + want + `$`).MatchString(first) {
			t.Errorf("first run: no %q line %q in\n%s", kind, want, first)
		}
	}
	if second := migrate(); regexp.MustCompile(`[1-9]\d* copied`).MatchString(second) || !strings.Contains(second, "0 copied of 3") {
		t.Errorf("second run copied again:\n%s", second)
	}
	checkMigrated(t, url, now)
}

// instancesTOML is the config block docs/INSTANCES.md tells every
// instance to carry, as written.
func instancesTOML(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("docs/INSTANCES.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```toml\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed || !strings.Contains(block, `backend = "postgres"`) {
		t.Fatalf("docs/INSTANCES.md has no toml block setting the postgres backend")
	}
	return block
}

// checkMigrated reads the PostgreSQL database back through the backend.
func checkMigrated(t *testing.T, url string, now time.Time) {
	t.Helper()
	db, err := postgres.Open(context.Background(), url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	list, err := db.Keys()
	if err != nil || len(list) != 2 {
		t.Fatalf("keys: %v, %v", list, err)
	}
	for _, k := range list {
		if k.Hash != sha256.Sum256([]byte("bw_secret_of_"+k.UserID)) {
			t.Errorf("key %s lost its hash: it would not authenticate", k.ID)
		}
		if revoked := !k.RevokedAt.IsZero(); revoked != (k.UserID == "bob") {
			t.Errorf("key %s revoked = %v", k.ID, revoked)
		}
	}
	money, err := postgres.NewMoney(context.Background(), db, postgres.MoneyOptions{Location: time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	defer money.Close(context.Background())
	used, err := money.QuotaUsed(context.Background(), budget.MonthKey(now, time.UTC))
	if err != nil || used["alice"] != 3 {
		t.Errorf("alice's quota: %v, %v; want 3 used", used, err)
	}
	day, settled, err := money.LedgerDay(context.Background(), budget.DayKey(now, time.UTC))
	if err != nil || day.Requests != 3 || day.SpendMicroUSD != 2100 || settled != 2100 {
		t.Errorf("ledger day: %+v settled %d (%v); want 3 calls, 2100 µ$ spent and settled", day, settled, err)
	}
	rows, err := db.Usage(now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil || len(rows) != 3 {
		t.Errorf("usage rows: %d (%v), want 3", len(rows), err)
	}
	if on, err := db.Flag(state.BrakeFlag); err != nil || !on {
		t.Errorf("brake: %v, %v; want on", on, err)
	}
}

// boltRead records one more paid read of user's in the bolt database at
// path as its server would (a lease, then a usage row that settles it).
func boltRead(t *testing.T, path, user string, now time.Time) {
	t.Helper()
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, day, month := context.Background(), budget.DayKey(now, time.UTC), budget.MonthKey(now, time.UTC)
	if err := db.Lease(ctx, day, 1, 1000); err != nil {
		t.Fatal(err)
	}
	rec := budget.UsageRecord{Time: now, UserID: user, KeyID: "key_" + user, RequestID: "req-later", Model: "gemini-3.5-flash-lite", CostMicroUSD: 700}
	if err := db.RecordUsage(ctx, month, rec, budget.Settlement{Day: day, ActualMicroUSD: 700, Leased: true, LeasedMicroUSD: 1000}); err != nil {
		t.Fatal(err)
	}
}

// moneyIn is what PostgreSQL counts of today: the ledger day (calls,
// spend, settled), its month's spend, each user's quota count and the
// usage rows.
type moneyIn struct {
	Calls, MicroUSD, Settled, SettledCalls, MonthMicroUSD int64
	Quota                                                 map[string]int64
	Rows                                                  int64
}

func moneyOf(t *testing.T, url string, now time.Time) moneyIn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	day, month := budget.DayKey(now, time.UTC), budget.MonthKey(now, time.UTC)
	var m moneyIn
	err = conn.QueryRow(ctx, `SELECT coalesce(max(calls), 0), coalesce(max(micro_usd), 0), coalesce(max(settled_micro_usd), 0), coalesce(max(settled_calls), 0),
		(SELECT coalesce(max(micro_usd), 0) FROM ledger_months WHERE month = $2), (SELECT count(*) FROM usage_rows WHERE day = $1)
		FROM ledger_days WHERE day = $1`, day, month).Scan(&m.Calls, &m.MicroUSD, &m.Settled, &m.SettledCalls, &m.MonthMicroUSD, &m.Rows)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := conn.Query(ctx, "SELECT user_id, used FROM quota_counts WHERE month = $1", month)
	m.Quota = map[string]int64{}
	var user string
	var used int64
	_, err = pgx.ForEachRow(rows, []any{&user, &used}, func() error { m.Quota[user] = used; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// migrate into a database an instance has already served from on the
// bolt file's day: by default it refuses before copying anything, naming
// the day and the users both count; with --merge it adds the bolt file's
// spend and quota counts to the instance's once, and a rerun adds nothing;
// reads the bolt file served since are added by the next run.
func TestMigrateIntoADatabaseInUse(t *testing.T) {
	dir := t.TempDir()
	now := time.Now().UTC()
	boltPath := filepath.Join(dir, "old.db")
	secret := boltToMigrate(t, boltPath, now) // alice: 3 reads, 2100 µ$
	url := pgtest.NewDatabase(t)
	cfg := writeConfig(t, instancesTOML(t)+"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n[budget]\ntimezone = \"UTC\"\n")
	vars := map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": secret}
	env := envFrom(vars)
	serveReads(t, cfg, vars, map[string]int{"alice": 2, "dave": 1}) // an instance served alice and dave today
	served := moneyOf(t, url, now)
	if served.Calls != 3 || served.MicroUSD == 0 || served.Settled != served.MicroUSD || served.Quota["alice"] != 2 || served.Rows != 3 {
		t.Fatalf("the instance's figures: %+v", served)
	}
	migrate := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"migrate", "--from", boltPath, "--config", cfg}, args...), env, &out, &errOut)
		return out.String() + errOut.String(), err
	}

	out, err := migrate()
	if err == nil {
		t.Fatalf("migrate into a database in use: no refusal\n%s", out)
	}
	day := budget.DayKey(now, time.UTC)
	for _, want := range []string{"the ledger of " + day, "quota counts of alice", "--merge"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "dave") {
		t.Errorf("the refusal names dave, whom the bolt file does not count: %v", err)
	}
	if got := moneyOf(t, url, now); got.Calls != served.Calls || got.Rows != served.Rows || got.Quota["alice"] != 2 {
		t.Errorf("the refused migration wrote: %+v", got)
	}
	var keys int
	if conn, err := pgx.Connect(context.Background(), url); err == nil {
		_ = conn.QueryRow(context.Background(), "SELECT count(*) FROM api_keys").Scan(&keys)
		conn.Close(context.Background())
	}
	if keys != 2 {
		t.Errorf("the refused migration copied keys: %d, want the instance's 2", keys)
	}

	// The bolt file's 3 reads of alice's at 700 µ$, added to the instance's.
	plus := func(m moneyIn, calls, microUSD, alice int64) moneyIn {
		return moneyIn{Calls: m.Calls + calls, MicroUSD: m.MicroUSD + microUSD, Settled: m.Settled + microUSD, SettledCalls: m.SettledCalls + calls,
			MonthMicroUSD: m.MonthMicroUSD + microUSD, Quota: map[string]int64{"alice": m.Quota["alice"] + alice, "dave": m.Quota["dave"]}, Rows: m.Rows + calls}
	}
	want := plus(served, 3, 2100, 3)
	for i, args := range [][]string{{"--merge"}, {"--merge"}, nil} {
		out, err := migrate(args...)
		if err != nil {
			t.Fatalf("run %d %v: %v\n%s", i+1, args, err, out)
		}
		if got := moneyOf(t, url, now); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("after run %d %v PostgreSQL counts\n%+v\nwant\n%+v\n%s", i+1, args, got, want, out)
		}
		if i > 0 && regexp.MustCompile(`[1-9]\d* copied`).MatchString(out) {
			t.Errorf("run %d %v added again:\n%s", i+1, args, out)
		}
	}

	// The bolt file serves one more read of alice's: the next run adds it.
	boltRead(t, boltPath, "alice", sameDay(now, time.Minute))
	if out, err := migrate(); err != nil {
		t.Fatalf("migrate after the bolt file served again: %v\n%s", err, out)
	}
	want = plus(served, 4, 2800, 4)
	if got := moneyOf(t, url, now); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the bolt file served once more PostgreSQL counts\n%+v\nwant\n%+v", got, want)
	}
}

// The copy must see the database at rest: one a server holds is refused,
// and nothing is written.
func TestMigrateRefusesAHeldDatabase(t *testing.T) {
	boltPath := filepath.Join(t.TempDir(), "held.db")
	held, err := storage.Open(boltPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	url := pgtest.NewDatabase(t)
	cfg := writeConfig(t, "[storage]\nbackend = \"postgres\"\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n")
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"migrate", "--from", boltPath, "--config", cfg},
		envFrom(map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": migrateSecret}), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("migrate of a held database: %v, want a refusal that says to stop the server", err)
	}
}

// config check on the postgres backend connects, writing nothing, and
// says the server, the schema and the records; it refuses a missing or
// malformed URL.
func TestConfigCheckOnPostgres(t *testing.T) {
	url := pgtest.NewDatabase(t)
	cfg := writeConfig(t, instancesTOML(t)+"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n")
	check := func(env map[string]string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"config", "check", "--config", cfg}, envFrom(env), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	secret := map[string]string{"BREAKWATER_SECRET": migrateSecret}
	if out, err := check(secret); err == nil || !strings.Contains(err.Error(), postgres.EnvURL) {
		t.Errorf("without %s: %v\n%s", postgres.EnvURL, err, out)
	}
	if out, err := check(map[string]string{"BREAKWATER_SECRET": migrateSecret, postgres.EnvURL: "postgres://%zz"}); err == nil ||
		!strings.Contains(err.Error(), "not a valid connection string") || strings.Contains(err.Error()+out, "%zz") {
		t.Errorf("a malformed URL: %v\n%s", err, out)
	}
	if out, err := check(map[string]string{"BREAKWATER_SECRET": "short", postgres.EnvURL: url}); err == nil || !strings.Contains(err.Error(), "at least 16 bytes") {
		t.Errorf("a secret serve refuses (5 bytes): %v\n%s", err, out)
	}
	// A role that may connect but not create tables: serve could not make
	// the schema, so config check fails and says what to grant.
	role := fmt.Sprintf("bw_check_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(context.Background(), url) // writes no schema, as Open would
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec(context.Background(), "DROP ROLE "+role) // before the connection closes
	restricted, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	restricted.User = neturl.User(role)
	out, err := check(map[string]string{"BREAKWATER_SECRET": migrateSecret, postgres.EnvURL: restricted.String()})
	if err == nil || !strings.Contains(err.Error(), "CREATE on schema public (to make the schema)") || !strings.Contains(err.Error(), "GRANT CREATE ON SCHEMA public TO "+role) {
		t.Errorf("a role without CREATE: %v\n%s", err, out)
	}
	env := map[string]string{"BREAKWATER_SECRET": migrateSecret, postgres.EnvURL: url}
	out, err = check(env)
	if err != nil {
		t.Fatalf("config check: %v\n%s", err, out)
	}
	for _, want := range []string{"storage: postgres, database ", "(PostgreSQL 1", "storage: no Breakwater tables yet"} {
		if !strings.Contains(out, want) {
			t.Errorf("fresh database: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "older than 14") {
		t.Errorf("a current server reported as too old:\n%s", out)
	}
	db, err := postgres.Open(context.Background(), url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var tables int
	if err := db.Pool().QueryRow(context.Background(), "SELECT count(*) FROM breakwater_schema").Scan(&tables); err != nil || tables == 0 {
		t.Fatalf("the schema after Open: %d, %v", tables, err)
	}
	db.Close()
	out, err = check(env)
	want := fmt.Sprintf("storage: schema %d (current); 0 active keys, 0 users", postgres.LatestSchema())
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("after the migration: %v, want %q in\n%s", err, want, out)
	}
}
