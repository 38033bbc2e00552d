package main

// The open-loop figures of the postgres cases (issue 29): the highest
// constant request rate at which the accepted path's p99 stays at or
// under a bound, and the p99 the guard adds at one client.
//
// A closed-loop generator (generate: each connection sends its next
// request when the last is answered) slows down with the server and so
// never sees the queue a stall builds: the requests that would have been
// sent during the stall are simply not sent (coordinated omission). The
// open-loop generator here sends requests on a fixed schedule, request i
// due at start + i/rate whatever the answers, and measures each one's
// latency from when it was due, so a request that waited for a free
// connection, or behind a stall, counts its wait.

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// openLoopP99 is issue 29's bound on the accepted path's p99 for the
// highest constant rate.
const openLoopP99 = 20 * time.Millisecond

// openLoad is one step of the open-loop generator.
type openLoad struct {
	// addrs are the instances: request i goes to addrs[i % len(addrs)].
	addrs []string
	rate  float64       // requests per second in all
	span  time.Duration // requests are due over this long
	// conns is the connections per address: one request in flight on
	// each. A request due while all of its address's are busy waits for
	// one, and its wait counts in its latency.
	conns int
	// pool, if set, holds the connections (pool[a][k]: address a's k-th)
	// and keeps them open for the next step: a step then does not pay
	// for dialling or for the server's first request on a connection.
	pool [][]openConn
	// giveUp: a request picked up this long after it was due is not
	// sent, and it and every later one count as over any bound (the step
	// has failed; sending the backlog would only make it long).
	giveUp time.Duration
	// timeout bounds one request; a request that takes longer is a
	// failure and its connection is closed.
	timeout time.Duration
	// request appends the bytes of request number seq (over all
	// addresses) to buf, as load.request does.
	request func(buf []byte, seq int64, scratch *clientScratch) []byte
	expect  int // the status every answer should have
}

// openOutcome is what a step measured.
type openOutcome struct {
	due       int64           // requests due in the step
	latencies []time.Duration // of the answers with the expected status, from when each was due, sorted
	missed    int64           // due but not answered as expected: another status, an error, or not sent
	firstErr  error
}

// p99 is the latency at or under which 99% of the due requests were
// answered as expected; a request missed counts as slower than any.
func (o openOutcome) p99() time.Duration { return o.quantile(0.99) }

// quantile is the latency at or under which a share q of the due
// requests were answered as expected; +Inf (as the largest Duration)
// when more than 1-q of them were missed.
func (o openOutcome) quantile(q float64) time.Duration {
	if o.due == 0 {
		return 0
	}
	i := int64(math.Ceil(q*float64(o.due))) - 1
	if i >= int64(len(o.latencies)) {
		return time.Duration(math.MaxInt64)
	}
	return o.latencies[max(i, 0)]
}

// generateOpen runs one open-loop step.
func generateOpen(o openLoad) openOutcome {
	if o.timeout == 0 {
		o.timeout = 5 * time.Second
	}
	if o.giveUp == 0 {
		o.giveUp = time.Second
	}
	n := len(o.addrs)
	if o.pool == nil {
		o.pool = newOpenPool(o.addrs, o.conns, o.timeout)
		defer closeOpenPool(o.pool)
	}
	total := int64(o.span.Seconds() * o.rate)
	start := time.Now().Add(100 * time.Millisecond) // the connections are dialled meanwhile
	dueAt := func(i int64) time.Time { return start.Add(time.Duration(float64(i) / o.rate * float64(time.Second))) }
	var next = make([]atomic.Int64, n) // per address: its requests taken so far
	var late atomic.Bool               // a request was picked up giveUp after it was due
	type tally struct {
		latencies []time.Duration
		missed    int64
		firstErr  error
	}
	tallies := make([]tally, n*o.conns)
	var wg sync.WaitGroup
	for w := range n * o.conns {
		a := w % n
		wg.Go(func() {
			t := &tallies[w]
			scratch := &clientScratch{id: w, rand: uint64(w)*0x9E3779B97F4A7C15 + 1}
			c := &o.pool[a][w/n]
			if c.conn == nil {
				if err := c.dial(); err != nil && t.firstErr == nil {
					t.firstErr = err
				}
			}
			var buf []byte
			for {
				i := (next[a].Add(1)-1)*int64(n) + int64(a)
				if i >= total {
					return
				}
				if late.Load() {
					t.missed++
					continue
				}
				due := dueAt(i)
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				} else if -d > o.giveUp {
					late.Store(true)
					t.missed++
					continue
				}
				buf = o.request(buf[:0], i, scratch)
				status, err := c.roundTrip(buf)
				switch {
				case err != nil:
					t.missed++
					if t.firstErr == nil {
						t.firstErr = err
					}
				case status != o.expect:
					t.missed++
					if t.firstErr == nil {
						t.firstErr = fmt.Errorf("status %d, want %d", status, o.expect)
					}
				default:
					t.latencies = append(t.latencies, time.Since(due))
				}
			}
		})
	}
	wg.Wait()
	out := openOutcome{due: total}
	for _, t := range tallies {
		out.latencies = append(out.latencies, t.latencies...)
		out.missed += t.missed
		if out.firstErr == nil {
			out.firstErr = t.firstErr
		}
	}
	slices.Sort(out.latencies)
	return out
}

