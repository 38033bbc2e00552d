package multi

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// ceilingRace is one global ceiling set low enough that a burst over two
// instances races for its last room.
type ceilingRace struct {
	name string
	cfg  harness.Config
	// count starts the brake alert's count: the figure the brake decided
	// on, every instance's calls ("": not checked).
	count string
}

// ceilingRaces are the three ceilings, each about 20 calls' worth.
var ceilingRaces = []ceilingRace{
	{"daily_requests", harness.Config{DailyRequests: 20}, "20 calls today"},
	{"daily_usd", harness.Config{DailyRequests: 100000, DailyUSD: 20 * oneCallMicro / 1e6, MaxOutputTokens: 40}, ""},
	{"monthly_usd", harness.Config{DailyRequests: 100000, MonthlyUSD: 20 * oneCallMicro / 1e6, MaxOutputTokens: 40}, ""},
}

// hookEnv is the variable that holds the test webhook's URL.
const hookEnv = "BREAKWATER_TEST_HOOK_URL"

// TestCeilingRaceAlertsTheBrakeOnly: 200 clients over two instances race
// for the last room under each global ceiling, retrying budget_busy as
// the API asks. Reaching the ceiling is the brake: the webhook receives
// brake_engaged, whose count is the service's (not the settled calls one
// instance has seen), and never usage_commit_failed (the database is healthy),
// no instance logs a reservation it could not write, and every refused
// client gets the brake's own answer (budget_paused or budget_busy),
// never usage_unavailable.
func TestCeilingRaceAlertsTheBrakeOnly(t *testing.T) {
	t.Parallel()
	for _, race := range ceilingRaces {
		t.Run(race.name, func(t *testing.T) {
			t.Parallel() // a database, a webhook and a pair of its own
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			hook, err := harness.NewWebhook()
			if err != nil {
				t.Fatal(err)
			}
			defer hook.Close()
			p := newPairEdited(t, pgtest.NewDatabase(t), race.cfg, 10, 20*time.Millisecond,
				func(body string) string { return body + harness.WebhookConfig(hookEnv) }, hookEnv+"="+hook.URL)
			rs := p.burstRetrying(ctx, 200, "budget_busy")
			t.Logf("200 clients over 2 instances: %v", tally(rs))
			if !hook.WaitFor("brake_engaged", 10*time.Second) {
				t.Errorf("no brake_engaged alert at the webhook; received %v", hook.Kinds())
			}
			time.Sleep(2 * time.Second) // alerts raised by the last refusals are on their way
			p.stopAll()
			checkBrakeSignals(t, p, rs, hook.Kinds())
			for _, n := range hook.Notices() {
				if n.Kind == "brake_engaged" && !strings.HasPrefix(n.Details["count"], race.count) {
					t.Errorf("the brake alert's count is %q, want the figure it decided on, %q", n.Details["count"], race.count)
				}
			}
		})
	}
}

// checkBrakeSignals fails t for any sign of a fault at a ceiling reached
// on a healthy database: an alert of a failing write, the log line of a
// reservation not written, or an answer other than a 200 or the brake's.
func checkBrakeSignals(t *testing.T, p *pair, rs []result, kinds []string) {
	t.Helper()
	if slices.Contains(kinds, "usage_commit_failed") {
		t.Errorf("the webhook received usage_commit_failed at a ceiling, with the database healthy: %v", kinds)
	}
	for i := range 2 {
		b, err := os.ReadFile(p.proc(i).LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "level=ERROR") {
				t.Errorf("instance %d logged an error at a ceiling: %s", i, line)
			}
		}
	}
	for _, r := range rs {
		a := r.answer
		if a.Status == 0 { // no answer reached the client: nothing it was told
			t.Logf("instance %d: no answer: %v", r.instance, a.Err)
			continue
		}
		if a.Status != http.StatusOK && (a.Status != http.StatusServiceUnavailable || (a.Code != "budget_paused" && a.Code != "budget_busy")) {
			t.Errorf("instance %d answered %d %s (%v) at a ceiling, want 200 or the brake's 503", r.instance, a.Status, a.Code, a.Err)
		}
	}
}
