package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as the harness's own children (the
// bare Echo server and the Redis peer), as the harness binary does, and
// builds breakwater once for both smoke tests.
func TestMain(m *testing.M) {
	if child, err := childMain(); child {
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "breakwater-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if prebuilt, err = buildBreakwater(root, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// smokePlan runs every case and every memory figure, briefly and small.
var smokePlan = plan{
	rounds: 1, warmup: 200 * time.Millisecond, duration: time.Second, clients: 16, users: 50,
	activeKeys: []int{100, 300}, clientIPs: []int{100, 300}, memWarmup: 20, memChurn: 200,
	inFlight: 100, inFlightLatency: time.Second, settle: 1100 * time.Millisecond,
}

// TestSmoke proves the harness works end to end: it builds breakwater,
// starts every server (redis-server too: the test fails if it cannot be
// found or installed), runs every case and memory figure once, and checks
// that each answered as its case says and that the report names them all.
// It runs with -profile (the profiles overlap the measured second, so they
// cost the test almost nothing) and checks that every Breakwater case
// wrote one. It judges no timing: shared CI machines are too noisy for
// that.
func TestSmoke(t *testing.T) {
	t.Parallel() // beside TestSmokePostgres: both mostly wait out their cases' seconds, and neither judges timing
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := smokePlan
	p.profile = t.TempDir()
	r, err := benchmark(p, root, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	checkProfiles(t, r, p.profile)
	r.form = "smoke test"
	var out bytes.Buffer
	r.print(&out)
	t.Log("\n" + out.String())
	if err := r.problems(); err != nil {
		t.Fatal(err)
	}

	text := out.String()
	for _, c := range r.cases {
		if got := r.figure(c.id); got.rps <= 0 || got.p99 <= 0 || got.p50 > got.p99 {
			t.Errorf("case %q: %.0f req/s, p50 %s, p99 %s", c.label, got.rps, got.p50, got.p99)
		}
		if !strings.Contains(text, c.label) {
			t.Errorf("the report does not name case %q", c.label)
		}
	}
	for _, q := range r.ratios() {
		if q.value <= 0 {
			t.Errorf("ratio %q is %v", q.label, q.value)
		}
		if !strings.Contains(text, q.label) {
			t.Errorf("the report does not show ratio %q", q.label)
		}
	}
	m := r.memory
	if got, want := len(m.activeKeys), len(smokePlan.activeKeys); got != want {
		t.Errorf("%d active-key figures, want %d", got, want)
	}
	if got, want := len(m.clientIPs), len(smokePlan.clientIPs); got != want {
		t.Errorf("%d client-IP figures, want %d", got, want)
	}
	for _, pt := range append(append(m.keysAtRest, m.activeKeys...), m.clientIPs...) {
		if pt.base.rss <= 0 || pt.now.rss <= 0 || pt.base.anon <= 0 || pt.now.anon <= 0 ||
			pt.now.anon > pt.now.rss || pt.base.anon > pt.base.rss {
			t.Errorf("memory figure for %d: %+v against a base of %+v", pt.n, pt.now, pt.base)
		}
	}
	if f := m.inFlight; f.completed != f.n || f.peak < f.base || f.base <= 0 {
		t.Errorf("calls in flight: %d of %d answered 200 (%v, first error %v), peak RSS %d, base %d",
			f.completed, f.n, f.statuses, f.firstErr, f.peak, f.base)
	}
	if !strings.Contains(text, "calls in flight") {
		t.Error("the report does not show the calls in flight")
	}
	if len(r.controls) != 2 || !strings.Contains(text, "the disk alone") {
		t.Errorf("disk controls %+v, or not in the report", r.controls)
	}
	for _, c := range r.controls {
		if c.rps <= 0 || c.txs <= 0 || c.txs > c.rps*2 {
			t.Errorf("disk control %q: %.0f reads/s in %.0f transactions/s", c.label, c.rps, c.txs)
		}
	}
	// Every accepted read is a durable write: under the accepted cases the
	// server's writer commits, each commit carrying at least one write, and
	// its writes are about as many as the reads (plus statistics batches).
	for _, c := range r.cases {
		if c.bw == nil || c.expect != 200 {
			continue
		}
		if f := r.figure(c.id); f.commits <= 0 || f.writes < f.commits || f.writes < 0.8*f.rps {
			t.Errorf("case %q: %.0f commits/s carrying %.0f writes/s, at %.0f reads/s", c.label, f.commits, f.writes, f.rps)
		}
	}
	if !strings.Contains(text, "group commit under the load") {
		t.Error("the report does not show the group commit under the load")
	}
	if f := r.fsync; f.idle <= 0 || f.busy <= 0 || !strings.Contains(text, "fdatasync of one 4 KiB page") {
		t.Errorf("fsync control %+v, or not in the report", f)
	}
	o := r.overhead
	for _, s := range overheadSeries {
		if h := o.series[s.name]; h.count() <= 0 || h.quantile(0.5) <= 0 || h.quantile(0.5) > h.quantile(0.99) {
			t.Errorf("half load, %s: %.0f observations, p50 %v, p99 %v", s.name, h.count(), h.quantile(0.5), h.quantile(0.99))
		}
		if !strings.Contains(text, s.label) {
			t.Errorf("the report does not show %q", s.label)
		}
	}
	if o.achieved <= 0 || o.achieved > 1.2*o.rate {
		t.Errorf("half load: %.0f answers a second for %.0f asked: the pacing does not hold", o.achieved, o.rate)
	}
}

// checkProfiles checks that each Breakwater case of r wrote a CPU profile
// to dir, named for its case, in pprof's gzipped format, and that the
// peers wrote none.
func checkProfiles(t *testing.T, r *report, dir string) {
	t.Helper()
	var want []string
	for _, c := range r.cases {
		if c.bw != nil {
			want = append(want, filepath.Join(dir, slug(c.label)+".pprof"))
		}
	}
	if got := slices.Sorted(slices.Values(r.profiles)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("profiles %q, want %q", got, want)
	}
	for _, path := range want {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
			continue
		}
		if len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
			t.Errorf("%s: %d bytes, not a gzipped profile", path, len(data))
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Errorf("%d files in the profile folder, want %d", len(entries), len(want))
	}
	var out bytes.Buffer
	printProfiles(&out, r.profiles, time.Second)
	if text := out.String(); !strings.Contains(text, "go tool pprof") || !strings.Contains(text, want[0]) {
		t.Errorf("the profiles are not printed with the command that reads them:\n%s", text)
	}
}

func TestSlug(t *testing.T) {
	for _, tt := range []struct{ label, want string }{
		{"accepted, 1,000 users, ceilings on", "accepted-1000-users-ceilings-on"},
		{"rejected, 1 key over its rate (429)", "rejected-1-key-over-its-rate-429"},
		{"rejected, random keys (401)", "rejected-random-keys-401"},
	} {
		t.Run(tt.label, func(t *testing.T) {
			if got := slug(tt.label); got != tt.want {
				t.Errorf("slug(%q) = %q, want %q", tt.label, got, tt.want)
			}
		})
	}
}

func TestProfileSeconds(t *testing.T) {
	for _, tt := range []struct {
		measured time.Duration
		want     int
	}{
		{4 * time.Second, 4}, {1500 * time.Millisecond, 2}, {200 * time.Millisecond, 1}, {0, 1},
	} {
		t.Run(tt.measured.String(), func(t *testing.T) {
			if got := profileSeconds(tt.measured); got != tt.want {
				t.Errorf("profileSeconds(%s) = %d, want %d", tt.measured, got, tt.want)
			}
		})
	}
}
