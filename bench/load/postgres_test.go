package main

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
)

// TestSmokePostgres proves the postgres cases work end to end: it builds
// breakwater, uses the server pgtest.EnvURL names (what .ci/run starts) or
// else starts a throwaway PostgreSQL cluster (the test fails when none can
// be started), one instance on bolt, one on a database and two on another
// for the accepted path, one on bolt and two on a third database for the
// refusals, runs every case once, briefly, and checks that each answered
// as it should, that every case on PostgreSQL counted its database's
// transactions and its answers, that every database's idle rate was
// measured, that the histograms said where the time went, that the
// open-loop search and the one-client runs ran, and that the report shows
// it all. It judges no timing.
func TestSmokePostgres(t *testing.T) {
	t.Parallel() // beside TestSmoke: both mostly wait out their cases' seconds, and neither judges timing
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := plan{rounds: 1, warmup: 200 * time.Millisecond, duration: time.Second, clients: 16, users: 50,
		openStep: 200 * time.Millisecond, openStart: 100, openCeiling: 400, openBisect: 1, openConns: 8, serial: 300 * time.Millisecond,
		openMinRequests: 60} // a p99 of 60 requests is their slowest but one: enough for a test that judges no timing
	adminURL := os.Getenv(pgtest.EnvURL)
	r, err := benchmarkPostgres(p, root, t.TempDir(), adminURL, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	r.form = "smoke test"
	var out bytes.Buffer
	r.print(&out)
	t.Log("\n" + out.String())
	if err := r.problems(); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if len(r.cases) != 10 {
		t.Fatalf("%d cases, want 10 (1 user and 50 users on bolt, postgres, postgres twice; 429 and 401 on bolt and postgres twice)", len(r.cases))
	}
	pgCases := 0
	for _, c := range r.cases {
		f := r.figure(c.id)
		if f.rps <= 0 || !strings.Contains(text, c.label) {
			t.Errorf("case %q: %.0f req/s, or not in the report", c.label, f.rps)
		}
		if !c.refusals {
			if f.commits <= 0 {
				t.Errorf("case %q: %.0f commits/s", c.label, f.commits)
			}
			if d := r.stageMean(c.id, usageSeries); d <= 0 || d > r.meanLatency(c.id) {
				t.Errorf("case %q: usage record's commit wait %s against a mean latency of %s", c.label, d, r.meanLatency(c.id))
			}
		}
		if c.pg == nil {
			continue
		}
		pgCases++
		checkPostgresCase(t, r, c, adminURL)
	}
	if pgCases != 6 {
		t.Errorf("%d cases on postgres, want 6", pgCases)
	}
	checkOpenFigures(t, r)
	for _, want := range []string{"postgres, 2 instances ÷ bolt, 1 user", "load average when the rounds started", "PostgreSQL transactions per accepted read",
		"where the time goes", "PostgreSQL 1", "refusals (429), postgres, 2 instances ÷ bolt", "refusals (401), postgres, 2 instances ÷ bolt",
		"PostgreSQL transactions per 1,000 refusals", "idle: the transactions", "highest constant rate", "the p99 the guard adds at one client", "the disk under them"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report does not show %q", want)
		}
	}
}

