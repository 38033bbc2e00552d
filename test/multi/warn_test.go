package multi

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// warnConfig sends every alert to the json webhook of $BW_TEST_HOOK_URL,
// with early warnings at 50% and 80%.
const warnConfig = `
[alerts]
warn_at = [0.5, 0.8]
[[alerts.webhook]]
format = "json"
url_env = "BW_TEST_HOOK_URL"
`

// TestEarlyWarningsBeforeTheBrakeAcrossInstances: the runaway case on two
// instances: 30 reads at once, spread over both, against daily_requests =
// 20. Whichever instance's lease takes the service's calls across a share
// raises its warning there and then, so the webhook gets the 50% and the
// 80% warnings, then brake_engaged, within seconds, each once for the
// service.
func TestEarlyWarningsBeforeTheBrakeAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	hook, err := harness.NewWebhook()
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close()
	p := newPairEdited(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 20}, 3, 20*time.Millisecond,
		func(body string) string { return body + warnConfig }, "BW_TEST_HOOK_URL="+hook.URL)
	start := time.Now()
	rs := p.burst(ctx, 30)
	if got := len(ok(rs)); got != 20 {
		t.Errorf("%d reads answered 200 (%v), want the 20 the ceiling allows", got, tally(rs))
	}
	want := []string{"budget_warn_daily_requests_50", "budget_warn_daily_requests_80", detect.KindBrakeEngaged}
	for len(hook.Kinds()) < len(want) && time.Since(start) < 5*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	early := hook.Kinds()
	t.Logf("%v; the webhook got %v within %s", tally(rs), early, time.Since(start).Round(time.Millisecond))
	if !slices.Equal(early, want) {
		t.Errorf("within 5s of the burst, the webhook got %s, want %s\n%s", strings.Join(early, " "), strings.Join(want, " "), p.logs())
	}
	p.stopAll() // a clean stop delivers what is queued: no instance sends one again
	if got := hook.Kinds(); !slices.Equal(got, want) {
		t.Errorf("after the stop, the webhook got %s, want %s once each", strings.Join(got, " "), strings.Join(want, " "))
	}
}
