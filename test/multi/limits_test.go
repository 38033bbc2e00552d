package multi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// The defense layers' limits on postgres are the service's, not each
// instance's: a client that alternates between two instances gets the
// limit once (the users' rate and burst, the invite fail limit and its
// cooldowns, a guarded route's per-IP limit); with PostgreSQL stopped each
// instance decides in memory, counting every such decision as a fail-open,
// and shares again once it is back.

// limitsPair starts two instances on dbURL with harness's config, edited:
// [limits.user] replaced by userLimits, trusted proxies on loopback (the
// client address then comes from X-Forwarded-For), and extra appended.
func limitsPair(t *testing.T, dbURL, userLimits, extra string) *pair {
	t.Helper()
	return newPairEdited(t, dbURL, harness.Config{DailyRequests: 1000}, 1, time.Millisecond, func(body string) string {
		edited := strings.Replace(body, "max_in_flight_per_user = 64\n", "max_in_flight_per_user = 64\ntrusted_proxies = [\"127.0.0.0/8\"]\n", 1)
		edited = strings.Replace(edited, "[limits.user]\nrate = 100000\nwindow = \"1m\"\nburst = 100000\n", userLimits, 1)
		if !strings.Contains(edited, "trusted_proxies") || !strings.Contains(edited, userLimits) {
			t.Fatalf("the harness's config changed: edit this test's\n%s", body)
		}
		return edited + extra
	})
}

// sequence sends n requests of user 0 one after the other, request k to
// instance k%2, and returns what each got.
func (p *pair) sequence(ctx context.Context, n int) []result {
	client := &http.Client{Timeout: 30 * time.Second}
	out := make([]result, n)
	for k := range n {
		out[k] = p.send(ctx, client, k%2, 0, nil)
	}
	return out
}

// checkRefusals fails t unless rs hold exactly want 200s and every other
// answer is a 429 whose Retry-After is within [1, maxWait] seconds.
func checkRefusals(t *testing.T, rs []result, want, maxWait int) {
	t.Helper()
	if got := len(ok(rs)); got != want {
		t.Errorf("%d requests alternating between the instances: %d passed, want exactly %d (%v)", len(rs), got, want, tally(rs))
	}
	for _, r := range rs {
		a := r.answer
		if a.Status != http.StatusOK && (a.Status != http.StatusTooManyRequests || a.RetryAfter < 1 || a.RetryAfter > maxWait) {
			t.Errorf("instance %d answered %d %s with Retry-After %d, want 200, or 429 with Retry-After in [1, %d]",
				r.instance, a.Status, a.Code, a.RetryAfter, maxWait)
		}
	}
}

// TestUserRateExactAcrossInstances: rate = 5 a minute for one user, 12
// quick requests alternating between two instances: exactly 5 pass, each
// 429 with its Retry-After; the burst (3 in a second) likewise, for 12
// requests at once.
func TestUserRateExactAcrossInstances(t *testing.T) {
	t.Run("rate", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n", "")
		checkRefusals(t, p.sequence(ctx, 12), 5, 60)
	})
	t.Run("burst", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 1000\nwindow = \"1m\"\nburst = 3\n", "")
		// A request whose instance read its clock before another's that
		// the database recorded first waits that much past the second,
		// as in one instance's memory: Retry-After may round up to 2.
		checkRefusals(t, p.burst(ctx, 12), 3, 2)
	})
	// The window is decided with the attempt and the quota slot, after
	// the upload: a request that ends before (an upload that is no image)
	// counts all the same. (The harness reads the same image again:
	// dedupe_window is off; TestWaiterGoneCountsAgainstTheRate turns it
	// on.)
	t.Run("bad uploads", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n", "")
		client := &http.Client{Timeout: 30 * time.Second}
		for k, want := range []int{http.StatusOK, 0, 0, http.StatusOK, 0, http.StatusTooManyRequests, http.StatusTooManyRequests} {
			body := harness.NthPNG(1)
			if k == 1 || k == 2 || k == 4 {
				body = []byte("this is no image at all")
			}
			a := harness.PostHeader(ctx, client, p.proc(k%2).Addr, p.keys[0].Secret, body, nil)
			bad := a.Status >= 400 && a.Status < 500 && a.Status != http.StatusTooManyRequests
			if (want == 0 && !bad) || (want != 0 && a.Status != want) {
				t.Fatalf("request %d: %d %s, want %d (0: refused as no image)", k, a.Status, a.Code, want)
			}
		}
	})
	// With an Idempotency-Key the count waits too: a repeat answered from
	// storage counts before it is answered, a first request at its
	// admission; the sixth request is refused whatever it is.
	t.Run("idempotent requests", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n", "")
		client := &http.Client{Timeout: 30 * time.Second}
		for k, want := range []int{200, 200, 200, 200, 200, 429, 429} {
			h := http.Header{"Idempotency-Key": {fmt.Sprintf("key-%d", k%2)}}
			a := harness.PostHeader(ctx, client, p.proc(k%2).Addr, p.keys[0].Secret, harness.NthPNG(uint64(100+k%2)), h)
			if a.Status != want {
				t.Fatalf("request %d: %d %s, want %d", k, a.Status, a.Code, want)
			}
		}
	})
}