// TestSmokePostgresOpenOnly runs -postgres -open briefly: the open-loop
// search and the one-client runs, and neither the rounds nor the floor
// (the flag once ran the rounds all the same).
func TestSmokePostgresOpenOnly(t *testing.T) {
	t.Parallel()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := plan{rounds: 1, warmup: 200 * time.Millisecond, duration: time.Second, clients: 16, users: 50, openOnly: true,
		openStep: 200 * time.Millisecond, openStart: 100, openCeiling: 200, openBisect: 1, openConns: 8, serial: 300 * time.Millisecond,
		openMinRequests: 60}
	start := time.Now()
	r, err := benchmarkPostgres(p, root, t.TempDir(), os.Getenv(pgtest.EnvURL), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.print(&out)
	t.Logf("in %s:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err := r.problems(); err != nil {
		t.Error(err)
	}
	if len(r.samples) != 0 || r.floor != (floorFigure{}) || len(r.idle) != 0 {
		t.Errorf("-open ran the rounds or the floor: %d cases' samples, floor %+v, %d idle figures", len(r.samples), r.floor, len(r.idle))
	}
	checkOpenFigures(t, r)
	text := out.String()
	if strings.Contains(text, "rounds") || !strings.Contains(text, "highest constant rate") || !strings.Contains(text, "the p99 the guard adds at one client") {
		t.Errorf("the report of -open:\n%s", text)
	}
}

// checkPostgresCase checks a case on PostgreSQL: its transactions and
// answers counted, its database's idle rate measured.
func checkPostgresCase(t *testing.T, r *report, c tcase, adminURL string) {
	t.Helper()
	f := r.figure(c.id)
	s := r.samples[c.id][0]
	// Every answer of its kind the client saw is among those its
	// instances counted, and an accepted read is in a committed
	// transaction. PostgreSQL's CPU is counted only for a cluster the
	// harness started (a flood of refusals may cost it none).
	if s.served < float64(f.statuses[c.expect]) || (!c.refusals && s.pgCommits <= 0) || s.span <= r.plan.duration ||
		(adminURL != "" && s.pgCPU != 0) || (adminURL == "" && !c.refusals && s.pgCPU <= 0) {
		t.Errorf("case %q: %.0f answers counted by the instances for %d seen, %.0f transactions, pg cpu %.2f, span %s",
			c.label, s.served, f.statuses[c.expect], s.pgCommits, s.pgCPU, s.span)
	}
	with, idle, without, ok := r.txPer(c)
	if !ok || with < 0 || math.IsInf(with, 0) || (!c.refusals && with <= 0) || math.Abs(with-idle-without) > 1e-9 {
		t.Errorf("case %q: %v transactions per answer, %v of them idle, %v without", c.label, with, idle, without)
	}
	if rate, ok := r.idleRate(c.pg); !ok || rate < 0 {
		t.Errorf("case %q: idle rate %v (measured %v)", c.label, rate, ok)
	}
	if (c.also != nil) != strings.Contains(c.label, "2 instances") {
		t.Errorf("case %q: second instance %v", c.label, c.also)
	}
}

// checkOpenFigures checks that the open-loop search ran on both backends
// and the one-client runs on bare Echo and both backends.
func checkOpenFigures(t *testing.T, r *report) {
	t.Helper()
	if len(r.open) != 2 {
		t.Fatalf("%d open-loop figures, want 2 (bolt, postgres with 2 instances)", len(r.open))
	}
	for _, f := range r.open {
		if len(f.search.steps) == 0 || f.search.steps[0].rate != r.plan.openStart {
			t.Errorf("open loop, %s: steps %+v", f.label, f.search.steps)
		}
		// Every rate tried has each try's CPU: the serving processes',
		// and PostgreSQL's per request where the harness counts it.
		pgCounted := r.pgCPUCounted && strings.HasPrefix(f.label, "postgres")
		for _, st := range f.search.steps {
			srv, per, ok := f.cpuAt(st.rate)
			if !ok || len(f.cpu[st.rate]) != max(1, r.plan.openTries) || srv <= 0 || (per > 0) != pgCounted {
				t.Errorf("open loop, %s, %.0f req/s: cpu %+v (pg counted: %v)", f.label, st.rate, f.cpu[st.rate], pgCounted)
			}
		}
	}
	if d := r.disk; d.n != diskProbes || d.p50 <= 0 || d.p99 < d.p50 {
		t.Errorf("the disk's flushes: %+v", d)
	}
	if len(r.serial) != 3 {
		t.Fatalf("%d one-client figures, want 3 (bare Echo, bolt, postgres with 2 instances)", len(r.serial))
	}
	for i, f := range r.serial {
		if f.out.requests == 0 || f.expected != 1 {
			t.Errorf("one client, %s: %d answers, %.0f%% as expected", f.label, f.out.requests, 100*f.expected)
		}
		if i > 0 && f.series[guardSeries].count() < float64(f.out.statuses[200]) {
			t.Errorf("one client, %s: %v guard observations for %d reads", f.label, f.series[guardSeries].count(), f.out.statuses[200])
		}
	}
}

// TestGenerateSplit checks that a two-instance case's load splits the
// clients between the two addresses, the first taking the even requests
// and the second the odd ones, and merges what they measured.
func TestGenerateSplit(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]map[string]int{} // server -> path -> requests
	serve := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			if seen[name] == nil {
				seen[name] = map[string]int{}
			}
			seen[name][r.URL.Path]++
			mu.Unlock()
			_, _ = w.Write([]byte("ok"))
		}))
	}
	a, b := serve("a"), serve("b")
	defer a.Close()
	defer b.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	req := func(path string) []byte { return fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path) }
	out := generateSplit(load{addr: host(a), clients: 4, duration: 300 * time.Millisecond, request: oneOf(req("/even"), req("/odd"))}, host(b))
	if out.requests == 0 || out.statuses[http.StatusOK] != out.requests || out.errors != 0 {
		t.Fatalf("%d answers, %v, %d errors (%v)", out.requests, out.statuses, out.errors, out.firstErr)
	}
	if !slices.IsSorted(out.latencies) || int64(len(out.latencies)) != out.requests {
		t.Errorf("%d latencies for %d answers, sorted %v", len(out.latencies), out.requests, slices.IsSorted(out.latencies))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen["a"]) != 1 || seen["a"]["/even"] == 0 || len(seen["b"]) != 1 || seen["b"]["/odd"] == 0 {
		t.Errorf("requests seen: %v, want the even ones on a and the odd ones on b", seen)
	}
}

func TestMergeSorted(t *testing.T) {
	got := mergeSorted([]time.Duration{1, 4, 5}, []time.Duration{2, 3, 6, 7})
	for i, d := range got {
		if d != time.Duration(i+1) {
			t.Fatalf("mergeSorted = %v", got)
		}
	}
	if len(got) != 7 {
		t.Fatalf("mergeSorted = %v", got)
	}
}
