package netcut

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"breakwater/storage/postgres"
	"breakwater/test/harness"
)

// The edge plans of the cut tests: the users the host instance drives to
// their limit while the cut instance is cut off.
const (
	edgeQuota = 12 // plan "quota": monthly_quota
	edgeLine  = 12 // plan "line": daily_attempts
	edgeUsers = 4  // users of each edge plan
	bulkUsers = 8  // users of plan "bulk", which has no limit to speak of
)

// refusedWithin bounds how long the cut instance takes to answer a
// request during the cut: the money path's timeouts in turn (the
// transaction in progress on the admission's lane, postgres.DefaultOpTimeout,
// then as long to read its outcome back, then the request's own write,
// and a wait for a place in the money queue). Measured: at most 18 s.
// The clients give up after 30 s: a request left hanging fails the test.
const refusedWithin = 5 * postgres.DefaultOpTimeout

// longCut is the cut longer than a quota hold's life: the holds of the
// cut instance stop counting HoldTTL after its last heartbeat, and the
// host instance then has 10 s to drive the edge users to their limits
// (it takes about one).
const longCut = postgres.HoldTTL + 10*time.Second

// resumeWithin is how soon after the link is whole again the cut
// instance must answer a paid read (docs/INSTANCES.md).
const resumeWithin = 2 * time.Second

// TestCutOffFromTheDatabase cuts the instance in the namespace off from
// the database (every packet between them dropped, nothing else) while
// both instances serve, for 5 s (shorter than a quota hold's life,
// postgres.HoldTTL) and for longCut (longer). Throughout, the cut instance
// makes no upstream call it was not already making and refuses paid
// reads with 503; the host instance serves on, driving the users of two
// edge plans (a monthly quota, a daily line) to their limit; the cut
// instance answers a paid read within resumeWithin of the link's return;
// every 200 has its usage row. Shorter than a hold's life, no quota and
// no daily line is passed; longer, a quota may be passed by at most the
// reads the cut instance had in flight for that user at the cut (the
// documented bound), and the test prints by how many it was.
func TestCutOffFromTheDatabase(t *testing.T) {
	t.Parallel() // beside TestDatabaseLatency: each rig is a namespace, a cluster and instances of its own
	for _, d := range []time.Duration{5 * time.Second, longCut} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel() // the long cut is 40 s of waiting
			cutOff(t, d)
		})
	}
}

// cutRun is one cut under load: the rig, when the cut began and ended,
// and what the clients saw.
type cutRun struct {
	t             *testing.T
	r             *rig
	d             time.Duration
	cutAt, mendAt time.Time
	during        int64 // upstream calls the cut instance began during the cut
	reachedLimits bool  // every edge user was refused for their limit during the cut
	resumed       bool
	bulk          []result // both instances, all along
	edgeBefore    []result // edge users on the cut instance, up to the cut
	edgeHost      []result // edge users on the host instance, during the cut
	edgeAfter     []result // edge users on both, after the cut
}

func (c *cutRun) all() []result {
	return slices.Concat(c.bulk, c.edgeBefore, c.edgeHost, c.edgeAfter)
}

// edge is the edge users' target on instance i: quota and line users in
// turn.
func edge(i int) target {
	return func(k int) (int, string, int) {
		if k%2 == 0 {
			return i, "quota", (k / 2) % edgeUsers
		}
		return i, "line", (k / 2) % edgeUsers
	}
}

func cutOff(t *testing.T, d time.Duration) {
	c := runCut(t, d)
	b := c.r.books()
	c.checkCutInstance()
	checkServedThroughout(t, c.bulk, c.cutAt, c.mendAt)
	c.checkResume()
	c.r.checkRows(b, c.all())
	c.checkEdges(b)
	if t.Failed() {
		log, _ := os.ReadFile(c.r.procs[cut].LogPath)
		t.Logf("cut at %s, mended at %s; the cut instance's log:\n%s",
			c.cutAt.UTC().Format("15:04:05.000"), c.mendAt.UTC().Format("15:04:05.000"), log)
	}
}

