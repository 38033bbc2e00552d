package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// selftest proves the limits of the config it is given, on a throwaway
// database: the live one named by storage.path is never made.
func TestSelftestLeavesTheLiveDatabaseAlone(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "data", "breakwater.db")
	path := filepath.Join(dir, "config.toml")
	toml := "[storage]\npath = \"data/breakwater.db\"\n[budget]\ndaily_requests = 10\n[limits.user]\nrate = 6\nburst = 2\n" +
		"[invites]\nfail_limit = 2\n[plans.free]\nmonthly_quota = 8\ndaily_attempts = 4\n"
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), nil, []string{"selftest", "--config", path}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatalf("selftest: %v\n%s", err, out.String())
	}
	for _, want := range []string{"budget.daily_requests = 10: 40 parallel requests, 10 upstream calls", "limits.user rate 6/1m burst 2: exact",
		"plans.free monthly_quota 8:", "plans.free daily_attempts 4:", "invites fail_limit 2: cooldown after 2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "DOES NOT HOLD") {
		t.Errorf("a limit did not hold:\n%s", out.String())
	}
	if _, err := os.Stat(live); !os.IsNotExist(err) {
		t.Errorf("the live database %s was touched: %v", live, err)
	}
}
