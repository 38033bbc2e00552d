// Package pooler holds the tests of real breakwater binaries behind a real
// PgBouncer (pgtest.NewBouncer): in session mode two instances keep the
// money path and the shared limits as they do on a direct connection (a
// daily ceiling raced by many clients, a user's rate, an operator's change
// reaching the other instance through LISTEN/NOTIFY); in transaction and
// statement mode both `serve` and `config check` refuse to start, naming
// the fix. A fake Gemini counts every upstream call.
package pooler

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// bin is the breakwater binary, built once for the package.
var bin string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var done func()
	var err error
	if bin, done, err = harness.BuildForMain("pooler"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer done()
	return pgtest.Main(m)
}

const (
	adminToken = "pooler-test-admin-token-0123456789abcdef"
	secret     = "pooler-test-server-secret-0123456789"
	plan       = "pooled"
)

// poolSize is the PgBouncer's server connections for the test's database:
// in session mode each client holds one for as long as it is connected,
// and an instance connects up to 17 (its pool of 16 and its listener).
const poolSize = 2*17 + 6

// setup is a database behind a PgBouncer, a config for it, a fake Gemini
// and the test's users' keys.
type setup struct {
	t       *testing.T
	direct  string // the database's own URL, for reading the books
	bouncer *pgtest.Bouncer
	dir     string
	config  string
	env     []string
	gemini  *harness.Gemini
	keys    []harness.Key
	procs   []*harness.Process
}

