package multi

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// Floods answered from memory, measured in the database's own count of
// transactions (pg_stat_database: xact_commit + xact_rollback of the
// test's database, read from a session on another database so that the
// reading is not counted).
//
// Two things blur that count, and the test accounts for both:
//   - a backend reports its transactions to the statistics at most once a
//     second, and one that has gone idle after reporting only when its
//     idle timeout fires, 10 s later (PostgreSQL's PGSTAT_IDLE_INTERVAL):
//     each reading is therefore taken statLag after the work it counts;
//   - autovacuum's workers make transactions in the database about once
//     a minute: it is switched off for the test database's tables;
//   - the instances make transactions of their own while nothing happens
//     (the budget's totals read every second, the heartbeat of their
//     quota holds every 5 s, and every 30 s from its start a resync of
//     the keys, users and brake, whose report may come 10 s late): their
//     count is measured over a quiet stretch first and subtracted from a
//     flood's stretch. Every stretch is one resync period long and starts
//     halfway between two resyncs, so that each holds each instance's
//     resync once, reported within it.

// soakEnv is the variable that runs the module's one soak: the floods'
// counts of transactions, TestFloodsCostNoTransactions and
// TestGuardedFloodsCostNoTransactions.
const soakEnv = "BREAKWATER_SOAK"

// soak skips t unless soakEnv is 1. The flood tests wait out stretches of
// 30 s to read PostgreSQL's count of transactions (about 140 and 170 s,
// most of this package's time), and that count, within ±10, is only as
// steady as the machine is quiet: run beside other tests (other packages
// in go test ./..., or this package's own bursts), a stretch strayed by
// 60 (measured). .ci/run runs them alone, after the suite, with
// BREAKWATER_SOAK=1.
func soak(t *testing.T) {
	t.Helper()
	if os.Getenv(soakEnv) != "1" {
		t.Skip("a soak: .ci/run runs it alone after the suite, with " + soakEnv + "=1")
	}
}

// statLag is how long after some work its transactions are all in
// pg_stat_database: PGSTAT_IDLE_INTERVAL (10 s), and a second for the
// last report.
const statLag = 11 * time.Second

// resyncEvery is the instances' resync period (app.resyncEvery): the
// length of a measured stretch.
const resyncEvery = 30 * time.Second

// floodSize is how many requests each flood sends, over both instances.
const floodSize = 10_000

// floodTicks is what the background ticks a flood keeps busy may write
// while it lasts took: the dashboard's refusal counts, written behind
// once a second by each instance while they change, and each instance's
// statistics row of the minute's refusals, each write with the ping the
// connection pool sends first on a connection idle for a second. They
// come with any refusal, not with each: a flood twice as long makes twice
// as many, a flood twice as dense none more.
func floodTicks(took time.Duration) float64 {
	const instances, pinged = 2, 2
	return instances * pinged * (math.Ceil(took.Seconds()) + 1 + 1)
}

// quietAutovacuum switches autovacuum off for every table of the database
// at dbURL: its workers' transactions count in pg_stat_database, at
// moments of their own (about once a minute), and a test that counts the
// instances' transactions must not count them.
func quietAutovacuum(ctx context.Context, t *testing.T, dbURL string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema()")
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		if _, err := conn.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = off, toast.autovacuum_enabled = off)"); err != nil {
			t.Fatal(err)
		}
	}
}

// transactions returns the transactions of the database at dbURL so far.
func transactions(ctx context.Context, t *testing.T, dbURL string) float64 {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := u.Path[1:]
	u.Path = "/postgres" // another database: this session's transactions are not counted
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var commits, rollbacks int64
	err = conn.QueryRow(ctx, "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", name).Scan(&commits, &rollbacks)
	if err != nil {
		t.Fatal(err)
	}
	return float64(commits + rollbacks)
}

// meter reads a database's transactions over stretches aligned on the
// instances' resyncs, and knows the idle rate.
type meter struct {
	t     *testing.T
	dbURL string
	idle  float64   // transactions a second while no request is sent
	last  float64   // the reading at the end of the last stretch
	next  time.Time // when the current stretch ends
}

// idleStretches is how many stretches the idle rate is measured over.
const idleStretches = 2

// statNoise is how far a stretch's count strays from the idle rate's
// with no request sent: reports shift between stretches (a backend whose
// last report is less than a second old holds the next up to 10 s). Up
// to ±10 was seen here between quiet stretches.
const statNoise = 10

