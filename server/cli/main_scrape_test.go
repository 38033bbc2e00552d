package cli_test

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeScrapeConfigReadsMetrics takes the README's Prometheus scrape
// config and does what Prometheus does with it against a real admin
// listener: the token from its credentials_file (here a temporary one),
// sent as "Authorization: <type> <token>" to metrics_path on the target's
// port (the admin listener's, here a free one). It gets the metrics in the
// text format; without the token, 401.
func TestReadmeScrapeConfigReadsMetrics(t *testing.T) {
	readme, err := os.ReadFile("docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)### Prometheus scrape config\n.*?```yaml\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("docs/OPERATIONS.md has no Prometheus scrape config (a yaml block under ### Prometheus scrape config)")
	}
	field := func(name string) string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^\s*-?\s*` + name + `:\s*(.+?)\s*$`).FindSubmatch(block[1])
		if m == nil {
			t.Fatalf("the scrape config has no %s:\n%s", name, block[1])
		}
		return strings.Trim(string(m[1]), `[]"`)
	}
	path, authType, target := field("metrics_path"), field("type"), field("targets")
	field("credentials_file")
	if authType != "Bearer" {
		t.Errorf("authorization type %q, want Bearer", authType)
	}
	if target != "127.0.0.1:8081" {
		t.Errorf("target %q, want the default admin_listen 127.0.0.1:8081", target)
	}

	const token = "a-scrape-token-of-more-than-32-characters"
	tokenFile := filepath.Join(t.TempDir(), "breakwater-admin-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": token})
	a, _, _ := startApp(t, operatorConfig(t, "127.0.0.1:0", filepath.Join(t.TempDir(), "bw.db"), ""), env)
	url := "http://" + a.AdminAddr() + path

	scrape := func(credentialsFile string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if credentialsFile != "" {
			b, err := os.ReadFile(credentialsFile)
			if err != nil {
				t.Fatal(err)
			}
			// Prometheus trims the file's surrounding white space.
			req.Header.Set("Authorization", authType+" "+strings.TrimSpace(string(b)))
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, body
	}
	resp, body := scrape(tokenFile)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("scrape with the token: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	found := false
	for sc := bufio.NewScanner(strings.NewReader(string(body))); sc.Scan(); {
		found = found || strings.HasPrefix(sc.Text(), "breakwater_connections_open ")
	}
	if !found {
		t.Errorf("the scrape has no breakwater_connections_open sample:\n%.500s", body)
	}
	if resp, _ := scrape(""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("scrape without the token: %d, want 401", resp.StatusCode)
	}
}
