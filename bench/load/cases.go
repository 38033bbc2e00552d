package main

// The cases: what each one sends to which server, the rounds that
// interleave them, and the memory figures.

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// plan is how much the harness measures: the full run, -quick, or the
// smoke test's.
type plan struct {
	rounds           int           // every case once per round
	warmup, duration time.Duration // per case and round
	clients          int           // concurrent keep-alive connections
	users            int           // users of the many-users cases
	activeKeys       []int         // memory: active user keys, ascending (none: no memory figures)
	clientIPs        []int         // memory: client IPs, ascending
	memWarmup        int           // memory: keys or IPs served before the base reading, not counted
	memChurn         int           // memory: GET /healthz sent before each reading, so that the heap has cycled
	inFlight         int           // memory: upstream calls in flight at once
	inFlightLatency  time.Duration // memory: how long each of them takes
	settle           time.Duration // memory: wait before reading RSS (the write-behind runs every second)
	profile          string        // a folder for CPU profiles of the first round's Breakwater cases ("": none)
	// The open-loop figures (-postgres): each step of the search for the
	// highest constant rate within the p99 bound lasts openStep; the
	// rate starts at openStart, doubles up to openCeiling, then is
	// bisected openBisect times; openConns connections in all; a step
	// sends at least openMinRequests (0: minStepRequests), openTries times
	// (0: once), and counts the median try's p99. serial is how long one
	// client sends for the p99 the guard adds. A zero openStep leaves both
	// figures out.
	openStep               time.Duration
	openStart, openCeiling float64
	openBisect, openConns  int
	openMinRequests        int
	openTries              int
	serial                 time.Duration
	pin                    bool // -pin: PostgreSQL on a core of its own
	openOnly               bool // -open: the open-loop and one-client figures alone
}

var (
	fullPlan = plan{
		rounds: 5, warmup: time.Second, duration: 4 * time.Second, clients: 64, users: 1000,
		activeKeys: []int{10_000, 100_000}, clientIPs: []int{10_000, 100_000}, memWarmup: 1000, memChurn: 40_000,
		inFlight: 4000, inFlightLatency: 5 * time.Second, settle: 2 * time.Second,
	}
	quickPlan = plan{
		rounds: 2, warmup: 300 * time.Millisecond, duration: 1500 * time.Millisecond, clients: 64, users: 1000,
		openStep: 500 * time.Millisecond, openStart: 250, openCeiling: 64_000, openBisect: 3, openConns: 256, openTries: 3, serial: time.Second,
	}
)

// tcase is one throughput case.
type tcase struct {
	id      string // names the case in ratios
	label   string
	addr    string
	bw      *breakwater  // the instance that serves it; nil for the peers
	pids    func() []int // the processes that serve it, for their CPU time
	request func(buf []byte, seq int64, s *clientScratch) []byte
	expect  int // the status every answer should have
	// also is the second instance of a two-instance case (on one
	// PostgreSQL database): the clients are split between bw and also.
	also *breakwater
	// pg is the database of a case on PostgreSQL, whose transactions are
	// counted per accepted read; nil on bolt and for the peers.
	pg *pgDatabase
	// extraCPU, if set, is the CPU time of serving processes that pids
	// does not name (the PostgreSQL server and its backends).
	extraCPU func() time.Duration
	// refusals says the case's answers are refusals: on PostgreSQL its
	// transactions are counted per 1,000 refusals its instances counted,
	// not per accepted read.
	refusals bool
}

// instances are the Breakwater instances that serve c.
func (c tcase) instances() []*breakwater {
	switch {
	case c.bw == nil:
		return nil
	case c.also == nil:
		return []*breakwater{c.bw}
	}
	return []*breakwater{c.bw, c.also}
}

