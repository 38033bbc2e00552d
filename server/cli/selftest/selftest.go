// Package selftest proves an operator's own limits on the real pipeline:
// for a config, it opens the service (app.Open) against the simulated
// upstream on a fresh throwaway database, fires parallel requests at each
// limit over loopback, and says per limit what it saw and whether the
// limit held.
//
// It never touches the live state: every check runs on an in-memory copy
// of the config whose storage.path is a new file in a temporary folder,
// with ocr.provider "simulated", the listener on 127.0.0.1:0, the admin
// API, mail, JWT sign-in and the app's own routes off. Each check loosens
// the other limits in its copy, so that the one it tests is the one that
// refuses; a limit too large to reach in seconds is tested scaled down,
// and the line says so; a limit the config has in shadow mode is
// enforced in its copy, and the line says it is in shadow. The clock of
// the service is the selftest's own, so that windows of a minute or an
// hour pass at once. A read is billed at the price of the model its
// answer names: ocr.model, or ocr.fallback_model past a soft ceiling.
package selftest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/server/app"
	"breakwater/server/jwtauth"
)

// DefaultScale is the largest budget.daily_requests, monthly quota, daily
// line or limits.user rate tested as it is, so that a selftest runs in
// seconds on a small VPS (about 3,000 requests with the shipped config);
// a larger one is tested at DefaultScale, and its line says "tested
// scaled down".
const DefaultScale = 300

// parallel is how many requests are on the wire at once.
const parallel = 64

// selftestPlan is the plan of the checks that do not test a plan: no
// daily line and a quota no check reaches.
const selftestPlan = "selftest"

// shadowMark ends the line of a limit in shadow mode that held enforced:
// live it refuses nothing, so it is not said to hold.
const shadowMark = "shadow: counted, not enforced"

// inShadow is a line's note on how its limit was tested (" (tested
// scaled down, at 300)", or ""), with that the limit is in shadow mode
// and was tested enforced.
func inShadow(note string) string {
	if note == "" {
		return " (in shadow mode, tested enforced)"
	}
	return strings.TrimSuffix(note, ")") + "; in shadow mode, tested enforced)"
}

// ErrNotHeld is returned by Run when at least one limit did not hold.
var ErrNotHeld = errors.New("selftest: a limit did not hold")

// Service is one running copy of the pipeline under test.
type Service interface {
	// URL is the base of the public API: "http://127.0.0.1:PORT".
	URL() string
	// CreateKey makes an API key for a new user on plan.
	CreateKey(user, plan string) (secret string, err error)
	// CreateInvite makes an invite code for uses e-mails.
	CreateInvite(uses int) (code string, err error)
	// Close stops it.
	Close()
}

// Opener starts the pipeline for cfg with the clock now. OpenApp is the
// real one; a test hands Run a broken one to see the selftest fail.
type Opener func(ctx context.Context, cfg app.Config, now func() time.Time) (Service, error)

// OpenApp opens the real service with app.Open, with no secret from the
// environment: no admin API, no Gemini key.
func OpenApp(ctx context.Context, cfg app.Config, now func() time.Time) (Service, error) {
	a, err := app.Open(ctx, cfg, app.Options{Getenv: func(string) string { return "" }, Now: now})
	if err != nil {
		return nil, err
	}
	return appService{a}, nil
}

type appService struct{ a *app.App }

func (s appService) URL() string { return "http://" + s.a.Addr() }
func (s appService) Close()      { s.a.Close() }
func (s appService) CreateKey(user, plan string) (string, error) {
	secret, _, err := s.a.Keys().Create(user, plan)
	return secret, err
}
func (s appService) CreateInvite(uses int) (string, error) {
	code, _, err := s.a.Invites().Create(uses, 0, "selftest")
	return code, err
}

// Result is what one check proved.
type Result struct {
	// Limit names the key tested: "budget.daily_requests".
	Limit string
	// Line is the sentence printed for it.
	Line string
	// Held is whether the limit held exactly.
	Held bool
	// Shadow is set for a limit the config has in shadow mode: live, its
	// would-be refusals are counted and the requests let through. Its
	// check ran with it enforced on the copy, which proves what enforcing
	// it will refuse (the limit decides alike in both modes).
	Shadow bool
}

