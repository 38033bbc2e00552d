package operator_test

import (
	"strconv"
	"strings"
	"testing"

	"breakwater/server/operator"
)

// FormatUSD shows every digit down to the micro-dollar, at least two
// decimals, and never rounds: a ceiling reads as configured.
func TestFormatUSD(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{
		{0, "$0.00"},
		{0.5, "$0.50"},
		{0.00015, "$0.00015"},
		{0.000001, "$0.000001"},
		{0.123456, "$0.123456"},
		{0.99, "$0.99"},
		{1, "$1.00"},
		{12.345, "$12.345"},
		{1234.5, "$1234.50"},
		{0.007, "$0.007"},
		{0.00687, "$0.00687"},
		{50, "$50.00"},
		{1e6 + 0.000001, "$1000000.000001"},
		{-0.5, "-$0.50"},
	} {
		t.Run(c.want, func(t *testing.T) {
			if got := operator.FormatUSD(c.v); got != c.want {
				t.Errorf("FormatUSD(%v) = %q, want %q", c.v, got, c.want)
			}
		})
	}
	// Every amount of micro-dollars reads back as itself.
	for micro := int64(0); micro < 3_000_000_000; micro += 997_003 {
		got := operator.FormatUSD(float64(micro) / 1e6)
		whole, frac, _ := strings.Cut(strings.TrimPrefix(got, "$"), ".")
		back, err := strconv.ParseInt(whole+(frac + "000000")[:6], 10, 64)
		if err != nil || back != micro {
			t.Fatalf("FormatUSD(%d µ$) = %q, which reads %d µ$", micro, got, back)
		}
	}
}