// TestClaimedKeyCountsAgainstTheRate: an Idempotency-Key held by another
// instance (a read under way there) is answered 409 after a look at the
// kept answers and a claim, both in the database; such requests count
// against the rate as any other, so that a flood of them is refused 429
// (and then from memory) rather than costing two statements each.
func TestClaimedKeyCountsAgainstTheRate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := pgtest.NewDatabase(t)
	p := limitsPair(t, dbURL, "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n", "")
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The claim of a read under way on a third instance, for every user.
	if _, err := conn.Exec(ctx, `INSERT INTO answer_claims (user_id, key, owner, expires_at)
		SELECT id, 'busy', 'elsewhere', now() + interval '1 hour' FROM users`); err != nil {
		t.Fatal(err)
	}
	got := p.idempotentTally(ctx, 200, func(int) string { return "busy" })
	if got["409"] != 5 || got["429"] != 3 || len(got) != 2 {
		t.Fatalf("8 requests with a key claimed elsewhere: %v; want 5 × 409 and 3 × 429 (rate = 5)", got)
	}
}

// idempotentTally sends 8 requests of user 0 with the Idempotency-Key
// key(k), request k to instance k%2 with image first+k, one after the
// other, and returns the answers by status (and code, for a 503).
func (p *pair) idempotentTally(ctx context.Context, first int, key func(k int) string) map[string]int {
	client := &http.Client{Timeout: 30 * time.Second}
	got := map[string]int{}
	for k := range 8 {
		h := http.Header{"Idempotency-Key": {key(k)}}
		a := harness.PostHeader(ctx, client, p.proc(k%2).Addr, p.keys[0].Secret, harness.NthPNG(uint64(first+k)), h)
		s := strconv.Itoa(a.Status)
		if a.Status == http.StatusServiceUnavailable {
			s += " " + a.Code
		}
		got[s]++
	}
	return got
}

// TestIdempotentUnderTheBrakeCountsAgainstTheRate: a request with an
// Idempotency-Key looks its key up and claims it before the brake refuses
// it; it counts against the rate, so that a flood of new keys under the
// brake costs the database at most the rate, then is refused before its
// upload.
func TestIdempotentUnderTheBrakeCountsAgainstTheRate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n", "")
	for i := range 2 { // through each instance: on both at once, no request spent waiting
		p.admin(ctx, t, i, "/api/brake", `{"on":true}`)
	}
	got := p.idempotentTally(ctx, 400, func(k int) string { return fmt.Sprintf("brake-%d", k) })
	if got["503 paused_by_operator"] != 5 || got["429"] != 3 || len(got) != 2 {
		t.Fatalf("8 idempotent requests under the brake: %v; want 5 × 503 paused_by_operator and 3 × 429 (rate = 5)", got)
	}
}

