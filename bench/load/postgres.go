package main

// The postgres cases (-postgres, issues 28 and 29): the accepted path with
// the ceilings on, served by one instance on BoltDB, one instance on
// PostgreSQL, and two instances sharing one PostgreSQL database (the
// clients split between them, the same number in all), and the refusals
// (pgrefusals.go) on bolt and on two instances, interleaved in the same
// rounds. For the cases on PostgreSQL the harness counts the database's
// transactions (pg_stat_database) per accepted read or per 1,000
// refusals, and for every accepted case it reads where a read's time goes
// from the instances' own histograms. After the rounds: the highest
// constant rate within a p99 bound and the p99 the guard adds at one
// client (openloop.go).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
)

// pgStatsSettle is how long the harness waits after a case on PostgreSQL
// before it reads the database's transactions: a backend reports its
// counts when its session goes idle, at most once a second.
const pgStatsSettle = 1500 * time.Millisecond

// pgPlan is the postgres cases' full run: short cases, the database
// sharing the cores with everything else.
var pgPlan = plan{rounds: 3, warmup: time.Second, duration: 3 * time.Second, clients: 64, users: 1000,
	openStep: 2 * time.Second, openStart: 250, openCeiling: 64_000, openBisect: 5, openConns: 256, openTries: 3,
	serial: 3 * time.Second}

// diskProbes is how many flushes give the disk's p99 beside the one-client
// figures.
const diskProbes = 2000

// pgServer is the PostgreSQL server of the postgres cases: a throwaway
// cluster the harness started, or the server -postgres-url names.
type pgServer struct {
	admin   string          // the URL of a role that may create databases
	cluster *pgtest.Cluster // nil with -postgres-url
	dbs     []string        // the databases made, dropped at the end
	version string
	pinned  *pinning // -pin: where the cluster and the rest run
}

// pin puts the cluster on a core of its own and the rest on the others
// (-pin); it needs a cluster the harness started.
func (s *pgServer) pin() error {
	if s.cluster == nil {
		return errors.New("-pin pins a cluster the harness starts: leave -postgres-url out")
	}
	p, err := newPinning()
	if err != nil {
		return err
	}
	if err := p.apply(s.cluster.PID()); err != nil {
		return err
	}
	s.pinned = &p
	return nil
}

// startPostgres returns the server at adminURL, or starts a throwaway
// cluster when adminURL is empty.
func startPostgres(adminURL string, progress func(string, ...any)) (*pgServer, error) {
	s := &pgServer{admin: adminURL}
	if adminURL == "" {
		progress("starting a throwaway PostgreSQL cluster")
		c, err := pgtest.Start()
		if err != nil {
			return nil, fmt.Errorf("the postgres cases need PostgreSQL and none could be started (pass -postgres-url, or install Debian's postgresql): %w", err)
		}
		s.admin, s.cluster = c.URL("postgres"), c
	}
	err := s.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SHOW server_version").Scan(&s.version)
	})
	return s, err
}

// withConn runs f on a fresh connection to the admin URL.
func (s *pgServer) withConn(f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return fmt.Errorf("postgres: connect: %w", err)
	}
	defer conn.Close(ctx)
	return f(ctx, conn)
}

// newDatabase creates an empty database for a case; label says what
// serves it, in the report.
func (s *pgServer) newDatabase(name, label string) (*pgDatabase, error) {
	var r [4]byte
	_, _ = rand.Read(r[:])
	name = "bench_" + name + "_" + hex.EncodeToString(r[:])
	err := s.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: create database: %w", err)
	}
	s.dbs = append(s.dbs, name)
	u, err := url.Parse(s.admin)
	if err != nil {
		return nil, errors.New("postgres: the admin URL does not parse")
	}
	u.Path = "/" + name
	return &pgDatabase{name: name, label: label, url: u.String(), server: s}, nil
}

// close drops the databases made (stopping the cluster, if the harness
// started one, drops everything).
func (s *pgServer) close() {
	if s == nil {
		return
	}
	if s.cluster != nil {
		s.cluster.Remove()
		return
	}
	for _, name := range s.dbs {
		_ = s.withConn(func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			return err
		})
	}
}