// newOpenPool makes conns connections (not yet dialled) per address.
func newOpenPool(addrs []string, conns int, timeout time.Duration) [][]openConn {
	pool := make([][]openConn, len(addrs))
	for a, addr := range addrs {
		pool[a] = make([]openConn, conns)
		for k := range pool[a] {
			pool[a][k] = openConn{addr: addr, timeout: timeout}
		}
	}
	return pool
}

func closeOpenPool(pool [][]openConn) {
	for _, conns := range pool {
		for k := range conns {
			conns[k].close()
		}
	}
}

// openConn is one keep-alive connection, dialled again after a failure.
type openConn struct {
	addr    string
	timeout time.Duration
	conn    net.Conn
	br      *bufio.Reader
}

func (c *openConn) dial() error {
	conn, err := net.DialTimeout("tcp", c.addr, c.timeout)
	if err != nil {
		return err
	}
	c.conn, c.br = conn, bufio.NewReaderSize(conn, 16<<10)
	return nil
}

func (c *openConn) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// roundTrip sends req and reads its answer, dialling first if needed.
func (c *openConn) roundTrip(req []byte) (int, error) {
	if c.conn == nil {
		if err := c.dial(); err != nil {
			return 0, err
		}
	}
	if err := c.conn.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		c.close()
		return 0, err
	}
	status, keepAlive, err := roundTrip(c.conn, c.br, req)
	if err != nil || !keepAlive {
		c.close()
	}
	return status, err
}

// rateStep is one step of a search: the rate tried and what it gave.
type rateStep struct {
	rate float64
	p99  time.Duration
	ok   bool
}

// rateSearch is the outcome of searchRate.
type rateSearch struct {
	best   float64    // the highest rate that passed (0: none)
	capped bool       // every rate passed up to the ceiling: the true figure is higher
	steps  []rateStep // in the order tried
}

// bestStep is the step at best, and firstOver the lowest rate that
// failed, if any.
func (s rateSearch) bestStep() (best rateStep, firstOver rateStep, over bool) {
	for _, st := range s.steps {
		switch {
		case st.ok && st.rate == s.best:
			best = st
		case !st.ok && (!over || st.rate < firstOver.rate):
			firstOver, over = st, true
		}
	}
	return best, firstOver, over
}

