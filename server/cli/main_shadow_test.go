package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricValue reads one series of the admin listener's /metrics; 0 when
// it is absent.
func metricValue(t *testing.T, adminAddr, token, series string) float64 {
	t.Helper()
	body := adminPage(t, adminAddr, token, "/metrics")
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// adminPage reads path from the admin listener with token.
func adminPage(t *testing.T, adminAddr, token, path string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+adminAddr+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// With rate = 2 in shadow mode, ten quick requests all pass and the
// metric counts the 8 the limit would have refused; a hot reload to
// enforce refuses at once, as the shadow predicted.
func TestShadowModeThenEnforce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	adminAddr := freeAddr(t)
	base := fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
admin_listen = %q
[storage]
path = %q
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
[limits.user]
rate = 2
window = "1h"
`, adminAddr, filepath.Join(dir, "bw.db"))
	write := func(body string) { t.Helper(); saveAsEditor(t, path, body) }
	write(base + "mode = \"shadow\"\n")
	key := createKey(t, path, "sam")
	const token = "admin-token-for-the-test"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, logs, stop := startApp(t, path, envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": token}))
	a.Watch(ctx, path)
	img := samplePNG(t)
	for i := range 10 {
		status, body, err := postImage(a.Addr(), key, img)
		if err != nil {
			t.Fatal(err)
		}
		if status != http.StatusOK {
			t.Fatalf("request %d in shadow mode: %d %s, want 200", i, status, body)
		}
	}
	if got := metricValue(t, adminAddr, token, `breakwater_shadow_refusals_total{layer="rate",reason="rate"}`); got != 8 {
		t.Errorf("shadow refusals = %v, want 8", got)
	}
	if got := metricValue(t, adminAddr, token, `breakwater_refusals_total{layer="rate",reason="rate"}`); got != 0 {
		t.Errorf("real refusals = %v, want 0", got)
	}

	// Serving, usage reads the live figure through the admin API, not
	// the rows stored once a minute (it showed "-" while /metrics had
	// them). The recorder takes the requests' events within milliseconds.
	usageNow := func() string {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"usage", "sam", "--config", path}, envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": token}), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out := usageNow()
		if strings.Contains(out, "rate 8") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage while serving shows no live shadow refusals, want rate 8:\n%s", out)
		}
	}

	write(base + "mode = \"enforce\"\n")
	waitFor(t, logs, regexp.MustCompile(`msg="config reloaded".*limits.user.mode`))
	if status, _, err := postImage(a.Addr(), key, img); err != nil || status != http.StatusTooManyRequests {
		t.Fatalf("after the reload to enforce: %d %v, want 429", status, err)
	}
	// Stopped, usage reads the recorded shadow refusals.
	stop()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"usage", "sam", "--json", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var usage []struct {
		ShadowToday map[string]int64 `json:"shadow_today"`
	}
	if err := json.Unmarshal(out.Bytes(), &usage); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(usage) != 1 || usage[0].ShadowToday["rate"] != 8 {
		t.Errorf("usage %s, want 8 shadow refusals at layer rate", out.String())
	}
}