// newMeter measures the idle rate over idleStretches stretches. started is when the
// instances started (at most this early: their resyncs come every
// resyncEvery from a moment just before).
func newMeter(ctx context.Context, t *testing.T, dbURL string, started time.Time) *meter {
	m := &meter{t: t, dbURL: dbURL, next: started.Add(resyncEvery / 2)}
	for time.Until(m.next) < statLag { // what came before reported
		m.next = m.next.Add(resyncEvery)
	}
	time.Sleep(time.Until(m.next))
	m.last = transactions(ctx, t, dbURL)
	start, first := time.Now(), m.last
	var counts []float64
	for range idleStretches {
		m.next = m.next.Add(resyncEvery)
		time.Sleep(time.Until(m.next))
		now := transactions(ctx, t, dbURL)
		counts = append(counts, now-m.last)
		m.last = now
	}
	m.idle = (m.last - first) / time.Since(start).Seconds()
	t.Logf("idle: %.1f transactions a second (stretches of %v: %v)", m.idle, resyncEvery, counts)
	return m
}

// measure runs work at the start of a stretch and returns the
// transactions the stretch held beyond the idle rate, with the raw count
// and how long work took. The stretch ends at least statLag after work.
func (m *meter) measure(ctx context.Context, work func()) (beyond, raw float64, took time.Duration) {
	start := time.Now()
	work()
	took = time.Since(start)
	for m.next = m.next.Add(resyncEvery); time.Until(m.next) < statLag; {
		m.next = m.next.Add(resyncEvery)
	}
	time.Sleep(time.Until(m.next))
	stretch := time.Since(start)
	now := transactions(ctx, m.t, m.dbURL)
	raw = now - m.last
	m.last = now
	return raw - m.idle*stretch.Seconds(), raw, took
}

// flood sends floodSize requests from 32 clients, request k to instance
// k%2 with the key secret(k), and returns the answers by "status code".
func (p *pair) flood(ctx context.Context, secret func(k int) string) map[string]int {
	img := harness.NthPNG(imageSeq.Add(1))
	return floodEach(floodSize, func(client *http.Client, k int) string {
		a := harness.Post(ctx, client, p.proc(k%2).Addr, secret(k), img)
		return fmt.Sprintf("%d %s", a.Status, a.Code)
	})
}

// floodEach makes n requests from 32 clients sharing keep-alive
// connections, send(client, k) making request k and saying its answer,
// and returns the answers with how many of each.
func floodEach(n int, send func(client *http.Client, k int) string) map[string]int {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections()
	var (
		next atomic.Int64
		mu   sync.Mutex
		out  = map[string]int{}
		wg   sync.WaitGroup
	)
	for range 32 {
		wg.Go(func() {
			seen := map[string]int{}
			for k := int(next.Add(1) - 1); k < n; k = int(next.Add(1) - 1) {
				seen[send(client, k)]++
			}
			mu.Lock()
			defer mu.Unlock()
			for a, c := range seen {
				out[a] += c
			}
		})
	}
	wg.Wait()
	return out
}

// randomKey is a key of the right shape that no one holds.
func randomKey() string {
	const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = base62[int(b[i])%len(base62)]
	}
	return "bw_" + string(b)
}

