package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"breakwater/server/failpoint"
	"breakwater/test/harness"
)

// Options configure a crash loop; zero fields take the defaults of main's
// flags.
type Options struct {
	Rounds        int
	Users         int
	KeysPerUser   int
	Workers       int
	DailyRequests int64 // 0: 30 per round
	Latency       time.Duration
	Root          string // module root; "" asks go env GOMOD
	Dir           string // work folder, kept; "" a temporary one, removed
	PowerCut      bool
	Backend       string // storage.backend: "" or "bolt", or "postgres"
	PostgresURL   string // the database of backend "postgres"
	Seed          int64
	Log           func(format string, args ...any) // nil: quiet
}

// Kill causes, as counted in Report.Kills.
const (
	killReserved = failpoint.Reserved // the failpoint after the reservation's commit
	killRecorded = failpoint.Recorded // the failpoint after the usage record's commit
	killRandom   = "random"           // SIGKILL from outside at a random moment
	killFallback = "fallback"         // a failpoint round whose failpoint did not fire in time
	killCeiling  = "ceiling"          // the last rounds: load until the ceiling refuses, then a random kill
)

// roundLoad bounds how long one round's load runs before a failpoint that
// has not fired is replaced by a kill from outside.
const roundLoad = 3 * time.Second

// ceilingLoad bounds each of the last rounds, which load the server until
// the budget ceiling refuses calls.
const ceilingLoad = 20 * time.Second

// ceilingSettle bounds the wait, in the last rounds, between the first
// 503 budget_paused and the kill's random delay, for the requests that
// were in flight then to be answered (see kill). Near the ceiling each
// call's lease is one call, written alone and in turn: 8 clients' leases
// took up to 0.1 s each on a loaded machine.
const ceilingSettle = 5 * time.Second

// Report is the outcome of a crash loop.
type Report struct {
	Rounds         int
	Kills          map[string]int
	PowerCuts      int
	Answers        map[string]int64 // "200", "503 budget_paused", "no answer", ...
	OK             int64            // 200s received
	Calls          int64            // calls the fake Gemini received
	Ledger         int64            // requests in the budget ledger
	DailyRequests  int64
	UsageRows      int
	Open           int   // reservation rows of earlier versions left open (leases keep none)
	Excess         int64 // ledger requests over the calls made: what the kills left counted
	MostExcess     int64 // the most Excess grew by in one round
	MaxLease       int64 // budget.MaxLease of the run's daily_requests
	CeilingReached bool
	Violations     []string
	Elapsed        time.Duration
}

// Summary is the report as printed by the command.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rounds: %d in %s\n", r.Rounds, r.Elapsed.Round(time.Second))
	fmt.Fprintf(&b, "kills: reserved %d, recorded %d, random %d, ceiling %d, fallback %d; power cuts %d\n",
		r.Kills[killReserved], r.Kills[killRecorded], r.Kills[killRandom], r.Kills[killCeiling], r.Kills[killFallback], r.PowerCuts)
	keys := make([]string, 0, len(r.Answers))
	for k := range r.Answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, r.Answers[k]))
	}
	fmt.Fprintf(&b, "answers: %s\n", strings.Join(parts, ", "))
	fmt.Fprintf(&b, "upstream calls: %d (daily_requests %d, reached: %v); ledger requests: %d; usage rows: %d; open reservation rows: %d\n",
		r.Calls, r.DailyRequests, r.CeilingReached, r.Ledger, r.UsageRows, r.Open)
	fmt.Fprintf(&b, "ledger over calls: %d, at most %d in one round (bound: a lease of %d + one call per client)\n",
		r.Excess, r.MostExcess, r.MaxLease)
	fmt.Fprintf(&b, "violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	return b.String()
}

// loop is one crash loop's state across rounds.
type loop struct {
	o      Options
	rng    *rand.Rand
	bin    string
	config string
	dbPath string
	dir    string
	gemini *harness.Gemini
	disk   *disk // with -powercut
	keys   []apiKey
	img    []byte
	rep    *Report

	mu       sync.Mutex
	ok       map[string]string // request id of every 200 -> user
	okByUser map[string]int64
	rowsSeen map[string]bool // request ids of usage rows already checked
	badSeen  int64           // calls not in the wire format, already reported
	reported map[string]bool // violations already reported
}

type apiKey struct{ user, key string }

