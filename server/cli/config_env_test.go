package cli_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// shippedWebhook is the [[alerts.webhook]] example of the shipped
// config.toml, uncommented as an operator would: its key lines without
// "# ", its comment lines left out.
func shippedWebhook(t *testing.T) string {
	t.Helper()
	_, block, ok := strings.Cut(string(shippedConfig), "\n# [[alerts.webhook]]\n")
	if !ok {
		t.Fatal("the shipped config.toml has no [[alerts.webhook]] example")
	}
	block, _, _ = strings.Cut(block, "\n\n")
	out := "[[alerts.webhook]]\n"
	for line := range strings.SplitSeq(block, "\n") {
		if key, ok := strings.CutPrefix(line, "# "); ok && !strings.HasPrefix(key, "#") {
			out += key + "\n"
		}
	}
	if !strings.Contains(out, "url_env = ") || !strings.Contains(out, "secret_env = ") {
		t.Fatalf("the shipped webhook example names no url_env and secret_env:\n%s", out)
	}
	return out
}

// A variable that the config names by a key ending in _env (the shipped
// webhook example's BREAKWATER_SLACK_URL and BREAKWATER_SLACK_SECRET)
// holds what the config reads: config check and serve do not warn that
// it is no override, as they still do for a look-alike the config does
// not name.
func TestVariablesTheConfigNamesAreNoOverrides(t *testing.T) {
	webhook := shippedWebhook(t)
	path := simulatedConfig(t, "[plans.free]\nmonthly_quota = 10\n"+webhook)
	// The warning looks at the process's environment.
	t.Setenv("BREAKWATER_SLACK_URL", "https://hooks.slack.example/services/T0/B0/x")
	t.Setenv("BREAKWATER_SLACK_SECRET", "a-webhook-signing-secret")
	t.Setenv("BREAKWATER_LIMITS_USER_RATE", "5")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "--config", path}, os.Getenv, &out, &out); err != nil {
		t.Fatalf("config check: %v\n%s", err, out.String())
	}
	_, logs, stop := startApp(t, path, os.Getenv)
	stop()
	for what, said := range map[string]string{"config check": out.String(), "serve": logs.String()} {
		for _, name := range []string{"BREAKWATER_SLACK_URL", "BREAKWATER_SLACK_SECRET"} {
			if strings.Contains(said, name+" is not read") {
				t.Errorf("%s warns that %s, which the webhook's %s names, is no override:\n%s", what, name, "*_env", said)
			}
		}
		if !strings.Contains(said, "BREAKWATER_LIMITS_USER_RATE is not read") {
			t.Errorf("%s does not warn about BREAKWATER_LIMITS_USER_RATE, which the config does not name:\n%s", what, said)
		}
	}
}
