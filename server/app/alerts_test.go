package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"breakwater/detect"
)

// [alerts] loads webhooks without mail, warn_at left out takes its
// default (with or without the section), and warn_at = [] switches the
// early warnings off rather than taking the default.
func TestAlertsConfig(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		warnAt   []float64
		mail     bool
		webhooks int
	}{
		{"no section", minimal, detect.DefaultWarnAt, false, 0},
		{"webhooks without mail", minimal + "[alerts]\n[[alerts.webhook]]\nformat = \"ntfy\"\nurl_env = \"NTFY_URL\"\n" +
			"[[alerts.webhook]]\nformat = \"json\"\nurl_env = \"HOOK_URL\"\nsecret_env = \"HOOK_SECRET\"\n", detect.DefaultWarnAt, false, 2},
		{"warnings off", minimal + "[alerts]\nwarn_at = []\n", []float64{}, false, 0},
		{"own shares with mail", minimal + "[alerts]\nwarn_at = [0.9]\nsmtp_host = \"smtp.example.com\"\nfrom = \"bw@example.com\"\nto = [\"ops@example.com\"]\n",
			[]float64{0.9}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(writeConfig(t, tc.body), env(nil))
			if err != nil {
				t.Fatal(err)
			}
			a := c.AlertSettings()
			if !slices.Equal(a.WarnAt, tc.warnAt) || (a.WarnAt == nil) != (tc.warnAt == nil) {
				t.Errorf("warn_at %v, want %v", a.WarnAt, tc.warnAt)
			}
			if a.MailOn() != tc.mail || len(a.Webhooks) != tc.webhooks {
				t.Errorf("mail %v, %d webhooks; want %v, %d", a.MailOn(), len(a.Webhooks), tc.mail, tc.webhooks)
			}
		})
	}
	if _, err := Load(writeConfig(t, minimal+"[alerts]\n[[alerts.webhook]]\nformat = \"teams\"\nurl_env = \"X\"\n"), env(nil)); err == nil ||
		!strings.Contains(err.Error(), "alerts.webhook[1].format") {
		t.Errorf("an unknown format: %v, want an error naming the key", err)
	}
}

// A webhook whose variable is empty is left out, loudly, and never
// stops the others.
func TestWebhooksFromTheEnvironment(t *testing.T) {
	settings := detect.AlertsConfig{Webhooks: []detect.WebhookConfig{
		{Format: "slack", URLEnv: "EMPTY_URL"},
		{Format: "json", URLEnv: "HOOK_URL", SecretEnv: "HOOK_SECRET"},
	}}
	got := Webhooks(settings, env(map[string]string{"HOOK_URL": "http://127.0.0.1:1/hook", "HOOK_SECRET": "s"}), &detect.Counters{}, nil)
	if len(got) != 2 || got[0].Err == nil || !strings.Contains(got[0].Err.Error(), "EMPTY_URL") || got[1].Err != nil {
		t.Fatalf("webhooks %+v, want the first refused naming EMPTY_URL and the second started", got)
	}
	if got[1].Name != "webhook json ($HOOK_URL)" {
		t.Errorf("name %q", got[1].Name)
	}
	got[1].Hook.Close(t.Context())
}

// Through the whole App: a webhook without mail gets the alert of an
// upstream refusal that stops every read, signed, in the json format.
func TestAppSendsAlertsToAWebhookWithoutMail(t *testing.T) {
	gemini := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"code":429,"message":"Your prepayment credits are depleted. Please go to AI Studio at https://ai.studio/projects to manage your project and billing.","status":"RESOURCE_EXHAUSTED"}}`)
	}))
	defer gemini.Close()
	got := make(chan *http.Request, 4)
	bodies := make(chan []byte, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
	}))
	defer hook.Close()
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n[ocr]\nbase_url = %q\n"+minimal+
		"[alerts]\ndashboard_url = \"https://ops.example/admin/dashboard\"\n[[alerts.webhook]]\nformat = \"json\"\nurl_env = \"HOOK_URL\"\nsecret_env = \"HOOK_SECRET\"\n",
		filepath.Join(t.TempDir(), "bw.db"), gemini.URL))
	secrets := map[string]string{"GEMINI_API_KEY": "k", "HOOK_URL": hook.URL, "HOOK_SECRET": "s3cret"}
	cfg, err := Load(path, env(secrets))
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), cfg, Options{Getenv: env(secrets)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	key, _, err := a.keys.Create("alice", "free")
	if err != nil {
		t.Fatal(err)
	}
	var img bytes.Buffer
	png.Encode(&img, image.NewGray(image.Rect(0, 0, 8, 8)))
	req, _ := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/v1/ocr", &img)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", resp.StatusCode)
	}
	select {
	case r := <-got:
		body := <-bodies
		if sig := r.Header.Get(detect.SignatureHeader); sig != detect.Sign("s3cret", body) {
			t.Errorf("signature %q", sig)
		}
		var n detect.JSONNotice
		if err := json.Unmarshal(body, &n); err != nil {
			t.Fatal(err)
		}
		if n.Kind != detect.KindUpstreamCredits || n.Severity != detect.SeverityCritical || n.Dashboard != "https://ops.example/admin/dashboard" ||
			n.Details["reason"] != "credits_depleted" {
			t.Errorf("notice %+v", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the webhook got no alert")
	}
}

// warn_at is a list of numbers; from the environment it is
// comma-separated like every list, and a word in it is refused.
func TestWarnAtFromTheEnvironment(t *testing.T) {
	saved := environ
	t.Cleanup(func() { environ = saved })
	for _, tc := range []struct {
		value string
		want  []float64
		err   string
	}{
		{"0.6, 0.9", []float64{0.6, 0.9}, ""},
		{"half", nil, `"half" is not a number`},
	} {
		environ = func() []string { return []string{"BREAKWATER_ALERTS__WARN_AT=" + tc.value} }
		c, err := Load(writeConfig(t, minimal+"[alerts]\n"), env(map[string]string{"BREAKWATER_ALERTS__WARN_AT": tc.value}))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "alerts.warn_at") {
				t.Errorf("%q: %v, want an error naming alerts.warn_at", tc.value, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := c.AlertSettings().WarnAt; !slices.Equal(got, tc.want) {
			t.Errorf("%q: warn_at %v, want %v", tc.value, got, tc.want)
		}
	}
}