// Run runs the crash loop. It returns an error when the loop itself could
// not run (a build, a mount, a server that does not start); violations of
// the promises are in the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	start := time.Now()
	if o.Rounds <= 0 {
		o.Rounds = 50
	}
	if o.Users <= 0 {
		o.Users = 3
	}
	if o.KeysPerUser <= 0 {
		o.KeysPerUser = 2
	}
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.DailyRequests <= 0 {
		o.DailyRequests = 30 * int64(o.Rounds)
	}
	if o.Latency <= 0 {
		o.Latency = 3 * time.Millisecond
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano()
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.Backend == "" {
		o.Backend = backendBolt
	}
	switch {
	case o.Backend != backendBolt && o.Backend != backendPostgres:
		return nil, fmt.Errorf("backend %q: want %q or %q", o.Backend, backendBolt, backendPostgres)
	case o.Backend == backendPostgres && o.PostgresURL == "":
		return nil, fmt.Errorf("backend %q needs the database's URL", backendPostgres)
	case o.Backend == backendPostgres && o.PowerCut:
		return nil, fmt.Errorf("a power cut is of the bolt file's disk: not with backend %q", backendPostgres)
	}
	l := &loop{
		o:        o,
		rng:      rand.New(rand.NewPCG(uint64(o.Seed), 0)),
		img:      harness.PNG(),
		rep:      &Report{Kills: map[string]int{}, Answers: map[string]int64{}, DailyRequests: o.DailyRequests},
		ok:       map[string]string{},
		okByUser: map[string]int64{},
		rowsSeen: map[string]bool{},
		reported: map[string]bool{},
	}
	defer func() { l.rep.Elapsed = time.Since(start) }()
	if err := l.setUp(ctx); err != nil {
		l.tearDown()
		return nil, err
	}
	defer l.tearDown()
	o.Log("crashloop: seed %d, %d rounds, %d users x %d keys, %d clients, daily_requests %d, backend %s, power cut %v",
		o.Seed, o.Rounds, o.Users, o.KeysPerUser, o.Workers, o.DailyRequests, o.Backend, o.PowerCut)
	for round := 1; round <= o.Rounds; round++ {
		if err := ctx.Err(); err != nil {
			return l.rep, fmt.Errorf("stopped after %d rounds: %w", round-1, err)
		}
		if err := l.round(ctx, round); err != nil {
			return l.rep, fmt.Errorf("round %d: %w", round, err)
		}
		l.rep.Rounds = round
	}
	return l.rep, nil
}

func (l *loop) setUp(ctx context.Context) error {
	root := l.o.Root
	if root == "" {
		var err error
		if root, err = harness.ModuleRoot(ctx); err != nil {
			return err
		}
	}
	l.dir = l.o.Dir
	if l.dir == "" {
		d, err := os.MkdirTemp("", "crashloop-")
		if err != nil {
			return err
		}
		l.dir = d
	} else if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return err
	}
	bin, err := harness.Build(ctx, root, l.dir, "failpoint")
	if err != nil {
		return err
	}
	l.bin = bin
	dataDir := filepath.Join(l.dir, "data")
	if l.o.PowerCut {
		if l.disk, err = newDisk(ctx, l.dir); err != nil {
			return err
		}
		dataDir = l.disk.mnt
	}
	l.dbPath = filepath.Join(dataDir, "breakwater.db")
	if l.gemini, err = harness.NewGemini(root, l.o.Latency); err != nil {
		return err
	}
	l.config = filepath.Join(l.dir, "config.toml")
	err = harness.WriteConfig(l.config, harness.Config{
		DBPath: l.dbPath, GeminiURL: l.gemini.URL, DailyRequests: l.o.DailyRequests, Plan: "crash", Backend: l.o.Backend,
	})
	if err != nil {
		return err
	}
	for u := range l.o.Users {
		user := fmt.Sprintf("crash-user-%d", u+1)
		for range l.o.KeysPerUser {
			key, err := harness.NewKey(ctx, l.bin, l.config, user, "crash", l.backendEnv()...)
			if err != nil {
				return err
			}
			l.keys = append(l.keys, apiKey{user: user, key: key.Secret})
		}
	}
	return nil
}

