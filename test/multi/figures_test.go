package multi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// TestMoneyFiguresAreTheService: after reads spread unevenly over both
// instances, each instance's admin API and the CLI report the service's
// figures, not the instance's: today's calls and spend, and each user's
// reads.
func TestMoneyFiguresAreTheService(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPair(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 100000, DailyUSD: 50}, 2, 0)
	client := &http.Client{Timeout: 10 * time.Second}
	const onA, onB = 7, 3
	for k := range onA + onB {
		i := 0
		if k >= onA {
			i = 1
		}
		if r := p.send(ctx, client, i, k%2, nil); r.answer.Status != http.StatusOK {
			t.Fatalf("read %d on instance %d: %d %s\n%s", k, i, r.answer.Status, r.answer.Code, p.logs())
		}
	}
	const reads = onA + onB
	wantSpend := float64(reads*oneCallMicro) / 1e6
	type budgetInfo struct {
		Requests int64   `json:"requests_today"`
		SpendUSD float64 `json:"spend_today_usd"`
	}
	type usageInfo struct {
		User       string `json:"user"`
		ReadsToday int64  `json:"reads_today"`
		ReadsMonth int64  `json:"reads_month"`
	}
	check := func(where string, b budgetInfo, us []usageInfo) {
		t.Helper()
		if b.Requests != reads || fmt.Sprintf("%.6f", b.SpendUSD) != fmt.Sprintf("%.6f", wantSpend) {
			t.Errorf("%s: today %d calls, $%.6f; want the service's %d calls, $%.6f", where, b.Requests, b.SpendUSD, reads, wantSpend)
		}
		got := map[string]usageInfo{}
		for _, u := range us {
			got[u.User] = u
		}
		for u, want := range map[string]int64{"user0": 5, "user1": 5} {
			if got[u].ReadsToday != want || got[u].ReadsMonth != want {
				t.Errorf("%s: %s read %d today, %d this month; want %d", where, u, got[u].ReadsToday, got[u].ReadsMonth, want)
			}
		}
	}
	for i, name := range []string{"A", "B"} {
		var b budgetInfo
		var us []usageInfo
		p.adminGet(ctx, t, i, "/api/budget", &b)
		p.adminGet(ctx, t, i, "/api/usage", &us)
		check("instance "+name+"'s admin API", b, us)
	}
	var b budgetInfo
	var us []usageInfo
	p.cli(ctx, t, &b, "budget", "--json")
	p.cli(ctx, t, &us, "usage", "--json")
	check("the CLI", b, us)
}

// adminGet reads path from instance i's admin API as JSON into v.
func (p *pair) adminGet(ctx context.Context, t *testing.T, i int, path string, v any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.proc(i).AdminAddr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s on instance %d: %s", path, i, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s on instance %d: %v", path, i, err)
	}
}

// cli runs the binary's command args on the shared database and decodes
// its JSON output into v.
func (p *pair) cli(ctx context.Context, t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := harness.Command(ctx, bin, p.config, p.env, args...)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("%v: %v in %s", args, err, out)
	}
}