// TestWaiterGoneCountsAgainstTheRate: a request that waits for its user's
// read of the same image under way, and whose client goes away
// meanwhile, counts against the rate as it would have before its upload
// (it was let in, and it cost an upload and a look at the recent reads):
// a client cannot make such requests without limit.
func TestWaiterGoneCountsAgainstTheRate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limits := "[limits.user]\nrate = 5\nwindow = \"1m\"\nburst = 0\n"
	p := newPairEdited(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 1000}, 1, 2*time.Second, func(body string) string {
		edited := strings.Replace(body, "dedupe_window = \"0s\"\n", "dedupe_window = \"1m\"\n", 1)
		edited = strings.Replace(edited, "[limits.user]\nrate = 100000\nwindow = \"1m\"\nburst = 100000\n", limits, 1)
		if !strings.Contains(edited, "dedupe_window = \"1m\"") || !strings.Contains(edited, limits) {
			t.Fatalf("the harness's config changed: edit this test's\n%s", body)
		}
		return edited
	})
	client := &http.Client{Timeout: 30 * time.Second}
	img := harness.NthPNG(300)
	lead := make(chan harness.Answer, 1)
	go func() { lead <- harness.PostHeader(ctx, client, p.proc(0).Addr, p.keys[0].Secret, img, nil) }()
	for { // until the lead's call (2 s at the fake) is under way
		if _, n := p.gemini.Calls(); n == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the lead's call never reached the fake")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var waiters sync.WaitGroup
	for range 6 {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			gone, stop := context.WithTimeout(ctx, 500*time.Millisecond)
			defer stop()
			if a := harness.PostHeader(gone, client, p.proc(0).Addr, p.keys[0].Secret, img, nil); a.Err == nil {
				t.Errorf("a waiter was answered %d %s before its client went away", a.Status, a.Code)
			}
		}()
	}
	waiters.Wait()
	if a := <-lead; a.Status != http.StatusOK {
		t.Fatalf("the lead read: %d %s, want 200", a.Status, a.Code)
	}
	// The lead and 6 waiters gone: the window (5) is full.
	if a := harness.PostHeader(ctx, client, p.proc(1).Addr, p.keys[0].Secret, harness.NthPNG(301), nil); a.Status != http.StatusTooManyRequests {
		t.Fatalf("after the lead and 6 waiters whose clients went away: %d %s, want 429", a.Status, a.Code)
	}
}

