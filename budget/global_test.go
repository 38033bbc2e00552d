package budget

import (
	"errors"
	"testing"
	"time"
)

// Under a burst, the worst cases of calls in flight can fill a money
// ceiling while the day's spend is far from it. Such a refusal is "busy"
// with a short Retry-After, not "paused until midnight"; once the money
// itself is spent it is paused until the period ends.
func TestGlobalBusyIsNotPaused(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name     string
		cfg      Config
		untilEnd time.Duration
	}{
		{"daily_usd", Config{DailyUSD: 0.001}, 12 * time.Hour},
		{"monthly_usd", Config{MonthlyUSD: 0.001}, 12 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGlobal(tt.cfg, time.UTC, &memLedger{}, GlobalState{Day: "2026-11-30", Month: "2026-11"})
			if err != nil {
				t.Fatal(err)
			}
			// Three calls in flight hold 900 of 1000 micro-dollars.
			var open []Reservation
			for range 3 {
				r, err := g.Claim(300, now)
				if err != nil {
					t.Fatal(err)
				}
				open = append(open, r)
			}
			_, err = g.Claim(300, now)
			var pe *PausedError
			if !errors.As(err, &pe) || pe.Ceiling != tt.name || !pe.Busy || pe.RetryAfter != BusyRetryAfter {
				t.Fatalf("a fourth call while three are in flight: %+v, want busy with Retry-After %s", pe, BusyRetryAfter)
			}
			if st := g.Status(now); st.Engaged {
				t.Errorf("status says the brake is engaged while only calls in flight hold the ceiling: %+v", st)
			}
			// Each call cost 100: most of the worst case comes back.
			for _, r := range open {
				g.Settled(r, 100)
			}
			if _, err := g.Claim(300, now); err != nil {
				t.Fatalf("after the calls settled: %v", err)
			}
			// 300 spent, 300 in flight; spend the rest for real.
			r, err := g.Claim(400, now)
			if err != nil {
				t.Fatal(err)
			}
			g.Settled(r, 400)
			_, err = g.Claim(301, now)
			if !errors.As(err, &pe) || pe.Busy {
				t.Fatalf("with the money spent: %+v, want paused", pe)
			}
			if pe.RetryAfter != tt.untilEnd {
				t.Errorf("paused for %s, want until the period ends (%s)", pe.RetryAfter, tt.untilEnd)
			}
		})
	}
}

// MicroUSD is the decimal the operator wrote, cut after six decimals: no
// cent value loses a micro-dollar to the float's binary error, and no
// ceiling is raised by rounding.
func TestMicroUSDIsTheDecimalWritten(t *testing.T) {
	for _, tc := range []struct {
		usd  float64
		want int64
	}{
		{2.01, 2_010_000}, {0.007, 7_000}, {12.345, 12_345_000}, {0.29, 290_000}, {4.35, 4_350_000},
		{0.0000019, 1}, {0.0000001, 0}, {1e6, 1e12}, {0, 0},
	} {
		if got := MicroUSD(tc.usd); got != tc.want {
			t.Errorf("MicroUSD(%v) = %d, want %d", tc.usd, got, tc.want)
		}
	}
	for cents := int64(1); cents <= 100_000; cents++ {
		usd := float64(cents) / 100
		if got := MicroUSD(usd); got != cents*10_000 {
			t.Fatalf("MicroUSD(%v) = %d, want %d", usd, got, cents*10_000)
		}
	}
}
