package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/storage"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// The large bolt database the migration is killed in: one key a user.
const (
	bigKeys      = 100_000
	bigUsageRows = 24_000
	bigDays      = 80 // ledger days, ending yesterday: three or four months
	bigInvites   = 20
	bigSecret    = "0123456789abcdef0123456789abcdef"
)

// boltTotals are what a bolt database holds of each kind the migration
// copies, as counts and sums; PostgreSQL must hold the same after it.
type boltTotals struct {
	Users, Keys, Invites, Redemptions int64
	UsageRows, UsageMicroUSD          int64
	QuotaUsed                         int64 // every month's counts, summed
	LedgerDays, LedgerCalls           int64
	LedgerMicroUSD                    int64 // the days' spend, which is also the months'
	Brake                             int64
}

// migrate --from, killed with SIGKILL in the middle of a large copy and
// run again, copies everything once and nothing twice. The first kill
// lands while the 100,000 keys are being written (one transaction: none
// of them stays), the second after some of the usage rows' chunks were
// committed (the rest follow, none twice); the third run finishes. Counts
// and sums of every kind then equal the source's.
func TestMigrateKilledMidCopyCopiesOnce(t *testing.T) {
	t.Parallel() // the longest here: the others run beside it
	if testing.Short() {
		t.Skip("builds the binary and a bolt database of 100,000 keys")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	begin := time.Now()
	dir := t.TempDir()
	var bin string
	var buildErr error
	built := make(chan struct{})
	go func() { // the build and the bolt file take seconds each: together
		defer close(built)
		bin, buildErr = harness.Build(ctx, ".", dir)
	}()
	src := filepath.Join(dir, "old.db")
	want := writeLargeBolt(t, src, time.Now().UTC())
	<-built
	t.Logf("built and written after %v", time.Since(begin).Round(time.Millisecond))
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	url := pgtest.NewDatabase(t)
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte("[storage]\nbackend = \"postgres\"\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100000\n[budget]\ntimezone = \"UTC\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &migrateRun{t: t, ctx: ctx, bin: bin, config: config, src: src, url: url}

	// Killed once the users are in, while the keys' transaction runs.
	m.killWhen("during the keys", func(out string) bool { return strings.Contains(out, "\nusers ") || strings.HasPrefix(out, "users ") })
	if n := m.count("api_keys"); n != 0 {
		t.Fatalf("%d keys copied: the kill did not land before the keys' commit (it must, to test anything)", n)
	}
	// Killed after some of the usage rows' chunks were committed.
	m.killWhen("during the usage rows", func(string) bool { return m.count("usage_rows") > 0 })
	if n := m.count("usage_rows"); n == 0 || n >= want.UsageRows {
		t.Fatalf("%d of %d usage rows copied at the kill: it did not land in the middle of the copy", n, want.UsageRows)
	}
	left := want.UsageRows - m.count("usage_rows")
	if third := m.finish(); !strings.Contains(third, fmt.Sprintf("usage rows   %d copied of %d", left, want.UsageRows)) {
		t.Errorf("the run after the kills did not copy the %d usage rows left:\n%s", left, third)
	}
	if got := postgresTotals(t, ctx, url); got != want {
		t.Errorf("PostgreSQL holds\n%+v\nthe bolt database\n%+v", got, want)
	}
}

// migrateRun runs the binary's migrate --from against one database.
type migrateRun struct {
	t                     *testing.T
	ctx                   context.Context
	bin, config, src, url string
}

func (m *migrateRun) command() *exec.Cmd {
	cmd := exec.CommandContext(m.ctx, m.bin, "migrate", "--from", m.src, "--config", m.config)
	cmd.Env = append(os.Environ(), postgres.EnvURL+"="+m.url, "BREAKWATER_SECRET="+bigSecret)
	return cmd
}

// finish runs migrate to its end and returns what it printed.
func (m *migrateRun) finish() string {
	m.t.Helper()
	start := time.Now()
	defer func() { m.t.Logf("a whole run took %v", time.Since(start).Round(time.Millisecond)) }()
	cmd := m.command()
	pipe, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		m.t.Logf("%v %s", time.Since(start).Round(time.Millisecond), sc.Text())
		out.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		m.t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	return out.String()
}

// killWhen starts migrate, sends it SIGKILL as soon as ready says so
// (polled every few milliseconds, given what it printed so far), and
// waits until PostgreSQL has ended its sessions, so that what stays is
// what was committed.
func (m *migrateRun) killWhen(what string, ready func(out string) bool) {
	m.t.Helper()
	var out lockedBuffer
	cmd := m.command()
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for !ready(out.String()) {
		select {
		case err := <-done:
			m.t.Fatalf("migrate ended before the kill %s: %v\n%s", what, err, out.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	err := <-done
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		m.t.Fatalf("migrate was not killed %s: %v\n%s", what, err, out.String())
	}
	m.t.Logf("killed %s, %v after the start, having printed:\n%s", what, time.Since(start).Round(time.Millisecond), out.String())
	m.waitSessionsGone()
}

// waitSessionsGone waits until no session of the killed process is left:
// PostgreSQL rolls back what it had not committed when it sees the
// connection closed.
func (m *migrateRun) waitSessionsGone() {
	m.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		err := m.query(func(c *pgx.Conn) error {
			return c.QueryRow(m.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
		})
		if err != nil {
			m.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%d sessions of the killed migrate still open after 30 s", n)
		}
	}
}

// count is how many rows table holds (0 before the schema is made).
func (m *migrateRun) count(table string) int64 {
	m.t.Helper()
	var n int64
	err := m.query(func(c *pgx.Conn) error {
		var exists bool
		if err := c.QueryRow(m.ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			return err
		}
		return c.QueryRow(m.ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n)
	})
	if err != nil {
		m.t.Fatal(err)
	}
	return n
}

func (m *migrateRun) query(f func(*pgx.Conn) error) error {
	c, err := pgx.Connect(m.ctx, m.url)
	if err != nil {
		return err
	}
	defer c.Close(m.ctx)
	return f(c)
}

// postgresTotals reads the counts and sums of what was copied.
func postgresTotals(t *testing.T, ctx context.Context, url string) boltTotals {
	t.Helper()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var got boltTotals
	var monthMicroUSD int64
	err = c.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM users), (SELECT count(*) FROM api_keys), (SELECT count(*) FROM invites),
		(SELECT count(*) FROM invite_redemptions),
		(SELECT count(*) FROM usage_rows), (SELECT coalesce(sum(micro_usd), 0) FROM usage_rows),
		(SELECT coalesce(sum(used), 0) FROM quota_counts),
		(SELECT count(*) FROM ledger_days), (SELECT coalesce(sum(settled_calls), 0) FROM ledger_days),
		(SELECT coalesce(sum(settled_micro_usd), 0) FROM ledger_days),
		(SELECT coalesce(sum(micro_usd), 0) FROM ledger_months),
		(SELECT count(*) FROM flags WHERE name = $1 AND value = '1')`, state.BrakeFlag).Scan(
		&got.Users, &got.Keys, &got.Invites, &got.Redemptions, &got.UsageRows, &got.UsageMicroUSD, &got.QuotaUsed,
		&got.LedgerDays, &got.LedgerCalls, &got.LedgerMicroUSD, &monthMicroUSD, &got.Brake)
	if err != nil {
		t.Fatal(err)
	}
	if monthMicroUSD != got.LedgerMicroUSD {
		t.Errorf("the ledger's months hold %d µ$, its days %d", monthMicroUSD, got.LedgerMicroUSD)
	}
	return got
}

// writeLargeBolt writes a bolt database as a busy server leaves it:
// bigKeys users with a key each, invites with redemptions, bigUsageRows
// paid reads spread over bigDays ledger days (each read's quota counted in
// its month), and the brake on. It returns what it holds.
func writeLargeBolt(t *testing.T, path string, now time.Time) boltTotals {
	t.Helper()
	start := time.Now()
	db, err := storage.Open(path, storage.Options{NoSync: true}) // a throwaway file
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	created := now.AddDate(0, 0, -bigDays-1)
	list, users := make([]keys.Key, bigKeys), make([]keys.User, bigKeys)
	for i := range bigKeys {
		user := fmt.Sprintf("user%06d", i)
		list[i] = keys.Key{ID: "key_" + user, Hash: sha256.Sum256([]byte("bw_" + user)), UserID: user, CreatedAt: created}
		users[i] = keys.User{ID: user, Plan: "free", CreatedAt: created}
	}
	for i := 0; i < bigKeys; i += 10_000 { // bbolt's nodes split at commit: a transaction of 100,000 puts is quadratic
		if err := db.CreateKeys(list[i:i+10_000], users[i:i+10_000]); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("keys written in %v", time.Since(start).Round(time.Millisecond))
	want := boltTotals{Users: bigKeys, Keys: bigKeys, Invites: bigInvites, Brake: 1}
	want.Redemptions = writeInvites(t, db, created)
	writeReads(t, db, now, &want)
	if err := db.SetFlag(state.BrakeFlag, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("bolt database of %d keys and %d usage rows written in %v", bigKeys, bigUsageRows, time.Since(start).Round(time.Millisecond))
	return want
}

// writeInvites writes bigInvites invites, keyed with bigSecret, the i-th
// redeemed by i e-mails; it returns the redemptions.
func writeInvites(t *testing.T, db *storage.DB, at time.Time) (redeemed int64) {
	t.Helper()
	key, err := invites.NewKey([]byte(bigSecret))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RekeyInvites(key.Mark(), key.Rekey); err != nil {
		t.Fatal(err)
	}
	for i := range bigInvites {
		inv := invites.Invite{ID: fmt.Sprintf("inv_%02d", i), Hash: key.Rekey(sha256.Sum256([]byte(fmt.Sprint("CODE-", i)))), MaxUses: 100, CreatedAt: at}
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
		for j := range i {
			if _, err := db.RedeemInvite(context.Background(), inv.Hash, fmt.Sprintf("u%d@example.com", j), at.Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			redeemed++
		}
	}
	return redeemed
}

// writeReads records bigUsageRows paid reads over the bigDays days before
// now's: each day's calls leased, then each read settled at its cost.
// Several writers at once, so that the group commit takes them in
// batches.
func writeReads(t *testing.T, db *storage.DB, now time.Time, want *boltTotals) {
	t.Helper()
	ctx := context.Background()
	perDay := bigUsageRows / bigDays
	var wg sync.WaitGroup
	errs := make(chan error, bigDays)
	for d := range bigDays {
		dayStart := now.AddDate(0, 0, d-bigDays).Truncate(24 * time.Hour)
		day, month := budget.DayKey(dayStart, time.UTC), budget.MonthKey(dayStart, time.UTC)
		if err := db.Lease(ctx, day, int64(perDay), int64(perDay)*1000); err != nil {
			t.Fatal(err)
		}
		want.LedgerDays++
		want.LedgerCalls += int64(perDay)
		for i := range perDay {
			cost := int64(100 + (d*perDay+i)%900)
			want.UsageRows++
			want.UsageMicroUSD += cost
			want.QuotaUsed++
			want.LedgerMicroUSD += cost
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perDay {
				cost := int64(100 + (d*perDay+i)%900)
				rec := budget.UsageRecord{Time: dayStart.Add(time.Duration(i) * time.Second), UserID: fmt.Sprintf("user%06d", (d*perDay+i)%bigKeys),
					RequestID: fmt.Sprintf("req-%d-%d", d, i), Model: "gemini-3.5-flash-lite", CostMicroUSD: cost}
				rec.KeyID = "key_" + rec.UserID
				s := budget.Settlement{Day: day, ActualMicroUSD: cost, Leased: true, LeasedMicroUSD: 1000}
				if err := db.RecordUsage(ctx, month, rec, s); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// lockedBuffer collects a running command's output for polling.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
