package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/detect/smtptest"
	"breakwater/server/cli"
)

// config init writes the shipped, commented config.toml, byte for byte,
// and never replaces a file without --force.
func TestConfigInit(t *testing.T) {
	shipped, err := os.ReadFile("config.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	cmd := func(args ...string) error {
		return run(context.Background(), args, envFrom(nil), io.Discard, io.Discard)
	}
	if err := cmd("config", "init", path); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, shipped) {
		t.Error("config init did not write the shipped config.toml")
	}
	if err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(map[string]string{"GEMINI_API_KEY": "k"}), io.Discard, io.Discard); err != nil {
		t.Errorf("config check of what config init wrote: %v", err)
	}
	os.WriteFile(path, []byte("# mine\n"), 0o600)
	if err := cmd("config", "init", path); err == nil || !strings.Contains(err.Error(), "exists") || cli.ExitCode(err, io.Discard) != 1 {
		t.Errorf("config init over a file: %v, want a refusal", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "# mine\n" {
		t.Error("config init replaced a file without --force")
	}
	if err := cmd("config", "init", "--force", path); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, shipped) {
		t.Error("config init --force did not replace the file")
	}
	// Without FILE it writes the --config file.
	other := filepath.Join(dir, "other.toml")
	if err := cmd("config", "init", "--config", other); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("config init --config: %v", err)
	}
}

// alerts test sends one mail now through [alerts] and prints the SMTP
// server's answer; a refusal is the error, with the server's words.
func TestAlertsTest(t *testing.T) {
	config := func(addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		return writeConfig(t, fmt.Sprintf("[storage]\npath = %q\n[plans.free]\nmonthly_quota = 10\n[alerts]\nsmtp_host = %q\nsmtp_port = %d\ntls = \"none\"\nfrom = \"bw@example.com\"\nto = [\"ops@example.com\"]\n",
			filepath.Join(t.TempDir(), "bw.db"), host, p))
	}
	smtp := smtptest.Start(t, "127.0.0.1:0")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"alerts", "test", "--config", config(smtp.Addr)}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	msgs := smtp.WaitFor(t, 1, 5*time.Second)
	if len(msgs) != 1 || !strings.Contains(msgs[0].Headers(), "ops@example.com") {
		t.Errorf("the server got %+v", msgs)
	}
	if !strings.Contains(out.String(), "test mail to ops@example.com sent through 127.0.0.1") || !strings.Contains(out.String(), "the server said: 2.0.0 OK: queued") {
		t.Errorf("alerts test printed %q, want the server's answer", out.String())
	}

	// A server that wants a login refuses the mail: its words are the error.
	strict := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.NoTLS, Username: "u", Password: "p"})
	err := run(context.Background(), []string{"alerts", "test", "--config", config(strict.Addr)}, envFrom(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "refused the mail") || !strings.Contains(err.Error(), "Please authenticate first") {
		t.Errorf("alerts test against a refusing server: %v", err)
	}
	if err := run(context.Background(), []string{"alerts", "test", "--config", writeConfig(t, minimalConfig)}, envFrom(nil), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "no [alerts] channel") {
		t.Errorf("alerts test without [alerts]: %v", err)
	}
}

// alerts test sends to every channel, webhooks without mail included, and
// prints each answer; a channel that refuses fails the command after the
// others were tried.
func TestAlertsTestWebhooks(t *testing.T) {
	var got atomic.Value
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got.Store(string(body))
		io.WriteString(w, "ok")
	}))
	defer ok.Close()
	gone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no such hook", http.StatusNotFound) }))
	defer gone.Close()
	config := writeConfig(t, fmt.Sprintf("[storage]\npath = %q\n[plans.free]\nmonthly_quota = 10\n[alerts]\n"+
		"[[alerts.webhook]]\nformat = \"json\"\nurl_env = \"OPS_HOOK\"\n"+
		"[[alerts.webhook]]\nformat = \"slack\"\nurl_env = \"GONE_HOOK\"\n", filepath.Join(t.TempDir(), "bw.db")))
	var out bytes.Buffer
	err := run(context.Background(), []string{"alerts", "test", "--config", config},
		envFrom(map[string]string{"OPS_HOOK": ok.URL, "GONE_HOOK": gone.URL}), &out, io.Discard)
	if !strings.Contains(out.String(), "webhook json ($OPS_HOOK): the receiver said: 200 OK: ok") {
		t.Errorf("alerts test printed %q, want the json receiver's answer", out.String())
	}
	if body, _ := got.Load().(string); !strings.Contains(body, `"kind":"test"`) || !strings.Contains(body, `"severity":"info"`) {
		t.Errorf("the receiver got %q", body)
	}
	if err == nil || !strings.Contains(err.Error(), "webhook slack ($GONE_HOOK)") || !strings.Contains(err.Error(), "404") {
		t.Errorf("alerts test with a refusing webhook: %v", err)
	}
	if strings.Contains(out.String()+fmt.Sprint(err), gone.URL) {
		t.Errorf("a webhook URL, a secret, was printed: %s %v", out.String(), err)
	}
}

// config check says where alerts go: each webhook by the variable that
// holds its URL, and that an unset one would be left out.
func TestConfigCheckNamesAlertChannels(t *testing.T) {
	path := writeConfig(t, fmt.Sprintf("[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n[alerts]\nwarn_at = []\n"+
		"[[alerts.webhook]]\nformat = \"ntfy\"\nurl_env = \"NTFY_URL\"\nsecret_env = \"NTFY_SECRET\"\n", filepath.Join(t.TempDir(), "bw.db")))
	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"webhook 1: ntfy to $NTFY_URL, signed with $NTFY_SECRET", "warning: NTFY_URL is not set", "no early warning"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config check printed %q, want %q", out.String(), want)
		}
	}
	if strings.Contains(out.String(), "mail: alerts go to") {
		t.Errorf("config check says mail is on without smtp_host:\n%s", out.String())
	}
}