// searchRate finds the highest rate at which try's p99 stays within
// bound: from start it doubles the rate while it passes (up to ceiling),
// then bisects between the last rate that passed and the first that did
// not, bisect times. If start fails it bisects between 0 and start. It
// assumes the p99 grows with the rate; a noisy step only moves the
// figure within the interval it was searching.
func searchRate(try func(rate float64) time.Duration, bound time.Duration, start, ceiling float64, bisect int) rateSearch {
	var s rateSearch
	step := func(rate float64) bool {
		p99 := try(rate)
		ok := p99 <= bound
		s.steps = append(s.steps, rateStep{rate: rate, p99: p99, ok: ok})
		return ok
	}
	lo, hi := 0.0, 0.0
	for r := start; ; r *= 2 {
		if r > ceiling {
			s.best, s.capped = lo, true
			return s
		}
		if !step(r) {
			hi = r
			break
		}
		lo = r
	}
	for range bisect {
		mid := math.Round((lo + hi) / 2)
		if mid <= lo || mid >= hi {
			break
		}
		if step(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	s.best = lo
	return s
}

// openLoopFigure is one backend's highest rate within the bound.
type openLoopFigure struct {
	label  string // the backend
	search rateSearch
	// cpu is each rate's tries' CPU, in the order tried.
	cpu map[float64][]stepCPU
}

// stepCPU is what one open-loop step cost: the cores the serving
// processes used over its span (PostgreSQL's included), and PostgreSQL's
// CPU per request due (0 where it is not counted).
type stepCPU struct {
	srv   float64
	pgPer time.Duration
}

// cpuCells prints cpuAt(rate): the cores and PostgreSQL's CPU per
// request, "–" for what was not measured.
func (f openLoopFigure) cpuCells(rate float64) (srv, pgPer string) {
	cores, per, ok := f.cpuAt(rate)
	if !ok {
		return "–", "–"
	}
	srv, pgPer = fmt.Sprintf("%.2f", cores), "–"
	if per > 0 {
		pgPer = roundDuration(per)
	}
	return srv, pgPer
}

// cpuAt is the median over rate's tries of the cores the serving
// processes used and of PostgreSQL's CPU per request.
func (f openLoopFigure) cpuAt(rate float64) (srv float64, pgPer time.Duration, ok bool) {
	tries := f.cpu[rate]
	if len(tries) == 0 {
		return 0, 0, false
	}
	srvs, pers := make([]float64, len(tries)), make([]float64, len(tries))
	for i, t := range tries {
		srvs[i], pers[i] = t.srv, float64(t.pgPer)
	}
	return median(srvs), time.Duration(median(pers)), true
}

// openLoop searches the highest constant rate of c's requests (all its
// instances, the requests alternating between them) at which the p99 stays
// within openLoopP99, each step plan.openStep long. turn runs each step
// (with its scrapes and the pause after it) in the search's turn.
func (b *bench) openLoop(c tcase, backend string, turn func(func())) openLoopFigure {
	addrs := []string{c.addr}
	if c.also != nil {
		addrs = append(addrs, c.also.addr)
	}
	p := b.plan
	conns := max(1, p.openConns/len(addrs))
	pool := newOpenPool(addrs, conns, 5*time.Second)
	defer closeOpenPool(pool)
	step := func(rate float64) openOutcome {
		span := p.stepSpan(rate)
		return generateOpen(openLoad{addrs: addrs, rate: rate, span: span, conns: conns, pool: pool, request: c.request, expect: c.expect})
	}
	turn(func() { step(p.openStart) }) // a step not counted: the connections dialled, their first requests served
	insts := c.instances()
	cpu := map[float64][]stepCPU{}
	once := func(rate float64) (p99 time.Duration) {
		turn(func() {
			before, _ := sumHistograms(insts)
			srv0, pg0, _ := c.cpu()
			out := step(rate)
			srv1, pg1, _ := c.cpu()
			used := stepCPU{srv: (srv1 - srv0).Seconds() / p.stepSpan(rate).Seconds(), pgPer: (pg1 - pg0) / time.Duration(max(out.due, 1))}
			cpu[rate] = append(cpu[rate], used)
			after, err := sumHistograms(insts)
			var guard, usage string // the instances' own p99s over the step: where a slow step's time went
			if err == nil && before != nil {
				guard, usage = guardUsageP99(histogramsSince(after, before))
			}
			b.progress("open loop, %s: %s req/s for %s: p99 %s (guard p99 %s, usage record p99 %s; srv cpu %.2f, pg/req %s), %d of %d missed %v", backend,
				thousands(rate), p.stepSpan(rate), p99String(out.p99()), guard, usage, used.srv, roundDuration(used.pgPer), out.missed, out.due, out.firstErr)
			time.Sleep(200 * time.Millisecond) // what the step left behind (commits, statistics) settles
			p99 = out.p99()
		})
		return p99
	}
	// A rate's p99 is the median of its tries': one stall of the shared
	// machine (a checkpoint, the cores taken by another process) neither
	// ends the search below the rate the path carries, nor lets a rate
	// pass on a lucky try.
	try := func(rate float64) time.Duration {
		return medianTry(p.openTries, func() time.Duration { return once(rate) })
	}
	return openLoopFigure{label: backend, search: searchRate(try, openLoopP99, p.openStart, p.openCeiling, p.openBisect), cpu: cpu}
}

// turns lets searches run their steps in turn, one step each, so that
// every backend's steps meet the machine as the others' do: a shared
// host's speed moves by the minute (bolt's figure ranged 3,500 to 16,000
// within one hour), and a search run after another would meet another
// machine. A search that has ended takes no more turns.
type turns struct {
	mu     sync.Mutex
	cond   *sync.Cond
	next   int    // whose turn it is
	active []bool // searches not yet ended
}

func newTurns(n int) *turns {
	t := &turns{active: make([]bool, n)}
	for i := range t.active {
		t.active[i] = true
	}
	t.cond = sync.NewCond(&t.mu)
	return t
}

// take runs f as search i's turn, once it is i's, and then passes the
// turn on.
func (t *turns) take(i int, f func()) {
	t.mu.Lock()
	for t.next != i {
		t.cond.Wait()
	}
	t.mu.Unlock()
	f()
	t.mu.Lock()
	t.pass(i)
	t.mu.Unlock()
}

// done ends search i: its turns go to the others.
func (t *turns) done(i int) {
	t.mu.Lock()
	t.active[i] = false
	if t.next == i {
		t.pass(i)
	}
	t.mu.Unlock()
}

// pass gives the turn to the next search after i that has not ended (i
// itself when it is the last). t.mu is held.
func (t *turns) pass(i int) {
	n := len(t.active)
	for k := 1; k <= n; k++ {
		if j := (i + k) % n; t.active[j] {
			t.next = j
			break
		}
	}
	t.cond.Broadcast()
}

// medianTry is the median of tries (at least one) calls of once.
func medianTry(tries int, once func() time.Duration) time.Duration {
	got := make([]time.Duration, max(1, tries))
	for i := range got {
		got[i] = once()
	}
	slices.Sort(got)
	return got[len(got)/2]
}

// minStepRequests is the fewest requests a step of the search sends: a
// step at a low rate lasts longer than plan.openStep, so that its p99 is
// not its slowest request or two.
const minStepRequests = 300

// stepSpan is how long a step at rate lasts: openStep, or as long as its
// fewest requests take.
func (p plan) stepSpan(rate float64) time.Duration {
	return max(p.openStep, time.Duration(float64(p.stepRequests())/rate*float64(time.Second)).Round(time.Millisecond))
}

// stepRequests is the fewest requests a step sends.
func (p plan) stepRequests() int {
	if p.openMinRequests > 0 {
		return p.openMinRequests
	}
	return minStepRequests
}

// p99String prints a p99, "missed" for one that more than 1% of the
// requests did not reach.
func p99String(d time.Duration) string {
	if d == time.Duration(math.MaxInt64) {
		return "> 1% missed"
	}
	return roundDuration(d)
}

// serialFigure is the p99 at one client, serial requests, through one
// backend or direct to a bare Echo handler.
type serialFigure struct {
	label    string
	out      outcome
	series   map[string]histogram // the instances' overhead histograms over the run (nil: not Breakwater)
	expected float64              // share of the expected status
}

// serialPath is one path of the one-client figure: its addresses (the
// requests alternating between them), its instances (none for bare
// Echo), its requests and the status they should have.
type serialPath struct {
	label   string
	addrs   []string
	insts   []*breakwater
	request func([]byte, int64, *clientScratch) []byte
	expect  int
}

// serialSlice is how long one path's client sends before the next path's
// takes over.
const serialSlice = 250 * time.Millisecond

// serialRuns sends each path's requests one at a time from one client,
// plan.serial in all for each, the paths taking turns a serialSlice each
// (so that every path meets the machine as the others do), and reads the
// instances' histograms before and after.
func (b *bench) serialRuns(paths []serialPath) ([]serialFigure, error) {
	before := make([]map[string]histogram, len(paths))
	conns := make([][]openConn, len(paths))
	outs := make([]outcome, len(paths))
	for i, p := range paths {
		var err error
		if before[i], err = sumHistograms(p.insts); err != nil {
			return nil, err
		}
		conns[i] = make([]openConn, len(p.addrs))
		for k, a := range p.addrs {
			conns[i][k] = openConn{addr: a, timeout: 10 * time.Second}
			defer conns[i][k].close()
		}
		outs[i] = outcome{statuses: map[int]int64{}}
	}
	scratch := &clientScratch{rand: 1}
	for range max(1, int(b.plan.serial/serialSlice)) {
		for i, p := range paths {
			serialLoad(conns[i], min(serialSlice, b.plan.serial), p.request, scratch, &outs[i])
		}
	}
	figures := make([]serialFigure, len(paths))
	for i, p := range paths {
		out := outs[i]
		slices.Sort(out.latencies)
		out.requests = int64(len(out.latencies))
		f := serialFigure{label: p.label, out: out, expected: out.share(p.expect)}
		if len(p.insts) > 0 {
			after, err := sumHistograms(p.insts)
			if err != nil {
				return figures[:i], err
			}
			f.series = histogramsSince(after, before[i])
		}
		b.progress("one client, %s: p50 %s, p99 %s, %s", p.label, roundDuration(out.percentile(0.5)), roundDuration(out.percentile(0.99)),
			statusSummary(sample{statuses: out.statuses, errors: out.errors}))
		figures[i] = f
	}
	return figures, nil
}

// sumHistograms is the overhead histograms of insts, added up.
func sumHistograms(insts []*breakwater) (map[string]histogram, error) {
	var sum map[string]histogram
	for _, bw := range insts {
		hs, err := bw.histograms()
		if err != nil {
			return nil, err
		}
		if sum == nil {
			sum = hs
			continue
		}
		for name, h := range hs {
			sum[name] = sum[name].plus(h)
		}
	}
	return sum, nil
}

// histogramsSince is each of after's histograms less before's of the same
// name: the observations between the two reads.
func histogramsSince(after, before map[string]histogram) map[string]histogram {
	out := make(map[string]histogram, len(after))
	for name, h := range after {
		out[name] = h.minus(before[name])
	}
	return out
}

// guardUsageP99 is the p99 of the guard's overhead and of the usage
// record's commit wait in series, as bucket bounds.
func guardUsageP99(series map[string]histogram) (guard, usage string) {
	return bound(series[guardSeries].quantile(0.99)), bound(series[usageSeries].quantile(0.99))
}

// plus is h's observations and o's (the same buckets).
func (h histogram) plus(o histogram) histogram {
	out := histogram{bounds: h.bounds, counts: append([]float64(nil), h.counts...)}
	if len(o.counts) == len(out.counts) {
		for i := range out.counts {
			out.counts[i] += o.counts[i]
		}
	}
	return out
}

// serialLoad is one client sending requests one after another for d,
// the i-th to conns[i % len(conns)] (keep-alive connections, each of its
// own address), adding what it measured to out.
func serialLoad(conns []openConn, d time.Duration, request func([]byte, int64, *clientScratch) []byte, scratch *clientScratch, out *outcome) {
	var buf []byte
	start := time.Now()
	for i := int64(0); time.Since(start) < d; i++ {
		c := &conns[i%int64(len(conns))]
		buf = request(buf[:0], i, scratch)
		t0 := time.Now()
		status, err := c.roundTrip(buf)
		if err != nil {
			out.errors++
			if out.firstErr == nil {
				out.firstErr = err
			}
			continue
		}
		out.latencies = append(out.latencies, time.Since(t0))
		out.statuses[status]++
	}
	out.elapsed += time.Since(start)
}

// printOpenLoop writes the highest constant rate within the p99 bound.
func (r *report) printOpenLoop(w io.Writer) {
	if len(r.open) == 0 {
		return
	}
	p := r.plan
	fmt.Fprintf(w, "\nhighest constant rate with the accepted path's p99 ≤ %s (open loop: requests due on a fixed schedule whatever\n", openLoopP99)
	fmt.Fprintf(w, " the answers, latency from when each was due; accepted, %s users, ceilings on, %d connections in all, the requests\n",
		thousands(float64(p.users)), p.openConns)
	fmt.Fprintf(w, " alternating between the instances; steps of %s (at least %d requests), each rate tried %d times and its p99\n",
		p.openStep, p.stepRequests(), max(1, p.openTries))
	fmt.Fprintf(w, " the median try's, from %s req/s, doubling, then bisecting %d times, after a step not counted; a request not\n",
		thousands(p.openStart), p.openBisect)
	fmt.Fprintln(w, " answered as accepted counts as slower than any, and one due more than 1s ago ends its step; the generator's own")
	fmt.Fprintln(w, " lateness counts, as the server's; the backends' searches take turns, a step each, so that both meet the machine alike)")
	fmt.Fprintf(w, "%-28s %10s %10s %8s %8s %12s %10s %8s %8s %6s\n", "backend", "req/s", "its p99", "srv cpu", "pg/req",
		"first over", "its p99", "srv cpu", "pg/req", "steps")
	for _, f := range r.open {
		best, over, isOver := f.search.bestStep()
		rate, bestP99, first, firstP99 := thousands(f.search.best), p99String(best.p99), "–", "–"
		bestCPU, bestPG := f.cpuCells(f.search.best)
		overCPU, overPG := "–", "–"
		switch {
		case f.search.capped:
			rate = "≥ " + rate
		case f.search.best == 0:
			rate, bestP99 = "< "+thousands(over.rate), "–"
		}
		if isOver {
			first, firstP99 = thousands(over.rate), p99String(over.p99)
			overCPU, overPG = f.cpuCells(over.rate)
		}
		fmt.Fprintf(w, "%-28s %10s %10s %8s %8s %12s %10s %8s %8s %6d\n", f.label, rate, bestP99, bestCPU, bestPG,
			first, firstP99, overCPU, overPG, len(f.search.steps))
	}
	fmt.Fprintf(w, "(srv cpu: the cores of %d the serving processes used over the step, PostgreSQL's included; pg/req: PostgreSQL's CPU\n", runtime.NumCPU())
	fmt.Fprintln(w, " per request due, where the harness started the cluster; medians of the rate's tries)")
	if len(r.open) == 2 && r.open[0].search.best > 0 {
		fmt.Fprintf(w, "(%s ÷ %s: %.2f, no target)\n", r.open[1].label, r.open[0].label, r.open[1].search.best/r.open[0].search.best)
	}
}

// printSerial writes the p99 the guard adds at one client.
func (r *report) printSerial(w io.Writer) {
	if len(r.serial) == 0 {
		return
	}
	fmt.Fprintf(w, "\nthe p99 the guard adds at one client (one client, serial requests for %s each, the paths taking turns %s at a time,\n", r.plan.serial, serialSlice)
	fmt.Fprintln(w, " 1 user, ceilings on; added p99: the client's p99 through the backend less its p99 direct to a bare Echo handler answering the same request,")
	fmt.Fprintln(w, " the simulated upstream answering at once; beside it, the instances' own histograms over the same requests, as bucket")
	fmt.Fprintln(w, " bounds)")
	fmt.Fprintf(w, "%-30s %9s %9s %9s %10s %12s %14s  %s\n", "path", "requests", "p50", "p99", "added p99", "guard p99", "usage rec. p99", "answers")
	direct := r.serial[0].out.percentile(0.99)
	for i, f := range r.serial {
		added, guard, usage := "–", "–", "–"
		if i > 0 {
			added = roundDuration(f.out.percentile(0.99) - direct)
			guard, usage = guardUsageP99(f.series)
		}
		fmt.Fprintf(w, "%-30s %9s %9s %9s %10s %12s %14s  %s\n", f.label, thousands(float64(f.out.requests)), roundDuration(f.out.percentile(0.5)),
			roundDuration(f.out.percentile(0.99)), added, guard, usage, statusSummary(sample{statuses: f.out.statuses, errors: f.out.errors, expected: f.expected}))
	}
	fmt.Fprintln(w, "(guard p99: arrival to the committed reservation, the upload excluded; usage rec.: the usage record's commit wait)")
	if f := r.disk; f.n > 0 {
		fmt.Fprintf(w, "the disk under them: %s flushes of one 4 KiB page in turn (write, fdatasync) in the run's directory: p50 %s,\n",
			thousands(float64(f.n)), roundDuration(f.p50))
		fmt.Fprintf(w, " p99 %s; every accepted read waits for at least one (its usage record is on the disk before its answer),\n", roundDuration(f.p99))
		fmt.Fprintln(w, " so its added p99 at one client is not below that p99 on either backend")
	}
}