// cpu is the CPU time of the cluster's server: the postmaster, its live
// children (the backends, the WAL writer, the checkpointer) and the
// children it has reaped. Zero for a server the harness did not start.
func (s *pgServer) cpu() time.Duration {
	if s.cluster == nil {
		return 0
	}
	pm := s.cluster.PID()
	_, own, reaped, _ := pgtest.ProcCPU(pm)
	total := own + reaped
	for _, pid := range childrenOf(pm) {
		if _, t, _, ok := pgtest.ProcCPU(pid); ok {
			total += t
		}
	}
	return total
}

// pgDatabase is one case's database.
type pgDatabase struct {
	name, label, url string
	server           *pgServer
}

// pgCounts are a postgres case's whole-case counters at one moment.
type pgCounts struct {
	commits, rollbacks, served float64
	err                        error
}

// counts reads the database's transactions, committed and rolled back
// (pg_stat_database, from a session on another database, so that reading
// adds none), and the accepted reads (or, for a refusal case, the
// refusals) c's instances have counted.
func (d *pgDatabase) counts(c tcase) pgCounts {
	var out pgCounts
	for _, bw := range c.instances() {
		count := bw.acceptedReads
		if c.refusals {
			count = bw.refusals
		}
		n, err := count()
		out.served += n
		out.err = errors.Join(out.err, err)
	}
	var err error
	out.commits, out.rollbacks, err = d.xacts()
	out.err = errors.Join(out.err, err)
	return out
}

// xacts reads the database's transactions committed and rolled back.
func (d *pgDatabase) xacts() (commits, rollbacks float64, err error) {
	err = d.server.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		var c, r int64
		err := conn.QueryRow(ctx, "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", d.name).Scan(&c, &r)
		commits, rollbacks = float64(c), float64(r)
		return err
	})
	return commits, rollbacks, err
}

// transactions is the database's transactions so far, committed and
// rolled back.
func (d *pgDatabase) transactions() (float64, error) {
	c, r, err := d.xacts()
	return c + r, err
}

// acceptedReads is the instance's count of successful upstream calls,
// summed over the series of every model (primary and fallback); 0: no
// call yet.
func (b *breakwater) acceptedReads() (float64, error) {
	return b.sumSeries("breakwater_upstream_calls_total", `outcome="ok"`)
}

// sumSeries sums the instance's series of the metric name whose labels
// hold want ("": every series).
func (b *breakwater) sumSeries(name, want string) (float64, error) {
	body, err := b.metrics()
	if err != nil {
		return 0, err
	}
	total := 0.0
	for line := range strings.Lines(string(body)) {
		series, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, labels, _ := strings.Cut(series, "{")
		if n != name || !strings.Contains(labels, want) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: metrics: %q: %w", b.name, line, err)
		}
		total += v
	}
	return total, nil
}

// stageSeries are the histograms that say where an accepted read's time
// goes, in the order printed.
var stageSeries = []struct{ name, label string }{
	{guardSeries, "guard"},
	{"breakwater_reservation_commit_seconds", "of which commit"},
	{usageSeries, "usage record"},
}

// stageSum is one histogram's sum of seconds and count.
type stageSum struct{ sum, count float64 }

// stageSums reads the stage histograms' sums and counts.
func (b *breakwater) stageSums() (map[string]stageSum, error) {
	body, err := b.metrics()
	if err != nil {
		return nil, err
	}
	out := map[string]stageSum{}
	for line := range strings.Lines(string(body)) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		for _, s := range stageSeries {
			var dst *float64
			st := out[s.name]
			switch name {
			case s.name + "_sum":
				dst = &st.sum
			case s.name + "_count":
				dst = &st.count
			default:
				continue
			}
			if *dst, err = strconv.ParseFloat(value, 64); err != nil {
				return nil, fmt.Errorf("%s: metrics: %q: %w", b.name, line, err)
			}
			out[s.name] = st
		}
	}
	return out, nil
}

func addStages(a, b map[string]stageSum) map[string]stageSum {
	out := map[string]stageSum{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = stageSum{out[k].sum + v.sum, out[k].count + v.count}
	}
	return out
}

