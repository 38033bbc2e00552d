// Package multi holds the tests of two real breakwater binaries on one
// PostgreSQL database: the money path (the global budget's ceilings, plan
// quotas, the daily line, usage records) must hold across instances as it
// does inside one, through a kill -9 of an instance and a stop of the
// database, and an operator's change made through one instance must reach
// the other within a second. A fake Gemini counts every upstream call.
package multi

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

// TestMain builds the binary from the module's root and runs the tests,
// stopping the PostgreSQL cluster pgtest started, if any.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var done func()
	var err error
	if bin, done, err = harness.BuildForMain("multi"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer done()
	return pgtest.Main(m)
}

// Each test has its own database (a cluster, where it stops one), fake
// Gemini and instances, so most run two at a time (t.Parallel; go test's
// default of GOMAXPROCS at once). The tests of the shared defense limits
// (limits_test.go) and the soak's floods run alone, before the others: a
// limit the database does not decide within postgres.LimitTimeout
// (300 ms) is decided in memory, as it should be, and would no longer be
// exact, as they check, on a machine loaded by another test.
const parallelNote = 0

const (
	adminToken = "multi-test-admin-token-0123456789abcdef"
	secret     = "multi-test-server-secret-0123456789"
	plan       = "multi"
)

// pair is two breakwater instances (or more, newGroup) serving from one
// database, with the fake Gemini they share and the keys of the test's
// users.
type pair struct {
	t      *testing.T
	dbURL  string
	config string
	dir    string
	env    []string
	gemini *harness.Gemini
	keys   []harness.Key

	mu    sync.Mutex
	procs []*harness.Process
	runs  int // processes started, for log names
}

// newPair writes cfg (on postgres at dbURL), creates users API keys with
// the CLI (none: the database stays untouched) and starts two instances
// at once.
func newPair(t *testing.T, dbURL string, cfg harness.Config, users int, latency time.Duration) *pair {
	t.Helper()
	return newPairEdited(t, dbURL, cfg, users, latency, nil)
}

// newPairEdited is newPair with the config file's text passed through
// edit (nil: none) before the keys are made and the instances start, and
// env added to the instances' environment.
func newPairEdited(t *testing.T, dbURL string, cfg harness.Config, users int, latency time.Duration, edit func(config string) string,
	env ...string) *pair {
	t.Helper()
	return newGroup(t, dbURL, cfg, users, latency, 2, edit, env...)
}

// newGroup is newPairEdited with n instances.
func newGroup(t *testing.T, dbURL string, cfg harness.Config, users int, latency time.Duration, n int, edit func(config string) string,
	env ...string) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, _ := os.Getwd()
	g, err := harness.NewGemini(root, latency)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	p := &pair{t: t, dbURL: dbURL, dir: t.TempDir(), gemini: g, procs: make([]*harness.Process, n)}
	p.config = filepath.Join(p.dir, "config.toml")
	p.env = []string{
		"BREAKWATER_POSTGRES_URL=" + dbURL,
		"BREAKWATER_SECRET=" + secret,
		"BREAKWATER_ADMIN_TOKEN=" + adminToken,
		"GEMINI_API_KEY=test-key",
	}
	p.env = append(p.env, env...)
	cfg.Backend, cfg.GeminiURL, cfg.Plan = "postgres", g.URL, plan
	cfg.DBPath = filepath.Join(p.dir, "unused.db")
	if err := harness.WriteConfig(p.config, cfg); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		body, err := os.ReadFile(p.config)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.config, []byte(edit(string(body))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range users {
		k, err := harness.NewKey(ctx, bin, p.config, fmt.Sprintf("user%d", i), plan, p.env...)
		if err != nil {
			t.Fatal(err)
		}
		p.keys = append(p.keys, k)
	}
	t.Cleanup(p.stopAll)
	// All at once: on a database no command has touched yet, they race
	// to migrate its schema.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = p.startErr(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// start starts instance i (again).
func (p *pair) start(i int) {
	p.t.Helper()
	if err := p.startErr(i); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pair) startErr(i int) error {
	p.mu.Lock()
	p.runs++
	log := filepath.Join(p.dir, fmt.Sprintf("instance%d-run%d.log", i, p.runs))
	p.mu.Unlock()
	proc, err := harness.Start(bin, p.config, log, p.env...)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.procs[i] = proc
	p.mu.Unlock()
	return nil
}

// proc is instance i's current process.
func (p *pair) proc(i int) *harness.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.procs[i]
}

// stopAll stops every instance cleanly (a clean stop gives its lease back).
func (p *pair) stopAll() {
	var wg sync.WaitGroup
	for i := range p.procs {
		if proc := p.proc(i); proc != nil {
			wg.Go(func() { proc.Stop(10 * time.Second) })
		}
	}
	wg.Wait()
}