// runCut starts a rig, loads both instances, cuts the namespaced one off
// for d while the host instance drives the edge users to their limits,
// mends the link, waits for the cut instance to serve again, loads the
// edge users on both for 2 s more and stops both instances.
func runCut(t *testing.T, d time.Duration) *cutRun {
	ctx, cancel := context.WithTimeout(context.Background(), d+90*time.Second)
	defer cancel()
	r := newRig(t, rigOptions{
		latency: [2]time.Duration{100 * time.Millisecond, 100 * time.Millisecond},
		cfg:     harness.Config{DailyRequests: 1000000, Plan: "bulk"},
		plans: fmt.Sprintf("[plans.quota]\nmonthly_quota = %d\ndaily_attempts = 0\n\n[plans.line]\nmonthly_quota = 100000000\ndaily_attempts = %d\n",
			edgeQuota, edgeLine),
		users: map[string]int{"bulk": bulkUsers, "quota": edgeUsers, "line": edgeUsers},
	})
	c := &cutRun{t: t, r: r, d: d}
	bulk := r.load(ctx, 8, func(k int) (int, string, int) { return k % 2, "bulk", (k / 2) % bulkUsers })
	served := func(i, n int) func() bool {
		return func() bool {
			return len(where(bulk.results(), func(res result) bool { return res.instance == i && isOK(res) })) >= n
		}
	}
	if !waitFor(30*time.Second, served(host, 20)) || !waitFor(10*time.Second, served(cut, 20)) {
		bulk.halt()
		t.Fatalf("both instances did not serve: %v\n%s", tally(bulk.results()), r.logs())
	}
	// The edge users' reads in flight on the cut instance at the cut hold
	// quota slots there.
	edgeCut := r.load(ctx, 16, edge(cut))
	if !waitFor(10*time.Second, func() bool { return len(where(edgeCut.results(), isOK)) >= 16 }) {
		edgeCut.halt()
		bulk.halt()
		t.Fatalf("the edge users were not served on the cut instance: %v\n%s", tally(edgeCut.results()), r.logs())
	}
	edgeCutDone := make(chan []result, 1)
	edgeHost := c.cut(ctx, func() { edgeCutDone <- edgeCut.halt() })
	c.resumed = waitFor(15*time.Second, func() bool {
		return len(where(bulk.results(), func(res result) bool {
			return res.instance == cut && isOK(res) && res.answered.After(c.mendAt)
		})) > 0
	})
	// Both instances, the link whole, still refuse the edge users.
	c.edgeHost = edgeHost.halt()
	edgeBoth := r.load(ctx, 16, func(k int) (int, string, int) { _, p, u := edge(0)(k); return k / 16 % 2, p, u })
	time.Sleep(2 * time.Second)
	c.edgeAfter = edgeBoth.halt()
	c.bulk = bulk.halt()
	c.edgeBefore = <-edgeCutDone
	r.stop()
	return c
}