// Options are a run's parameters; the zero value is the operator's run.
type Options struct {
	// Open starts the pipeline. Nil: OpenApp.
	Open Opener
	// Scale is the largest figure a limit is tested at. 0: DefaultScale.
	Scale int64
	// retryWait replaces the package's retryWait; a test's proxy that
	// drops answers sets it shorter.
	retryWait time.Duration
}

// Run checks every limit of cfg that is on, printing one line per limit
// to w as it goes, and returns the results; the error wraps ErrNotHeld,
// naming the limits, when one did not hold, or is what stopped a check
// from running. cfg must have passed app.Load; it is not changed.
func Run(ctx context.Context, cfg app.Config, w io.Writer, o Options) ([]Result, error) {
	if o.Open == nil {
		o.Open = OpenApp
	}
	if o.Scale <= 0 {
		o.Scale = DefaultScale
	}
	dir, err := os.MkdirTemp("", "breakwater-selftest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if o.retryWait <= 0 {
		o.retryWait = retryWait
	}
	r := &runner{ctx: ctx, cfg: cfg, open: o.Open, scale: o.Scale, retryWait: o.retryWait, dir: dir, client: newClient()}
	defer r.client.CloseIdleConnections()
	var checks []func() (Result, error)
	if cfg.Budget.DailyRequests > 0 {
		checks = append(checks, r.dailyRequests)
	}
	if cfg.Budget.DailyUSD > 0 {
		checks = append(checks, func() (Result, error) { return r.money("budget.daily_usd", cfg.Budget.DailyUSD) })
	}
	if cfg.Budget.MonthlyUSD > 0 {
		checks = append(checks, func() (Result, error) { return r.money("budget.monthly_usd", cfg.Budget.MonthlyUSD) })
	}
	if u := cfg.Limits.User; u.Rate > 0 || u.Burst > 0 {
		checks = append(checks, r.userRate)
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Plans)) {
		checks = append(checks, func() (Result, error) { return r.quota(name) })
		if cfg.Plans[name].DailyAttempts > 0 {
			checks = append(checks, func() (Result, error) { return r.dailyAttempts(name) })
		}
	}
	checks = append(checks, r.failLimit)

	var results []Result
	var broken []string
	for _, check := range checks {
		res, err := check()
		if err != nil {
			return results, err
		}
		mark := "holds"
		if res.Shadow {
			mark = shadowMark
		}
		if !res.Held {
			mark, broken = "DOES NOT HOLD", append(broken, res.Limit)
		}
		fmt.Fprintf(w, "%s — %s\n", res.Line, mark)
		results = append(results, res)
	}
	if len(broken) > 0 {
		return results, fmt.Errorf("%w: %s", ErrNotHeld, strings.Join(broken, ", "))
	}
	return results, nil
}

// runner is one selftest run.
type runner struct {
	ctx   context.Context
	cfg   app.Config
	open  Opener
	scale int64
	// retryWait is the wait before ocr sends a request again.
	retryWait time.Duration
	dir       string
	n         int          // services opened, for their folders
	images    atomic.Int64 // images sent, so that no read is a repeat
	client    *http.Client
}

