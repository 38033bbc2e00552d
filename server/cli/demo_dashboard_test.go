package cli_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

var dashboardRE = regexp.MustCompile(`(?m)^Dashboard: (http://127\.0\.0\.1:\d+/) .*\n(\w{32})$`)

// The demo shows a newcomer the dashboard in the first minute: its
// address on loopback and a throwaway admin token that opens it. And a
// throwaway database has no yesterday: no detection pass is run or
// logged at start.
func TestDemoShowsTheDashboard(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, logs := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--config", "config.toml"}, envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "the-operators-own-token"}), out, logs)
	}()
	waitFor(t, out, dashboardRE)
	m := dashboardRE.FindStringSubmatch(out.String())
	url, token := m[1], m[2]
	get := func(password string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.SetBasicAuth("demo", password)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(token); got != http.StatusOK {
		t.Errorf("dashboard with the printed token: %d", got)
	}
	if got := get("the-operators-own-token"); got != http.StatusUnauthorized {
		t.Errorf("dashboard with the operator's own token: %d, want 401 (the demo's token is its own)", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("demo returned %v", err)
	}
	if strings.Contains(logs.String(), "detection") {
		t.Errorf("the demo ran or logged a detection pass on its throwaway database:\n%s", logs.String())
	}
}