// TestFloodsCostNoTransactions: a user over the daily line, refused once
// on each instance (each decides that first refusal in the database and
// remembers it), sends 10,000 requests over both instances; beyond the
// idle rate, the ticks a flood keeps busy (floodTicks) and the count's
// noise (statNoise) they make at most 10 transactions (PostgreSQL's
// statement log of such a flood shows the ticks' writes alone, none per
// request; without the deny cache, with the rate windows in the database,
// each request would be one).
// Then 10,000 requests with random unknown keys, turned away by the keys
// in memory: at most 10 as well. Last, a user banned and unbanned
// through A is served by B within a second of the unban.
func TestFloodsCostNoTransactions(t *testing.T) {
	soak(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	dbURL := pgtest.NewDatabase(t)
	p := newPair(t, dbURL, harness.Config{DailyRequests: 100000, DailyAttempts: 1}, 2, 0)
	started := time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	if r := p.send(ctx, client, 0, 0, nil); r.answer.Status != http.StatusOK {
		t.Fatalf("the one read of the day: %d %s\n%s", r.answer.Status, r.answer.Code, p.logs())
	}
	for i := range 2 {
		if r := p.send(ctx, client, i, 0, nil); r.answer.Status != http.StatusTooManyRequests || r.answer.Code != "daily_limit" {
			t.Fatalf("over the line on instance %d: %d %s\n%s", i, r.answer.Status, r.answer.Code, p.logs())
		}
	}
	quietAutovacuum(ctx, t, dbURL)
	m := newMeter(ctx, t, dbURL, started)

	var answers map[string]int
	beyond, raw, took := m.measure(ctx, func() { answers = p.flood(ctx, func(int) string { return p.keys[0].Secret }) })
	t.Logf("one user over the line, %d requests in %v: %v; %.0f transactions, %.1f beyond the idle rate", floodSize, took, answers, raw, beyond)
	if answers["429 daily_limit"] != floodSize {
		t.Errorf("answers %v, want %d × 429 daily_limit", answers, floodSize)
	}
	if limit := 10 + floodTicks(took) + statNoise; beyond > limit {
		t.Errorf("%.1f transactions beyond the idle rate for %d refusals of one user, want at most 10, %.0f for the ticks and %d for the count's noise",
			beyond, floodSize, floodTicks(took), statNoise)
	}

	beyond, raw, took = m.measure(ctx, func() { answers = p.flood(ctx, func(int) string { return randomKey() }) })
	t.Logf("random unknown keys, %d requests in %v: %v; %.0f transactions, %.1f beyond the idle rate", floodSize, took, answers, raw, beyond)
	if answers["401 unauthorized"] != floodSize {
		t.Errorf("answers %v, want %d × 401 unauthorized", answers, floodSize)
	}
	if limit := 10 + floodTicks(took) + statNoise; beyond > limit {
		t.Errorf("%.1f transactions beyond the idle rate for %d unknown keys, want at most 10, %.0f for the ticks and %d for the count's noise",
			beyond, floodSize, floodTicks(took), statNoise)
	}

	p.admin(ctx, t, 0, "/api/users/user1", `{"banned":true}`)
	p.waitBanned(ctx, t, 1, 1)
	p.admin(ctx, t, 0, "/api/users/user1", `{"banned":false}`)
	d := p.until(ctx, t, time.Now(), 1, 1, http.StatusOK, "")
	t.Logf("user unbanned through A: B serves again after %v", d)
}

// waitBanned sends user's requests to instance i until one is refused as
// banned. Their body is no image: one that passes before the ban is in
// force is refused by the image check (415), before the daily line
// counts an attempt, so the user's one attempt of the day stays unused.
func (p *pair) waitBanned(ctx context.Context, t *testing.T, i, user int) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var last harness.Answer
	for start := time.Now(); time.Since(start) < propagationBound+5*time.Second; {
		last = harness.Post(ctx, client, p.proc(i).Addr, p.keys[user].Secret, []byte("not an image"))
		if last.Status == http.StatusForbidden && last.Code == "banned" {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("instance %d still answers %d %s, want 403 banned\n%s", i, last.Status, last.Code, p.logs())
}

// TestCachedRefusalsWhilePostgresIsDown: a user over the daily line,
// refused once on each instance, is still refused by both (429
// daily_limit, its Retry-After counting down to midnight, never a 503)
// while PostgreSQL (a cluster of the test's own) is stopped; started
// again, another user is served.
func TestCachedRefusalsWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cluster := pgtest.NewCluster(t)
	dbURL := createDatabase(ctx, t, cluster.URL("postgres"), "bw_deny")
	p := newPair(t, dbURL, harness.Config{DailyRequests: 100000, DailyAttempts: 1}, 2, 0)
	client := &http.Client{Timeout: 10 * time.Second}
	if r := p.send(ctx, client, 0, 0, nil); r.answer.Status != http.StatusOK {
		t.Fatalf("the one read of the day: %d %s\n%s", r.answer.Status, r.answer.Code, p.logs())
	}
	for i := range 2 {
		if r := p.send(ctx, client, i, 0, nil); r.answer.Code != "daily_limit" {
			t.Fatalf("over the line on instance %d: %d %s\n%s", i, r.answer.Status, r.answer.Code, p.logs())
		}
	}

	cluster.Stop()
	answers := map[string]int{}
	last := [2]int{86401, 86401}
	for k := range 400 {
		i := k % 2
		a := p.send(ctx, client, i, 0, nil).answer
		answers[fmt.Sprintf("%d %s", a.Status, a.Code)]++
		if a.Status == http.StatusTooManyRequests && (a.RetryAfter <= 0 || a.RetryAfter > last[i]) {
			t.Errorf("instance %d: Retry-After %d after %d, want it counting down", i, a.RetryAfter, last[i])
		}
		last[i] = a.RetryAfter
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("400 requests of the refused user while PostgreSQL is down: %v", answers)
	if answers["429 daily_limit"] != 400 {
		t.Errorf("answers %v, want 400 × 429 daily_limit", answers)
	}

	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	var a harness.Answer
	for time.Since(started) < 15*time.Second {
		if a = p.send(ctx, client, 1, 1, nil).answer; a.Status == http.StatusOK {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if a.Status != http.StatusOK {
		t.Errorf("another user, after PostgreSQL started again: %d %s\n%s", a.Status, a.Code, p.logs())
	}
	t.Logf("another user served %v after PostgreSQL started again", time.Since(started).Round(time.Millisecond))
}
