package failover

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

const (
	secret = "failover-test-server-secret-0123456789"
	plan   = "failover"

	// oneCallMicro is what one call costs at the fake's recorded usage
	// (ocr/testdata/ok.json) at the shipped prices, as test/multi counts it.
	oneCallMicro = 438

	// The load: clients, users, and the limits it runs into. Users 0 to
	// heavyUsers-1 have heavyClients clients each and use up their quota;
	// the others share the rest of the clients.
	clients      = 100
	users        = 25
	heavyUsers   = 5
	heavyClients = 10
	quota        = 40  // monthly_quota of the plan
	line         = 60  // daily_attempts of the plan
	ceilingCalls = 700 // daily_requests
	ceilingUSD   = 600 // daily_usd, in calls' worth: the ceiling the load reaches
	// killAt is how many upstream calls are made before the primary is
	// killed.
	killAt = 200
)

// upstream is a proxy before the fake Gemini that counts each image it
// is sent, by the SHA-256 of its base64 text: every request of the test
// has an image of its own, so an image read twice is an Idempotency-Key
// read twice.
type upstream struct {
	URL   string
	srv   *http.Server
	mu    sync.Mutex
	reads map[[32]byte]int
}

func newUpstream(t *testing.T, target string) *upstream {
	t.Helper()
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{URL: "http://" + ln.Addr().String(), reads: map[[32]byte]int{}}
	proxy := httputil.NewSingleHostReverseProxy(to)
	u.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			var req struct {
				Contents []struct {
					Parts []struct {
						InlineData *struct {
							Data string `json:"data"`
						} `json:"inlineData"`
					} `json:"parts"`
				} `json:"contents"`
			}
			if json.Unmarshal(body, &req) == nil {
				for _, c := range req.Contents {
					for _, p := range c.Parts {
						if p.InlineData != nil {
							u.mu.Lock()
							u.reads[sha256.Sum256([]byte(p.InlineData.Data))]++
							u.mu.Unlock()
						}
					}
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	})}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

// readsOf is how many times the image whose base64 text has digest d was
// sent upstream.
func (u *upstream) readsOf(d [32]byte) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reads[d]
}

// group is the instances on the multi-host URL, their fake Gemini and
// the users' keys.
type group struct {
	t      *testing.T
	dir    string
	config string
	env    []string
	gemini *harness.Gemini
	up     *upstream
	keys   []harness.Key
	procs  [2]*harness.Process
}

