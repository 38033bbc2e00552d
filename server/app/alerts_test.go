package app

import (
	"slices"
	"strings"
	"testing"

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