// service opens the pipeline on a fresh database with the copy that
// change makes of the config, and its clock at noon on the 10th of this
// month in budget.timezone (so that no check crosses a midnight).
func (r *runner) service(change func(c *app.Config)) (Service, *clock, error) {
	c := r.cfg
	c.Plans = maps.Clone(r.cfg.Plans)
	c.Plans[selftestPlan] = budget.Plan{MonthlyQuota: 1 << 40}
	r.n++
	c.Storage.Path = filepath.Join(r.dir, fmt.Sprintf("check-%02d", r.n), "breakwater.db")
	c.OCR.Provider = "simulated"
	c.OCR.SimulatedLatency = 0
	c.Server.Listen = "127.0.0.1:0"
	c.Server.MaxInFlightPerUser = 1 << 20 // the transport's cap is not a limit tested here
	c.Server.TrustedProxies = []string{"127.0.0.1"}
	c.Server.ClientIPHeader = "X-Forwarded-For"
	c.Alerts = nil                // no mail from a selftest
	c.Auth.JWT = jwtauth.Config{} // no JWKS fetched
	c.Routes = nil
	change(&c)
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("selftest config: %w", err)
	}
	if _, err := c.Budget.Location(); err != nil {
		return nil, nil, err
	}
	clk := newClock(serviceStart(c))
	s, err := r.open(r.ctx, c, clk.Now)
	if err != nil {
		return nil, nil, fmt.Errorf("selftest: open the service: %w", err)
	}
	return s, clk, nil
}

// serviceStart is the time a service under test starts at: the 10th of
// the month at noon in budget.timezone, whatever today is, so that no day
// or month ends during a test.
func serviceStart(c app.Config) time.Time {
	loc, err := c.Budget.Location()
	if err != nil {
		loc = time.UTC // refused where the service opens
	}
	y, m, _ := time.Now().In(loc).Date()
	return time.Date(y, m, 10, 12, 0, 0, 0, loc)
}

// close stops s after closing the client's idle connections: the server
// would wait seconds for one that was dialled and never sent a request.
func (r *runner) close(s Service) {
	r.client.CloseIdleConnections()
	s.Close()
}

// noCeilings switches off the budget's ceilings in a copy.
func noCeilings(c *app.Config) {
	c.Budget.DailyRequests, c.Budget.DailyUSD, c.Budget.MonthlyUSD = 0, 0, 0
}

// scaled is the figure a limit is tested at, and the note that says so
// when it is lower than the operator's.
func scaled(limit, most int64) (int64, string) {
	if limit <= most {
		return limit, ""
	}
	return most, fmt.Sprintf(" (tested scaled down, at %s)", thousands(most))
}

// dailyRequests fires four times the ceiling in parallel from users with
// no other limit, then tops up one at a time: the calls upstream must be
// the ceiling exactly, and the next one refused by the brake. Tested
// scaled down, a soft_daily_requests is scaled alike, so that it stays
// below the ceiling.
func (r *runner) dailyRequests() (Result, error) {
	b := r.cfg.Budget
	limit, note := scaled(b.DailyRequests, r.scale)
	soft := b.SoftDailyRequests
	if note != "" && soft > 0 {
		soft = scaleLine(soft, float64(limit)/float64(b.DailyRequests), limit)
		note = fmt.Sprintf(" (tested scaled down, at %s, soft_daily_requests at %s)", thousands(limit), thousands(soft))
	}
	sent, got, tail, err := r.brake(limit, limit, func(c *app.Config) {
		c.Budget.DailyRequests, c.Budget.SoftDailyRequests = limit, soft
	})
	if err != nil {
		return Result{}, err
	}
	calls := got.total()
	line := fmt.Sprintf("budget.daily_requests = %s%s: %s parallel requests, %s upstream calls, then %s",
		thousands(b.DailyRequests), note, thousands(sent), thousands(calls), tail)
	return Result{Limit: "budget.daily_requests", Line: line, Held: calls == limit && tail.held}, nil
}

// brake runs a budget ceiling's check on a service where only the ceiling
// that set switches on can refuse: from users with no other limit, four
// times the calls it allows (limit, at least one) in parallel, then one
// at a time until the brake refuses, at most most+1 more. Reservations
// still in flight during the burst may refuse a call the ceiling would
// have let through (budget_busy); the top-up reaches the ceiling one
// request at a time.
func (r *runner) brake(limit, most int64, set func(c *app.Config)) (sent int64, got reads, tail refusals, err error) {
	s, _, err := r.service(func(c *app.Config) {
		noCeilings(c)
		set(c)
		c.Limits.User = limiter.Config{}
	})
	if err != nil {
		return 0, nil, refusals{}, err
	}
	defer r.close(s)
	keys, err := makeKeys(s, 8, selftestPlan)
	if err != nil {
		return 0, nil, refusals{}, err
	}
	sent = 4 * max(limit, 1)
	got, tail = r.reach(s, keys, sent, most, answer{status: http.StatusServiceUnavailable, code: "budget_paused"})
	return sent, got, tail, nil
}