// verifyInvite posts an invite check to instance i from client address ip
// and returns the answer's status.
func (p *pair) verifyInvite(t *testing.T, i int, ip, code, email string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": code, "email": email})
	req, err := http.NewRequest(http.MethodPost, "http://"+p.proc(i).Addr+"/v1/invites/verify", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestInviteCooldownAcrossInstances: five wrong invite guesses through A
// put the client's address and the e-mail in a cooldown on B: B refuses
// a valid code for that e-mail from another address, and for another
// e-mail from that address, while it accepts the code from a third;
// `cooldowns list` names both, and `cooldowns clear` lifts one on A.
func TestInviteCooldownAcrossInstances(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 60\n", "\n[invites]\nburst = 100\n")
	out, err := harness.Command(ctx, bin, p.config, p.env, "invites", "create", "--uses", "5")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	code := lines[len(lines)-1]
	const guesser, victim = "203.0.113.5", "victim@example.com"
	for i := range 5 {
		if got := p.verifyInvite(t, 0, guesser, fmt.Sprintf("WRONG-CODE-%d", i), victim); got != http.StatusForbidden {
			t.Fatalf("wrong guess %d through A: %d, want 403", i+1, got)
		}
	}
	for _, c := range []struct {
		what, ip, email string
		want            int
	}{
		{"the e-mail in its cooldown, from another address", "203.0.113.6", victim, http.StatusForbidden},
		{"the address in its cooldown, with another e-mail", guesser, "other@example.com", http.StatusForbidden},
		{"a third client", "203.0.113.7", "third@example.com", http.StatusOK},
	} {
		if got := p.verifyInvite(t, 1, c.ip, code, c.email); got != c.want {
			t.Errorf("a valid code through B, %s: %d, want %d\n%s", c.what, got, c.want, p.logs())
		}
	}
	// The operator's commands see and lift the service's cooldowns, for
	// every instance at once.
	out, err = harness.Command(ctx, bin, p.config, p.env, "cooldowns", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ip:" + guesser, "email:" + victim} {
		if !strings.Contains(string(out), key) {
			t.Errorf("cooldowns list does not name %s:\n%s", key, out)
		}
	}
	if _, err := harness.Command(ctx, bin, p.config, p.env, "cooldowns", "clear", "email:"+victim); err != nil {
		t.Fatal(err)
	}
	if got := p.verifyInvite(t, 0, "203.0.113.8", code, victim); got != http.StatusOK {
		t.Errorf("the e-mail's cooldown lifted by the operator: a valid code through A got %d, want 200", got)
	}
}

// routeConfig is two guarded routes for forward auth: login, limited per
// client address to 3 a minute, and signup, to 2 a day.
const routeConfig = `
[[routes]]
name = "login"
path = "/api/login"
identity = "ip"
rate = 3
window = "1m"
burst = 0

[[routes]]
name = "signup"
path = "/api/signup"
identity = "ip"
rate = 100
daily = 2
`

// forwardAuth asks instance i whether a request of client ip to the login
// route may pass, and returns the status.
func (p *pair) forwardAuth(t *testing.T, i int, ip string) int {
	t.Helper()
	return p.forwardAuthTo(t, i, "login", ip)
}

// forwardAuthTo asks instance i whether a request of client ip to route
// may pass, and returns the status.
func (p *pair) forwardAuthTo(t *testing.T, i int, route, ip string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+p.proc(i).Addr+"/v1/forward-auth/"+route, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", ip)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// routePasses sends n checks of client ip, alternating from instance
// first, and counts the 200s; any answer but 200 or 429 fails t.
func (p *pair) routePasses(t *testing.T, ip string, n, first int) int {
	t.Helper()
	passed := 0
	for k := range n {
		switch got := p.forwardAuth(t, (first+k)%2, ip); got {
		case http.StatusOK:
			passed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("forward auth of %s: %d, want 200 or 429\n%s", ip, got, p.logs())
		}
	}
	return passed
}

// TestRoutePerIPLimitAcrossInstances: a guarded route's per-IP limit (3 a
// minute) and another's daily line (2) hold across instances, and the
// first through a restart of both.
func TestRoutePerIPLimitAcrossInstances(t *testing.T) {
	p := limitsPair(t, pgtest.NewDatabase(t), "[limits.user]\nrate = 60\n", routeConfig)
	if got := p.routePasses(t, "198.51.100.1", 8, 0); got != 3 {
		t.Errorf("8 checks of one address alternating between the instances: %d passed, want exactly 3", got)
	}
	daily := 0
	for k := range 6 {
		if p.forwardAuthTo(t, k%2, "signup", "198.51.100.9") == http.StatusOK {
			daily++
		}
	}
	if daily != 2 {
		t.Errorf("6 checks of one address alternating between the instances on a route of 2 a day: %d passed, want exactly 2", daily)
	}
	p.stopAll()
	p.start(0)
	p.start(1)
	if got := p.routePasses(t, "198.51.100.1", 4, 1); got != 0 {
		t.Errorf("after a restart of both instances, %d of 4 checks of the limited address passed, want none", got)
	}
}

// failOpens reads breakwater_layer_failopen_total{layer} from instance
// i's /metrics.
func (p *pair) failOpens(t *testing.T, i int, layer string) float64 {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+p.proc(i).AdminAddr()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	want := fmt.Sprintf("breakwater_layer_failopen_total{layer=%q} ", layer)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), want); found {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestPostgresStoppedLimitsDecideLocally: with PostgreSQL stopped, each
// instance decides a new client in memory (its own limit still holds)
// and counts each such decision as a fail-open; started again, the limit
// is shared again without a restart.
func TestPostgresStoppedLimitsDecideLocally(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := pgtest.NewCluster(t)
	dbURL := createDatabase(ctx, t, cluster.URL("postgres"), "bw_limits")
	p := limitsPair(t, dbURL, "[limits.user]\nrate = 60\n", routeConfig)
	if got := p.routePasses(t, "198.51.100.1", 6, 0); got != 3 {
		t.Fatalf("before the stop: %d of 6 checks passed, want 3", got)
	}
	layer := "route:login"
	before := p.failOpens(t, 0, layer)

	cluster.Stop()
	passed := 0 // all five through A: A's memory decides, and its limit holds
	for range 5 {
		if p.forwardAuth(t, 0, "198.51.100.2") == http.StatusOK {
			passed++
		}
	}
	if passed != 3 {
		t.Errorf("PostgreSQL stopped: a new address passed %d of 5 checks on one instance, want its memory's 3", passed)
	}
	// The fifth is refused from the deny cache, as the fourth's refusal
	// was remembered: no layer decides it, and no fail-open is counted.
	if got := p.failOpens(t, 0, layer) - before; got < 4 {
		t.Errorf("PostgreSQL stopped: %v fail-opens counted for 4 decisions made in memory and 1 refusal from memory, want 4", got)
	}

	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	// Shared again once a decision on each instance counts no fail-open.
	probe := 0
	back := waitFor(20*time.Second, func() bool {
		for i := range 2 {
			n := p.failOpens(t, i, layer)
			probe++
			p.forwardAuth(t, i, fmt.Sprintf("198.51.100.%d", 100+probe))
			if p.failOpens(t, i, layer) != n {
				time.Sleep(200 * time.Millisecond)
				return false
			}
		}
		return true
	})
	if !back {
		t.Fatalf("the limits did not go back to PostgreSQL within 20 s\n%s", p.logs())
	}
	if got := p.routePasses(t, "198.51.100.3", 8, 1); got != 3 {
		t.Errorf("PostgreSQL started again: %d of 8 checks alternating between the instances passed, want exactly 3", got)
	}
}