func (l *loop) tearDown() {
	if l.gemini != nil {
		l.gemini.Close()
	}
	if l.disk != nil {
		if err := l.disk.close(); err != nil {
			l.o.Log("crashloop: %v", err)
		}
	}
	if l.o.Dir == "" && l.dir != "" {
		os.RemoveAll(l.dir)
	}
}

// backendEnv is what the server and the CLI need in their environment for
// the backend: on postgres the database's URL and the secret every
// instance and command shares.
func (l *loop) backendEnv() []string {
	if l.o.Backend != backendPostgres {
		return nil
	}
	return []string{"BREAKWATER_POSTGRES_URL=" + l.o.PostgresURL, "BREAKWATER_SECRET=crashloop-server-secret-0123456789"}
}

// round starts the server, loads it, kills it, and checks the database.
func (l *loop) round(ctx context.Context, n int) error {
	mode := l.roundMode(n)
	env := append([]string{"GEMINI_API_KEY=crashloop-not-a-key"}, l.backendEnv()...)
	if mode == killReserved || mode == killRecorded {
		p := 0.05 + 0.2*l.rng.Float64() // fires after about 4 to 20 hits
		env = append(env, fmt.Sprintf("%s=%s:%.3f", failpoint.Env, mode, p))
	}
	logPath := filepath.Join(l.dir, fmt.Sprintf("round-%02d.log", n))
	proc, err := harness.Start(l.bin, l.config, logPath, env...)
	if err != nil {
		return err
	}
	_, callsBefore := l.gemini.Calls()

	ld := l.startLoad(ctx, proc.Addr, n)
	cause := l.kill(n, mode, proc, logPath, ld)
	<-proc.Done()
	l.rep.Kills[cause]++
	ld.stop()

	if l.disk != nil {
		if err := l.disk.cut(ctx); err != nil {
			return err
		}
		l.rep.PowerCuts++
	}
	_, callsAfter := l.gemini.Calls()
	if err := l.check(n); err != nil {
		return err
	}
	l.o.Log("round %2d: %-8s upstream calls %4d (+%d), 200s %5d, usage rows %5d, ledger %4d, over calls %d, violations %d",
		n, cause, callsAfter, callsAfter-callsBefore, l.rep.OK, l.rep.UsageRows, l.rep.Ledger, l.rep.Excess, len(l.rep.Violations))
	return nil
}

// roundMode is how round n ends: failpoints and random kills in turn, and
// in the last rounds a load until the ceiling refuses calls, so that every
// run reaches daily_requests, and then a restart on it.
func (l *loop) roundMode(n int) string {
	mode := []string{killReserved, killRecorded, killRandom}[(n-1)%3]
	if n > 2 && n > l.o.Rounds-l.o.Rounds/10-2 {
		mode = killCeiling
	}
	return mode
}

// roundClients is the clients of one round, running until stopped.
type roundClients struct {
	paused    <-chan struct{} // closed at the first 503 budget_paused
	answered  []atomic.Int64  // the answers (or failures) each client has had
	cancel    context.CancelFunc
	wg        *sync.WaitGroup
	transport *http.Transport
}

// settle waits until every client has had an answer since settle was
// called, so that each request in flight then has ended, or until timeout
// or done. It reports whether they all had one.
func (r roundClients) settle(timeout time.Duration, done <-chan struct{}) bool {
	before := make([]int64, len(r.answered))
	for i := range r.answered {
		before[i] = r.answered[i].Load()
	}
	end := time.After(timeout)
	for {
		all := true
		for i := range r.answered {
			all = all && r.answered[i].Load() > before[i]
		}
		if all {
			return true
		}
		select {
		case <-end:
			return false
		case <-done:
			return false
		case <-time.After(time.Millisecond):
		}
	}
}

// stop stops the clients and waits for them.
func (r roundClients) stop() {
	r.cancel()
	r.wg.Wait()
	r.transport.CloseIdleConnections()
}