// cut cuts the link for c.d, runs atCut as it begins, and returns the
// load of the edge users on the host instance, which it starts once the
// cut instance's holds have stopped counting (for a cut longer than
// their life) or at once.
func (c *cutRun) cut(ctx context.Context, atCut func()) *load {
	t, r := c.t, c.r
	pg := fmt.Sprintf("%s:%d", r.ns.HostIP, r.cluster.Port())
	r.ns.Cut(r.cluster.Port())
	// The cut holds from here: nft has returned. Taken before it, a
	// request sent while nft ran (hundreds of milliseconds on a loaded
	// machine) could be answered 200 and counted as during the cut.
	c.cutAt = time.Now()
	go atCut()
	if r.ns.Reach(pg, 500*time.Millisecond) {
		t.Fatalf("the database is still reachable from the namespace after the cut")
	}
	time.Sleep(time.Until(c.cutAt.Add(500 * time.Millisecond)))
	// Whatever the cut instance admitted before the cut has called by
	// now; from here on it may call no more until the link is back.
	settled := r.upstream(cut)
	if c.d > postgres.HoldTTL {
		time.Sleep(time.Until(c.cutAt.Add(postgres.HoldTTL + 3*time.Second)))
	}
	edgeHost := r.load(ctx, 16, edge(host))
	limited := func() bool {
		refused := map[string]bool{}
		for _, res := range edgeHost.results() {
			if res.answer.Code == "quota_exceeded" || res.answer.Code == "daily_limit" {
				refused[fmt.Sprint(res.plan, res.user)] = true
			}
		}
		return len(refused) == 2*edgeUsers
	}
	c.reachedLimits = waitFor(time.Until(c.cutAt.Add(c.d)), limited)
	// Its clients, refused from now on, would only crowd the bulk
	// users' out.
	edgeHost.halted.Store(true)
	time.Sleep(time.Until(c.cutAt.Add(c.d)))
	c.during = r.upstream(cut) - settled
	c.mendAt = time.Now()
	r.ns.Mend()
	if !r.ns.Reach(pg, 2*time.Second) {
		t.Errorf("the database is not reachable from the namespace once the cut is lifted")
	}
	return edgeHost
}

// checkCutInstance checks what the cut instance did during the cut: no
// upstream call, every request answered within refusedWithin, and 503
// to those answered before the link was back.
func (c *cutRun) checkCutInstance() {
	t, r := c.t, c.r
	all := c.all()
	inCut := where(all, func(res result) bool {
		return res.instance == cut && res.sent.After(c.cutAt) && res.answered.Before(c.mendAt)
	})
	hostInCut := where(c.bulk, func(res result) bool {
		return res.instance == host && isOK(res) && res.sent.After(c.cutAt) && res.answered.Before(c.mendAt)
	})
	t.Logf("cut for %v: the cut instance answered %v to requests sent and answered during the cut; "+
		"the host instance answered %d bulk 200s meanwhile (%.0f a second)",
		c.d, tally(inCut), len(hostInCut), float64(len(hostInCut))/c.d.Seconds())
	t.Logf("upstream calls: host %d, cut %d (%d begun after the cut's first 500 ms); all answers: %v",
		r.upstream(host), r.upstream(cut), c.during, tally(all))
	if c.during != 0 {
		t.Errorf("the cut instance made %d upstream calls while cut off from the database, want none", c.during)
	}
	// A request the cut instance takes during the cut waits for the
	// money path's transaction in progress (5 s, then 5 s to read its
	// outcome back) and for its own (5 s): a cut shorter than that ends
	// before any is answered, and they are then answered as usual.
	if c.d > refusedWithin && len(inCut) == 0 {
		t.Error("no request to the cut instance was answered during the cut")
	}
	for _, res := range inCut {
		if res.answer.Status != http.StatusServiceUnavailable {
			t.Errorf("the cut instance answered %d %s (%v) during the cut, want 503", res.answer.Status, res.answer.Code, res.answer.Err)
			break
		}
	}
	var slowest time.Duration
	for _, res := range where(all, func(res result) bool {
		return res.instance == cut && res.sent.After(c.cutAt) && res.sent.Before(c.mendAt)
	}) {
		slowest = max(slowest, res.took())
		if res.answer.Status == 0 {
			t.Errorf("a request sent to the cut instance during the cut got no answer in %v: %v", res.took(), res.answer.Err)
			break
		}
	}
	t.Logf("the slowest answer of the cut instance to a request sent during the cut took %v", slowest.Round(time.Millisecond))
	if slowest > refusedWithin {
		t.Errorf("the cut instance took %v to answer a request sent during the cut, more than %v", slowest, refusedWithin)
	}
	// On a loaded machine a 5 s cut may end first: the limits are then
	// reached after it, and the books are checked all the same.
	refused := map[string]bool{}
	for _, res := range slices.Concat(c.edgeHost, c.edgeAfter) {
		if res.answer.Code == "quota_exceeded" || res.answer.Code == "daily_limit" {
			refused[fmt.Sprint(res.plan, res.user)] = true
		}
	}
	t.Logf("every edge user refused for their limit during the cut: %v", c.reachedLimits)
	if len(refused) < 2*edgeUsers {
		t.Errorf("only %d of the %d edge users were refused for their limit: %v", len(refused), 2*edgeUsers, tally(slices.Concat(c.edgeHost, c.edgeAfter)))
	}
}