// userRate checks limits.user with the service's clock: in each second
// twice the burst in parallel, of which exactly the burst passes, until
// the window holds rate requests and the next is refused; once the
// window has moved past the first second, that second's requests may be
// made again. The limit is enforced, also when the config has it in
// shadow mode.
func (r *runner) userRate() (Result, error) {
	u := r.cfg.Limits.User.WithDefaults()
	rate, note := scaled(int64(u.Rate), r.scale)
	s, clk, err := r.service(func(c *app.Config) {
		noCeilings(c)
		c.Limits.User.Rate = int(rate)
		c.Limits.User.Mode = limiter.ModeEnforce
	})
	if err != nil {
		return Result{}, err
	}
	defer r.close(s)
	keys, err := makeKeys(s, 1, selftestPlan)
	if err != nil {
		return Result{}, err
	}
	shadow := u.Shadow()
	if shadow {
		note = inShadow(note)
	}
	name := fmt.Sprintf("limits.user rate %d/%s burst %d%s", u.Rate, shortDuration(u.Window), u.Burst, note)
	if rate == 0 { // burst only
		got := r.fire(s, keys, 2*u.Burst)
		passed := got.count(http.StatusOK, "")
		return Result{Limit: "limits.user.burst", Held: passed == int64(u.Burst) && got.count(http.StatusTooManyRequests, "rate_limited") == int64(u.Burst),
			Line: fmt.Sprintf("%s: %d parallel requests in one second, %d passed", name, 2*u.Burst, passed), Shadow: shadow}, nil
	}
	step := rate // per second; the burst bounds it
	if u.Burst > 0 && int64(u.Burst) < step {
		step = int64(u.Burst)
	}
	var passed, sent int64
	var first int64        // passed in the first second
	var firstEnd time.Time // when the first second's requests were all answered
	start := clk.Now()
	held, why := true, ""
	for passed < rate {
		if clk.Now().Sub(start) >= u.Window-limiter.BurstWindow {
			// The window moves before it fills: the burst is the
			// binding limit, and rate cannot be reached.
			break
		}
		want := min(step, rate-passed)
		got := r.fire(s, keys, int(2*want))
		sent += 2 * want
		n := got.count(http.StatusOK, "")
		if n != want && held {
			held, why = false, fmt.Sprintf(", %d passed in a second where %d should", n, want)
		}
		if firstEnd.IsZero() {
			first, firstEnd = n, clk.Now()
		}
		passed += n
		clk.Advance(limiter.BurstWindow)
	}
	// The window is full: one more is refused.
	over := r.ocr(s, keys[0])
	sent++
	if passed >= rate && (over.status != http.StatusTooManyRequests || over.code != "rate_limited") {
		held, why = false, fmt.Sprintf(", request %d of the window answered %s", rate+1, over)
	}
	// Past the window from the first second, its requests are free again.
	clk.Set(firstEnd.Add(u.Window + time.Millisecond))
	again := r.fire(s, keys, int(2*first)).count(http.StatusOK, "")
	if again != first && held {
		held, why = false, fmt.Sprintf(", %d passed after the window moved where %d should", again, first)
	}
	verdict := "exact"
	if !held {
		verdict = "not exact" + why
	}
	line := fmt.Sprintf("%s: %s (%s requests: %s passed in the window, then 429; %d again after %s)",
		name, verdict, thousands(sent+2*first), thousands(passed), again, shortDuration(u.Window))
	return Result{Limit: "limits.user", Line: line, Held: held, Shadow: shadow}, nil
}

// quota fires one and a half times a plan's monthly quota in parallel
// from one user of that plan, with its daily line and the other limits
// off: exactly the quota passes, and the rest gets 429 quota_exceeded.
func (r *runner) quota(plan string) (Result, error) {
	return r.planLimit(plan, "monthly_quota", r.cfg.Plans[plan].MonthlyQuota, "reads", "quota_exceeded", false,
		func(n int64) budget.Plan { return budget.Plan{MonthlyQuota: n} })
}