func subStages(a, b map[string]stageSum) map[string]stageSum {
	if a == nil {
		return nil
	}
	out := map[string]stageSum{}
	for k, v := range a {
		out[k] = stageSum{v.sum - b[k].sum, v.count - b[k].count}
	}
	return out
}

// generateSplit runs l with its clients split between l.addr and other,
// the two halves taking the requests in turn (even numbers to the first,
// odd to the second, so that they do not send the same user's key at the
// same moment), and merges what they measured.
func generateSplit(l load, other string) outcome {
	first, second := l, l
	first.clients, second.clients = (l.clients+1)/2, l.clients/2
	second.addr = other
	first.request = func(buf []byte, seq int64, s *clientScratch) []byte { return l.request(buf, 2*seq, s) }
	second.request = func(buf []byte, seq int64, s *clientScratch) []byte { return l.request(buf, 2*seq+1, s) }
	var a, b outcome
	var wg sync.WaitGroup
	wg.Go(func() { a = generate(first) })
	b = generate(second)
	wg.Wait()
	o := outcome{requests: a.requests + b.requests, elapsed: a.elapsed, statuses: map[int]int64{}, errors: a.errors + b.errors}
	o.latencies = mergeSorted(a.latencies, b.latencies)
	for _, x := range []outcome{a, b} {
		for s, n := range x.statuses {
			o.statuses[s] += n
		}
		if o.firstErr == nil {
			o.firstErr = x.firstErr
		}
	}
	return o
}