// sample is one case's figures in one round.
type sample struct {
	rps      float64
	p50, p99 time.Duration
	srvCPU   float64 // cores the serving processes used
	genCPU   float64 // cores the load generator (this process) used
	// commits and writes are the storage writer's transactions and the
	// durable writes they carried, per second (Breakwater cases only).
	commits, writes float64
	commitErr       error   // reading the counters failed
	expected        float64 // share of answers with the expected status
	statuses        map[int]int64
	errors          int64
	firstErr        error
	// mean is the mean latency of the counted answers.
	mean time.Duration
	// stages are the instances' histograms over the measured time, as
	// sum of seconds and count (where the time goes).
	stages map[string]stageSum
	// pgCommits, pgRollbacks and served are, for a case on PostgreSQL,
	// its database's transactions (pg_stat_database) and the accepted
	// reads its instances counted, over the whole case, its warm-up and
	// the wait for the statistics included; pgErr says why they are
	// missing. pgCPU is the cores PostgreSQL used over the measured time
	// (a share of srvCPU; 0 for a server the harness did not start).
	// served counts refusals instead for a refusal case. span is how
	// long the case was counted (pg_stat_database's readings apart).
	pgCommits, pgRollbacks, served float64
	pgCPU                          float64
	pgErr                          error
	span                           time.Duration
}

// bench holds everything one run started.
type bench struct {
	plan     plan
	dir, bin string
	progress func(string, ...any)

	echo, peer, redis *process
	echoAddr          string // bare Echo's address in the postgres run (the direct path)
	on, off, reject   *breakwater
	others            []*breakwater // the postgres cases' instances (-postgres)
	pg                *pgServer     // their server (-postgres)
	cases             []tcase

	profiles   []string // the CPU profiles written (plan.profile)
	profileErr error    // the profiles that could not be

	// idle is, per round, each case database's transactions over an
	// idle interval (-postgres); idleErr, the intervals not counted.
	idle    []map[string]idleSample
	idleErr error
}