// dailyAttempts is quota's check for a plan's daily line, with the quota
// out of reach and the line enforced, also when the config has it in
// shadow mode.
func (r *runner) dailyAttempts(plan string) (Result, error) {
	p := r.cfg.Plans[plan]
	return r.planLimit(plan, "daily_attempts", p.DailyAttempts, "upstream calls", "daily_limit", p.ShadowDaily(),
		func(n int64) budget.Plan {
			return budget.Plan{MonthlyQuota: 1 << 40, DailyAttempts: n, DailyMode: limiter.ModeEnforce}
		})
}

// planLimit checks one of a plan's limits, key, configured at limit: on a
// service where only that limit can refuse (the plan made by withLimit at
// the scaled figure), one user's parallel requests get exactly that many
// answers (counted as counted), then 429 code. shadow says the config
// has the limit in shadow mode.
func (r *runner) planLimit(plan, key string, limit int64, counted, code string, shadow bool, withLimit func(int64) budget.Plan) (Result, error) {
	n, note := scaled(limit, r.scale)
	if shadow {
		note = inShadow(note)
	}
	s, _, err := r.service(func(c *app.Config) {
		noCeilings(c)
		c.Limits.User = limiter.Config{}
		c.Plans[plan] = withLimit(n)
	})
	if err != nil {
		return Result{}, err
	}
	defer r.close(s)
	keys, err := makeKeys(s, 1, plan)
	if err != nil {
		return Result{}, err
	}
	sent := n + max(n/2, 10)
	passed, tail := r.reach(s, keys, sent, n, answer{status: http.StatusTooManyRequests, code: code})
	got := passed.total()
	line := fmt.Sprintf("plans.%s %s %s%s: %s parallel requests, %s %s, then %s",
		plan, key, thousands(limit), note, thousands(sent), thousands(got), counted, tail)
	return Result{Limit: "plans." + plan + "." + key, Line: line, Held: got == n && tail.held, Shadow: shadow}, nil
}

// failLimit checks the invite fail limit from two client addresses and
// two e-mails: after fail_limit-1 wrong codes the right one is accepted;
// after fail_limit wrong codes even the right one is refused, until the
// cooldown has passed on the service's clock. The limit is enforced, also
// when [invites] is in shadow mode.
func (r *runner) failLimit() (Result, error) {
	iv := r.cfg.Invites
	s, clk, err := r.service(func(c *app.Config) {
		c.Invites.Rate, c.Invites.Window, c.Invites.Burst = limiter.MaxRate, time.Hour, limiter.MaxRate
		c.Invites.GlobalFailPerHour = 1 << 30
		c.Invites.Mode = limiter.ModeEnforce
	})
	if err != nil {
		return Result{}, err
	}
	defer r.close(s)
	code, err := s.CreateInvite(2)
	if err != nil {
		return Result{}, err
	}
	wrong := "WRONG-" + strings.Repeat("X", len(code)-6)
	try := func(ip, email, code string) int {
		clk.Advance(time.Second) // each attempt within fail_window of the last
		return r.verify(s, ip, email, code)
	}
	held, why := true, ""
	for range iv.FailLimit - 1 {
		try("198.51.100.1", "below@selftest.invalid", wrong)
	}
	if st := try("198.51.100.1", "below@selftest.invalid", code); st != http.StatusOK {
		held, why = false, fmt.Sprintf("; the right code after %d failures got %d", iv.FailLimit-1, st)
	}
	for range iv.FailLimit {
		try("198.51.100.2", "above@selftest.invalid", wrong)
	}
	if st := try("198.51.100.2", "above@selftest.invalid", code); st != http.StatusForbidden && held {
		held, why = false, fmt.Sprintf("; the right code after %d failures got %d, not a refusal", iv.FailLimit, st)
	}
	clk.Advance(iv.Cooldown + time.Second)
	if st := try("198.51.100.2", "above@selftest.invalid", code); st != http.StatusOK && held {
		held, why = false, fmt.Sprintf("; the right code after the cooldown got %d", st)
	}
	note := ""
	if iv.Shadow() {
		note = inShadow("")
	}
	line := fmt.Sprintf("invites fail_limit %d%s: cooldown after %d, right code refused during it, accepted after %s%s",
		iv.FailLimit, note, iv.FailLimit, shortDuration(iv.Cooldown), why)
	return Result{Limit: "invites.fail_limit", Line: line, Held: held, Shadow: iv.Shadow()}, nil
}

