// Command load is Breakwater's benchmark harness: it builds the real binary,
// starts it with configs of its own on loopback next to a bare Echo handler
// and a Redis-backed limiter peer (redis_rate on a real redis-server),
// measures each with its own HTTP load generator in interleaved rounds, and
// prints requests per second, latency percentiles, the ratios the
// performance targets name, and memory figures.
//
//	go run ./bench/load          # the full run (about 5 minutes)
//	go run ./bench/load -quick   # under a minute: fewer, shorter rounds, no memory figures
//	go run ./bench/load -postgres  # accepted reads and refusals on bolt and on postgres, one and two instances; the open-loop figures
//
// It never talks to anything but 127.0.0.1, and it does not judge timing
// for CI: the smoke test only proves that every case runs and answers as
// it should. See bench/README.md.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if child, err := childMain(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// run parses the flags, runs the benchmark and prints the report on stdout
// (progress goes to stderr).
func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "the quick form: 2 rounds of 1.5 s per case, no memory figures (under a minute)")
	mem := fs.Bool("mem", true, "measure memory (RSS per active key and client IP, calls in flight); off by default with -quick")
	rounds := fs.Int("rounds", 0, "rounds of every case (default 5, -quick 2)")
	duration := fs.Duration("duration", 0, "measured time per case and round (default 4s, -quick 1.5s)")
	clients := fs.Int("clients", 0, "concurrent keep-alive connections (default 64)")
	root := fs.String("root", "", "the breakwater module to build (default: the module of the current directory)")
	keep := fs.Bool("keep", false, "keep the temporary directory (configs, databases, server logs) and print its path")
	profile := fs.String("profile", "", "write a CPU profile of each Breakwater case, over its measured time in the first round, to `DIR`/CASE.pprof")
	pgCases := fs.Bool("postgres", false, "run the postgres cases instead: the accepted path on one instance on bolt, one on PostgreSQL and two sharing one database, the refusals on bolt and two instances (3 rounds of 3 s, -quick 2 of 1.5 s), then the highest constant rate within a p99 of 20 ms and the guard's added p99 at one client")
	pgURL := fs.String("postgres-url", "", "with -postgres: the `URL` of a PostgreSQL role that may create databases (default: a throwaway cluster the harness starts)")
	pin := fs.Bool("pin", false, "with -postgres: the throwaway cluster pinned to the last core, the instances, the load generator and the harness to the others (as taskset would), the closest to a database on its own host")
	openOnly := fs.Bool("open", false, "with -postgres: only the highest constant rate and the one-client p99, without the rounds and the floor (a minute or two)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	p, form := fullPlan, "full run"
	if *pgCases {
		p, form = pgPlan, "postgres cases (-postgres)"
		if *quick {
			p, form = quickPlan, "postgres cases, quick form (-postgres -quick)"
		}
		p.pin, p.openOnly = *pin, *openOnly
	} else if *pgURL != "" || *pin || *openOnly {
		return errors.New("-postgres-url, -pin and -open go with -postgres")
	} else if *quick {
		p, form = quickPlan, "quick form (-quick)"
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "mem" && *mem {
				p.activeKeys, p.clientIPs, p.memWarmup, p.memChurn = fullPlan.activeKeys, fullPlan.clientIPs, fullPlan.memWarmup, fullPlan.memChurn
				p.inFlight, p.inFlightLatency, p.settle = fullPlan.inFlight, fullPlan.inFlightLatency, fullPlan.settle
			}
		})
	} else if !*mem {
		p.activeKeys, p.clientIPs = nil, nil
	}
	if *rounds > 0 {
		p.rounds = *rounds
	}
	if *duration > 0 {
		p.duration = *duration
	}
	if *clients > 0 {
		p.clients = *clients
	}
	if *profile != "" {
		abs, err := filepath.Abs(*profile)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return err
		}
		p.profile = abs
	}
	if *root == "" {
		r, err := moduleRoot()
		if err != nil {
			return err
		}
		*root = r
	}
	dir, err := os.MkdirTemp("", "breakwater-bench-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintln(stderr, "keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	defer onInterrupt(dir, *keep, stderr)()
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	var r *report
	if *pgCases {
		r, err = benchmarkPostgres(p, *root, dir, *pgURL, progress)
	} else {
		r, err = benchmark(p, *root, dir, progress)
	}
	if r != nil {
		r.form = form
		r.print(stdout)
		printProfiles(stderr, r.profiles, p.duration)
	}
	if err != nil {
		return err
	}
	return r.problems()
}