// newSetup puts a fresh database behind a PgBouncer in mode and writes cfg
// for it, with [limits.user] replaced by userLimits when not empty; it
// makes users keys with the CLI when the mode lets it.
func newSetup(t *testing.T, mode string, cfg harness.Config, userLimits string, users int) *setup {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := &setup{t: t, direct: pgtest.NewDatabase(t), dir: t.TempDir()}
	s.bouncer = pgtest.NewBouncer(t, s.direct, pgtest.BouncerOptions{Mode: mode, PoolSize: poolSize})
	root, _ := os.Getwd()
	g, err := harness.NewGemini(root, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	s.gemini = g
	s.config = filepath.Join(s.dir, "config.toml")
	s.env = []string{
		"BREAKWATER_POSTGRES_URL=" + s.bouncer.URL(),
		"BREAKWATER_SECRET=" + secret,
		"BREAKWATER_ADMIN_TOKEN=" + adminToken,
		"GEMINI_API_KEY=test-key",
	}
	cfg.Backend, cfg.GeminiURL, cfg.Plan = "postgres", g.URL, plan
	cfg.DBPath = filepath.Join(s.dir, "unused.db")
	if err := harness.WriteConfig(s.config, cfg); err != nil {
		t.Fatal(err)
	}
	if userLimits != "" {
		body, err := os.ReadFile(s.config)
		if err != nil {
			t.Fatal(err)
		}
		const shipped = "[limits.user]\nrate = 100000\nwindow = \"1m\"\nburst = 100000\n"
		if !strings.Contains(string(body), shipped) {
			t.Fatalf("the harness's config changed: edit this test's\n%s", body)
		}
		if err := os.WriteFile(s.config, []byte(strings.Replace(string(body), shipped, userLimits, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range users {
		k, err := harness.NewKey(ctx, bin, s.config, fmt.Sprintf("user%d", i), plan, s.env...)
		if err != nil {
			t.Fatalf("%v\n%s", err, s.bouncer.Log())
		}
		s.keys = append(s.keys, k)
	}
	return s
}

// startPair starts two instances at once and stops them when t ends.
func (s *setup) startPair() {
	s.t.Helper()
	s.procs = make([]*harness.Process, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			s.procs[i], errs[i] = harness.Start(bin, s.config, filepath.Join(s.dir, fmt.Sprintf("instance%d.log", i)), s.env...)
		})
	}
	wg.Wait()
	s.t.Cleanup(s.stopAll)
	for _, err := range errs {
		if err != nil {
			s.t.Fatalf("%v\nPgBouncer:\n%s", err, s.bouncer.Log())
		}
	}
}

// stopAll stops the instances cleanly (a clean stop gives the lease back).
func (s *setup) stopAll() { harness.StopAll(10*time.Second, s.procs...) }

// logs is the tail of each instance's log, for a failure message.
func (s *setup) logs() string {
	return harness.Logs(func(i int) string { return fmt.Sprintf("instance %d", i) }, s.procs...)
}

// imageSeq makes every image of the package's tests a distinct one.
var imageSeq atomic.Uint64

// send posts a fresh image for user to instance i.
func (s *setup) send(ctx context.Context, client *http.Client, i, user int) harness.Answer {
	return harness.PostHeader(ctx, client, s.procs[i].Addr, s.keys[user].Secret, harness.NthPNG(imageSeq.Add(1)), nil)
}

// books is what the database holds of the money path today: the ledger's
// calls, and the usage rows by request id.
type books struct {
	calls int64
	rows  map[string]int
}

// readBooks reads the books directly, not through the pooler.
func (s *setup) readBooks() books {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.direct)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close(ctx)
	b := books{rows: map[string]int{}}
	err = conn.QueryRow(ctx, "SELECT calls FROM ledger_days WHERE day = $1", time.Now().UTC().Format("2006-01-02")).Scan(&b.calls)
	if err != nil && err != pgx.ErrNoRows {
		s.t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "SELECT request_id FROM usage_rows")
	if err != nil {
		s.t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			s.t.Fatal(err)
		}
		b.rows[id]++
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	return b
}

// TestCeilingBehindPgBouncer: 300 requests at once over two instances
// behind PgBouncer in session mode, 10 users, daily_requests = 30: the fake
// Gemini's calls ≤ the ledger's ≤ 30, nearly all of it used, and every 200
// has exactly one usage row (the same check as on a direct connection,
// test/multi's TestDailyRequestsAcrossInstances).
func TestCeilingBehindPgBouncer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ceiling = 30
	s := newSetup(t, "session", harness.Config{DailyRequests: ceiling}, "", 10)
	s.startPair()
	client := &http.Client{Timeout: 30 * time.Second}
	answers := make([]harness.Answer, 300)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range answers {
		wg.Go(func() {
			<-start
			answers[k] = s.send(ctx, client, k%2, k%len(s.keys))
		})
	}
	close(start)
	wg.Wait()
	s.stopAll()
	_, upstream := s.gemini.Calls()
	b := s.readBooks()
	tally := map[string]int{}
	var oks []harness.Answer
	for _, a := range answers {
		tally[fmt.Sprintf("%d %s", a.Status, a.Code)]++
		if a.Status == http.StatusOK {
			oks = append(oks, a)
		}
	}
	t.Logf("300 requests over 2 instances behind PgBouncer: %v; %d upstream calls, the ledger counts %d", tally, upstream, b.calls)
	if upstream > ceiling || b.calls > ceiling {
		t.Errorf("%d upstream calls, %d in the ledger; the ceiling is %d", upstream, b.calls, ceiling)
	}
	if b.calls < upstream {
		t.Errorf("the ledger counts %d calls, the fake received %d: a call was not counted", b.calls, upstream)
	}
	if len(oks) < 25 {
		t.Errorf("%d successes, want at least 25 of the %d the ceiling allows\n%s", len(oks), ceiling, s.logs())
	}
	for _, a := range oks {
		if a.RequestID == "" || b.rows[a.RequestID] != 1 {
			t.Errorf("a 200 (request %q) has %d usage rows, want 1", a.RequestID, b.rows[a.RequestID])
		}
	}
	if int64(len(b.rows)) > upstream {
		t.Errorf("%d usage rows for %d upstream calls", len(b.rows), upstream)
	}
}

// TestRateAndChangesBehindPgBouncer: behind PgBouncer in session mode a
// user's rate (5 a minute) holds for the service: 12 requests alternating
// between the instances, exactly 5 pass, the rest 429; and a key revoked
// through A's admin API is refused by B within a second (the change
// travels by LISTEN/NOTIFY, which needs whole sessions).
func TestRateAndChangesBehindPgBouncer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := newSetup(t, "session", harness.Config{DailyRequests: 1000}, "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n", 2)
	s.startPair()
	client := &http.Client{Timeout: 30 * time.Second}
	passed := 0
	for k := range 12 {
		a := s.send(ctx, client, k%2, 0)
		switch a.Status {
		case http.StatusOK:
			passed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d on instance %d: %d %s, want 200 or 429\n%s", k, k%2, a.Status, a.Code, s.logs())
		}
	}
	if passed != 5 {
		t.Errorf("12 requests alternating between the instances, rate 5 a minute: %d passed, want exactly 5", passed)
	}

	if a := s.send(ctx, client, 1, 1); a.Status != http.StatusOK {
		t.Fatalf("user1 on instance 1 before the revocation: %d %s\n%s", a.Status, a.Code, s.logs())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.procs[0].AdminAddr()+"/api/keys/"+s.keys[1].ID+"/revoke", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("revoke through instance 0: %d", resp.StatusCode)
	}
	changed := time.Now()
	for {
		a := s.send(ctx, client, 1, 1)
		if a.Status == http.StatusUnauthorized {
			break
		}
		if time.Since(changed) > time.Second {
			t.Fatalf("instance 1 still answers %d %s a second after the key was revoked through instance 0\n%s", a.Status, a.Code, s.logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("key revoked through instance 0: refused by instance 1 after %v", time.Since(changed).Round(time.Millisecond))
}

// TestTransactionPoolerRefused: behind PgBouncer in transaction or
// statement mode both `config check` and `serve` exit with an error that
// names the pooler's mode and the fix (its session port), and serve
// listens on nothing; the same commands pass in session mode.
func TestTransactionPoolerRefused(t *testing.T) {
	for _, mode := range []string{"transaction", "statement", "session"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s := newSetup(t, mode, harness.Config{DailyRequests: 1000}, "", 0)
			check, checkErr := harness.Command(ctx, bin, s.config, s.env, "config", "check")
			proc, serveErr := harness.Start(bin, s.config, filepath.Join(s.dir, "serve.log"), s.env...)
			if proc != nil {
				proc.Stop(10 * time.Second)
			}
			if mode == "session" {
				if checkErr != nil || serveErr != nil {
					t.Fatalf("session mode: config check %v, serve %v\nPgBouncer:\n%s", checkErr, serveErr, s.bouncer.Log())
				}
				return
			}
			if checkErr == nil || serveErr == nil {
				t.Fatalf("%s mode: config check %v, serve %v; want both to refuse", mode, checkErr, serveErr)
			}
			for what, out := range map[string]string{"config check": string(check), "serve": harness.Tail(filepath.Join(s.dir, "serve.log"))} {
				for _, want := range []string{"pooler in transaction (or statement) mode", "use the pooler's session mode", "port 5432 rather than 6543"} {
					if !strings.Contains(out, want) {
						t.Errorf("%s in %s mode says:\n%s\nwant it to say %q", what, mode, out, want)
					}
				}
			}
		})
	}
}
