package cli_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"breakwater/ocr"
	"breakwater/server/app"
)

// TestConfigCheckUnknownModel: a model whose image tiling the worst case
// does not know stops config check, unless acknowledged; then config check
// and serve warn.
func TestConfigCheckUnknownModel(t *testing.T) {
	var out, errOut bytes.Buffer
	path := writeConfig(t, minimalConfig+"\n[ocr]\nmodel = \"gemini-3-pro-preview\"\n")
	err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(nil), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "ocr.model") || !strings.Contains(err.Error(), "ocr.allow_unknown_model") {
		t.Errorf("config check with an unknown model: %v, want ocr.model refused and the way out named", err)
	}

	out.Reset()
	path = writeConfig(t, minimalConfig+"\n[ocr]\nmodel = \"gemini-3-pro-preview\"\nallow_unknown_model = true\n")
	if err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(map[string]string{"GEMINI_API_KEY": "test-key"}), &out, &errOut); err != nil {
		t.Fatalf("config check with the unknown model allowed: %v", err)
	}
	if !strings.Contains(out.String(), `warning: ocr.model "gemini-3-pro-preview" is not a known model`) {
		t.Errorf("config check printed %q, want the unknown-model warning", out.String())
	}

	out.Reset()
	path = writeConfig(t, minimalConfig+"\n[ocr]\nmodel = \"gemini-2.5-pro\"\n")
	if err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(map[string]string{"GEMINI_API_KEY": "test-key"}), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "warning: ocr.price.input_usd_per_million = 0.3 is below the list price of gemini-2.5-pro") {
		t.Errorf("config check printed %q, want the price warning", out.String())
	}

	var logs bytes.Buffer
	cfg := ocr.Config{Model: "gemini-3-pro-preview", AllowUnknownModel: true}.WithDefaults()
	if _, err := app.NewReader(cfg, "test-key", slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "is not a known model") {
		t.Errorf("serve's reader logged %q, want the unknown-model warning", logs.String())
	}
}
