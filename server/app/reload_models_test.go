package app

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
)

// A reload applies new prices live, but the running client keeps sending
// its model, media_resolution and output cap until a restart, so the worst
// case keeps counting the image at the running rule; a new model's list
// prices wait for the restart that brings the model.
func TestReloadKeepsTheRunningModelsImageRule(t *testing.T) {
	dir := t.TempDir()
	base := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n", filepath.Join(dir, "bw.db")) + minimal
	getenv := env(map[string]string{"GEMINI_API_KEY": "test-key"})
	cfg, err := Load(writeConfig(t, base+"[ocr]\nmedia_resolution = \"high\"\n"), getenv)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), cfg, Options{Getenv: getenv, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)

	next, err := Load(writeConfig(t, base+"[ocr]\nmedia_resolution = \"low\"\n[ocr.price]\ninput_usd_per_million = 0.5\n"), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(next, "test"); err != nil {
		t.Fatal(err)
	}
	p := a.cfg.OCR.Price
	if got, want := p.ImageTokens(640, 480), 1120; got != want {
		t.Errorf("after the reload: %d image tokens, want the running level's %d", got, want)
	}
	if p.InputUSDPerMillion != 0.5 || p.OutputUSDPerMillion != 2.5 {
		t.Errorf("after the reload: prices %g / %g, want the new 0.5 and the model's 2.5", p.InputUSDPerMillion, p.OutputUSDPerMillion)
	}

	next, err = Load(writeConfig(t, base+"[ocr]\nmodel = \"gemini-3.1-pro-preview\"\n[ocr.price]\ninput_usd_per_million = 3\n"), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(next, "test"); err != nil {
		t.Fatal(err)
	}
	if p := a.cfg.OCR.Price; p.InputUSDPerMillion != 0.5 || p.ImageTokens(1, 1) != 1120 {
		t.Errorf("a new model in the file: price %+v, want the running one until the restart", p)
	}
}
