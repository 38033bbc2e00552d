package netcut

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	var done func()
	var err error
	if bin, done, err = harness.BuildForMain("netcut"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer done()
	sweepNamespaces(os.Stderr)
	flag.Parse()
	// The two cuts and the latency test at once, each on a rig of its
	// own: the long cut is 40 s of waiting.
	pgtest.Parallel(3)
	return pgtest.Main(m)
}

const (
	secret = "netcut-test-server-secret-0123456789"
	dbName = "bw_netcut"
)

// The instances of a rig: host runs beside the database, cut in the
// namespace.
const (
	host = 0
	cut  = 1
)

var instanceName = [2]string{"host", "cut"}

// rig is two breakwater instances on one database of a cluster of the
// test's own: instance host on the host, reaching the database over
// loopback, instance cut in a network namespace, reaching it over a veth
// as a second machine would. Each has a fake Gemini of its own, so the
// upstream calls are counted per instance.
type rig struct {
	t       *testing.T
	ns      *netns
	cluster *pgtest.Cluster
	dbURL   string // from the host
	dir     string
	config  string
	fakes   [2]*harness.Gemini
	env     [2][]string
	exe     [2]string
	procs   [2]*harness.Process
	keys    map[string][]harness.Key // by plan
}

// rigOptions shape a rig.
type rigOptions struct {
	latency [2]time.Duration // each fake Gemini's answer time
	cfg     harness.Config   // Plan names the plan written by WriteConfig
	plans   string           // more [plans.NAME] sections, appended to the config
	users   map[string]int   // keys to make, by plan
	// dbURL, when set, is what the cut instance is given as the
	// database's URL instead of the database over the veth (a relay).
	dbURL func(r *rig) string
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := newNetns(t)
	cluster := pgtest.NewClusterWith(t, pgtest.Options{
		Listen: "127.0.0.1," + ns.HostIP,
		Init: func(data string) error {
			f, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(f, "host all all %s trust\n", ns.Subnet)
			return cmpErr(err, f.Close())
		},
	})
	r := &rig{t: t, ns: ns, cluster: cluster, dir: t.TempDir(), keys: map[string][]harness.Key{}}
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+dbName)
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.dbURL = cluster.URL(dbName)
	root, _ := os.Getwd()
	if r.fakes[host], err = harness.NewGemini(root, o.latency[host]); err != nil {
		t.Fatal(err)
	}
	if r.fakes[cut], err = harness.NewGeminiAt(root, ns.HostIP+":0", o.latency[cut]); err != nil {
		t.Fatal(err)
	}
	for _, g := range r.fakes {
		t.Cleanup(func() { _ = g.Close() })
	}
	cfg := o.cfg
	cfg.Backend, cfg.GeminiURL = "postgres", r.fakes[host].URL
	cfg.DBPath = filepath.Join(r.dir, "unused.db")
	r.config = filepath.Join(r.dir, "config.toml")
	if err := harness.WriteConfig(r.config, cfg); err != nil {
		t.Fatal(err)
	}
	if o.plans != "" {
		body, err := os.ReadFile(r.config)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(r.config, append(body, "\n"+o.plans...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"BREAKWATER_SECRET=" + secret, "GEMINI_API_KEY=test-key"}
	r.env[host] = append(slices.Clone(common), "BREAKWATER_POSTGRES_URL="+r.dbURL)
	cutURL := fmt.Sprintf("postgres://postgres@%s:%d/%s?sslmode=disable", ns.HostIP, cluster.Port(), dbName)
	if o.dbURL != nil {
		cutURL = o.dbURL(r)
	}
	r.env[cut] = append(slices.Clone(common), "BREAKWATER_POSTGRES_URL="+cutURL,
		"BREAKWATER_OCR__BASE_URL="+r.fakes[cut].URL,
		"BREAKWATER_SERVER__LISTEN="+ns.NSIP+":0")
	r.exe[host], r.exe[cut] = bin, ns.Wrap(r.dir, bin)
	plans := make([]string, 0, len(o.users))
	for plan := range o.users {
		plans = append(plans, plan)
	}
	slices.Sort(plans)
	for _, plan := range plans {
		for i := range o.users[plan] {
			k, err := harness.NewKey(ctx, bin, r.config, fmt.Sprintf("%s%d", plan, i), plan, r.env[host]...)
			if err != nil {
				t.Fatal(err)
			}
			r.keys[plan] = append(r.keys[plan], k)
		}
	}
	t.Cleanup(r.stop)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			r.procs[i], errs[i] = harness.Start(r.exe[i], r.config, filepath.Join(r.dir, instanceName[i]+".log"), r.env[i]...)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(r.procs[cut].Addr, ns.NSIP+":") {
		t.Fatalf("the cut instance listens on %s, not on the namespace's %s", r.procs[cut].Addr, ns.NSIP)
	}
	return r
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// stop stops both instances cleanly (a clean stop gives back the leases
// and quota holds).
func (r *rig) stop() { harness.StopAll(15*time.Second, r.procs[:]...) }

// logs is the tail of both instances' logs, for a failure message.
func (r *rig) logs() string {
	return harness.Logs(func(i int) string { return instanceName[i] + " instance" }, r.procs[:]...)
}

// upstream is the calls instance i's fake Gemini received.
func (r *rig) upstream(i int) int64 {
	_, n := r.fakes[i].Calls()
	return n
}

// imageSeq makes every image a distinct one.
var imageSeq atomic.Uint64

// result is one request a client sent.
type result struct {
	instance int
	plan     string
	user     int
	sent     time.Time
	answered time.Time
	answer   harness.Answer
}

func (r result) took() time.Duration { return r.answered.Sub(r.sent) }

// target says where a load's request k goes and for whom.
type target func(k int) (instance int, plan string, user int)

// load is clients sending fresh images, each request recorded, until
// halted. Halting stops new requests and waits for those in flight: a
// request is never abandoned by its client, which would change what the
// server does with it.
type load struct {
	halted atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	rs     []result
}

func (r *rig) load(ctx context.Context, workers int, to target) *load {
	l := &load{}
	client := &http.Client{Timeout: 30 * time.Second}
	for w := range workers {
		l.wg.Go(func() {
			for k := w; !l.halted.Load() && ctx.Err() == nil; k += workers {
				i, plan, user := to(k)
				res := result{instance: i, plan: plan, user: user, sent: time.Now()}
				res.answer = harness.Post(ctx, client, r.procs[i].Addr, r.keys[plan][user].Secret, harness.NthPNG(imageSeq.Add(1)))
				res.answered = time.Now()
				l.mu.Lock()
				l.rs = append(l.rs, res)
				l.mu.Unlock()
				if res.answer.Status != http.StatusOK {
					time.Sleep(5 * time.Millisecond) // a refused client does not spin
				}
			}
		})
	}
	return l
}

// halt stops the load and returns every request's result.
func (l *load) halt() []result {
	l.halted.Store(true)
	l.wg.Wait()
	return l.results()
}

func (l *load) results() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.rs)
}