// checkResume checks that the cut instance answered a paid read within
// resumeWithin of the link's return.
func (c *cutRun) checkResume() {
	back := time.Duration(-1)
	for _, res := range c.bulk {
		if res.instance == cut && isOK(res) && res.answered.After(c.mendAt) && (back < 0 || res.answered.Sub(c.mendAt) < back) {
			back = res.answered.Sub(c.mendAt)
		}
	}
	c.t.Logf("the cut instance answered a 200 %v after the link was whole again", back.Round(time.Millisecond))
	if !c.resumed || back > resumeWithin {
		c.t.Errorf("the cut instance answered no 200 within %v of the link's return (%v)\n%s", resumeWithin, back, c.r.logs())
	}
}

// checkEdges checks the edge users' books: a quota is passed not at all
// in a cut shorter than a hold's life, and by at most the reads the cut
// instance had in flight for the user at the cut in a longer one; a
// daily line is never passed.
func (c *cutRun) checkEdges(b books) {
	t := c.t
	worst := int64(0)
	for u := range edgeUsers {
		q, l := fmt.Sprint("quota", u), fmt.Sprint("line", u)
		inFlight := int64(len(where(c.edgeBefore, func(res result) bool {
			return res.plan == "quota" && res.user == u && res.sent.Before(c.cutAt) && res.answered.After(c.cutAt)
		})))
		over := max(b.byUser[q], b.used[q]) - edgeQuota
		worst = max(worst, over)
		t.Logf("user %s: %d usage rows, quota counts %d of %d; %d reads in flight on the cut instance at the cut",
			q, b.byUser[q], b.used[q], edgeQuota, inFlight)
		switch {
		case c.d < postgres.HoldTTL && over > 0:
			t.Errorf("user %s passed their quota of %d by %d in a cut shorter than a hold's life", q, edgeQuota, over)
		case over > inFlight:
			t.Errorf("user %s passed their quota of %d by %d, more than the %d reads in flight on the cut instance", q, edgeQuota, over, inFlight)
		}
		t.Logf("user %s: %d usage rows, %d attempts counted of %d", l, b.byUser[l], b.attempts[l], edgeLine)
		if b.attempts[l] > edgeLine || b.byUser[l] > edgeLine {
			t.Errorf("user %s: %d attempts counted, %d usage rows; the daily line is %d", l, b.attempts[l], b.byUser[l], edgeLine)
		}
	}
	t.Logf("cut for %v: the most a quota was passed by: %d", c.d, max(worst, 0))
}

// servedEvery is the longest the host instance may go without a 200
// during the cut.
const servedEvery = 2 * time.Second

// checkServedThroughout fails t unless the host instance answered a bulk
// 200 in every servedEvery of the cut.
func checkServedThroughout(t *testing.T, rs []result, from, to time.Time) {
	t.Helper()
	n := int(to.Sub(from) / servedEvery)
	per := make([]int, n)
	for _, res := range rs {
		if res.instance != host || !isOK(res) || res.answered.Before(from) {
			continue
		}
		if k := int(res.answered.Sub(from) / servedEvery); k < n {
			per[k]++
		}
	}
	for k, m := range per {
		if m == 0 {
			t.Errorf("the host instance answered no 200 in %v from %v into the cut (200s each %v: %v)",
				servedEvery, time.Duration(k)*servedEvery, servedEvery, per)
			return
		}
	}
}
