package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/test/harness"
)

// oneCallMicro is what one call costs at the fake's recorded usage at the
// shipped prices: 348 + 90 micro-dollars.
const oneCallMicro = 438

// TestCeilingRaceAlertsTheBrakeOnly is test/multi's test of the same name
// on bolt: 200 clients race one instance for the last room under each
// global ceiling, retrying budget_busy. The webhook receives brake_engaged
// and never usage_commit_failed, the server logs no error, and every
// refused client gets the brake's answer.
func TestCeilingRaceAlertsTheBrakeOnly(t *testing.T) {
	t.Parallel() // its binary, fake, webhook and database of its own
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin, err := harness.Build(ctx, ".", dir)
	if err != nil {
		t.Fatal(err)
	}
	gemini, err := harness.NewGemini(".", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer gemini.Close()
	for i, cfg := range []harness.Config{
		{DailyRequests: 20},
		{DailyRequests: 100000, DailyUSD: 20 * oneCallMicro / 1e6, MaxOutputTokens: 40},
		{DailyRequests: 100000, MonthlyUSD: 20 * oneCallMicro / 1e6, MaxOutputTokens: 40},
	} {
		t.Run([]string{"daily_requests", "daily_usd", "monthly_usd"}[i], func(t *testing.T) {
			cfg.GeminiURL, cfg.Plan, cfg.DBPath = gemini.URL, "free", filepath.Join(t.TempDir(), "bw.db")
			raceCeiling(ctx, t, bin, cfg)
		})
	}
}

// raceCeiling starts one server under cfg with a webhook, sends the burst
// and checks what the operator and the clients were told.
func raceCeiling(ctx context.Context, t *testing.T, bin string, cfg harness.Config) {
	hook, err := harness.NewWebhook()
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close()
	dir := filepath.Dir(cfg.DBPath)
	config := filepath.Join(dir, "config.toml")
	if err := harness.WriteConfig(config, cfg); err != nil {
		t.Fatal(err)
	}
	if err := appendFile(config, harness.WebhookConfig("BREAKWATER_TEST_HOOK_URL")); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for u := range 10 {
		key, err := harness.CreateKey(ctx, bin, config, fmt.Sprintf("user%d", u), cfg.Plan)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	p, err := harness.Start(bin, config, filepath.Join(dir, "server.log"), "GEMINI_API_KEY=test-key", "BREAKWATER_TEST_HOOK_URL="+hook.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	answers := burstRetrying(ctx, p.Addr, keys, 200)
	if !hook.WaitFor("brake_engaged", 10*time.Second) {
		t.Errorf("no brake_engaged alert at the webhook; received %v", hook.Kinds())
	}
	time.Sleep(2 * time.Second) // alerts raised by the last refusals are on their way
	p.Stop(10 * time.Second)
	if kinds := hook.Kinds(); slices.Contains(kinds, "usage_commit_failed") {
		t.Errorf("the webhook received usage_commit_failed at a ceiling, with the disk healthy: %v", kinds)
	}
	log, _ := os.ReadFile(p.LogPath)
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("the server logged an error at a ceiling: %s", line)
		}
	}
	ok := 0
	for _, a := range answers {
		switch {
		case a.Status == http.StatusOK:
			ok++
		case a.Status == 0:
			// No answer reached the client (a connection reset on a
			// loaded machine): nothing it was told, right or wrong.
			t.Logf("no answer: %v", a.Err)
		case a.Status != http.StatusServiceUnavailable || (a.Code != "budget_paused" && a.Code != "budget_busy"):
			t.Errorf("answered %d %s (%v) at a ceiling, want 200 or the brake's 503", a.Status, a.Code, a.Err)
		}
	}
	if ok < 15 {
		t.Errorf("%d reads answered, want most of the ceiling's 20", ok)
	}
}

// burstRetrying sends n fresh images at once over keys, each client
// retrying budget_busy after a short pause (at most 200 times).
func burstRetrying(ctx context.Context, addr string, keys []string, n int) []harness.Answer {
	client := &http.Client{Timeout: 30 * time.Second}
	out := make([]harness.Answer, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			for try := 0; ; try++ {
				out[k] = harness.Post(ctx, client, addr, keys[k%len(keys)], harness.NthPNG(uint64(k*1000+try)))
				if out[k].Code != "budget_busy" || try >= 200 || ctx.Err() != nil {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return out
}

// appendFile adds text to the end of the file at path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