// tally counts answers by "status code".
func tally(rs []result) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		key := fmt.Sprintf("%d %s", r.answer.Status, r.answer.Code)
		if r.answer.Status == 0 {
			key = "no answer"
		}
		m[key]++
	}
	return m
}

// where keeps the results for which keep holds.
func where(rs []result, keep func(result) bool) []result {
	var out []result
	for _, r := range rs {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

func isOK(r result) bool { return r.answer.Status == http.StatusOK }

// waitFor waits (at most limit) until cond holds, checking every 10 ms.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// books is what the database holds of the money path, read once both
// instances have stopped.
type books struct {
	calls    int64            // the ledger's calls today
	rows     map[string]int   // usage rows by request id
	rowCount int64            // usage rows
	byUser   map[string]int64 // usage rows by user
	used     map[string]int64 // quota_counts this month, by user
	attempts map[string]int64 // attempt_counts today, by user
	holds    int64            // quota holds left, summed
}

func (r *rig) books() books {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.dbURL)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(ctx)
	now := time.Now().UTC()
	day, month := now.Format("2006-01-02"), now.Format("2006-01")
	b := books{rows: map[string]int{}, byUser: map[string]int64{}, used: map[string]int64{}, attempts: map[string]int64{}}
	err = conn.QueryRow(ctx, "SELECT coalesce(sum(calls), 0) FROM ledger_days WHERE day = $1", day).Scan(&b.calls)
	if err != nil {
		r.t.Fatal(err)
	}
	scan := func(q string, args []any, each func(k string, n int64)) {
		rows, err := conn.Query(ctx, q, args...)
		if err != nil {
			r.t.Fatal(err)
		}
		for rows.Next() {
			var k string
			var n int64
			if err := rows.Scan(&k, &n); err != nil {
				r.t.Fatal(err)
			}
			each(k, n)
		}
		if err := rows.Err(); err != nil {
			r.t.Fatal(err)
		}
	}
	scan("SELECT request_id, 1 FROM usage_rows", nil, func(k string, _ int64) { b.rows[k]++; b.rowCount++ })
	scan("SELECT user_id, count(*) FROM usage_rows WHERE month = $1 GROUP BY user_id", []any{month},
		func(k string, n int64) { b.byUser[k] = n })
	scan("SELECT user_id, used FROM quota_counts WHERE month = $1", []any{month}, func(k string, n int64) { b.used[k] = n })
	scan("SELECT user_id, count FROM attempt_counts WHERE day = $1", []any{day}, func(k string, n int64) { b.attempts[k] = n })
	scan("SELECT 'all', coalesce(sum(n), 0)::bigint FROM quota_holds", nil, func(_ string, n int64) { b.holds = n })
	return b
}

// checkRows fails t for a 200 without exactly one usage row, for more
// usage rows than upstream calls, and for a ledger that counts fewer
// calls than the fakes received.
func (r *rig) checkRows(b books, rs []result) {
	t := r.t
	t.Helper()
	missing := 0
	for _, res := range where(rs, isOK) {
		if res.answer.RequestID == "" || b.rows[res.answer.RequestID] != 1 {
			missing++
			if missing <= 5 {
				t.Errorf("a 200 of the %s instance (request %q) has %d usage rows, want 1",
					instanceName[res.instance], res.answer.RequestID, b.rows[res.answer.RequestID])
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d 200s without their usage row", missing, len(where(rs, isOK)))
	}
	upstream := r.upstream(host) + r.upstream(cut)
	if b.rowCount > upstream {
		t.Errorf("%d usage rows for %d upstream calls", b.rowCount, upstream)
	}
	if b.calls < upstream {
		t.Errorf("the ledger counts %d calls, the fakes received %d: a call was not counted", b.calls, upstream)
	}
	if b.holds != 0 {
		t.Errorf("%d quota holds left after both instances stopped cleanly", b.holds)
	}
}
