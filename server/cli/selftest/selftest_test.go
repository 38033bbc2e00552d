package selftest

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/server/app"
)

// shipped loads the repository's config.toml, as an operator would.
func shipped(t *testing.T) app.Config {
	t.Helper()
	cfg, err := app.Load(filepath.Join("..", "..", "..", "config.toml"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// result is the result of limit among results, failing t without one.
func result(t *testing.T, results []Result, limit string) Result {
	t.Helper()
	for _, r := range results {
		if r.Limit == limit {
			return r
		}
	}
	t.Fatalf("no check of %s", limit)
	return Result{}
}

// The selftest passes on the shipped config, checking each limit it
// sets, and says so line by line.
func TestShippedConfigHolds(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	start := time.Now()
	results, err := Run(context.Background(), shipped(t), &out, Options{Scale: 100})
	t.Logf("%s in %s", out.String(), time.Since(start))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, want := range []string{"budget.daily_requests", "budget.daily_usd", "budget.monthly_usd", "limits.user", "plans.free.monthly_quota", "plans.free.daily_attempts",
		"plans.pro.monthly_quota", "plans.pro.daily_attempts", "invites.fail_limit"} {
		found := false
		for _, r := range results {
			if r.Limit == want {
				found = true
				if !r.Held {
					t.Errorf("%s did not hold: %s", want, r.Line)
				}
			}
		}
		if !found {
			t.Errorf("no check of %s", want)
		}
	}
}

// smallTOML is a config whose limits a selftest reaches quickly.
const smallTOML = `[storage]
path = "data/breakwater.db"
[budget]
timezone = "Europe/Berlin"
daily_requests = 20
daily_usd = 0.00945 # 25 of the sample reads at the default model's $0.000378
monthly_usd = 0.0189 # 50
[limits.user]
rate = 10
window = "1m"
burst = 2
[invites]
fail_limit = 3
cooldown = "5m"
[plans.free]
monthly_quota = 12
daily_attempts = 6
`

// smallDegraded are the keys that give smallTOML soft ceilings and a
// fallback model whose sample reads cost $0.00012 (the primary's
// $0.000378): past 18 calls or $0.0075 of the day, or $0.017 of the
// month, the reads go to it.
const smallDegraded = `[ocr]
fallback_model = "gemini-2.5-flash"
[budget]
soft_daily_requests = 18
soft_daily_usd = 0.0075
soft_monthly_usd = 0.017
`

// shadowKeys put every limit of smallTOML that has a mode in shadow, as
// step 1 of "Choosing thresholds" in docs/OPERATIONS.md says.
const shadowKeys = `[limits.user]
mode = "shadow"
[invites]
mode = "shadow"
[plans.free]
daily_mode = "shadow"
`

// small is smallTOML loaded.
func small(t *testing.T) app.Config {
	t.Helper()
	return load(t, smallTOML)
}

// load loads text as a config.toml in a folder of its own.
func load(t *testing.T, text string) app.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := app.Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// file is the text of a file of the repository.
func file(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docSnippet is the first toml block under heading in docs/CONFIGURATION.md.
func docSnippet(t *testing.T, heading string) string {
	t.Helper()
	re := regexp.MustCompile("(?s)\n## " + regexp.QuoteMeta(heading) + "\n.*?```toml\n(.*?)```")
	m := re.FindStringSubmatch(file(t, "docs/CONFIGURATION.md"))
	if m == nil {
		t.Fatalf("docs/CONFIGURATION.md has no toml block under %q", heading)
	}
	return m[1]
}

// withKeys is base with every key of keys set as keys sets it, its line
// verbatim: in place of the key's line in its table, else after the
// table's last key, else in the table added at the end.
func withKeys(t *testing.T, base, keys string) string {
	t.Helper()
	lines := strings.Split(base, "\n")
	keyOf := func(line string) string {
		k, _, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(strings.TrimSpace(line), "#") {
			return ""
		}
		return strings.TrimSpace(k)
	}
	set := func(table, key, line string) {
		in, last := false, -1
		for i, l := range lines {
			if strings.HasPrefix(l, "[") {
				if in {
					break
				}
				in = l == table
				continue
			}
			if in && keyOf(l) == key {
				lines[i] = line
				return
			}
			if in && keyOf(l) != "" {
				last = i
			}
		}
		if last < 0 {
			lines = append(lines, table, line)
			return
		}
		lines = slices.Insert(lines, last+1, line)
	}
	table := ""
	for _, l := range strings.Split(keys, "\n") {
		switch {
		case strings.HasPrefix(l, "["):
			table = l
		case keyOf(l) != "":
			set(table, keyOf(l), l)
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// A pipeline whose limit is looser than the config says makes the
// selftest fail, naming that limit and no other: the selftest is handed
// the real app opened on a tampered copy of what it asked for. The
// money brake's cases of the day fail as well with soft ceilings and a
// fallback model, and those of the limits with a mode in shadow mode.
func TestBrokenLimitFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		limit  string
		also   string // the keys of the other config it runs on
		tamper func(c *app.Config)
	}{
		{"the brake overshoots", "budget.daily_requests", "", func(c *app.Config) {
			if c.Budget.DailyRequests > 0 {
				c.Budget.DailyRequests += 3
			}
		}},
		{"the money brake overshoots", "budget.daily_usd", smallDegraded, func(c *app.Config) {
			if c.Budget.DailyUSD > 0 {
				c.Budget.DailyUSD += 0.0025 // three calls' worst case: the brake spends past the operator's ceiling
			}
		}},
		{"the money brake stops early", "budget.daily_usd", smallDegraded, func(c *app.Config) {
			if c.Budget.DailyUSD > 0 {
				c.Budget.DailyUSD -= 0.0012 // more than a call's worst case short of the ceiling
			}
		}},
		{"the month's brake overshoots", "budget.monthly_usd", "", func(c *app.Config) {
			if c.Budget.MonthlyUSD > 0 {
				c.Budget.MonthlyUSD += 0.0025
			}
		}},
		{"one more in a second", "limits.user", shadowKeys, func(c *app.Config) {
			if c.Limits.User.Burst > 0 {
				c.Limits.User.Burst++
			}
		}},
		{"one read more a month", "plans.free.monthly_quota", "", func(c *app.Config) {
			p := c.Plans["free"]
			p.MonthlyQuota++
			c.Plans["free"] = p
		}},
		{"one call more a day", "plans.free.daily_attempts", shadowKeys, func(c *app.Config) {
			if p := c.Plans["free"]; p.DailyAttempts > 0 {
				p.DailyAttempts++
				c.Plans["free"] = p
			}
		}},
		{"one failure more before the cooldown", "invites.fail_limit", shadowKeys, func(c *app.Config) { c.Invites.FailLimit++ }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			failsOnly(t, small(t), tc.limit, tc.tamper)
		})
		if tc.also != "" {
			t.Run(tc.name+" (soft ceilings or shadow)", func(t *testing.T) {
				t.Parallel()
				failsOnly(t, load(t, withKeys(t, smallTOML, tc.also)), tc.limit, tc.tamper)
			})
		}
	}
}

// failsOnly runs the selftest of cfg on the app opened on the copy tamper
// makes of what it asked for, and fails t unless it says that limit and
// no other does not hold.
func failsOnly(t *testing.T, cfg app.Config, limit string, tamper func(c *app.Config)) {
	t.Helper()
	broken := func(ctx context.Context, cfg app.Config, now func() time.Time) (Service, error) {
		tamper(&cfg)
		return OpenApp(ctx, cfg, now)
	}
	var out bytes.Buffer
	results, err := Run(context.Background(), cfg, &out, Options{Open: broken})
	if !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Run = %v, want ErrNotHeld; output:\n%s", err, out.String())
	}
	for _, r := range results {
		if got, want := r.Held, r.Limit != limit; got != want {
			t.Errorf("%s: held = %v, want %v: %s", r.Limit, got, want, r.Line)
		}
	}
	if !strings.Contains(out.String(), "DOES NOT HOLD") {
		t.Errorf("the output does not say what failed:\n%s", out.String())
	}
}

// On a config of its own the selftest holds too, and says which limits
// it tested scaled down.
func TestSmallConfigHolds(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if _, err := Run(context.Background(), small(t), &out, Options{}); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "scaled") {
		t.Errorf("nothing of this config needs scaling down:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "budget.daily_requests = 20: 80 parallel requests, 20 upstream calls, then 503 budget_paused (") {
		t.Errorf("the brake's line is not what was proved:\n%s", out.String())
	}
	for _, want := range []string{"budget.daily_usd = 0.00945: 100 parallel requests, ", "budget.monthly_usd = 0.0189: 200 parallel requests, "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q:\n%s", want, out.String())
		}
	}
}

// With the soft ceilings and fallback model of "Degrade before deny" in
// the shipped config, the snippet's lines verbatim, the selftest holds:
// reads past the soft line go to the fallback model and cost its price.
func TestDegradeBeforeDenyHolds(t *testing.T) {
	t.Parallel()
	cfg := load(t, withKeys(t, file(t, "config.toml"), docSnippet(t, "Degrade before deny")))
	if cfg.OCR.FallbackModel == "" || !cfg.Budget.HasSoft() {
		t.Fatalf("the snippet set no soft ceiling or fallback model: %+v", cfg.Budget)
	}
	var out bytes.Buffer
	results, err := Run(context.Background(), cfg, &out, Options{Scale: 40})
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, limit := range []string{"budget.daily_usd", "budget.monthly_usd"} {
		if r := result(t, results, limit); !regexp.MustCompile(` [1-9][0-9,]* reads on ` + regexp.QuoteMeta(cfg.OCR.FallbackModel) + ` at `).MatchString(r.Line) {
			t.Errorf("%s: no read on the fallback model: %s", limit, r.Line)
		}
	}
}

// On a config small enough to test the day unscaled, with soft ceilings
// and a fallback model, the day's reads go to the primary model up to
// the soft line (in a parallel burst, a little before it: calls in
// flight count at their worst case) and to the fallback past it, each at
// its own price: the selftest bills them so, and the money ceilings hold.
func TestSmallDegradedHolds(t *testing.T) {
	t.Parallel()
	cfg := load(t, withKeys(t, smallTOML, smallDegraded))
	var out bytes.Buffer
	results, err := Run(context.Background(), cfg, &out, Options{})
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	line := result(t, results, "budget.daily_usd").Line
	if !regexp.MustCompile(`^budget\.daily_usd = 0\.00945: [0-9]+ parallel requests, [1-9][0-9]* reads? on gemini-3\.5-flash-lite at \$0\.000378, [1-9][0-9]* reads? on gemini-2\.5-flash at \$0\.00012, `).MatchString(line) {
		t.Errorf("the day's line does not bill each model at its price:\n%s", out.String())
	}
	if !strings.Contains(line, "on gemini-2.5-flash), then 503 budget_paused") {
		t.Errorf("the day's line does not say the next read goes to the fallback:\n%s", out.String())
	}
}

// In shadow mode (every limit of the shipped config that has a mode), the
// limits are tested enforced, and their lines say that live they are
// counted, not enforced; the run passes. The limits that cannot be
// shadowed still hold.
func TestShadowModeIsSaid(t *testing.T) {
	t.Parallel()
	cfg := load(t, withKeys(t, file(t, "config.toml"), shadowKeys+"[plans.pro]\ndaily_mode = \"shadow\"\n"))
	var out bytes.Buffer
	results, err := Run(context.Background(), cfg, &out, Options{Scale: 40})
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	shadowed := []string{"limits.user", "invites.fail_limit", "plans.free.daily_attempts", "plans.pro.daily_attempts"}
	for _, r := range results {
		want := slices.Contains(shadowed, r.Limit)
		if r.Shadow != want || !r.Held {
			t.Errorf("%s: shadow = %v, held = %v; want shadow = %v and held: %s", r.Limit, r.Shadow, r.Held, want, r.Line)
		}
	}
	for _, limit := range shadowed {
		line := result(t, results, limit).Line
		if !strings.Contains(out.String(), line+" — shadow: counted, not enforced\n") || !strings.Contains(line, "in shadow mode, tested enforced)") {
			t.Errorf("%s: its line does not say it is in shadow:\n%s", limit, out.String())
		}
	}
	if strings.Count(out.String(), " — holds\n") != len(results)-len(shadowed) {
		t.Errorf("a limit in shadow is said to hold:\n%s", out.String())
	}
}

// lossy is a Service whose public API is behind a proxy that loses the
// answer of every nth read: the read is made and billed, and the client
// gets no answer (a client timeout on a loaded machine does the same).
type lossy struct {
	Service
	proxy     *httptest.Server
	transport *http.Transport
}

func (l lossy) URL() string { return l.proxy.URL }
func (l lossy) Close() {
	l.proxy.Close()
	// A connection the proxy dialled and never used would hold the
	// service's shutdown for seconds.
	l.transport.CloseIdleConnections()
	l.Service.Close()
}

func openLossy(n int64) Opener {
	return func(ctx context.Context, cfg app.Config, now func() time.Time) (Service, error) {
		s, err := OpenApp(ctx, cfg, now)
		if err != nil {
			return nil, err
		}
		target, err := url.Parse(s.URL())
		if err != nil {
			return nil, err
		}
		forward := httputil.NewSingleHostReverseProxy(target)
		transport := http.DefaultTransport.(*http.Transport).Clone()
		forward.Transport = transport
		var reads atomic.Int64
		var seen sync.Map // Idempotency-Keys sent before: a repeat is never lost
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get("Idempotency-Key")
			_, repeat := seen.LoadOrStore(key, true)
			if r.URL.Path == "/v1/ocr" && (key == "" || !repeat) && reads.Add(1)%n == 0 {
				forward.ServeHTTP(httptest.NewRecorder(), r) // read, answered
				panic(http.ErrAbortHandler)                  // and the answer lost
			}
			forward.ServeHTTP(w, r)
		}))
		return lossy{s, proxy, transport}, nil
	}
}

// A read whose answer was lost on the way is still counted: the selftest
// sends it again with its Idempotency-Key and gets the kept answer, so
// the limits hold. Without that, every ceiling seemed to stop short.
func TestLostAnswersAreCounted(t *testing.T) {
	t.Parallel()
	cfg := load(t, withKeys(t, smallTOML, "[limits.user]\nrate = 0\nburst = 0\n"))
	var out bytes.Buffer
	// The lost reads were answered before their answers were dropped:
	// the repeat needs no second's wait to find the kept answer.
	if _, err := Run(context.Background(), cfg, &out, Options{Open: openLossy(7), retryWait: 100 * time.Millisecond}); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "EOF") {
		t.Errorf("a lost answer is left in the output:\n%s", out.String())
	}
}