func newGroup(t *testing.T, dbURL string) *group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, _ := os.Getwd()
	g, err := harness.NewGemini(root, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	gr := &group{t: t, dir: t.TempDir(), gemini: g, up: newUpstream(t, g.URL)}
	gr.config = filepath.Join(gr.dir, "config.toml")
	gr.env = []string{"BREAKWATER_POSTGRES_URL=" + dbURL, "BREAKWATER_SECRET=" + secret, "GEMINI_API_KEY=test-key"}
	cfg := harness.Config{
		Backend: "postgres", DBPath: filepath.Join(gr.dir, "unused.db"), GeminiURL: gr.up.URL, Plan: plan,
		DailyRequests: ceilingCalls, DailyUSD: float64(ceilingUSD*oneCallMicro) / 1e6, MaxOutputTokens: 40,
		MonthlyQuota: quota, DailyAttempts: line,
	}
	if err := harness.WriteConfig(gr.config, cfg); err != nil {
		t.Fatal(err)
	}
	gr.keys = make([]harness.Key, users)
	errs := make([]error, users)
	var wg sync.WaitGroup
	for i := range users {
		wg.Go(func() { gr.keys[i], errs[i] = harness.NewKey(ctx, bin, gr.config, userName(i), plan, gr.env...) })
		if i == 0 {
			wg.Wait() // the first makes the schema
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(gr.stopAll)
	for i := range gr.procs {
		p, err := harness.Start(bin, gr.config, filepath.Join(gr.dir, fmt.Sprintf("instance%d.log", i)), gr.env...)
		if err != nil {
			t.Fatal(err)
		}
		gr.procs[i] = p
	}
	return gr
}

func userName(i int) string { return fmt.Sprintf("user%d", i) }

func (g *group) stopAll() { harness.StopAll(10*time.Second, g.procs[:]...) }

func (g *group) logs() string {
	return harness.Logs(func(i int) string { return fmt.Sprintf("instance %d", i) }, g.procs[:]...)
}

// try is one attempt of a request: its answer and when it was sent and
// answered.
type try struct {
	instance       int
	sent, answered time.Time
	answer         harness.Answer
	replayed       bool // Idempotent-Replayed: the kept answer of an earlier try
}

// post sends img to addr's /v1/ocr with the API key and the
// Idempotency-Key idem, and says whether the answer was a replay.
func post(ctx context.Context, client *http.Client, addr, key string, img []byte, idem string) (harness.Answer, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		return harness.Answer{Err: err}, false
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	req.Header.Set("Idempotency-Key", idem)
	resp, err := client.Do(req)
	if err != nil {
		return harness.Answer{Err: err}, false
	}
	defer resp.Body.Close()
	a := harness.Answer{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-ID")}
	a.Body, a.Err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if a.Err == nil && a.Status != http.StatusOK {
		var p struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(a.Body, &p)
		a.Code = p.Code
	}
	return a, resp.Header.Get("Idempotent-Replayed") == "true"
}

// request is one image a client sends, with its Idempotency-Key, until
// it has an answer to keep: a 200, or a refusal no retry changes.
type request struct {
	user   int
	key    string
	digest [32]byte // of the image's base64 text, as upstream counts it
	tries  []try
}

// final is the request's last answer.
func (r *request) final() harness.Answer { return r.tries[len(r.tries)-1].answer }

// settled reports whether an answer ends a request: a 200 or a refusal
// that says the same on a retry today.
func settled(a harness.Answer) bool {
	switch {
	case a.Status == http.StatusOK:
		return true
	case a.Status == http.StatusTooManyRequests && (a.Code == "quota_exceeded" || a.Code == "daily_limit"):
		return true
	case a.Code == "budget_paused":
		return true
	}
	return false
}

// load is the clients at work.
type load struct {
	g      *group
	cancel context.CancelFunc
	wg     sync.WaitGroup
	seq    atomic.Uint64

	mu    sync.Mutex
	reqs  []*request
	tries []try // every attempt, in the order answered
}

// clientUser is the user of client c: heavyClients clients for each of
// the first heavyUsers users, the rest spread over the others.
func clientUser(c int) int {
	if c < heavyUsers*heavyClients {
		return c / heavyClients
	}
	return heavyUsers + c%(users-heavyUsers)
}

func (g *group) startLoad(ctx context.Context) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{g: g, cancel: cancel}
	client := &http.Client{Timeout: 15 * time.Second}
	for c := range clients {
		l.wg.Go(func() {
			user := clientUser(c)
			for n := 0; ctx.Err() == nil; n++ {
				img := harness.NthPNG(l.seq.Add(1))
				r := &request{user: user, key: fmt.Sprintf("c%d-%d", c, n),
					digest: sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(img)))}
				for k := 0; ctx.Err() == nil; k++ {
					i := (c + n + k) % 2
					tr := try{instance: i, sent: time.Now()}
					tr.answer, tr.replayed = post(ctx, client, g.procs[i].Addr, g.keys[user].Secret, img, r.key)
					tr.answered = time.Now()
					if ctx.Err() != nil && tr.answer.Status == 0 {
						break // cut off by the end of the load
					}
					r.tries = append(r.tries, tr)
					l.mu.Lock()
					l.tries = append(l.tries, tr)
					l.mu.Unlock()
					if settled(tr.answer) {
						break
					}
					pause := 20 * time.Millisecond
					if tr.answer.Status == http.StatusConflict {
						pause = 200 * time.Millisecond // the key still in progress
					}
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
				if len(r.tries) > 0 {
					l.mu.Lock()
					l.reqs = append(l.reqs, r)
					l.mu.Unlock()
				}
				if len(r.tries) > 0 && r.final().Status != http.StatusOK {
					select { // a refused client does not spin
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	return l
}

func (l *load) stop() []*request {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reqs
}

func (l *load) triesSoFar() []try {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]try(nil), l.tries...)
}

// books is what a database holds of the money path today.
type books struct {
	calls, microUSD int64 // the ledger's day
	rows            map[string]int
	rowCount        int64
	rowMicro        int64
	rowsOf          map[string]int64   // usage rows by user
	quotaOf         map[string]int64   // quota_counts by user, this month
	attemptsOf      map[string]int64   // attempt_counts by user, today
	answers         int64              // idempotency_answers kept
	kept            map[[2]string]bool // idempotency_answers by user and key
}

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
	b := books{rows: map[string]int{}, rowsOf: map[string]int64{}, quotaOf: map[string]int64{}, attemptsOf: map[string]int64{}}
	err = conn.QueryRow(ctx, "SELECT calls, micro_usd FROM ledger_days WHERE day = $1", now.Format("2006-01-02")).Scan(&b.calls, &b.microUSD)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	rows, _ := conn.Query(ctx, "SELECT request_id, user_id, micro_usd FROM usage_rows")
	var (
		id, user string
		micro    int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &user, &micro}, func() error {
		b.rows[id]++
		b.rowsOf[user]++
		b.rowCount++
		b.rowMicro += micro
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var n int64
	rows, _ = conn.Query(ctx, "SELECT user_id, used FROM quota_counts WHERE month = $1", now.Format("2006-01"))
	if _, err := pgx.ForEachRow(rows, []any{&user, &n}, func() error { b.quotaOf[user] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	rows, _ = conn.Query(ctx, "SELECT user_id, count FROM attempt_counts WHERE day = $1", now.Format("2006-01-02"))
	if _, err := pgx.ForEachRow(rows, []any{&user, &n}, func() error { b.attemptsOf[user] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	b.kept = map[[2]string]bool{}
	var key string
	rows, _ = conn.Query(ctx, "SELECT user_id, key FROM idempotency_answers")
	if _, err := pgx.ForEachRow(rows, []any{&user, &key}, func() error { b.kept[[2]string{user, key}] = true; b.answers++; return nil }); err != nil {
		t.Fatal(err)
	}
	return b
}

// failover is what one run saw.
type failover struct {
	reqs             []*request
	killed, promoted time.Time
	firstOK          [2]time.Duration // from the promotion to each instance's first 200 (-1: none)
	upstream         int64            // calls the fake received
	promotedBooks    books            // the new primary's, at the end
	atPromotion      books            // the standby's, at its promotion
	oldBooks         books            // the old primary's, started again alone afterwards
	group            *group
}

// runFailover runs the load on two instances over a primary and a
// standby (synchronous or not), kills the primary once killAt calls have
// been made, promotes the standby, and runs the load on until both
// instances answer budget_paused (the ceiling reached) or 40 s pass.
func runFailover(t *testing.T, o pgtest.ReplicaOptions) *failover {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	begin := time.Now()
	phase := func(what string) { t.Logf("%v: %s", time.Since(begin).Round(time.Millisecond), what) }
	conf, urlTemplate := docSnippets(t)
	if o.Sync {
		o.PrimarySettings = conf
	}
	r := pgtest.NewReplicatedWith(t, o)
	phase("the primary and its standby are up")
	r.CreateDatabase(t, "bw")
	med, p90 := commitLatency(t, r.Primary.URL("postgres"))
	t.Logf("a one-row commit on the primary (synchronous standby: %v): median %v, p90 %v", o.Sync, med, p90)
	dbURL := strings.NewReplacer("P1", fmt.Sprint(r.Primary.Port()), "P2", fmt.Sprint(r.Standby.Port()), "/db?", "/bw?").Replace(urlTemplate)
	t.Logf("the instances' URL: %s", dbURL)
	g := newGroup(t, dbURL)
	phase("the instances are up")
	l := g.startLoad(ctx)
	calls := func() int64 { _, n := g.gemini.Calls(); return n }
	if !waitFor(30*time.Second, func() bool { return calls() >= killAt }) {
		l.stop()
		t.Fatalf("only %d upstream calls under load\n%s", calls(), g.logs())
	}
	f := &failover{group: g}
	r.Primary.Kill()
	f.killed = time.Now()
	atKill := calls()
	// What the standby has, all it received replayed, before it takes
	// writes: with the old primary's books afterwards, what was lost.
	waitReplayed(t, r.Standby.URL("bw"))
	f.atPromotion = readBooks(t, r.Standby.URL("bw"))
	time.Sleep(time.Until(f.killed.Add(500 * time.Millisecond))) // the failover's detection, as a tool would take it
	if err := r.Promote(); err != nil {
		l.stop()
		t.Fatal(err)
	}
	f.promoted = time.Now()
	t.Logf("primary killed at %d upstream calls; standby promoted %v later", atKill, f.promoted.Sub(f.killed).Round(time.Millisecond))
	f.firstOK = [2]time.Duration{-1, -1}
	paused := func() bool {
		ts := l.triesSoFar()
		seen := [2]bool{}
		for _, tr := range ts {
			if tr.answer.Status == http.StatusOK && tr.answered.After(f.promoted) {
				if d := tr.answered.Sub(f.promoted); f.firstOK[tr.instance] < 0 || d < f.firstOK[tr.instance] {
					f.firstOK[tr.instance] = d
				}
			}
		}
		for _, tr := range ts[max(0, len(ts)-200):] {
			// budget_busy: an instance's lease holds the last room.
			if tr.answer.Code == "budget_paused" || tr.answer.Code == "budget_busy" {
				seen[tr.instance] = true
			}
		}
		return seen[0] && seen[1] && calls() >= ceilingUSD*9/10
	}
	if !waitFor(40*time.Second, paused) {
		t.Errorf("the load did not reach the ceiling after the failover: %d upstream calls\n%s", calls(), g.logs())
	}
	phase("the ceiling is reached")
	f.reqs = l.stop()
	g.stopAll()
	phase("the instances are stopped")
	f.upstream = calls()
	f.promotedBooks = readBooks(t, r.Standby.URL("bw"))
	// The old primary, alone on its port (its standby is gone: nothing
	// is written to it), tells what it had that the failover lost.
	if err := r.Primary.Start(); err != nil {
		t.Fatal(err)
	}
	f.oldBooks = readBooks(t, r.Primary.URL("bw"))
	return f
}

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

// tally counts answers by "status code".
func tally(reqs []*request) map[string]int {
	m := map[string]int{}
	for _, r := range reqs {
		for _, tr := range r.tries {
			a := tr.answer
			k := fmt.Sprintf("%d %s", a.Status, a.Code)
			if a.Status == 0 {
				k = "no answer"
			}
			m[k]++
		}
	}
	return m
}

// lost compares the old primary's books with the standby's at its
// promotion: what the failover lost.
type lost struct {
	usageRows, leaseCalls, leaseMicro, attempts, quota, answers int64
}

func (f *failover) lost() lost {
	o, p := f.oldBooks, f.atPromotion
	var l lost
	for id, n := range o.rows {
		if p.rows[id] < n {
			l.usageRows += int64(n - p.rows[id])
		}
	}
	l.leaseCalls = o.calls - min(o.calls, p.calls)
	l.leaseMicro = o.microUSD - min(o.microUSD, p.microUSD)
	for u, n := range o.attemptsOf {
		l.attempts += max(0, n-p.attemptsOf[u])
	}
	for u, n := range o.quotaOf {
		l.quota += max(0, n-p.quotaOf[u])
	}
	l.answers = max(0, o.answers-p.answers)
	return l
}

// TestFailoverToSynchronousStandby: under load (100 clients, 25 users,
// every request with an Idempotency-Key and retried on failure), the
// primary is killed and its synchronous standby promoted. The instances
// find the new primary through the multi-host URL by themselves (a 200
// from each within 10 s of the promotion); every 200 has its usage row
// in the promoted database; the fake's calls <= the ledger's calls <= the
// ceiling (and daily_usd); an image is read twice upstream only when its
// first read was cut off by the failover and never answered 200; no
// user's quota or daily line is passed in the promoted books.
func TestFailoverToSynchronousStandby(t *testing.T) {
	f := runFailover(t, pgtest.ReplicaOptions{Sync: true})
	p := f.promotedBooks
	t.Logf("%v; %d upstream calls; the promoted ledger counts %d calls, %d micro-dollars; %d usage rows",
		tally(f.reqs), f.upstream, p.calls, p.microUSD, p.rowCount)
	for i, d := range f.firstOK {
		t.Logf("instance %d: first 200 %v after the promotion", i, d.Round(time.Millisecond))
		if d < 0 || d > 10*time.Second {
			t.Errorf("instance %d answered no 200 within 10 s of the promotion (%v)\n%s", i, d, f.group.logs())
		}
	}
	checkMoney(t, f)
	// A try cut off by the failover left its key claimed; the claim is
	// given back once the new primary answers, so the retry is not told
	// 409 until the claim lapses (minutes).
	var last409 time.Duration
	for _, r := range f.reqs {
		for _, tr := range r.tries {
			if tr.answer.Code == "idempotency_key_in_use" {
				if d := tr.answered.Sub(f.promoted); d > 5*time.Second && d > last409 {
					t.Logf("key %s: %s", r.key, describe(r.tries, f.killed))
				}
				last409 = max(last409, tr.answered.Sub(f.promoted))
			}
		}
	}
	t.Logf("the last 409 idempotency_key_in_use %v after the promotion", last409.Round(time.Millisecond))
	if last409 > 5*time.Second {
		t.Errorf("a retry was told 409 idempotency_key_in_use %v after the promotion: a claim of the failover was not given back", last409)
	}
	l := f.lost()
	t.Logf("the old primary had, beyond the standby at its promotion: %d usage rows, %d leased calls, %d attempts, %d quota counts, %d kept answers",
		l.usageRows, l.leaseCalls, l.attempts, l.quota, l.answers)
	// A synchronous standby has every commit the primary acknowledged: a
	// usage row the old primary holds and the new one lacks was never
	// answered (its commit was not acknowledged).
	answered := map[string]bool{}
	for _, r := range f.reqs {
		for _, tr := range r.tries {
			if tr.answer.Status == http.StatusOK {
				answered[tr.answer.RequestID] = true
			}
		}
	}
	for id := range f.oldBooks.rows {
		if answered[id] && f.promotedBooks.rows[id] == 0 {
			t.Errorf("request %s was answered 200 and its usage row is on the old primary only", id)
		}
	}
}

// checkMoney checks the money invariants on the promoted books.
func checkMoney(t *testing.T, f *failover) {
	t.Helper()
	p := f.promotedBooks
	oks, missing, replays := 0, 0, 0
	for _, r := range f.reqs {
		for _, tr := range r.tries {
			if tr.answer.Status != http.StatusOK {
				continue
			}
			oks++
			if tr.replayed {
				// Its usage row is the first try's, under that try's
				// request id; the kept answer says it was recorded.
				replays++
				if !p.kept[[2]string{userName(r.user), r.key}] {
					missing++
					t.Errorf("a replayed 200 (key %s) has no kept answer in the promoted database", r.key)
				}
				continue
			}
			if id := tr.answer.RequestID; id == "" || p.rows[id] != 1 {
				missing++
				if missing <= 5 {
					t.Errorf("a 200 (request %q, instance %d, answered %v after the kill) has %d usage rows in the promoted database, want 1",
						id, tr.instance, tr.answered.Sub(f.killed).Round(time.Millisecond), p.rows[id])
				}
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d 200s without their usage row", missing, oks)
	}
	t.Logf("%d of the 200s were replays of a read recorded when its try failed", replays)
	if f.upstream > p.calls || p.calls > ceilingCalls {
		t.Errorf("%d upstream calls, the ledger counts %d, the ceiling is %d: want upstream <= ledger <= ceiling", f.upstream, p.calls, ceilingCalls)
	}
	if usd := int64(ceilingUSD * oneCallMicro); f.upstream*oneCallMicro > usd || p.microUSD > usd || p.rowMicro > usd {
		t.Errorf("the upstream calls cost %d micro-dollars, the ledger holds %d, the usage rows %d; daily_usd is %d",
			f.upstream*oneCallMicro, p.microUSD, p.rowMicro, usd)
	}
	if f.upstream < ceilingUSD*9/10 {
		t.Errorf("%d upstream calls: the load did not reach daily_usd (%d calls' worth)", f.upstream, ceilingUSD)
	}
	// An image read twice upstream: only a request whose earlier try was
	// cut off by the failover (sent before the promotion, not answered
	// 200), and then once more at most.
	twice := 0
	for _, r := range f.reqs {
		n := f.group.up.readsOf(r.digest)
		if n <= 1 {
			continue
		}
		twice++
		cut := false
		for _, tr := range r.tries[:len(r.tries)-1] {
			cut = cut || tr.sent.Before(f.promoted) && tr.answered.After(f.killed.Add(-time.Second)) && tr.answer.Status != http.StatusOK
		}
		if n > 2 || !cut {
			t.Errorf("Idempotency-Key %s read %d times upstream (tries %v)", r.key, n, describe(r.tries, f.killed))
		}
	}
	t.Logf("%d Idempotency-Keys read twice upstream, each a try cut off by the failover and sent again", twice)
	// Quotas and daily lines, per user: what the promoted database
	// counts and the 200s the clients saw.
	for u := range users {
		name := userName(u)
		ok := 0
		for _, r := range f.reqs {
			if r.user == u && r.final().Status == http.StatusOK {
				ok++
			}
		}
		if ok > quota || p.rowsOf[name] > quota || p.quotaOf[name] > quota {
			t.Errorf("%s: %d 200s, %d usage rows, quota count %d; the quota is %d", name, ok, p.rowsOf[name], p.quotaOf[name], quota)
		}
		if ok > line || p.attemptsOf[name] > line {
			t.Errorf("%s: %d 200s, %d attempts counted; the daily line is %d", name, ok, p.attemptsOf[name], line)
		}
	}
	heavy := 0
	for u := range heavyUsers {
		if p.quotaOf[userName(u)] == quota {
			heavy++
		}
	}
	if heavy == 0 {
		t.Errorf("no heavy user reached the quota (%v): the load did not test it", p.quotaOf)
	}
}

// describe is a request's tries, for a failure message.
func describe(tries []try, killed time.Time) string {
	var parts []string
	for _, tr := range tries {
		parts = append(parts, fmt.Sprintf("%d %s on %d [%v, %v]", tr.answer.Status, tr.answer.Code, tr.instance,
			tr.sent.Sub(killed).Round(time.Millisecond), tr.answered.Sub(killed).Round(time.Millisecond)))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// commitLatency times 300 commits of one row each, with synchronous_commit
// on as Breakwater's money commits, on the server at url: the median and
// the 90th percentile.
func commitLatency(t *testing.T, url string) (median, p90 time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on; CREATE TABLE IF NOT EXISTS bw_commit_probe (n bigint)"); err != nil {
		t.Fatal(err)
	}
	d := make([]time.Duration, 300)
	for i := range d {
		start := time.Now()
		if _, err := conn.Exec(ctx, "INSERT INTO bw_commit_probe VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
		d[i] = time.Since(start)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2].Round(time.Microsecond), d[len(d)*9/10].Round(time.Microsecond)
}

// standbyDelay is how long the asynchronous standby's replication
// connection holds each byte, each way: a standby at a distance (on
// loopback with no delay it is a millisecond behind and loses nothing).
const standbyDelay = 30 * time.Millisecond

// TestFailoverToAsynchronousStandby is the same failover with an
// asynchronous standby (no synchronous_standby_names) standbyDelay away:
// it measures what the failover loses, comparing the old primary's books
// (started again alone afterwards) with the promoted one's, and what that
// does to the ceilings and quotas. What is lost is whatever the primary
// had committed and not yet sent, the replication lag's worth. The test
// checks that every loss is replication's: a 200 without its usage row
// in the promoted database has it on the old primary, and the calls the
// promoted ledger misses are the old primary's leases.
func TestFailoverToAsynchronousStandby(t *testing.T) {
	f := runFailover(t, pgtest.ReplicaOptions{Delay: standbyDelay})
	p, o := f.promotedBooks, f.oldBooks
	l := f.lost()
	t.Logf("%v; %d upstream calls; the promoted ledger counts %d calls, the old primary's %d", tally(f.reqs), f.upstream, p.calls, o.calls)
	t.Logf("lost in the failover (on the old primary, not the standby at its promotion): %d usage rows, %d leased calls (%d micro-dollars), %d attempts, %d quota counts, %d kept answers",
		l.usageRows, l.leaseCalls, l.leaseMicro, l.attempts, l.quota, l.answers)
	for i, d := range f.firstOK {
		t.Logf("instance %d: first 200 %v after the promotion", i, d.Round(time.Millisecond))
		if d < 0 || d > 10*time.Second {
			t.Errorf("instance %d answered no 200 within 10 s of the promotion (%v)\n%s", i, d, f.group.logs())
		}
	}
	unrecorded := 0
	for _, r := range f.reqs {
		for _, tr := range r.tries {
			if id := tr.answer.RequestID; tr.answer.Status == http.StatusOK && !tr.replayed && p.rows[id] == 0 {
				unrecorded++
				if o.rows[id] == 0 {
					t.Errorf("a 200 (request %s) has its usage row neither in the promoted database nor on the old primary", id)
				}
			}
		}
	}
	t.Logf("%d 200s answered without their usage row in the promoted database (lost with the old primary)", unrecorded)
	if f.upstream > p.calls+l.leaseCalls {
		t.Errorf("%d upstream calls, the promoted ledger counts %d and lost %d: a call counted nowhere", f.upstream, p.calls, l.leaseCalls)
	}
	over := 0
	for u := range users {
		over += int(max(0, p.quotaOf[userName(u)]-quota))
	}
	t.Logf("the ceiling: %d upstream calls (%d micro-dollars) for daily_usd of %d calls' worth (%d); the promoted ledger holds %d, the old primary's %d; quotas passed by %d reads in all",
		f.upstream, f.upstream*oneCallMicro, ceilingUSD, ceilingUSD*oneCallMicro, p.microUSD, o.microUSD, over)
}

// waitReplayed waits until the standby at url has replayed all the WAL
// it received (its primary is gone: nothing more comes).
func waitReplayed(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var done bool
		err := conn.QueryRow(ctx, "SELECT coalesce(pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn(), false)").Scan(&done)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// docSnippets reads the two snippets of docs/INSTANCES.md's "Failover to
// a standby", which the tests run as they are: the primary's settings
// ("name=value" each, for the synchronous standby) and the instances'
// multi-host URL (P1, P2 and db to fill in).
func docSnippets(t *testing.T) (conf []string, url string) {
	t.Helper()
	doc, err := os.ReadFile("docs/INSTANCES.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n### Failover to a standby\n")
	blocks := strings.Split(section, "```")
	if !ok || len(blocks) < 4 {
		t.Fatal("docs/INSTANCES.md: no two snippets under ### Failover to a standby")
	}
	for _, line := range strings.Split(strings.TrimSpace(blocks[1]), "\n") {
		line, _, _ = strings.Cut(line, "#")
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("docs/INSTANCES.md: %q is no setting", line)
		}
		conf = append(conf, strings.TrimSpace(name)+"="+strings.Trim(strings.TrimSpace(value), "'"))
	}
	return conf, strings.TrimSpace(blocks[3])
}
