package multi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// hookLog is a json webhook receiver on 127.0.0.1 that keeps the kinds it
// is sent, in the order they arrive.
type hookLog struct {
	*httptest.Server
	mu    sync.Mutex
	kinds []string
}

func newHookLog(t *testing.T) *hookLog {
	h := &hookLog{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n detect.JSONNotice
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		h.mu.Lock()
		h.kinds = append(h.kinds, n.Kind)
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookLog) received() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.kinds)
}

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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	hook := newHookLog(t)
	t.Setenv("BW_TEST_HOOK_URL", hook.URL) // the instances' environment
	p := newPairEdited(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 20}, 3, 20*time.Millisecond,
		func(body string) string { return body + warnConfig })
	start := time.Now()
	rs := p.burst(ctx, 30)
	if got := len(ok(rs)); got != 20 {
		t.Errorf("%d reads answered 200 (%v), want the 20 the ceiling allows", got, tally(rs))
	}
	want := []string{"budget_warn_daily_requests_50", "budget_warn_daily_requests_80", detect.KindBrakeEngaged}
	for len(hook.received()) < len(want) && time.Since(start) < 5*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	early := hook.received()
	t.Logf("%v; the webhook got %v within %s", tally(rs), early, time.Since(start).Round(time.Millisecond))
	if !slices.Equal(early, want) {
		t.Errorf("within 5s of the burst, the webhook got %s, want %s\n%s", strings.Join(early, " "), strings.Join(want, " "), p.logs())
	}
	p.stopAll() // a clean stop delivers what is queued: no instance sends one again
	if got := hook.received(); !slices.Equal(got, want) {
		t.Errorf("after the stop, the webhook got %s, want %s once each", strings.Join(got, " "), strings.Join(want, " "))
	}
}
