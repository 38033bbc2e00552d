package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A typo in config.toml must not lock the operator out of the brake:
// serve and config check refuse the file, the operator's commands go on
// with a warning naming each key they left out.
func TestOperatorCommandsSurviveATypo(t *testing.T) {
	dir := t.TempDir()
	good := fmt.Sprintf("[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n", filepath.Join(dir, "bw.db"))
	path := writeConfig(t, good)
	if err := run(context.Background(), []string{"keys", "create", "--user", "ann", "--config", path}, envFrom(nil), &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, extra, key string
	}{
		{"unknown key", "[limits.user]\nbrust = 3\n", `unknown key "limits.user.brust"`},
		{"bad duration", "[limits.user]\nwindow = \"10mins\"\n", "limits.user.window"},
		{"bad value elsewhere", "[invites]\nrate = -4\n", "invites.rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeConfig(t, good+tt.extra)
			if err := run(context.Background(), []string{"config", "check", "--config", cfg}, envFrom(nil), &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tt.key) {
				t.Errorf("config check: %v, want a refusal naming %s", err, tt.key)
			}
			var out, stderr bytes.Buffer
			if err := run(context.Background(), []string{"brake", "on", "--config", cfg}, envFrom(nil), &out, &stderr); err != nil {
				t.Fatalf("brake on with %s in the file: %v", tt.key, err)
			}
			if !strings.Contains(out.String(), "ENGAGED by manual") {
				t.Errorf("brake on printed %q", out.String())
			}
			if !strings.Contains(stderr.String(), "warning:") || !strings.Contains(stderr.String(), tt.key) {
				t.Errorf("stderr %q, want a warning naming %s", stderr.String(), tt.key)
			}
			if err := run(context.Background(), []string{"brake", "off", "--config", cfg}, envFrom(nil), &out, &bytes.Buffer{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	// What the commands need is still checked.
	cfg := writeConfig(t, good+"[budget]\ntimezone = \"Mars/Olympus\"\n")
	if err := run(context.Background(), []string{"brake", "on", "--config", cfg}, envFrom(nil), &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "budget.timezone") {
		t.Errorf("brake on with a bad time zone: %v", err)
	}
	// serve stays strict.
	cfg = writeConfig(t, good+"[limits.user]\nbrust = 3\n")
	if err := run(context.Background(), []string{"serve", "--config", cfg}, envFrom(nil), &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "limits.user.brust") {
		t.Errorf("serve with a typo: %v", err)
	}
}
