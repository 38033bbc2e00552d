package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/ocr"
	"breakwater/server/edge"
	"breakwater/server/edgetest"
)

// stopCold ends e as a kill -9 would leave its database: the HTTP server,
// the events and the file are closed, and nothing of the brake is (its
// lease is not given back).
func (e *env) stopCold() {
	e.http.Close()
	e.events.Close(context.Background())
	e.db.Close()
}

// degradeCost is what the fake's answer (298 prompt and 24 output tokens)
// costs at model's price.
func degradeCost(t *testing.T, model string) int64 {
	t.Helper()
	p, ok := ocr.Config{FallbackModel: testFallback}.PriceOf(model)
	if !ok {
		t.Fatalf("no price for %s", model)
	}
	return p.Cost(ocr.Usage{PromptTokens: 298, CandidatesTokens: 24})
}

// Soft at 5 calls, hard at 10: calls 1-5 go to the primary model, 6-10 to
// the fallback, the 11th is refused; the answers, the usage rows and the
// ledger each name or count the model a call went to, at its price. A
// crash after the third call (the process gone without closing anything)
// keeps the rule: the restarted service reads the day's calls from the
// ledger. Entering degraded mode raises one alert.
func TestDegradeBeforeDeny(t *testing.T) {
	clk := newClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	dir := t.TempDir()
	rec := &recordingAlerter{}
	o := envOptions{dir: dir, clock: clk.now, alerts: rec, fallback: testFallback,
		budget: budget.Config{DailyRequests: 10, SoftDailyRequests: 5}}
	e := newEnv(t, o)
	key := e.key
	var models []string
	read := func(e *env, i int) {
		t.Helper()
		resp, data := e.post(key, "image/png", pngBytes(t, 16+i, 16))
		models = append(models, decodeOK(t, resp, data).Model)
	}
	for i := 1; i <= 3; i++ {
		read(e, i)
	}
	e.stopCold()
	o.gemini = e.gemini
	e = newEnv(t, o)
	for i := 4; i <= 10; i++ {
		read(e, i)
	}
	resp, data := e.post(key, "image/png", pngBytes(t, 40, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")

	want := []string{ocr.DefaultModel, ocr.DefaultModel, ocr.DefaultModel, ocr.DefaultModel, ocr.DefaultModel,
		testFallback, testFallback, testFallback, testFallback, testFallback}
	if !slices.Equal(models, want) {
		t.Errorf("the answers' models:\n got %v\nwant %v", models, want)
	}
	if p, f := e.gemini.callsTo(ocr.DefaultModel), e.gemini.callsTo(testFallback); p != 5 || f != 5 {
		t.Errorf("upstream calls: %d to the primary, %d to the fallback; want 5 and 5", p, f)
	}
	day, err := e.db.Budget("2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	wantSpend := 5*degradeCost(t, ocr.DefaultModel) + 5*degradeCost(t, testFallback)
	if day.Requests != 10 || day.SpendMicroUSD != wantSpend {
		t.Errorf("the ledger's day: %+v, want 10 calls and %d micro-dollars (each call at its model's price)", day, wantSpend)
	}
	rows, err := e.db.Usage(clk.now().Add(-time.Hour), clk.now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	byModel := map[string]int64{}
	for _, r := range rows {
		byModel[r.Model] += r.CostMicroUSD
	}
	if len(rows) != 10 || byModel[ocr.DefaultModel] != 5*degradeCost(t, ocr.DefaultModel) || byModel[testFallback] != 5*degradeCost(t, testFallback) {
		t.Errorf("usage rows: %d, cost by model %v", len(rows), byModel)
	}
	if got := rec.got(); !slices.Contains(got, detect.KindDegraded) || slices.Contains(got, detect.KindRestored) {
		t.Errorf("alerts: %v, want %s and not %s", got, detect.KindDegraded, detect.KindRestored)
	}
	d, err := e.adm.Dashboard(context.Background(), clk.now())
	if err != nil {
		t.Fatal(err)
	}
	if b := d.Budget; b.DegradedBy != "soft_daily_requests" || b.ReadsByModel[ocr.DefaultModel] != 5 || b.ReadsByModel[testFallback] != 5 {
		t.Errorf("the dashboard's budget: degraded by %q, reads by model %v", b.DegradedBy, b.ReadsByModel)
	}
	resp, page := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", testAdminToken)) // the page of d, at the same clock
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %d", resp.StatusCode)
	}
	if !strings.Contains(string(page), `id="model-state">fallback<`) ||
		!strings.Contains(string(page), testFallback+" 5") {
		t.Error("the dashboard page does not show the fallback model and its reads")
	}
	users, err := e.srv.d.Operator.Usage(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 1 || users[0].ReadsTodayByModel[testFallback] != 5 {
		t.Errorf("breakwater usage's figures: %+v", users)
	}
	m := scrape(t, e)
	for _, series := range []string{
		`breakwater_upstream_calls_total{model="gemini-2.5-flash-lite",outcome="ok"} 5`,
		`breakwater_upstream_calls_total{model="gemini-3.5-flash-lite",outcome="ok"} 2`, // since the restart
	} {
		if !strings.Contains(m, series+"\n") {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}

// A reload that raises the soft ceiling above the day's calls returns the
// reads to the primary model, with an alert; a plan on "primary" stays on
// the primary model above the soft ceiling (and is refused at the hard
// one), a plan on "fallback" always reads with the fallback.
func TestDegradeReloadAndPlans(t *testing.T) {
	clk := newClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	rec := &recordingAlerter{}
	e := newEnv(t, envOptions{clock: clk.now, alerts: rec, fallback: testFallback,
		plans:     map[string]int64{"pro": 100, "cheap": 100},
		planModel: map[string]string{"pro": budget.PlanModelPrimary, "cheap": budget.PlanModelFallback},
		budget:    budget.Config{DailyRequests: 6, SoftDailyRequests: 2}})
	pro, cheap := e.newKey("paula", "pro"), e.newKey("carl", "cheap")
	n := 0
	read := func(key string) string {
		t.Helper()
		n++
		resp, data := e.post(key, "image/png", pngBytes(t, 16+n, 16))
		return decodeOK(t, resp, data).Model
	}
	for i, tt := range []struct{ key, want string }{
		{cheap, testFallback},     // 1: below the soft line, but the plan takes the fallback
		{e.key, ocr.DefaultModel}, // 2
		{e.key, testFallback},     // 3: above
		{pro, ocr.DefaultModel},   // 4: the plan opts out
		{e.key, testFallback},     // 5
	} {
		if got := read(tt.key); got != tt.want {
			t.Errorf("read %d: model %s, want %s", i+1, got, tt.want)
		}
	}
	e.brake.SetConfig(budget.Config{DailyRequests: 6, SoftDailyRequests: 5}) // the day has 5 calls
	if got := read(e.key); got != testFallback {
		t.Errorf("at the raised line: model %s, want the fallback", got)
	}
	e.brake.SetConfig(budget.Config{DailyRequests: 20, SoftDailyRequests: 10})
	if got := read(e.key); got != ocr.DefaultModel {
		t.Errorf("after the reload that raised the soft ceiling: model %s, want the primary", got)
	}
	if got := rec.got(); !slices.Equal(got, []string{detect.KindDegraded, detect.KindRestored}) {
		t.Errorf("alerts: %v, want degraded then restored", got)
	}
	e.brake.SetConfig(budget.Config{DailyRequests: 8, SoftDailyRequests: 2})
	read(pro) // the 8th call, on the primary model
	resp, data := e.post(pro, "image/png", pngBytes(t, 99, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
}

// degradeBurst sends n reads at once, over users of their own (so that no
// per-user limit refuses them), and returns the models the answers name.
func degradeBurst(t *testing.T, e *env, n, users int) map[string]int {
	t.Helper()
	keys := make([]string, users)
	for i := range keys {
		keys[i] = e.newKey(fmt.Sprintf("burst%d", i), "burst")
	}
	var (
		mu     sync.Mutex
		models = map[string]int{}
		wg     sync.WaitGroup
	)
	start := make(chan struct{})
	for k := range n {
		wg.Go(func() {
			<-start
			resp, data := e.post(keys[k%users], "image/png", pngBytes(t, 16+k%200, 16+k/200))
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusOK {
				models[fmt.Sprintf("%d %s", resp.StatusCode, data)]++
				return
			}
			models[decodeOK(t, resp, data).Model]++
		})
	}
	close(start)
	wg.Wait()
	return models
}

// 150 reads at once on one instance (bolt), soft_daily_requests = 100,
// daily_requests = 200: exactly 100 go to the primary model and 50 to the
// fallback, as the answers, the fake and the ledger say, and degraded mode
// is entered once. Fails with the model chosen from Global.Soft before the
// claim: reads of a burst all see "below" and go to the primary.
func TestDegradeBurstExactOnBolt(t *testing.T) {
	rec := &recordingAlerter{}
	e := newEnv(t, envOptions{alerts: rec, fallback: testFallback, plans: map[string]int64{"burst": 1000}, cfg: burstConfig, timeout: time.Minute,
		budget: budget.Config{DailyRequests: 200, SoftDailyRequests: 100}})
	holdCalls(e.gemini, 150)
	models := degradeBurst(t, e, 150, 15)
	if models[ocr.DefaultModel] != 100 || models[testFallback] != 50 {
		t.Errorf("the answers' models: %v, want 100 %s and 50 %s", models, ocr.DefaultModel, testFallback)
	}
	if p, f := e.gemini.callsTo(ocr.DefaultModel), e.gemini.callsTo(testFallback); p != 100 || f != 50 {
		t.Errorf("upstream calls: %d to the primary, %d to the fallback; want 100 and 50", p, f)
	}
	if got := rec.got(); !slices.Equal(got, []string{detect.KindDegraded}) {
		t.Errorf("alerts: %v, want one %s", got, detect.KindDegraded)
	}
}

// The same with soft_daily_usd as the line, at 20 primary calls' worst
// case and a half, and every read claimed before any is settled: exactly
// the 20 whose worst cases fit under the line go to the primary model
// (within one worst case of the line, never past it), the 80 others to the
// fallback. Fails with the side read from Global.Soft, which is on the
// primary side until the line is reached, not until a primary call no
// longer fits: 21 (the last one past the line).
func TestDegradeBurstMoneyOnBolt(t *testing.T) {
	p, ok := ocr.Config{FallbackModel: testFallback}.PriceOf(ocr.DefaultModel)
	if !ok {
		t.Fatal("no price for the primary model")
	}
	worst := p.WorstCase(16, 16)
	line := 20*worst + worst/2
	e := newEnv(t, envOptions{fallback: testFallback, plans: map[string]int64{"burst": 1000}, cfg: burstConfig, timeout: time.Minute,
		budget: budget.Config{DailyUSD: 1, SoftDailyUSD: float64(line) / 1e6}})
	holdCalls(e.gemini, 100)
	models := degradeBurst(t, e, 100, 10)
	if models[ocr.DefaultModel] != 20 || models[testFallback] != 80 {
		t.Errorf("the answers' models: %v; want 20 on %s (their worst cases %d of the line's %d µ$), 80 on %s",
			models, ocr.DefaultModel, 20*worst, line, testFallback)
	}
}

// holdCalls makes the fake answer no call before n calls have reached it
// (or a minute has passed): every read of a burst of n is claimed, at its
// worst case, before any is settled.
func holdCalls(f *fakeGemini, n int64) {
	all := make(chan struct{})
	var once sync.Once
	f.set(func(w http.ResponseWriter, r *http.Request) {
		if f.calls.Load() >= n {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(time.Minute):
		}
		writeModelText(w, `{"serials":["SN-12345","SN-67890"]}`)
	})
}

// burstConfig lets a burst's users have all their reads in flight at once.
func burstConfig(c *edge.Config) { c.MaxInFlightPerUser = 64 }
