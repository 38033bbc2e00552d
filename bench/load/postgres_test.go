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
// be started), one instance on bolt, one on a database and two on another, runs every case once, briefly, and checks that each answered
// 200, that every case on PostgreSQL counted its database's transactions
// and its accepted reads, that the histograms said where the time went,
// and that the report shows it all. It judges no timing.
func TestSmokePostgres(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := plan{rounds: 1, warmup: 200 * time.Millisecond, duration: time.Second, clients: 16, users: 50}
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
	if len(r.cases) != 6 {
		t.Fatalf("%d cases, want 6 (1 user and 50 users on bolt, postgres, postgres twice)", len(r.cases))
	}
	pgCases := 0
	for _, c := range r.cases {
		f := r.figure(c.id)
		if f.rps <= 0 || f.commits <= 0 || !strings.Contains(text, c.label) {
			t.Errorf("case %q: %.0f req/s, %.0f commits/s, or not in the report", c.label, f.rps, f.commits)
		}
		if d := r.stageMean(c.id, "breakwater_usage_commit_seconds"); d <= 0 || d > r.meanLatency(c.id) {
			t.Errorf("case %q: usage record's commit wait %s against a mean latency of %s", c.label, d, r.meanLatency(c.id))
		}
		if c.pg == nil {
			continue
		}
		pgCases++
		s := r.samples[c.id][0]
		// Every accepted read the instances counted is in a committed
		// transaction; reads the client saw are among those counted.
		// PostgreSQL's CPU is counted only for a cluster the harness started.
		if s.served < float64(f.statuses[200]) || s.pgCommits <= 0 || (s.pgCPU <= 0) == (adminURL == "") {
			t.Errorf("case %q: %.0f reads counted by the instances for %d seen, %.0f transactions, pg cpu %.2f",
				c.label, s.served, f.statuses[200], s.pgCommits, s.pgCPU)
		}
		if tx, ok := r.txPerRead(c.id); !ok || tx <= 0 || math.IsInf(tx, 0) {
			t.Errorf("case %q: %v transactions per read", c.label, tx)
		}
		if (c.also != nil) != strings.Contains(c.label, "2 instances") {
			t.Errorf("case %q: second instance %v", c.label, c.also)
		}
	}
	if pgCases != 4 {
		t.Errorf("%d cases on postgres, want 4", pgCases)
	}
	for _, want := range []string{"postgres, 2 instances ÷ bolt, 1 user", "load average when the rounds started", "PostgreSQL transactions per accepted read", "where the time goes", "PostgreSQL 1"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report does not show %q", want)
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
