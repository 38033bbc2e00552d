package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// breakwater budget prints each money ceiling as configured and the spend
// to the micro-dollar: daily_usd = 0.007 is "$0.007", not "$0.01" beside
// a spend of "$0.00687", and monthly_usd = 12.345 is not rounded either.
func TestBudgetPrintsCeilingsAsConfigured(t *testing.T) {
	path := simulatedConfig(t, "[budget]\ndaily_usd = 0.007\nmonthly_usd = 12.345\n[plans.free]\nmonthly_quota = 100\n")
	key := createKey(t, path, "ann")
	a, _, stop := startApp(t, path, envFrom(nil))
	img := samplePNG(t)
	ok := 0
	for range 3 {
		status, body, err := postImage(a.Addr(), key, img)
		switch {
		case err != nil:
			t.Fatal(err)
		case status == http.StatusOK:
			ok++
		case status != http.StatusServiceUnavailable: // the brake, once the day is spent
			t.Fatalf("read: %d %s", status, body)
		}
	}
	stop()
	if ok == 0 {
		t.Fatal("no read was made: no spend to show")
	}
	var asJSON, table bytes.Buffer
	if err := run(context.Background(), []string{"budget", "--json", "--config", path}, envFrom(nil), &asJSON, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"budget", "--config", path}, envFrom(nil), &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	var b struct {
		Day        string  `json:"day"`
		Month      string  `json:"month"`
		SpendToday float64 `json:"spend_today_usd"`
		SpendMonth float64 `json:"spend_month_usd"`
	}
	if err := json.Unmarshal(asJSON.Bytes(), &b); err != nil || b.SpendToday == 0 {
		t.Fatalf("budget --json: %+v %v\n%s", b, err, asJSON.String())
	}
	for _, row := range []struct {
		ceiling, limit string
		spent          float64
	}{{"usd " + b.Day, "$0.007", b.SpendToday}, {"usd " + b.Month, "$12.345", b.SpendMonth}} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(row.ceiling) + ` +(\S+) +(\S+)$`).FindStringSubmatch(table.String())
		if m == nil {
			t.Fatalf("budget prints no %q row:\n%s", row.ceiling, table.String())
		}
		if m[2] != row.limit {
			t.Errorf("%s: LIMIT %s, want %s as configured:\n%s", row.ceiling, m[2], row.limit, table.String())
		}
		spent, err := strconv.ParseFloat(strings.TrimPrefix(m[1], "$"), 64)
		if err != nil || math.Round(spent*1e6) != math.Round(row.spent*1e6) {
			t.Errorf("%s: SPENT %s, want %s to the micro-dollar:\n%s", row.ceiling, m[1], fmt.Sprint(row.spent), table.String())
		}
	}
}