// logs returns the tail of every instance's log, for a failure message.
func (p *pair) logs() string {
	var b strings.Builder
	for i := range p.procs {
		if proc := p.proc(i); proc != nil {
			fmt.Fprintf(&b, "--- instance %d:\n%s\n", i, harness.Tail(proc.LogPath))
		}
	}
	return b.String()
}

// imageSeq makes every image of the package's tests a distinct one.
var imageSeq atomic.Uint64

// result is one request a client sent.
type result struct {
	instance int
	user     int
	sent     time.Time
	answered time.Time
	answer   harness.Answer
}

// send posts a fresh image for user to instance i.
func (p *pair) send(ctx context.Context, client *http.Client, i, user int, h http.Header) result {
	r := result{instance: i, user: user, sent: time.Now()}
	proc := p.proc(i)
	r.answer = harness.PostHeader(ctx, client, proc.Addr, p.keys[user].Secret, harness.NthPNG(imageSeq.Add(1)), h)
	r.answered = time.Now()
	return r
}

// burstClient is the client of a burst of n clients: each keeps its
// connection between its requests, as a real client does, so that the
// burst spends the test's CPU on requests rather than on new connections
// (the default transport keeps 2 a host and closes the rest: a burst of
// retrying clients, a new connection for nearly every request, starved
// the fake Gemini in the same process of CPU for seconds under -race).
func burstClient(n int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: n, MaxIdleConnsPerHost: n}}
}

// burst sends n requests at once, request k to instance k%instances for
// user k%users, and returns what each got.
func (p *pair) burst(ctx context.Context, n int) []result {
	client := burstClient(n)
	defer client.CloseIdleConnections()
	out := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			<-start
			out[k] = p.send(ctx, client, k%len(p.procs), k%len(p.keys), nil)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// tally counts the answers by "status code".
func tally(rs []result) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		a := r.answer
		key := fmt.Sprintf("%d %s", a.Status, a.Code)
		if a.Status == 0 {
			key = "no answer"
		}
		m[key]++
	}
	return m
}

// ok returns the 200s among rs.
func ok(rs []result) []result {
	var out []result
	for _, r := range rs {
		if r.answer.Status == http.StatusOK {
			out = append(out, r)
		}
	}
	return out
}

// ledger is the day's row of the shared budget ledger.
type ledger struct {
	calls, microUSD, settled int64
}

// books is what the shared database holds of the money path.
type books struct {
	ledger    ledger
	rows      map[string]int // usage rows by request id
	rowMicro  int64          // the usage rows' micro-dollars, summed
	rowCount  int64
	quotaUsed int64 // quota_counts, summed over users, this month
}

// readBooks reads the ledger, the usage rows and the quota counts.
func readBooks(t *testing.T, dbURL string) books {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	now := time.Now().UTC()
	b := books{rows: map[string]int{}}
	err = conn.QueryRow(ctx, "SELECT calls, micro_usd, settled_micro_usd FROM ledger_days WHERE day = $1",
		now.Format("2006-01-02")).Scan(&b.ledger.calls, &b.ledger.microUSD, &b.ledger.settled)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "SELECT request_id, micro_usd FROM usage_rows")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var micro int64
		if err := rows.Scan(&id, &micro); err != nil {
			t.Fatal(err)
		}
		b.rows[id]++
		b.rowMicro += micro
		b.rowCount++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	err = conn.QueryRow(ctx, "SELECT coalesce(sum(used), 0) FROM quota_counts WHERE month = $1", now.Format("2006-01")).Scan(&b.quotaUsed)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkRows fails t for every 200 in rs without exactly one usage row, and
// for a ledger that counts fewer calls than reached the fake.
func checkRows(t *testing.T, b books, rs []result, upstream int64) {
	t.Helper()
	missing := 0
	for _, r := range ok(rs) {
		if r.answer.RequestID == "" || b.rows[r.answer.RequestID] != 1 {
			missing++
			if missing <= 5 {
				t.Errorf("a 200 (request %q, instance %d) has %d usage rows, want 1", r.answer.RequestID, r.instance, b.rows[r.answer.RequestID])
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d 200s without their usage row", missing, len(ok(rs)))
	}
	if b.rowCount > upstream {
		t.Errorf("%d usage rows for %d upstream calls", b.rowCount, upstream)
	}
	if b.ledger.calls < upstream {
		t.Errorf("the ledger counts %d calls, the fake received %d: a call was not counted", b.ledger.calls, upstream)
	}
}
