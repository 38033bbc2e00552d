package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"breakwater/server/invites"
)

// readmeBlock returns the first fenced block of README.md's "First
// deployment behind Caddy" whose first line is first, verbatim.
func readmeBlock(t *testing.T, first string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## First deployment behind Caddy\n")
	if !ok {
		t.Fatal("README.md has no section \"First deployment behind Caddy\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, part := range strings.Split(section, "\n```")[1:] {
		_, block, _ := strings.Cut(part, "\n") // past the fence's language
		if strings.HasPrefix(block, first+"\n") {
			return block
		}
	}
	t.Fatalf("README.md's first deployment has no block starting %q", first)
	return ""
}

// replaceAll is strings.NewReplacer(oldnew...).Replace(s), failing the
// test when an old string is not in s: the README changed under the test.
func replaceAll(t *testing.T, s string, oldnew ...string) string {
	t.Helper()
	for i := 0; i < len(oldnew); i += 2 {
		if !strings.Contains(s, oldnew[i]) {
			t.Fatalf("the README's block no longer holds %q:\n%s", oldnew[i], s)
		}
	}
	return strings.NewReplacer(oldnew...).Replace(s)
}

// README.md's first deployment, run as written: Breakwater with the
// [server] and [storage] of step 2 (on loopback, trusting only the
// proxy), behind step 7's site block under the real Caddy. A read goes
// through, and the client address Breakwater's limits count is the one
// Caddy saw: client addresses forged in X-Forwarded-For and X-Real-IP,
// a new one on each request, do not make new clients, so the invite
// burst limit refuses the fourth verification of one second.
func TestReadmeCaddyDeployment(t *testing.T) {
	dir := t.TempDir()
	server := replaceAll(t, readmeBlock(t, "[server]"),
		`listen = "127.0.0.1:8080"`, `listen = "127.0.0.1:0"`, "/var/lib/breakwater/breakwater.db", filepath.Join(dir, "bw.db"))
	cfg, err := Load(writeConfig(t, server+"\n[ocr]\nprovider = \"simulated\"\n"+minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	clock := newTestClock() // every request of the test in one second
	a, err := Open(context.Background(), cfg, Options{Getenv: env(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	key, _, err := a.Keys().Create("alice", "")
	if err != nil {
		t.Fatal(err)
	}

	addr := freePort(t)
	site := replaceAll(t, readmeBlock(t, "api.example.com {"), "api.example.com", "http://"+addr, "127.0.0.1:8080", a.Addr())
	file := filepath.Join(dir, "Caddyfile")
	writeFile(t, file, "{\n\tadmin off\n\tauto_https off\n}\n"+site)
	cmd := exec.Command(binary(t, "caddy"), "run", "--config", file, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	startProxy(t, addr, cmd)

	send := func(path, contentType string, body []byte, h http.Header) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = h
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := send("/v1/ocr", "image/png", reloadImage(t), hdr("Authorization", "Bearer "+key)); resp.StatusCode != http.StatusOK ||
		!strings.Contains(body, `"serials"`) {
		t.Fatalf("a read through Caddy: %d %s, want 200 with serials", resp.StatusCode, body)
	}
	for i := range invites.DefaultBurst + 1 {
		forged := hdr("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1), "X-Real-IP", fmt.Sprintf("198.51.100.%d", i+1))
		resp, body := send("/v1/invites/verify", "application/json", fmt.Appendf(nil, `{"code":"INV-NOPE","email":"u%d@example.com"}`, i), forged)
		want := http.StatusForbidden // a wrong code
		if i == invites.DefaultBurst {
			want = http.StatusTooManyRequests // Caddy's one address, over its burst
		}
		if resp.StatusCode != want {
			t.Fatalf("verification %d with a forged client address: %d %s, want %d", i+1, resp.StatusCode, body, want)
		}
	}
}
