package selftest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// The selftest passes on the shipped config, checking each limit it
// sets, and says so line by line.
func TestShippedConfigHolds(t *testing.T) {
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

// small is a config whose limits a selftest reaches quickly.
func small(t *testing.T) app.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	toml := `[storage]
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
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := app.Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A pipeline whose limit is looser than the config says makes the
// selftest fail, naming that limit and no other: the selftest is handed
// the real app opened on a tampered copy of what it asked for.
func TestBrokenLimitFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  string
		tamper func(c *app.Config)
	}{
		{"the brake overshoots", "budget.daily_requests", func(c *app.Config) {
			if c.Budget.DailyRequests > 0 {
				c.Budget.DailyRequests += 3
			}
		}},
		{"the money brake overshoots", "budget.daily_usd", func(c *app.Config) {
			if c.Budget.DailyUSD > 0 {
				c.Budget.DailyUSD += 0.0025 // three calls' worst case: the brake spends past the operator's ceiling
			}
		}},
		{"the money brake stops early", "budget.daily_usd", func(c *app.Config) {
			if c.Budget.DailyUSD > 0 {
				c.Budget.DailyUSD -= 0.0012 // more than a call's worst case short of the ceiling
			}
		}},
		{"the month's brake overshoots", "budget.monthly_usd", func(c *app.Config) {
			if c.Budget.MonthlyUSD > 0 {
				c.Budget.MonthlyUSD += 0.0025
			}
		}},
		{"one more in a second", "limits.user", func(c *app.Config) {
			if c.Limits.User.Burst > 0 {
				c.Limits.User.Burst++
			}
		}},
		{"one read more a month", "plans.free.monthly_quota", func(c *app.Config) {
			p := c.Plans["free"]
			p.MonthlyQuota++
			c.Plans["free"] = p
		}},
		{"one call more a day", "plans.free.daily_attempts", func(c *app.Config) {
			if p := c.Plans["free"]; p.DailyAttempts > 0 {
				p.DailyAttempts++
				c.Plans["free"] = p
			}
		}},
		{"one failure more before the cooldown", "invites.fail_limit", func(c *app.Config) { c.Invites.FailLimit++ }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := func(ctx context.Context, cfg app.Config, now func() time.Time) (Service, error) {
				tc.tamper(&cfg)
				return OpenApp(ctx, cfg, now)
			}
			var out bytes.Buffer
			results, err := Run(context.Background(), small(t), &out, Options{Open: broken})
			if !errors.Is(err, ErrNotHeld) {
				t.Fatalf("Run = %v, want ErrNotHeld; output:\n%s", err, out.String())
			}
			for _, r := range results {
				if got, want := r.Held, r.Limit != tc.limit; got != want {
					t.Errorf("%s: held = %v, want %v: %s", r.Limit, got, want, r.Line)
				}
			}
			if !strings.Contains(out.String(), "DOES NOT HOLD") {
				t.Errorf("the output does not say what failed:\n%s", out.String())
			}
		})
	}
}

// On a config of its own the selftest holds too, and says which limits
// it tested scaled down.
func TestSmallConfigHolds(t *testing.T) {
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