// startLoad starts the round's clients against addr: each sends reads with
// a random key and records what it saw, until stopped.
func (l *loop) startLoad(ctx context.Context, addr string, n int) roundClients {
	loadCtx, stopLoad := context.WithCancel(ctx)
	paused := make(chan struct{})
	var pausedOnce sync.Once
	transport := &http.Transport{MaxIdleConnsPerHost: l.o.Workers}
	client := &http.Client{Transport: transport, Timeout: 15 * time.Second}
	wg := &sync.WaitGroup{}
	answered := make([]atomic.Int64, l.o.Workers)
	for w := range l.o.Workers {
		rng := rand.New(rand.NewPCG(uint64(l.o.Seed), uint64(n*1000+w+1)))
		wg.Go(func() {
			for loadCtx.Err() == nil {
				k := l.keys[rng.IntN(len(l.keys))]
				a := harness.Post(loadCtx, client, addr, k.key, l.img)
				if loadCtx.Err() != nil && a.Status == 0 {
					return // our own stop, not the server's answer
				}
				l.answer(k.user, a)
				answered[w].Add(1)
				if a.Status == http.StatusServiceUnavailable && a.Code == "budget_paused" {
					pausedOnce.Do(func() { close(paused) })
				}
				if a.Status == 0 {
					time.Sleep(time.Millisecond) // the server is dying; do not spin
				}
			}
		})
	}
	return roundClients{paused: paused, answered: answered, cancel: stopLoad, wg: wg, transport: transport}
}

// kill ends the server of round n the way mode says, and returns the kill
// cause to count. A server that exits by itself, or dies but not at the
// failpoint it was given, is a violation.
func (l *loop) kill(n int, mode string, proc *harness.Process, logPath string, ld roundClients) string {
	cause := mode
	paused := ld.paused
	switch mode {
	case killCeiling:
		select {
		case <-paused:
			// The brake refuses once its claims reach the ceiling, and a
			// claim reaches the ledger only with its lease's write, after
			// the claim: the first refusal may come while the last calls
			// under the ceiling are still being written (on a loaded
			// machine, for longer than the kill's delay). Those calls are
			// the ceiling's, and a kill before their writes leaves the
			// ledger short of it without a fault. The kill waits for the
			// requests in flight at the refusal to end; then the ledger
			// holds the ceiling, unless the brake refused below it.
			if !ld.settle(ceilingSettle, proc.Done()) {
				l.o.Log("round %d: requests in flight at the first budget_paused still unanswered after %s", n, ceilingSettle)
			}
		case <-time.After(ceilingLoad):
		case <-proc.Done():
		}
		delay := time.Duration(l.rng.Int64N(int64(100 * time.Millisecond)))
		select {
		case <-time.After(delay):
			proc.Kill()
		case <-proc.Done():
			l.violate("round %d: the server exited by itself (%s)", n, harness.Tail(logPath))
		}
	case killRandom:
		delay := 5*time.Millisecond + time.Duration(l.rng.Int64N(int64(250*time.Millisecond)))
		select {
		case <-time.After(delay):
			proc.Kill()
		case <-proc.Done():
			l.violate("round %d: the server exited by itself (%s)", n, harness.Tail(logPath))
		}
	default:
		var fallback <-chan time.Time
		select {
		case <-proc.Done():
		case <-paused: // the ceiling is reached: no call can reach the failpoint
			fallback = time.After(50 * time.Millisecond)
		case <-time.After(roundLoad):
			fallback = time.After(0)
		}
		if fallback != nil {
			select {
			case <-proc.Done():
			case <-fallback:
				cause = killFallback
				proc.Kill()
			}
		}
		if cause != killFallback {
			if !proc.Killed() || !logHas(logPath, "failpoint "+mode+": SIGKILL") {
				l.violate("round %d: the server died, but not at failpoint %s:\n%s", n, mode, harness.Tail(logPath))
			}
		}
	}
	return cause
}

// answer records what a client saw.
func (l *loop) answer(user string, a harness.Answer) {
	label := "no answer"
	switch {
	case a.Status == http.StatusOK:
		label = "200"
	case a.Status != 0:
		label = fmt.Sprintf("%d %s", a.Status, a.Code)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rep.Answers[label]++
	if a.Status != http.StatusOK {
		return
	}
	l.rep.OK++
	if a.RequestID == "" {
		l.rep.Violations = append(l.rep.Violations, "a 200 without X-Request-ID")
		return
	}
	if prev, dup := l.ok[a.RequestID]; dup {
		l.rep.Violations = append(l.rep.Violations, fmt.Sprintf("request id %s answered 200 twice (%s, %s)", a.RequestID, prev, user))
	}
	l.ok[a.RequestID] = user
	l.okByUser[user]++
}

func (l *loop) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rep.Violations = append(l.rep.Violations, fmt.Sprintf(format, args...))
}

func logHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