func mergeSorted(a, b []time.Duration) []time.Duration {
	out := make([]time.Duration, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0] <= b[0] {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// mean is the mean latency of the counted answers.
func (o outcome) mean() time.Duration {
	if len(o.latencies) == 0 {
		return 0
	}
	var total time.Duration
	for _, d := range o.latencies {
		total += d
	}
	return total / time.Duration(len(o.latencies))
}

// setupPostgres builds breakwater, starts or reaches PostgreSQL, and
// starts the instances of the postgres cases: for the accepted path one
// on bolt, one on a database of its own, two on another; for the
// refusals one on bolt and two on a third database; and a bare Echo
// handler, the direct path the guard's added p99 is taken against.
func setupPostgres(p plan, root, dir, adminURL string, progress func(string, ...any)) (*bench, error) {
	b := &bench{plan: p, dir: dir, progress: progress}
	progress("building breakwater from %s", root)
	var err error
	if b.bin, err = buildBreakwater(root, dir); err != nil {
		return b, err
	}
	if b.pg, err = startPostgres(adminURL, progress); err != nil {
		return b, err
	}
	if p.pin {
		if err := b.pg.pin(); err != nil {
			return b, err
		}
		progress("%s", b.pg.pinned)
	}
	var dbs [3]*pgDatabase
	for i, name := range []string{"one", "two", "rej"} {
		label := [...]string{"1 instance, accepted", "2 instances, accepted", "2 instances, refusals"}[i]
		if dbs[i], err = b.pg.newDatabase(name, label); err != nil {
			return b, err
		}
	}
	accepted := bwConfig{rate: 100_000, window: "1s", burst: 100_000, inFlightPerUser: 1024, maxConnections: 8192, ceilings: true,
		pprof: b.plan.profile != ""}
	groups := []struct {
		names []string
		db    *pgDatabase
	}{{[]string{"bolt"}, nil}, {[]string{"postgres-1"}, dbs[0]}, {[]string{"postgres-2a", "postgres-2b"}, dbs[1]}}
	img := testPNG()
	var cases []tcase
	for _, g := range groups {
		insts, one, many, err := b.startGroup(g.names, g.db, accepted, b.plan.users)
		if err != nil {
			return b, err
		}
		cases = append(cases, b.pgCases(insts, g.db, img, one, many)...)
	}
	// One user's cases first, then the many users', so that a round
	// starting one case later still runs each kind on every backend.
	b.cases = []tcase{cases[0], cases[2], cases[4], cases[1], cases[3], cases[5]}
	for _, g := range []struct {
		names []string
		db    *pgDatabase
	}{{[]string{"bolt-rejecting"}, nil}, {[]string{"postgres-rej-a", "postgres-rej-b"}, dbs[2]}} {
		insts, key, _, err := b.startGroup(g.names, g.db, rejectingConfig(b.plan.profile != ""), 0)
		if err != nil {
			return b, err
		}
		rc, err := b.refusalCases(insts, g.db, img, key)
		if err != nil {
			return b, err
		}
		cases = append(cases, rc...)
	}
	// The 429s of both backends, then the 401s.
	b.cases = append(b.cases, cases[6], cases[8], cases[7], cases[9])
	if p.openStep > 0 {
		progress("starting bare Echo (the direct path, for the guard's added p99)")
		if b.echo, b.echoAddr, err = startChild("echo", b.dir); err != nil {
			return b, err
		}
	}
	// The setup's own transactions (the keys made) are counted by the
	// time the instances' sessions have been idle a moment.
	time.Sleep(pgStatsSettle)
	return b, nil
}

// startGroup starts the instances of one backend (on db, or bolt when it
// is nil) with cfg and makes the keys: one user's with the first instance
// stopped, then users many users' through its admin API. A second
// instance must take the last key (or the one user's) before the rounds
// start.
func (b *bench) startGroup(names []string, db *pgDatabase, cfg bwConfig, users int) ([]*breakwater, string, []string, error) {
	if db != nil {
		cfg.postgresURL = db.url
	}
	var insts []*breakwater
	for _, name := range names {
		bw, err := newBreakwater(name, b.bin, filepath.Join(b.dir, name), cfg)
		if err != nil {
			return nil, "", nil, err
		}
		insts = append(insts, bw)
	}
	key, err := insts[0].createKeyStopped("bench-one")
	if err != nil {
		return nil, "", nil, err
	}
	var many []string
	for i, bw := range insts {
		b.progress("starting breakwater (%s) on %s", bw.name, bw.addr)
		if err := bw.start(); err != nil {
			return nil, "", nil, err
		}
		b.others = append(b.others, bw)
		if i == 0 {
			if users > 0 {
				if many, err = bw.createKeys(userIDs("bench-many-", users)); err != nil {
					return nil, "", nil, err
				}
			}
			continue
		}
		if users > 0 {
			err = waitAccepted(bw, many[len(many)-1])
		} else {
			err = waitKnown(bw, key)
		}
		if err != nil {
			return nil, "", nil, err
		}
	}
	return insts, key, many, nil
}

// waitKnown sends one read with key to bw until it is not refused as
// unknown (401), for at most 10 s.
func waitKnown(bw *breakwater, key string) error {
	req := oneOf(ocrRequest(bw.addr, key, testPNG()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := generate(load{addr: bw.addr, clients: 1, total: 1, request: req})
		if out.errors == 0 && out.statuses[http.StatusUnauthorized] == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the key still gets %v (errors %d: %v) after 10 s", bw.name, out.statuses, out.errors, out.firstErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitAccepted sends one read with key to bw until it is accepted, for at
// most 10 s: the key was made through another instance.
func waitAccepted(bw *breakwater, key string) error {
	req := oneOf(ocrRequest(bw.addr, key, testPNG()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := generate(load{addr: bw.addr, clients: 1, total: 1, request: req})
		if out.statuses[http.StatusOK] == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: a key made through the other instance still gets %v (errors %d: %v) after 10 s",
				bw.name, out.statuses, out.errors, out.firstErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// baseCase is what every case on insts (sharing db, nil on bolt) has in
// common: the instances it sends to and measures, and the database's CPU.
func (b *bench) baseCase(insts []*breakwater, db *pgDatabase) tcase {
	c := tcase{addr: insts[0].addr, bw: insts[0], pg: db,
		pids: func() []int {
			var out []int
			for _, bw := range insts {
				out = append(out, bw.proc.pid())
			}
			return out
		}}
	if len(insts) > 1 {
		c.also = insts[1]
	}
	if db != nil {
		c.extraCPU = b.pg.cpu
	}
	return c
}

// pgCases are one backend's two cases: one user, and many users in turn.
func (b *bench) pgCases(insts []*breakwater, db *pgDatabase, img []byte, one string, many []string) []tcase {
	backend := "bolt, 1 instance"
	id := "bolt"
	switch {
	case db != nil && len(insts) == 1:
		backend, id = "postgres, 1 instance", "pg1"
	case db != nil:
		backend, id = "postgres, 2 instances", "pg2"
	}
	first := insts[0]
	base := b.baseCase(insts, db)
	base.expect = http.StatusOK
	reqs := make([][]byte, len(many))
	for i, k := range many {
		reqs[i] = ocrRequest(first.addr, k, img)
	}
	c1, cN := base, base
	c1.id, c1.label, c1.request = id+"-1", "accepted, 1 user, "+backend, oneOf(ocrRequest(first.addr, one, img))
	cN.id, cN.label, cN.request = id+"-N", "accepted, "+thousands(float64(b.plan.users))+" users, "+backend, oneOf(reqs...)
	return []tcase{c1, cN}
}

// benchmarkPostgres runs the postgres cases.
func benchmarkPostgres(p plan, root, dir, adminURL string, progress func(string, ...any)) (*report, error) {
	b, err := setupPostgres(p, root, dir, adminURL, progress)
	defer b.close()
	if err != nil {
		return nil, err
	}
	r := &report{plan: p, started: time.Now().UTC(), cases: b.cases, postgres: b.pg.describe(), loadAvg: loadAverage(),
		pgCPUCounted: b.pg.cluster != nil}
	var floorErr error
	if !p.openOnly {
		r.samples = b.rounds()
		r.idle = b.idle
		r.profiles = b.profiles
		r.floor, floorErr = b.floorCPU()
	}
	if p.openStep > 0 {
		r.open, r.serial, err = b.openFigures()
		if err == nil {
			r.disk, err = probeDisk(b.dir, diskProbes)
		}
	}
	return r, errors.Join(err, floorErr, b.profileErr, b.idleErr)
}

// openFigures runs, after the rounds, the open-loop searches of the
// accepted path with many users on bolt and on two postgres instances,
// their steps in turn, then one client's serial requests direct to bare
// Echo and through the one-user case of each, the paths in turn.
func (b *bench) openFigures() ([]openLoopFigure, []serialFigure, error) {
	find := func(id string) tcase {
		for _, c := range b.cases {
			if c.id == id {
				return c
			}
		}
		panic("no case " + id) // the ids are the harness's own
	}
	cs := []tcase{find("bolt-N"), find("pg2-N")}
	open := make([]openLoopFigure, len(cs))
	b.progress("open loop: %s and %s, their steps in turn", cs[0].label, cs[1].label)
	t := newTurns(len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			defer t.done(i)
			open[i] = b.openLoop(c, backendOf(c), func(f func()) { t.take(i, f) })
		})
	}
	wg.Wait()
	paths := []serialPath{{label: "bare Echo (direct, no guard)", addrs: []string{b.echoAddr},
		request: oneOf(ocrRequest(b.echoAddr, "bw_none", testPNG())), expect: http.StatusOK}}
	for _, id := range []string{"bolt-1", "pg2-1"} {
		c := find(id)
		var addrs []string
		for _, bw := range c.instances() {
			addrs = append(addrs, bw.addr)
		}
		paths = append(paths, serialPath{label: backendOf(c), addrs: addrs, insts: c.instances(), request: c.request, expect: c.expect})
	}
	serial, err := b.serialRuns(paths)
	return open, serial, err
}

// backendOf names what serves c: "bolt, 1 instance", "postgres, 2
// instances".
func backendOf(c tcase) string {
	n := len(c.instances())
	unit := " instance"
	if n > 1 {
		unit = " instances"
	}
	if c.pg == nil {
		return "bolt, " + strconv.Itoa(n) + unit
	}
	return "postgres, " + strconv.Itoa(n) + unit
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return "unknown"
}

// describe says which server the postgres cases ran on.
func (s *pgServer) describe() string {
	if s.pinned != nil {
		return fmt.Sprintf("PostgreSQL %s, a throwaway cluster (initdb's defaults: fsync and synchronous_commit on), %s (-pin); srv cpu counts its processes", s.version, s.pinned)
	}
	if s.cluster != nil {
		return fmt.Sprintf("PostgreSQL %s, a throwaway cluster on the same cores (initdb's defaults: fsync and synchronous_commit on); srv cpu counts its processes", s.version)
	}
	return fmt.Sprintf("PostgreSQL %s at -postgres-url; srv cpu does not count it", s.version)
}

// pgRatios are the postgres cases' targets (issues 28 and 29) and two
// figures shown beside them.
func pgRatios(users int) []ratio {
	many := thousands(float64(users)) + " users"
	return []ratio{
		{"postgres, 2 instances ÷ bolt, 1 user", "pg2-1", "bolt-1", 0.5},
		{"postgres, 2 instances ÷ bolt, " + many, "pg2-N", "bolt-N", 0.5},
		{"postgres, 1 instance ÷ bolt, 1 user", "pg1-1", "bolt-1", 0},
		{"postgres, 1 instance ÷ bolt, " + many, "pg1-N", "bolt-N", 0},
		{"refusals (429), postgres, 2 instances ÷ bolt", "pg2-429", "bolt-429", minRefusalRatio},
		{"refusals (401), postgres, 2 instances ÷ bolt", "pg2-401", "bolt-401", minRefusalRatio},
	}
}

// maxTxPerRead is issue 29's bound on PostgreSQL transactions per
// accepted read (issue 28's was 1.2, before the limits were shared).
const maxTxPerRead = 1.5

// stageMean is a case's median over the rounds of a stage's mean time.
func (r *report) stageMean(id, name string) time.Duration {
	var vs []time.Duration
	for _, s := range r.samples[id] {
		if st := s.stages[name]; st.count > 0 {
			vs = append(vs, time.Duration(st.sum/st.count*float64(time.Second)))
		}
	}
	return median(vs)
}

// printPostgres writes the postgres cases' tables after the case table.
func (r *report) printPostgres(w io.Writer) {
	fmt.Fprintf(w, "\n%-50s %7s %8s  %s\n", "ratio (req/s over req/s)", "value", "target", "")
	for _, q := range pgRatios(r.plan.users) {
		v := 0.0
		if d := r.figure(q.den).rps; d > 0 {
			v = r.figure(q.num).rps / d
		}
		if q.target == 0 {
			fmt.Fprintf(w, "%-50s %7.2f %8s\n", q.label, v, "–")
			continue
		}
		fmt.Fprintf(w, "%-50s %7.2f %8s  %s\n", q.label, v, "≥ "+strconv.FormatFloat(q.target, 'f', 2, 64), metLabel(v >= q.target))
	}
	r.printIdle(w)
	r.printTxPerRead(w)
	r.printFloor(w)
	r.printTxPerRefusals(w)
	r.printStages(w)
	r.printOpenLoop(w)
	r.printSerial(w)
}

// printIdle writes the idle rate of each case database.
func (r *report) printIdle(w io.Writer) {
	fmt.Fprintf(w, "\nidle: the transactions of each case's database with no request (the instances' background work: heartbeats,\n")
	fmt.Fprintf(w, " refreshes, the budget's totals), over an idle interval as long as a case (%s) after each round; medians\n", r.plan.caseSpan())
	seen := map[*pgDatabase]bool{}
	for _, c := range r.cases {
		if c.pg == nil || seen[c.pg] {
			continue
		}
		seen[c.pg] = true
		rate, ok := r.idleRate(c.pg)
		if !ok {
			fmt.Fprintf(w, "  %-40s not measured\n", "postgres, "+c.pg.label)
			continue
		}
		fmt.Fprintf(w, "  %-40s %6.2f tx/s\n", "postgres, "+c.pg.label, rate)
	}
}

// printTxPerRead writes the accepted cases' transactions per read, with
// the idle rate's share and without it.
func (r *report) printTxPerRead(w io.Writer) {
	fmt.Fprintln(w, "\nPostgreSQL transactions per accepted read (pg_stat_database: xact_commit + xact_rollback of the case's database")
	fmt.Fprintln(w, " over the whole case, warm-up and background work included, over the reads its instances counted; medians)")
	lw := r.labelWidth()
	fmt.Fprintf(w, "%-*s %8s %6s %9s %8s  %-17s %8s %8s %9s %7s\n", lw, "case", "tx/read", "idle", "w/o idle", "target", "  the target,",
		"rolled", "commits", "writes", "pg cpu")
	fmt.Fprintf(w, "%-*s %8s %6s %9s %8s  %-8s %-8s %8s %8s %9s %7s\n", lw, "", "", "", "", "", "with", "w/o idle", "back", "/read", "/commit", "")
	for _, c := range r.cases {
		if c.pg == nil || c.refusals {
			continue
		}
		f := r.figure(c.id)
		with, idle, without, ok := r.txPer(c)
		perRead, perCommit := 0.0, 0.0
		if f.rps > 0 && f.commits > 0 {
			perRead, perCommit = f.commits/f.rps, f.writes/f.commits
		}
		fmt.Fprintf(w, "%-*s %8.2f %6.2f %9.2f %8s  %-8s %-8s %7.1f%% %8.2f %9.1f %7s\n", lw, c.label, with, idle, without,
			"≤ "+strconv.FormatFloat(maxTxPerRead, 'f', 1, 64), metLabel(ok && with <= maxTxPerRead), metLabel(ok && without <= maxTxPerRead),
			r.rolledBack(c.id), perRead, perCommit, r.pgCPU(c.id))
	}
	fmt.Fprintln(w, "(idle: the idle rate over the case's span, per read; w/o idle: tx/read less it; the target, with and w/o idle: met on each;")
	fmt.Fprintln(w, " rolled back: the share of the transactions; commits/read and writes/commit: the instances' own group-commit")
	fmt.Fprintln(w, " counters over the measured time; pg cpu: cores used by PostgreSQL's processes, a part of srv cpu)")
}

// printTxPerRefusals writes the refusal cases' transactions per 1,000
// refusals, with the idle rate's share and without it.
func (r *report) printTxPerRefusals(w io.Writer) {
	fmt.Fprintln(w, "\nPostgreSQL transactions per 1,000 refusals (the same count, over the refusals its instances counted,")
	fmt.Fprintln(w, " breakwater_refusals_total; medians)")
	lw := r.labelWidth()
	fmt.Fprintf(w, "%-*s %10s %8s %8s %6s %9s %8s  %-17s %7s\n", lw, "case", "refusals", "tx", "tx/1000", "idle", "w/o idle",
		"target", "  the target,", "pg cpu")
	fmt.Fprintf(w, "%-*s %10s %8s %8s %6s %9s %8s  %-8s %-8s %7s\n", lw, "", "", "", "", "", "", "", "with", "w/o idle", "")
	for _, c := range r.cases {
		if c.pg == nil || !c.refusals {
			continue
		}
		with, idle, without, ok := r.txPer(c)
		var refused, tx []float64
		for _, s := range r.samples[c.id] {
			refused, tx = append(refused, s.served), append(tx, s.pgCommits+s.pgRollbacks)
		}
		fmt.Fprintf(w, "%-*s %10s %8s %8.2f %6.2f %9.2f %8s  %-8s %-8s %7s\n", lw, c.label, thousands(median(refused)), thousands(median(tx)),
			1000*with, 1000*idle, 1000*without, "≤ "+strconv.FormatFloat(maxTxPerThousandRefusals, 'f', 1, 64),
			metLabel(ok && 1000*with <= maxTxPerThousandRefusals), metLabel(ok && 1000*without <= maxTxPerThousandRefusals), r.pgCPU(c.id))
	}
	fmt.Fprintln(w, "(refusals, tx: per round, over the case's span; idle: the idle rate over that span, per 1,000; w/o idle: tx/1000 less it;")
	fmt.Fprintln(w, " the target is issue 29's for a cached key, the 429s; the random keys are held to it too; the statistics tally refusals")
	fmt.Fprintln(w, " per minute and write them at the minute's turn, in whichever case or idle interval spans it)")
}

// pgCPU is a case's median PostgreSQL CPU, "–" for a server the harness
// did not start.
func (r *report) pgCPU(id string) string {
	if !r.pgCPUCounted {
		return "–"
	}
	return strconv.FormatFloat(median(r.pgCPUs(id)), 'f', 2, 64)
}

// printStages writes where an accepted read's time goes.
func (r *report) printStages(w io.Writer) {
	lw := r.labelWidth()
	fmt.Fprintln(w, "\nwhere the time goes (mean per accepted read over the measured time; the instances' histograms, the client's latency)")
	fmt.Fprintf(w, "%-*s %9s %14s %16s %14s %14s\n", lw, "case", "latency", "guard", "of which commit", "usage record", "the rest")
	for _, c := range r.cases {
		if c.refusals {
			continue
		}
		lat := r.meanLatency(c.id)
		guard, lease, usage := r.stageMean(c.id, stageSeries[0].name), r.stageMean(c.id, stageSeries[1].name), r.stageMean(c.id, stageSeries[2].name)
		share := func(d time.Duration) string {
			if lat <= 0 {
				return roundDuration(d)
			}
			return fmt.Sprintf("%s %3.0f%%", roundDuration(d), 100*float64(d)/float64(lat))
		}
		fmt.Fprintf(w, "%-*s %9s %14s %16s %14s %14s\n", lw, c.label, roundDuration(lat), share(guard), share(lease), share(usage), share(max(lat-guard-usage, 0)))
	}
	fmt.Fprintln(w, "(guard: arrival to the committed reservation, the upload excluded: the layers, the attempt and quota slot, the budget;")
	fmt.Fprintln(w, " of which commit: the wait for the reservation's commit; usage record: its commit wait after the call;")
	fmt.Fprintln(w, " the rest: latency less guard and usage record: the HTTP exchange, the upload, the simulated call, queueing for the cores)")
}

// rolledBack is the share of a postgres case's transactions that were
// rolled back, over all its rounds.
func (r *report) rolledBack(id string) float64 {
	var all, back float64
	for _, s := range r.samples[id] {
		all, back = all+s.pgCommits+s.pgRollbacks, back+s.pgRollbacks
	}
	if all == 0 {
		return 0
	}
	return 100 * back / all
}

func (r *report) pgCPUs(id string) []float64 {
	var vs []float64
	for _, s := range r.samples[id] {
		vs = append(vs, s.pgCPU)
	}
	return vs
}

// labelWidth is the width of the case column: the longest label.
func (r *report) labelWidth() int {
	w := 42
	for _, c := range r.cases {
		w = max(w, utf8.RuneCountInString(c.label))
	}
	return w
}

// meanLatency is a case's median over the rounds of its mean latency.
func (r *report) meanLatency(id string) time.Duration {
	var vs []time.Duration
	for _, s := range r.samples[id] {
		vs = append(vs, s.mean)
	}
	return median(vs)
}

// pgProblems reports a postgres case whose transactions could not be
// counted.
func (r *report) pgProblems() error {
	var errs []error
	for _, c := range r.measuredCases() {
		if c.pg == nil {
			continue
		}
		for _, s := range r.samples[c.id] {
			if s.pgErr != nil {
				errs = append(errs, fmt.Errorf("case %q: %w", c.label, s.pgErr))
			}
		}
		if _, _, _, ok := r.txPer(c); !ok {
			errs = append(errs, fmt.Errorf("case %q: no answer of its kind counted by its instances", c.label))
		}
		if _, ok := r.idleRate(c.pg); !ok {
			errs = append(errs, fmt.Errorf("case %q: its database's idle rate was not measured", c.label))
		}
	}
	for _, f := range r.open {
		if len(f.search.steps) == 0 {
			errs = append(errs, fmt.Errorf("open loop, %s: no step ran", f.label))
		}
	}
	for _, f := range r.serial {
		if f.out.requests == 0 || f.expected < 0.99 {
			errs = append(errs, fmt.Errorf("one client, %s: %s, first error %v", f.label,
				statusSummary(sample{statuses: f.out.statuses, errors: f.out.errors}), f.out.firstErr))
		}
	}
	return errors.Join(errs...)
}