// newClient is the selftest's HTTP client: at most parallel connections.
func newClient() *http.Client {
	return &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxConnsPerHost: parallel, MaxIdleConnsPerHost: parallel},
	}
}

// refusals is how a limit's refusals went: the limit's own, and any
// other answer (a timeout on a machine under load).
type refusals struct {
	want, final answer
	n           int64
	other       answers
	held        bool // the top-up ended on want, and no 200 came past the limit
}

func (t refusals) String() string {
	s := fmt.Sprintf("%s (%s)", t.want, thousands(t.n))
	if t.final != t.want {
		s += fmt.Sprintf("; the next one answered %s", t.final)
	}
	for _, a := range slices.SortedFunc(maps.Keys(t.other), func(a, b answer) int { return strings.Compare(a.String(), b.String()) }) {
		s += fmt.Sprintf("; %s: %s", a, thousands(t.other[a]))
	}
	return s
}

// reach fires sent requests at once, then one at a time until an answer
// is not a 200 (at most limit more), and returns the 200s: a limit that
// holds gives exactly limit, and ends on want. A parallel request that
// failed for another reason (busy) leaves room that the top-up takes, so
// only the limit decides the count; one whose answer was lost is asked
// again (see ocr).
func (r *runner) reach(s Service, keys []string, sent, limit int64, want answer) (reads, refusals) {
	got := r.fire(s, keys, int(sent))
	t := refusals{want: want, other: answers{}}
	passed := reads{}
	for a, n := range got {
		switch {
		case a.status == http.StatusOK:
			passed[a.model] += n
		case a == want:
			t.n += n
		default:
			t.other[a] += n
		}
	}
	for range limit + 1 {
		t.final = r.ocr(s, keys[0])
		if t.final.status != http.StatusOK {
			break
		}
		passed[t.final.model]++
	}
	t.held = t.final == want
	return passed, t
}

// reads counts 200s by the model the answer names.
type reads map[string]int64

// total is how many there are.
func (rs reads) total() int64 {
	var n int64
	for _, c := range rs {
		n += c
	}
	return n
}

// answer is one request's status, problem code, and for a 200 the
// model the answer names.
type answer struct {
	status int
	code   string
	model  string
}

func (a answer) String() string {
	if a.code == "" {
		return fmt.Sprint(a.status)
	}
	return fmt.Sprintf("%d %s", a.status, a.code)
}

// answers counts a burst's answers.
type answers map[answer]int64

// count is how many got status (and code, when it is not "").
func (as answers) count(status int, code string) int64 {
	var n int64
	for a, c := range as {
		if a.status == status && (code == "" || a.code == code) {
			n += c
		}
	}
	return n
}

