package cli_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// The dashboard's shadow table and breakwater usage read one source, the
// recorded events: after a restart both show the would-be refusals made
// before it, the same figures, on bolt and on PostgreSQL.
func TestShadowFiguresAgreeAfterARestart(t *testing.T) {
	for _, backend := range []string{"bolt", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			dir := t.TempDir()
			adminAddr := freeAddr(t)
			env := map[string]string{"BREAKWATER_ADMIN_TOKEN": "admin-token-for-the-shadow-test"}
			storage := fmt.Sprintf("[storage]\npath = %q\n", filepath.Join(dir, "bw.db"))
			if backend == "postgres" {
				storage = "[storage]\nbackend = \"postgres\"\n"
				env[postgres.EnvURL], env["BREAKWATER_SECRET"] = pgtest.NewDatabase(t), migrateSecret
			}
			config := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
admin_listen = %q
%s
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
[limits.user]
rate = 2
window = "1h"
mode = "shadow"
`, adminAddr, storage))
			out, err := cliRun(config, env, "keys", "create", "--user", "sam", "--plan", "free")
			if err != nil {
				t.Fatalf("keys create: %v\n%s", err, out)
			}
			key := regexp.MustCompile(`(?m)^(bw_\S+)$`).FindString(out)
			a, _, stop := startApp(t, config, envFrom(env))
			for i := range 6 {
				if status, body, err := postImage(a.Addr(), key, labelPNG(t, uint8(100+i))); err != nil || status != http.StatusOK {
					t.Fatalf("read %d in shadow mode: %d %s %v", i, status, body, err)
				}
			}
			stop()
			_, _, stop = startApp(t, config, envFrom(env))
			defer stop()
			dashboard := dashboardShadow(t, adminAddr, env["BREAKWATER_ADMIN_TOKEN"])
			usage := usageShadow(t, config, env)
			if dashboard["rate"] != 4 || fmt.Sprint(dashboard) != fmt.Sprint(usage) {
				t.Errorf("after a restart the dashboard shows %v in shadow mode, usage %v; want rate 4 in both", dashboard, usage)
			}
		})
	}
}

// dashboardShadow reads the dashboard's shadow table: layer -> count.
func dashboardShadow(t *testing.T, adminAddr, token string) map[string]int64 {
	t.Helper()
	page := adminPage(t, adminAddr, token, "/")
	table := regexp.MustCompile(`(?s)<table id="shadow">(.*?)</table>`).FindSubmatch(page)
	if table == nil {
		t.Fatalf("the dashboard has no shadow table:\n%s", page)
	}
	got := map[string]int64{}
	for _, m := range regexp.MustCompile(`<tr><td>([^<]+)</td><td class="n">(\d+)</td></tr>`).FindAllSubmatch(table[1], -1) {
		n, _ := strconv.ParseInt(string(m[2]), 10, 64)
		got[string(m[1])] = n
	}
	return got
}

// usageShadow sums breakwater usage's shadow counts of every user by layer.
func usageShadow(t *testing.T, config string, env map[string]string) map[string]int64 {
	t.Helper()
	out, err := cliRun(config, env, "usage", "--json")
	if err != nil {
		t.Fatalf("usage: %v\n%s", err, out)
	}
	var list []struct {
		ShadowToday map[string]int64 `json:"shadow_today"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := map[string]int64{}
	for _, u := range list {
		for layer, n := range u.ShadowToday {
			got[layer] += n
		}
	}
	return got
}