// onInterrupt makes an interrupted harness remove dir (unless keep) and
// exit; its servers die with it (they are started with a parent-death
// signal). The returned func stops watching.
func onInterrupt(dir string, keep bool, stderr io.Writer) (stop func()) {
	interrupt := make(chan os.Signal, 1)
	signal.Notify(interrupt, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-interrupt; ok {
			if !keep {
				os.RemoveAll(dir)
			}
			fmt.Fprintln(stderr, "load: interrupted")
			os.Exit(130)
		}
	}()
	return func() { signal.Stop(interrupt) }
}

// benchmark sets everything up, runs the rounds and the memory figures, and
// stops what it started.
func benchmark(p plan, root, dir string, progress func(string, ...any)) (*report, error) {
	b, err := setup(p, root, dir, progress)
	defer b.close()
	if err != nil {
		return nil, err
	}
	r := &report{plan: p, started: time.Now().UTC(), cases: b.cases, samples: b.rounds()}
	r.profiles = b.profiles
	progress("the disk alone (control)")
	if r.controls, err = b.diskControls(); err != nil {
		return r, err
	}
	if r.fsync, err = measureFsync(b.dir, 200); err != nil {
		return r, err
	}
	progress("guard overhead at half load")
	r.overhead, err = b.halfLoad(b.cases[1], r.figure(b.cases[1].id).rps)
	if err != nil {
		return r, err
	}
	r.memory, err = b.memory()
	return r, errors.Join(err, b.profileErr)
}

// report is what one run measured.
type report struct {
	form    string
	plan    plan
	started time.Time
	cases   []tcase
	samples map[string][]sample
	memory  memoryFigures
	// controls are the disk's own limit (diskControls).
	controls []diskControl
	// fsync is the disk's flush latency, idle and busy (measureFsync).
	fsync fsyncLatency
	// overhead is the guard's overhead at half load.
	overhead overheadFigures
	// profiles are the CPU profiles written (-profile).
	profiles []string
	// postgres describes the server of the postgres cases (-postgres);
	// empty in the other runs.
	postgres string
	// loadAvg is the machine's load average when the rounds started
	// (-postgres): whether other work shared the cores.
	loadAvg string
	// pgCPUCounted says PostgreSQL's CPU was counted (a cluster the
	// harness started).
	pgCPUCounted bool
	// floor is PostgreSQL's CPU per read at its floor, and from a client
	// (floor.go); zero when not measured.
	floor floorFigure
	// idle is, per round, each case database's transactions over an
	// idle interval (-postgres).
	idle []map[string]idleSample
	// open and serial are the open-loop figures (-postgres): the highest
	// constant rate within the p99 bound per backend, and one client's
	// latency direct and through each backend.
	open   []openLoopFigure
	serial []serialFigure
	disk   diskFigure // the disk's flush after the one-client runs (zero: not probed)
}

// figure is one case's medians across the rounds.
type figure struct {
	rps, srvCPU, genCPU, expected float64
	commits, writes               float64 // the storage writer's, per second
	commitErr                     error
	minRPS, maxRPS                float64 // the spread over the rounds
	p50, p99                      time.Duration
	statuses                      map[int]int64
	errors                        int64
	firstErr                      error
}

func (r *report) figure(id string) figure {
	ss := r.samples[id]
	f := figure{statuses: map[int]int64{}}
	var rps, srv, gen, exp, commits, writes []float64
	var p50, p99 []time.Duration
	for _, s := range ss {
		rps, srv, gen, exp = append(rps, s.rps), append(srv, s.srvCPU), append(gen, s.genCPU), append(exp, s.expected)
		commits, writes = append(commits, s.commits), append(writes, s.writes)
		f.commitErr = cmp.Or(f.commitErr, s.commitErr)
		p50, p99 = append(p50, s.p50), append(p99, s.p99)
		for k, v := range s.statuses {
			f.statuses[k] += v
		}
		f.errors += s.errors
		if f.firstErr == nil {
			f.firstErr = s.firstErr
		}
	}
	f.rps, f.srvCPU, f.genCPU, f.expected = median(rps), median(srv), median(gen), median(exp)
	f.commits, f.writes = median(commits), median(writes)
	if len(rps) > 0 {
		f.minRPS, f.maxRPS = slices.Min(rps), slices.Max(rps)
	}
	f.p50, f.p99 = median(p50), median(p99)
	return f
}

// ratio is one of the targets of issue 17: num's req/s over den's.
type ratio struct {
	label    string
	num, den string
	target   float64
}

// ratios returns the targets, naming the many-users cases by their count.
func targetRatios(users int) []ratio {
	many := thousands(float64(users)) + " users"
	return []ratio{
		{"accepted ÷ bare Echo, 1 user, ceilings on", "acc1on", "echo", 0.35},
		{"accepted ÷ bare Echo, 1 user, ceilings off", "acc1off", "echo", 0.35},
		{"accepted ÷ bare Echo, " + many + ", ceilings on", "accNon", "echo", 0.35},
		{"accepted ÷ bare Echo, " + many + ", ceilings off", "accNoff", "echo", 0.35},
		{"rejected ÷ bare Echo, 1 key over its rate (429)", "rej429", "echo", 0.90},
		{"rejected ÷ bare Echo, random keys (401)", "rej401", "echo", 0.90},
		{"accepted ÷ redis_rate peer, 1 user, ceilings off", "acc1off", "peer", 2.0},
		{"accepted ÷ redis_rate peer, 1 user, ceilings on", "acc1on", "peer", 1.5},
	}
}

