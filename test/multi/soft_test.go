package multi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"breakwater/ocr"
	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// withSoft adds ocr.fallback_model (the fake's other model) and the soft
// ceilings soft (its lines, "key = value") to a test config.
func withSoft(soft ...string) func(string) string {
	return func(config string) string {
		config = strings.Replace(config, "[ocr]\n", "[ocr]\nfallback_model = \""+harness.Fallback+"\"\n", 1)
		return strings.Replace(config, "[budget]\n", "[budget]\n"+strings.Join(soft, "\n")+"\n", 1)
	}
}

// byModel counts the 200s of rs by the model their answer names.
func byModel(t *testing.T, rs []result) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, r := range ok(rs) {
		var a struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(r.answer.Body, &a); err != nil {
			t.Fatalf("an answer without its model: %v: %s", err, r.answer.Body)
		}
		m[a.Model]++
	}
	return m
}

// TestSoftLineAcrossInstances: 150 clients at once over three instances,
// soft_daily_requests = 100 under daily_requests = 200, ocr.fallback_model
// set: exactly 100 reads go to the primary model and 50 to the fallback,
// as the answers and the fake say (the side of the line is decided with
// each claim, by the shared ledger), and the ledger holds the 150 calls,
// under the hard ceiling. Fails with the side read from each instance's
// view, refreshed once a second: a burst spends the soft band at primary
// prices (150 primary).
func TestSoftLineAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p := newGroup(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 200}, 15, 20*time.Millisecond, 3,
		withSoft("soft_daily_requests = 100"))
	rs := p.burst(ctx, 150)
	p.stopAll()
	models := byModel(t, rs)
	t.Logf("150 requests over 3 instances: %v; by model %v", tally(rs), models)
	if len(ok(rs)) != 150 || models[harness.Model] != 100 || models[harness.Fallback] != 50 {
		t.Errorf("the answers: %v, by model %v; want 150 answered, 100 by %s and 50 by %s\n%s",
			tally(rs), models, harness.Model, harness.Fallback, p.logs())
	}
	if pc, fc := p.gemini.CallsTo(harness.Model), p.gemini.CallsTo(harness.Fallback); pc != 100 || fc != 50 {
		t.Errorf("the fake's calls: %d to %s, %d to %s; want 100 and 50", pc, harness.Model, fc, harness.Fallback)
	}
	_, upstream := p.gemini.Calls()
	b := readBooks(t, p.dbURL)
	checkRows(t, b, rs, upstream)
	if b.ledger.calls != 150 {
		t.Errorf("the ledger counts %d calls, want the 150 made (under daily_requests = 200)", b.ledger.calls)
	}
}

// TestSoftUSDAcrossInstances: the same with soft_daily_usd at 20.5 primary
// worst cases: no read goes to the primary model unless its worst case
// fits under the line with every call in flight counted at its worst case
// (the primary's spend never passes the line), and at least the 20 whose
// worst cases fit go to it. Fails with the side read from each instance's
// view (every read of the burst on the primary).
func TestSoftUSDAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	price, known := ocr.Config{Model: harness.Model, Price: ocr.Price{MaxOutputTokens: 40}}.PriceOf(harness.Model)
	if !known {
		t.Fatal("no price for the fake's model")
	}
	worst := price.WorstCase(64, 24) // harness.NthPNG's images
	line := 20*worst + worst/2
	cfg := harness.Config{DailyRequests: 100000, DailyUSD: 1, MaxOutputTokens: 40}
	p := newGroup(t, pgtest.NewDatabase(t), cfg, 15, 20*time.Millisecond, 3,
		withSoft(fmt.Sprintf("soft_daily_usd = %g", float64(line)/1e6)))
	rs := p.burst(ctx, 120)
	p.stopAll()
	models := byModel(t, rs)
	t.Logf("120 requests over 3 instances, a line of %d µ$, the primary's worst case %d: %v; by model %v",
		line, worst, tally(rs), models)
	primary := int64(models[harness.Model])
	if len(ok(rs)) != 120 || primary < 20 || primary*oneCallMicro > line {
		t.Errorf("the answers: %v, by model %v; want all answered, at least 20 by %s, costing no more than %d µ$\n%s",
			tally(rs), models, harness.Model, line, p.logs())
	}
	if pc := p.gemini.CallsTo(harness.Model); pc != primary {
		t.Errorf("the fake's calls to %s: %d, the answers name it %d times", harness.Model, pc, primary)
	}
	_, upstream := p.gemini.Calls()
	checkRows(t, readBooks(t, p.dbURL), rs, upstream)
}