// fire sends n OCR requests at once, spread over keys, each with an image
// of its own (so none is a repeat read), and counts the answers.
func (r *runner) fire(s Service, keys []string, n int) answers {
	var (
		mu  sync.Mutex
		got = answers{}
		wg  sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			a := r.ocr(s, keys[i%len(keys)])
			mu.Lock()
			got[a]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

// ocr sends one read of an image not sent before, with an
// Idempotency-Key of its own. A request left without an answer (a client
// timeout on a loaded machine) may still have read, since a paid call
// outlives its client: it is sent again with the same key until the
// answer is known, the kept one if it read, so that no read goes
// uncounted.
func (r *runner) ocr(s Service, key string) answer {
	i := r.images.Add(1)
	img, idem := sampleImage(int(i)), fmt.Sprintf("selftest-%d", i)
	var a answer
	for try := range maxTries {
		if try > 0 {
			select {
			case <-r.ctx.Done():
				return a
			case <-time.After(r.retryWait):
			}
		}
		req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, s.URL()+"/v1/ocr", bytes.NewReader(img))
		if err != nil {
			return answer{code: err.Error()}
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "image/png")
		req.Header.Set("Idempotency-Key", idem)
		a = r.do(req)
		if a.status != 0 && a.code != "idempotency_key_in_use" {
			return a
		}
	}
	return a
}

// maxTries is how many times ocr sends a request whose answer is not
// known, retryWait the wait before each repeat: the Retry-After of
// 409 idempotency_key_in_use.
const (
	maxTries  = 30
	retryWait = time.Second
)

// verify sends one invite verification from ip and returns its status.
func (r *runner) verify(s Service, ip, email, code string) int {
	body, _ := json.Marshal(map[string]string{"code": code, "email": email})
	req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, s.URL()+"/v1/invites/verify", bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	return r.do(req).status
}

func (r *runner) do(req *http.Request) answer {
	resp, err := r.client.Do(req)
	if err != nil {
		return answer{code: err.Error()}
	}
	defer resp.Body.Close()
	var p struct {
		Code  string `json:"code"`
		Model string `json:"model"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&p)
	a := answer{status: resp.StatusCode, code: p.Code}
	if resp.StatusCode == http.StatusOK {
		a = answer{status: resp.StatusCode, model: p.Model}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return a
}

// makeKeys makes n users of plan with one key each.
func makeKeys(s Service, n int, plan string) ([]string, error) {
	keys := make([]string, n)
	for i := range keys {
		k, err := s.CreateKey(fmt.Sprintf("selftest-%s-%d", plan, i), plan)
		if err != nil {
			return nil, fmt.Errorf("selftest: create a key: %w", err)
		}
		keys[i] = k
	}
	return keys, nil
}

// sampleSize is the width and height of every sample image.
func sampleSize() (width, height int) { return 32, 8 }

// sampleEncoder is the one PNG encoder sampleImage uses, kept with its
// compressor, under sampleMu: a new compressor allocates and clears
// about a megabyte, which cost more than the rest of a request (under
// the race detector, three quarters of a selftest's CPU).
var (
	sampleMu      sync.Mutex
	sampleEncoder = png.Encoder{BufferPool: &oneBuffer{}}
)

// oneBuffer is a png.EncoderBufferPool of one buffer, used under sampleMu.
type oneBuffer struct{ b *png.EncoderBuffer }

func (p *oneBuffer) Get() *png.EncoderBuffer  { return p.b }
func (p *oneBuffer) Put(b *png.EncoderBuffer) { p.b = b }

// sampleImage is a small PNG that differs for every i.
func sampleImage(i int) []byte {
	w, h := sampleSize()
	img := image.NewGray(image.Rect(0, 0, w, h))
	for b := range w {
		if i>>b&1 == 1 {
			for y := range h {
				img.SetGray(b, y, color.Gray{Y: 255})
			}
		}
	}
	var buf bytes.Buffer
	sampleMu.Lock()
	defer sampleMu.Unlock()
	_ = sampleEncoder.Encode(&buf, img)
	return buf.Bytes()
}

// clock is the service's clock during a check: it runs with the real one
// from a chosen start, and jumps when a check moves it on.
type clock struct {
	mu     sync.Mutex
	start  time.Time // the service's time at real
	real   time.Time
	offset time.Duration
}

func newClock(start time.Time) *clock {
	return &clock{start: start, real: time.Now()}
}

// Now is the service's time.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start.Add(time.Since(c.real) + c.offset)
}

// Advance moves the clock on by d.
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// Set moves the clock on to t, if t is later.
func (c *clock) Set(t time.Time) {
	if d := t.Sub(c.Now()); d > 0 {
		c.Advance(d)
	}
}

// thousands prints n with commas: 2,000.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// shortDuration prints 1m rather than 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