func metLabel(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

// print writes the report's tables.
func (r *report) print(w io.Writer) {
	p := r.plan
	fmt.Fprintf(w, "Breakwater benchmark (bench/load), %s, %s\n", r.form, r.started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "machine: %s\n", machine())
	fmt.Fprintf(w, "load: %d keep-alive connections, one request in flight each, from this Go program on the same %d cores as the servers; 127.0.0.1 only\n",
		p.clients, runtime.NumCPU())
	if !p.openOnly {
		fmt.Fprintf(w, "rounds: %d, every case once per round (interleaved), %s measured per case after a %s warm-up; figures are medians of the rounds\n",
			p.rounds, p.duration, p.warmup)
	}
	fmt.Fprintf(w, "breakwater: simulated upstream at zero latency, POST /v1/ocr with a 64x32 PNG; many users = %s\n", thousands(float64(p.users)))
	if r.postgres != "" {
		fmt.Fprintf(w, "postgres: %s;\n  two instances share one database and the connections, half each; every case with the budget ceilings on\n", r.postgres)
		when := "the rounds"
		if p.openOnly {
			when = "the run"
		}
		fmt.Fprintf(w, "load average when %s started (1, 5, 15 min): %s\n", when, r.loadAvg)
	}
	fmt.Fprintln(w)
	if p.openOnly {
		r.printOpenLoop(w)
		r.printSerial(w)
		return
	}

	lw := r.labelWidth()
	fmt.Fprintf(w, "%-*s %8s %15s %9s %9s %7s %7s  %s\n", lw, "case", "req/s", "rounds' range", "p50", "p99", "srv cpu", "gen cpu", "answers")
	for _, c := range r.cases {
		f := r.figure(c.id)
		fmt.Fprintf(w, "%-*s %8s %15s %9s %9s %7.2f %7.2f  %s\n", lw, c.label, thousands(f.rps),
			thousands(f.minRPS)+"–"+thousands(f.maxRPS), roundDuration(f.p50), roundDuration(f.p99),
			f.srvCPU, f.genCPU, statusSummary(sample{statuses: f.statuses, errors: f.errors, expected: f.expected}))
	}
	fmt.Fprintln(w, "(req/s, p50, p99, cpu: medians over the rounds; srv cpu: cores used by the serving processes,")
	if r.postgres != "" {
		fmt.Fprintln(w, " both instances and PostgreSQL's processes together; gen cpu: cores used by the load generator)")
		r.printPostgres(w)
		return
	}
	fmt.Fprintln(w, " the peer's with its redis-server; gen cpu: cores used by the load generator)")

	fmt.Fprintf(w, "\n%-50s %7s %8s  %s\n", "ratio (req/s over req/s)", "value", "target", "")
	for _, q := range r.ratios() {
		fmt.Fprintf(w, "%-50s %7.2f %8s  %s\n", q.label, q.value, "≥ "+strconv.FormatFloat(q.target, 'f', 2, 64), metLabel(q.value >= q.target))
	}
	fmt.Fprintln(w)
	r.printControls(w)
	r.overhead.print(w)

	m := r.memory
	if len(m.activeKeys) == 0 {
		fmt.Fprintln(w, "\nmemory: not measured in this form (run without -quick, or add -mem)")
		return
	}
	const perKeyTarget = 1024.0 // bytes: 1 KiB per active user key or client IP
	fmt.Fprintf(w, "\n%-50s %12s %10s %12s %14s  %s\n", "memory (server RSS, VmRSS; anonymous, RssAnon)", "RSS /10,000", "RSS /one", "anon /one", "target", "")
	line := func(what string, pt memPoint, target bool) {
		per, anon := pt.per10k()/10_000, pt.anonPer10k()/10_000
		if !target {
			fmt.Fprintf(w, "%-50s %12s %10s %12s %14s\n", what, mib(int64(pt.per10k())), kib(per), kib(anon), "–")
			return
		}
		// The larger of the two is held to the target: RSS also drops
		// the database's mapped pages when bbolt maps a grown file anew,
		// which can hide the heap's growth.
		fmt.Fprintf(w, "%-50s %12s %10s %12s %14s  %s\n", what, mib(int64(pt.per10k())), kib(per), kib(anon), "≤ 1.00 KiB",
			metLabel(max(per, anon) <= perKeyTarget))
	}
	for i, pt := range m.activeKeys {
		line(fmt.Sprintf("%s user keys at rest (loaded, none used)", thousands(float64(pt.n))), m.keysAtRest[i], false)
		line(fmt.Sprintf("%s active user keys (one accepted read each)", thousands(float64(pt.n))), pt, true)
	}
	for _, pt := range m.clientIPs {
		line(fmt.Sprintf("%s client IPs (one wrong invite guess each)", thousands(float64(pt.n))), pt, true)
	}
	f := m.inFlight
	const flightTarget = 300_000_000 // bytes: 300 MB
	ok := f.peak <= flightTarget && f.completed == f.n
	fmt.Fprintf(w, "\n%s calls in flight (%s each, %d users × %d): peak RSS %s (%s before), %s per call;\n",
		thousands(float64(f.n)), f.latency, f.users, f.perUserCap, mib(f.peak), mib(f.base), kib(float64(f.peak-f.base)/float64(f.n)))
	fmt.Fprintf(w, "  %d/%d answered 200 within %s, at most %d at once. Target ≤ 300 MB and all answered: %s\n",
		f.completed, f.n, f.elapsed.Round(100*time.Millisecond), f.maxInFlight, metLabel(ok))
	if f.completed != f.n {
		fmt.Fprintf(w, "  answers: %s; first error: %v\n", statusSummary(sample{statuses: f.statuses, errors: f.errors}), f.firstErr)
	}
}

type ratioValue struct {
	ratio
	value float64
}

func (r *report) ratios() []ratioValue {
	var out []ratioValue
	for _, q := range targetRatios(r.plan.users) {
		v := 0.0
		if d := r.figure(q.den).rps; d > 0 {
			v = r.figure(q.num).rps / d
		}
		out = append(out, ratioValue{q, v})
	}
	return out
}

// problems reports a case whose answers were not what it measures (the
// figures would then describe another path).
func (r *report) problems() error {
	var errs []error
	for _, c := range r.measuredCases() {
		f := r.figure(c.id)
		if f.expected < 0.99 || len(r.samples[c.id]) == 0 || f.rps == 0 {
			errs = append(errs, fmt.Errorf("case %q: %.1f%% of answers were %d (%s), first error %v",
				c.label, 100*f.expected, c.expect, statusSummary(sample{statuses: f.statuses, errors: f.errors, expected: f.expected}), f.firstErr))
		}
		if f.commitErr != nil {
			errs = append(errs, fmt.Errorf("case %q: %w", c.label, f.commitErr))
		}
	}
	if o := r.overhead; o.series != nil && (o.expected < 0.99 || o.series[guardSeries].count() == 0) {
		errs = append(errs, fmt.Errorf("half load: %.1f%% of answers were 200, %.0f guard observations", 100*o.expected,
			o.series[guardSeries].count()))
	}
	if r.postgres != "" {
		errs = append(errs, r.pgProblems())
	}
	for _, pt := range append(r.memory.activeKeys, r.memory.clientIPs...) {
		if pt.expected < 0.99 {
			errs = append(errs, fmt.Errorf("memory step of %d: answers %s", pt.n, statusSummary(sample{statuses: pt.statuses, errors: pt.errors})))
		}
	}
	return errors.Join(errs...)
}

// measuredCases are the cases the rounds measured: none with -open.
func (r *report) measuredCases() []tcase {
	if r.plan.openOnly {
		return nil
	}
	return r.cases
}

// statusSummary is "100% 200" or "97.0% 200, 2.9% 503, 1 errors".
func statusSummary(s sample) string {
	var total int64
	for _, n := range s.statuses {
		total += n
	}
	var parts []string
	for _, code := range sortedKeys(s.statuses) {
		share := 100 * float64(s.statuses[code]) / float64(total)
		if share == 100 {
			parts = append(parts, fmt.Sprintf("100%% %d", code))
		} else {
			parts = append(parts, fmt.Sprintf("%.1f%% %d", share, code))
		}
	}
	if s.errors > 0 {
		parts = append(parts, fmt.Sprintf("%d errors", s.errors))
	}
	if len(parts) == 0 {
		return "no answers"
	}
	return strings.Join(parts, ", ")
}

// sortedKeys returns the status codes, those with the most answers first.
func sortedKeys(m map[int]int64) []int {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b int) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	return keys
}

// roundDuration prints a latency with three significant digits.
func roundDuration(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	}
}

func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b float64) string {
	return fmt.Sprintf("%.2f KiB", b/1024)
}

// machine describes this machine in one line: cores, memory, kernel, Go.
func machine() string {
	memTotal := "?"
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				memTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d cores (nproc), %s RAM, Linux %s, %s %s/%s", runtime.NumCPU(), memTotal,
		strings.TrimSpace(string(kernel)), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
