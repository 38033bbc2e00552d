package budget

import (
	"strings"
	"testing"
	"time"
)

// Soft at 5 calls, hard at 10: the day is below the soft line for the
// first five claims and above it from the sixth; the hard ceiling still
// refuses the eleventh. A brake started from the ledger's totals (a
// restart, clean or not) is on the same side, and raising the soft
// ceiling brings the day back below it.
func TestGlobalSoftCeilings(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cfg := Config{DailyRequests: 10, SoftDailyRequests: 5}
	g, err := NewGlobal(cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Month: "2026-12"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		side := g.Soft(now)
		if want := map[bool]string{true: "", false: "soft_daily_requests"}[i <= 5]; side != want {
			t.Fatalf("before call %d: Soft = %q, want %q", i, side, want)
		}
		r, err := g.Claim(100, now)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		g.Settled(r, 50)
	}
	if _, err := g.Claim(100, now); err == nil {
		t.Fatal("the 11th call passed the hard ceiling")
	}
	if st := g.Status(now); st.Degraded != "soft_daily_requests" {
		t.Errorf("Status.Degraded = %q, want soft_daily_requests", st.Degraded)
	}

	// A restart after three calls: the ledger says 3, the day is below.
	again, err := NewGlobal(cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Requests: 3, Month: "2026-12"})
	if err != nil {
		t.Fatal(err)
	}
	if side := again.Soft(now); side != "" {
		t.Errorf("restarted at 3 calls: Soft = %q, want below", side)
	}
	again, _ = NewGlobal(cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-12-03", Requests: 5, Month: "2026-12"})
	if side := again.Soft(now); side != "soft_daily_requests" {
		t.Errorf("restarted at 5 calls: Soft = %q, want above", side)
	}

	g.SetConfig(Config{DailyRequests: 20, SoftDailyRequests: 15})
	if side := g.Soft(now); side != "" {
		t.Errorf("after raising the soft ceiling: Soft = %q, want below", side)
	}
	if side := g.Soft(now.Add(24 * time.Hour)); side != "" {
		t.Errorf("a new day: Soft = %q, want below", side)
	}
}

func TestGlobalSoftMoney(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	g, err := NewGlobal(Config{SoftDailyUSD: 0.001, SoftMonthlyUSD: 0.005}, time.UTC, &memLedger{},
		GlobalState{Day: "2026-12-03", Month: "2026-12", MonthSpend: 4000})
	if err != nil {
		t.Fatal(err)
	}
	if side := g.Soft(now); side != "" {
		t.Fatalf("Soft = %q at 0 of 1000 today, 4000 of 5000 this month", side)
	}
	r, _ := g.Claim(1000, now)
	if side := g.Soft(now); side != "soft_daily_usd" {
		t.Errorf("a call in flight at its worst case fills the day: Soft = %q", side)
	}
	g.Settled(r, 600)
	if side := g.Soft(now); side != "" {
		t.Errorf("settled at 600: Soft = %q, want below", side)
	}
	g.Claim(400, now)
	if side := g.Soft(now.Add(24 * time.Hour)); side != "soft_monthly_usd" {
		t.Errorf("the next day, 5000 spent this month: Soft = %q, want soft_monthly_usd", side)
	}
}

func TestSoftCeilingValidation(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{DailyRequests: 10, SoftDailyRequests: 10}, "budget.soft_daily_requests: must be below"},
		{Config{DailyUSD: 5, SoftDailyUSD: 6}, "budget.soft_daily_usd: must be below"},
		{Config{MonthlyUSD: 50, SoftMonthlyUSD: 50}, "budget.soft_monthly_usd: must be below"},
		{Config{SoftDailyRequests: -1}, "budget.soft_daily_requests: must not be negative"},
		{Config{SoftDailyUSD: -1}, "budget.soft_daily_usd: must be between"},
		{Config{DailyRequests: 10, SoftDailyRequests: 9, DailyUSD: 0, SoftDailyUSD: 3}, ""},
	} {
		err := tt.cfg.Validate()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%+v: %v, want %q", tt.cfg, err, tt.want)
		}
	}
	if err := ValidatePlans(map[string]Plan{"free": {MonthlyQuota: 1, Model: "cheap"}}); err == nil ||
		!strings.Contains(err.Error(), "plans.free.model") {
		t.Errorf("plan model \"cheap\": %v", err)
	}
	for _, m := range []string{"", "auto", "primary", "fallback"} {
		if err := ValidatePlans(map[string]Plan{"free": {MonthlyQuota: 1, Model: m}}); err != nil {
			t.Errorf("plan model %q: %v", m, err)
		}
	}
}