// testPNG is the 64×32 image every OCR request sends.
func testPNG() []byte {
	img := image.NewNRGBA(image.Rect(0, 0, 64, 32))
	for y := range 32 {
		for x := range 64 {
			img.Set(x, y, color.NRGBA{R: uint8(x * 4), G: uint8(y * 8), B: uint8((x + y) * 2), A: 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		panic(err) // encoding into memory cannot fail
	}
	return buf.Bytes()
}

// ocrRequest is a whole POST /v1/ocr request with the image as its body.
func ocrRequest(addr, key string, img []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST /v1/ocr HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: image/png\r\nContent-Length: %d\r\n\r\n",
		addr, key, len(img))
	b.Write(img)
	return b.Bytes()
}

// oneOf sends reqs in turn, request seq getting reqs[seq % len].
func oneOf(reqs ...[]byte) func([]byte, int64, *clientScratch) []byte {
	return func(buf []byte, seq int64, _ *clientScratch) []byte {
		return append(buf, reqs[seq%int64(len(reqs))]...)
	}
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomKeys sends POST /v1/ocr with a fresh random, well-formed and
// unknown API key each time: a flood of 401s.
func randomKeys(addr string, img []byte) func([]byte, int64, *clientScratch) []byte {
	const placeholder = "bw_################################"
	tmpl := ocrRequest(addr, placeholder, img)
	at := bytes.Index(tmpl, []byte(placeholder)) + len("bw_")
	return func(buf []byte, _ int64, s *clientScratch) []byte {
		buf = append(buf, tmpl...)
		for i := range 32 {
			buf[at+i] = base62[s.next()%62]
		}
		return buf
	}
}

// inviteGuess is a wrong invite code from client IP number seq (sent as
// X-Forwarded-For by a trusted proxy), with an e-mail of its own.
func inviteGuess(addr string) func([]byte, int64, *clientScratch) []byte {
	return func(buf []byte, seq int64, _ *clientScratch) []byte {
		body := fmt.Sprintf(`{"code":"2345-6789-ABCD","email":"guess%d@example.com"}`, seq)
		return fmt.Appendf(buf, "POST /v1/invites/verify HTTP/1.1\r\nHost: %s\r\nX-Forwarded-For: 10.%d.%d.%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			addr, (seq>>16)&255, (seq>>8)&255, seq&255, len(body), body)
	}
}

func userIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = prefix + strconv.Itoa(i)
	}
	return ids
}

// setup builds breakwater and starts every server of the throughput cases.
func setup(p plan, root, dir string, progress func(string, ...any)) (*bench, error) {
	b := &bench{plan: p, dir: dir, progress: progress}
	redisBin, err := findRedis(progress)
	if err != nil {
		return b, err
	}
	progress("building breakwater from %s", root)
	if b.bin, err = buildBreakwater(root, dir); err != nil {
		return b, err
	}
	oneUser, manyUsers, err := b.startBreakwaters()
	if err != nil {
		return b, err
	}
	echoAddr, peerAddr, err := b.startPeers(redisBin)
	if err != nil {
		return b, err
	}
	b.cases = b.buildCases(testPNG(), oneUser, manyUsers, echoAddr, peerAddr)
	return b, b.primeRejecting()
}

// startBreakwaters starts the three breakwater instances (ceilings on,
// ceilings off, rejecting) and returns, per instance, the key of its one
// user and, for the first two, the keys of its many users.
func (b *bench) startBreakwaters() (map[*breakwater]string, map[*breakwater][]string, error) {
	// The accepted path: limits on but far above what one user sends here,
	// enough requests in flight per user for every client, and the budget
	// ceilings on (very high) or off (explicit 0s).
	accepted := bwConfig{rate: 100_000, window: "1s", burst: 100_000, inFlightPerUser: 1024, maxConnections: 8192}
	on, off := accepted, accepted
	on.ceilings = true
	// The rejected path: one request an hour, so every request of the flood
	// after the first is over the rate limit.
	reject := bwConfig{rate: 1, window: "1h", burst: 1, inFlightPerUser: 1024, maxConnections: 8192, ceilings: true}
	// -profile: Go's profiler on the admin listener, for the CPU profiles.
	on.pprof, off.pprof, reject.pprof = b.plan.profile != "", b.plan.profile != "", b.plan.profile != ""

	var oneUser = map[*breakwater]string{}
	var manyUsers = map[*breakwater][]string{}
	for _, inst := range []struct {
		bw   **breakwater
		name string
		cfg  bwConfig
		many bool
	}{{&b.on, "ceilings-on", on, true}, {&b.off, "ceilings-off", off, true}, {&b.reject, "rejecting", reject, false}} {
		bw, err := newBreakwater(inst.name, b.bin, filepath.Join(b.dir, inst.name), inst.cfg)
		if err != nil {
			return nil, nil, err
		}
		key, err := bw.createKeyStopped("bench-one")
		if err != nil {
			return nil, nil, err
		}
		b.progress("starting breakwater (%s) on %s", inst.name, bw.addr)
		if err := bw.start(); err != nil {
			return nil, nil, err
		}
		*inst.bw = bw
		oneUser[bw] = key
		if inst.many {
			keys, err := bw.createKeys(userIDs("bench-many-", b.plan.users))
			if err != nil {
				return nil, nil, err
			}
			manyUsers[bw] = keys
		}
	}
	return oneUser, manyUsers, nil
}

// startPeers starts the servers breakwater is compared with: bare Echo,
// redis-server and the redis_rate peer in front of it. It returns the
// addresses of bare Echo and of the peer.
func (b *bench) startPeers(redisBin string) (echoAddr, peerAddr string, err error) {
	b.progress("starting bare Echo, redis-server and the redis_rate peer")
	var redisAddr string
	if b.echo, echoAddr, err = startChild("echo", b.dir); err != nil {
		return "", "", err
	}
	if b.redis, redisAddr, err = startRedis(redisBin, b.dir); err != nil {
		return "", "", err
	}
	if b.peer, peerAddr, err = startChild("peer", b.dir, childRedisEnv+"="+redisAddr); err != nil {
		return "", "", err
	}
	return echoAddr, peerAddr, nil
}

// buildCases builds the throughput cases over the started servers: what
// each sends, to which address, the processes whose CPU time it counts and
// the status every answer should have.
func (b *bench) buildCases(img []byte, oneUser map[*breakwater]string, manyUsers map[*breakwater][]string, echoAddr, peerAddr string) []tcase {
	many := func(bw *breakwater) [][]byte {
		reqs := make([][]byte, len(manyUsers[bw]))
		for i, k := range manyUsers[bw] {
			reqs[i] = ocrRequest(bw.addr, k, img)
		}
		return reqs
	}
	pids := func(ps ...*process) func() []int {
		return func() []int {
			var out []int
			for _, p := range ps {
				out = append(out, p.pid())
			}
			return out
		}
	}
	bwPids := func(bw *breakwater) func() []int { return func() []int { return []int{bw.proc.pid()} } }
	users := thousands(float64(b.plan.users))
	return []tcase{
		{id: "echo", label: "bare Echo", addr: echoAddr, pids: pids(b.echo),
			request: oneOf(ocrRequest(echoAddr, oneUser[b.on], img)), expect: http.StatusOK},
		{id: "acc1on", label: "accepted, 1 user, ceilings on", addr: b.on.addr, bw: b.on, pids: bwPids(b.on),
			request: oneOf(ocrRequest(b.on.addr, oneUser[b.on], img)), expect: http.StatusOK},
		{id: "accNon", label: "accepted, " + users + " users, ceilings on", addr: b.on.addr, bw: b.on, pids: bwPids(b.on),
			request: oneOf(many(b.on)...), expect: http.StatusOK},
		{id: "acc1off", label: "accepted, 1 user, ceilings off", addr: b.off.addr, bw: b.off, pids: bwPids(b.off),
			request: oneOf(ocrRequest(b.off.addr, oneUser[b.off], img)), expect: http.StatusOK},
		{id: "accNoff", label: "accepted, " + users + " users, ceilings off", addr: b.off.addr, bw: b.off, pids: bwPids(b.off),
			request: oneOf(many(b.off)...), expect: http.StatusOK},
		{id: "rej429", label: "rejected, 1 key over its rate (429)", addr: b.reject.addr, bw: b.reject, pids: bwPids(b.reject),
			request: oneOf(ocrRequest(b.reject.addr, oneUser[b.reject], img)), expect: http.StatusTooManyRequests},
		{id: "rej401", label: "rejected, random keys (401)", addr: b.reject.addr, bw: b.reject, pids: bwPids(b.reject),
			request: randomKeys(b.reject.addr, img), expect: http.StatusUnauthorized},
		{id: "peer", label: "redis_rate peer, 3 decisions/request", addr: peerAddr, pids: pids(b.peer, b.redis),
			request: oneOf(ocrRequest(peerAddr, oneUser[b.on], img)), expect: http.StatusOK},
	}
}

// primeRejecting sends the rejecting instance's one request an hour now,
// so that every request of the flood is over the rate, and checks that it
// was accepted.
func (b *bench) primeRejecting() error {
	if out := generate(load{addr: b.reject.addr, clients: 1, total: 1, request: b.cases[5].request}); out.statuses[http.StatusOK] != 1 {
		return fmt.Errorf("rejecting instance: the first request got %v (errors %d: %v), want one 200", out.statuses, out.errors, out.firstErr)
	}
	return nil
}

// close stops every server the run started.
func (b *bench) close() {
	for _, bw := range append([]*breakwater{b.on, b.off, b.reject}, b.others...) {
		if bw != nil {
			bw.stop()
		}
	}
	b.peer.stop()
	b.redis.stop()
	b.echo.stop()
	b.pg.close() // after the instances: it drops their databases
}

// measure runs one case once; with profile, it also writes a CPU profile
// of the serving instance over the measured time (see profileCase). A
// case on PostgreSQL also counts its database's transactions around it.
func (b *bench) measure(c tcase, profile bool) sample {
	var before pgCounts
	t0 := time.Now()
	if c.pg != nil {
		before = c.pg.counts(c)
	}
	s := b.measureLoad(c, profile)
	if c.pg != nil {
		time.Sleep(pgStatsSettle) // the instances' sessions go idle and flush their statistics
		after := c.pg.counts(c)
		s.span = time.Since(t0)
		s.pgCommits, s.pgRollbacks = after.commits-before.commits, after.rollbacks-before.rollbacks
		s.served = after.served - before.served
		s.pgErr = errors.Join(before.err, after.err)
	}
	return s
}

// caseCounters are the serving instances' counters at one moment.
type caseCounters struct {
	commits commitCounts
	stages  map[string]stageSum
	err     error
}

// counters reads c's instances' counters (Breakwater cases only).
func (c tcase) counters() caseCounters {
	var out caseCounters
	for _, bw := range c.instances() {
		cc, err := bw.commitCounts()
		out.commits.commits += cc.commits
		out.commits.writes += cc.writes
		st, err2 := bw.stageSums()
		out.err = errors.Join(out.err, err, err2)
		out.stages = addStages(out.stages, st)
	}
	return out
}

// cpu is the CPU time so far of c's serving processes (extraCPU's
// included), of those extraCPU counts (PostgreSQL's), and of this
// program (the load generator).
func (c tcase) cpu() (srv, extra, gen time.Duration) {
	for _, pid := range c.pids() {
		srv += cpuTime(pid)
	}
	if c.extraCPU != nil {
		extra = c.extraCPU()
	}
	return srv + extra, extra, cpuTime(os.Getpid())
}

// measureLoad is measure's load and its figures.
func (b *bench) measureLoad(c tcase, profile bool) sample {
	l := load{addr: c.addr, clients: b.plan.clients, warmup: b.plan.warmup, duration: b.plan.duration, request: c.request}
	// CPU is read at the start and end of the measured time, from a
	// goroutine beside the clients.
	var srv0, pg0, gen0, srv1, pg1, gen1 time.Duration
	var t0, t1 time.Time
	var k0, k1 caseCounters
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(l.warmup)
		t0 = time.Now()
		srv0, pg0, gen0 = c.cpu()
		k0 = c.counters()
		time.Sleep(l.duration)
		t1 = time.Now()
		srv1, pg1, gen1 = c.cpu()
		k1 = c.counters()
	}()
	profiled := make(chan struct{})
	if profile {
		go func() {
			defer close(profiled)
			time.Sleep(l.warmup)
			b.profileCase(c, l.duration)
		}()
	} else {
		close(profiled)
	}
	var out outcome
	if c.also != nil {
		out = generateSplit(l, c.also.addr)
	} else {
		out = generate(l)
	}
	<-done
	<-profiled // the next case may profile the same instance: one profile at a time
	wall := t1.Sub(t0).Seconds()
	return sample{
		rps: out.rps(), p50: out.percentile(0.50), p99: out.percentile(0.99), mean: out.mean(),
		srvCPU: (srv1 - srv0).Seconds() / wall, genCPU: (gen1 - gen0).Seconds() / wall, pgCPU: (pg1 - pg0).Seconds() / wall,
		commits: (k1.commits.commits - k0.commits.commits) / wall, writes: (k1.commits.writes - k0.commits.writes) / wall,
		commitErr: errors.Join(k0.err, k1.err), stages: subStages(k1.stages, k0.stages),
		expected: out.share(c.expect), statuses: out.statuses, errors: out.errors, firstErr: out.firstErr,
	}
}

// rounds runs every case once per round, each round starting one case
// later than the last, so drift of the machine falls on all cases alike.
func (b *bench) rounds() map[string][]sample {
	results := map[string][]sample{}
	n := len(b.cases)
	for r := range b.plan.rounds {
		for i := range n {
			c := b.cases[(r+i)%n]
			s := b.measure(c, r == 0 && b.plan.profile != "" && c.bw != nil)
			results[c.id] = append(results[c.id], s)
			b.progress("round %d/%d  %-40s %9.0f req/s  p50 %-8s p99 %-8s %s", r+1, b.plan.rounds, c.label,
				s.rps, roundDuration(s.p50), roundDuration(s.p99), statusSummary(s))
		}
		if b.pg != nil {
			b.idle = append(b.idle, b.measureIdle())
		}
	}
	return results
}

// median returns the middle of the values (the mean of the two middle
// ones for an even count).
func median[T int64 | float64 | time.Duration](vs []T) T {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// memPoint is the memory after n things became active, against a base.
type memPoint struct {
	n         int
	base, now memSample
	expected  float64
	statuses  map[int]int64
	errors    int64
}

// per10k is the RSS growth per 10,000.
func (m memPoint) per10k() float64 { return float64(m.now.rss-m.base.rss) / float64(m.n) * 10_000 }

// anonPer10k is the growth of anonymous memory per 10,000. It differs
// from per10k by the database file's mapped pages, which RSS counts once
// touched and drops when bbolt maps a grown file anew.
func (m memPoint) anonPer10k() float64 {
	return float64(m.now.anon-m.base.anon) / float64(m.n) * 10_000
}

// inFlightResult is the figure of calls held in flight at once.
type inFlightResult struct {
	n, completed int
	maxInFlight  int64
	base, peak   int64 // RSS in bytes
	elapsed      time.Duration
	statuses     map[int]int64
	errors       int64
	firstErr     error
	latency      time.Duration
	perUserCap   int
	users        int
}

// memoryFigures are the memory part of the report.
type memoryFigures struct {
	keysAtRest []memPoint // keys that exist but made no request, against an empty database
	activeKeys []memPoint // the same keys after one accepted read each, against them at rest
	clientIPs  []memPoint
	inFlight   inFlightResult
}

// settledRSS waits for the write-behind and the garbage collector to catch
// up, then reads the server's RSS.
//
// First it sends plan.memChurn GET /healthz, which leave no state behind:
// enough garbage for the collector to cycle a few times, so that the heap
// has grown to the size it keeps at this population. A server holds a heap
// floor (server/app.HeapFloor: at least 16 MiB of room between
// collections), and the first requests after a start or a restart grow the
// heap into that room, whatever they are: without the churn, 10,000 keys
// or addresses would be charged with filling it.
func (b *bench) settledRSS(bw *breakwater) (memSample, error) {
	if n := b.plan.memChurn; n > 0 {
		out := generate(load{addr: bw.addr, clients: b.plan.clients, total: int64(n), request: oneOf(healthRequest(bw.addr))})
		if got := out.share(http.StatusOK); got < 1 {
			return memSample{}, fmt.Errorf("%s: memory churn: %v (errors %d: %v), want 200 only", bw.name, out.statuses, out.errors, out.firstErr)
		}
	}
	time.Sleep(b.plan.settle)
	return memOf(bw.proc.pid())
}

// healthRequest is GET /healthz.
func healthRequest(addr string) []byte {
	return fmt.Appendf(nil, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
}

// memoryDefaults is the config of the memory figures: production limits
// (the defaults), the budget ceilings on but far above what is sent, and
// X-Forwarded-For trusted from loopback.
var memoryDefaults = bwConfig{rate: 60, window: "1m", burst: 5, inFlightPerUser: 4, maxConnections: 1024, ceilings: true, trustLoopback: true}

// memory measures RSS per active user key, per client IP, and with many
// upstream calls in flight, each count on a fresh instance of its own (one
// instance growing from 10,000 to 100,000 would measure the garbage
// collector's headroom over the first count as much as the second).
func (b *bench) memory() (memoryFigures, error) {
	var m memoryFigures
	if len(b.plan.activeKeys) == 0 {
		return m, nil
	}
	img := testPNG()
	for _, n := range b.plan.activeKeys {
		atRest, active, err := b.activeKeys(n, img)
		if err != nil {
			return m, err
		}
		m.keysAtRest, m.activeKeys = append(m.keysAtRest, atRest), append(m.activeKeys, active)
	}
	for _, n := range b.plan.clientIPs {
		pt, err := b.clientIPs(n)
		if err != nil {
			return m, err
		}
		m.clientIPs = append(m.clientIPs, pt)
	}
	var err error
	m.inFlight, err = b.callsInFlight(img)
	return m, err
}

// activeKeys measures n user keys: the RSS of a fresh server, then of the
// server restarted on n keys written into its database (at rest: loaded,
// none used), then after one accepted read with each key. The at-rest
// figure counts the warm-up's keys too; the active figure's base is read
// after one accepted read with each of plan.memWarmup other keys (see
// warmedUp).
func (b *bench) activeKeys(n int, img []byte) (atRest, active memPoint, err error) {
	name := fmt.Sprintf("memory-keys-%d", n)
	bw, err := newBreakwater(name, b.bin, filepath.Join(b.dir, name), memoryDefaults)
	if err != nil {
		return atRest, active, err
	}
	if err := bw.start(); err != nil {
		return atRest, active, err
	}
	empty, err := b.settledRSS(bw)
	bw.stop()
	if err != nil {
		return atRest, active, err
	}
	start := time.Now()
	w := b.plan.memWarmup
	keys, err := bw.seedKeys(userIDs("mem-", w+n))
	if err != nil {
		return atRest, active, err
	}
	b.progress("memory: %d keys written in %s", w+n, time.Since(start).Round(time.Millisecond))
	if err := bw.start(); err != nil {
		return atRest, active, err
	}
	defer bw.stop()
	idle, err := b.settledRSS(bw)
	if err != nil {
		return atRest, active, err
	}
	reqs := make([][]byte, w+n)
	for i, k := range keys {
		reqs[i] = ocrRequest(bw.addr, k, img)
	}
	base, err := b.warmedUp(bw, oneOf(reqs[:w]...), w, http.StatusOK, idle)
	if err != nil {
		return atRest, active, err
	}
	out := generate(load{addr: bw.addr, clients: b.plan.clients, total: int64(n), request: oneOf(reqs[w:]...)})
	now, err := b.settledRSS(bw)
	if err != nil {
		return atRest, active, err
	}
	b.progress("memory: %d keys: RSS %s empty, %s at rest, %s warmed up, %s active (anonymous %s, %s, %s, %s)", n,
		mib(empty.rss), mib(idle.rss), mib(base.rss), mib(now.rss), mib(empty.anon), mib(idle.anon), mib(base.anon), mib(now.anon))
	atRest = memPoint{n: w + n, base: empty, now: idle, expected: 1}
	active = memPoint{n: n, base: base, now: now, expected: out.share(http.StatusOK), statuses: out.statuses, errors: out.errors}
	return atRest, active, nil
}

// warmedUp serves w requests (from w keys or IPs that the figure then
// leaves out), waits and reads the RSS that a figure grows from; with no
// warm-up it returns before. A fresh server's first few hundred requests
// cost it several MiB whatever their number (code paged in, the
// connections' buffers and goroutine stacks, the statistics queue and the
// collector's own structures touched for the first time, the heap goal
// leaving its floor): counted against 10,000 keys, that is most of the
// figure, and it is not memory per key. Each warm-up request must be
// answered with want.
func (b *bench) warmedUp(bw *breakwater, request func([]byte, int64, *clientScratch) []byte, w, want int, before memSample) (memSample, error) {
	if w == 0 {
		return before, nil
	}
	out := generate(load{addr: bw.addr, clients: b.plan.clients, total: int64(w), request: request})
	if got := out.share(want); got < 1 {
		return memSample{}, fmt.Errorf("%s: memory warm-up: %v (errors %d: %v), want %d only", bw.name, out.statuses, out.errors, out.firstErr, want)
	}
	return b.settledRSS(bw)
}

// clientIPs measures n client IPs: wrong invite guesses, each from an
// address of its own through a trusted proxy, each with an e-mail of its
// own, against the server's RSS after plan.memWarmup such guesses from
// other addresses.
func (b *bench) clientIPs(n int) (memPoint, error) {
	name := fmt.Sprintf("memory-ips-%d", n)
	bw, err := newBreakwater(name, b.bin, filepath.Join(b.dir, name), memoryDefaults)
	if err != nil {
		return memPoint{}, err
	}
	if err := bw.start(); err != nil {
		return memPoint{}, err
	}
	defer bw.stop()
	fresh, err := b.settledRSS(bw)
	if err != nil {
		return memPoint{}, err
	}
	w := b.plan.memWarmup
	guess := inviteGuess(bw.addr)
	base, err := b.warmedUp(bw, guess, w, http.StatusForbidden, fresh)
	if err != nil {
		return memPoint{}, err
	}
	measured := func(buf []byte, seq int64, s *clientScratch) []byte { return guess(buf, int64(w)+seq, s) }
	out := generate(load{addr: bw.addr, clients: b.plan.clients, total: int64(n), request: measured})
	now, err := b.settledRSS(bw)
	if err != nil {
		return memPoint{}, err
	}
	b.progress("memory: %d client IPs: RSS %s, %s warmed up, %s fresh (anonymous %s, %s, %s)", n,
		mib(now.rss), mib(base.rss), mib(fresh.rss), mib(now.anon), mib(base.anon), mib(fresh.anon))
	return memPoint{n: n, base: base, now: now, expected: out.share(http.StatusForbidden), statuses: out.statuses, errors: out.errors}, nil
}

// callsInFlight holds plan.inFlight calls to a slow simulated upstream at
// once and samples the server's RSS meanwhile: the default cap of requests
// in flight per user, enough users that it refuses none, and enough
// connections for all.
func (b *bench) callsInFlight(img []byte) (inFlightResult, error) {
	flight := memoryDefaults
	flight.latency = b.plan.inFlightLatency
	flight.maxConnections = 2*b.plan.inFlight + 64
	users := (b.plan.inFlight + flight.inFlightPerUser - 1) / flight.inFlightPerUser
	bw, err := newBreakwater("memory-inflight", b.bin, filepath.Join(b.dir, "memory-inflight"), flight)
	if err != nil {
		return inFlightResult{}, err
	}
	if err := bw.start(); err != nil {
		return inFlightResult{}, err
	}
	defer bw.stop()
	keys, err := bw.createKeys(userIDs("flight-", users))
	if err != nil {
		return inFlightResult{}, err
	}
	reqs := make([][]byte, len(keys))
	for i, k := range keys {
		reqs[i] = ocrRequest(bw.addr, k, img)
	}
	settled, err := b.settledRSS(bw)
	if err != nil {
		return inFlightResult{}, err
	}
	base := settled.rss
	var inFlight, maxInFlight atomic.Int64
	peak := base
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // RSS every 20 ms while the calls are out
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				if v, err := rss(bw.proc.pid()); err == nil && v > peak {
					peak = v
				}
			}
		}
	}()
	b.progress("memory: %d calls in flight, %s each, %d users", b.plan.inFlight, b.plan.inFlightLatency, users)
	start := time.Now()
	out := generate(load{addr: bw.addr, clients: b.plan.inFlight, total: int64(b.plan.inFlight),
		timeout: b.plan.inFlightLatency + 30*time.Second, request: oneOf(reqs...),
		onRequest: func(d int) {
			v := inFlight.Add(int64(d))
			for old := maxInFlight.Load(); v > old && !maxInFlight.CompareAndSwap(old, v); old = maxInFlight.Load() {
			}
		}})
	elapsed := time.Since(start)
	close(stopSampling)
	<-sampled
	return inFlightResult{n: b.plan.inFlight, completed: int(out.statuses[http.StatusOK]), maxInFlight: maxInFlight.Load(),
		base: base, peak: peak, elapsed: elapsed, statuses: out.statuses, errors: out.errors, firstErr: out.firstErr,
		latency: b.plan.inFlightLatency, perUserCap: flight.inFlightPerUser, users: users}, nil
}
