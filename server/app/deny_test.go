package app

import (
	"bytes"
	"context"
	encbinary "encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/server/guard"
)

// denyApp is an App on bolt with a rate of 3 a minute and a plan "free"
// of one attempt a day (and a plan "pro" of 100), with one key of user
// ada on "free", and post, which sends one image and returns the status
// and the problem's code.
func denyApp(t *testing.T) (*App, func(*testing.T) (int, string)) {
	t.Helper()
	gemini, _ := countingGemini(t)
	dir := t.TempDir()
	body := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n[ocr]\nbase_url = %q\ndedupe_window = \"0s\"\n"+
		"[limits.user]\nrate = 3\nburst = 100\n[plans.free]\nmonthly_quota = 100\ndaily_attempts = 1\n"+
		"[plans.pro]\nmonthly_quota = 100\ndaily_attempts = 100\n", filepath.Join(dir, "bw.db"), gemini.URL)
	getenv := env(map[string]string{"GEMINI_API_KEY": "test-key"})
	cfg, err := Load(writeConfig(t, body), getenv)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), cfg, Options{Getenv: getenv, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	key, _, err := a.Keys().Create("ada", "free")
	if err != nil {
		t.Fatal(err)
	}
	img := reloadImage(t)
	return a, func(t *testing.T) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/v1/ocr", bytes.NewReader(img))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "image/png")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.Code
	}
}

// On bolt too the OCR route remembers an exact refusal, and an
// operator's change clears it: a user at the daily line moved to a plan
// with room passes at once.
func TestDenyClearedByOperatorChange(t *testing.T) {
	a, post := denyApp(t)
	if got, _ := post(t); got != http.StatusOK {
		t.Fatalf("first read: %d", got)
	}
	if got, code := post(t); got != http.StatusTooManyRequests || code != "daily_limit" {
		t.Fatalf("over the line: %d %s, want 429 daily_limit", got, code)
	}
	if n := a.deny.Len(); n != 1 {
		t.Fatalf("%d refusals remembered, want the daily line's", n)
	}
	if _, err := a.operator.SetPlan(context.Background(), "ada", "pro"); err != nil {
		t.Fatal(err)
	}
	if n := a.deny.Len(); n != 0 {
		t.Errorf("%d refusals remembered after the plan change, want none", n)
	}
	if got, code := post(t); got != http.StatusOK {
		t.Errorf("after the plan change: %d %s, want 200", got, code)
	}
}

// A reload that raises the rate clears the remembered rate refusals of
// the instance that reloads: the next request passes. (On the old code,
// without the clear, it was refused from memory until the window's end.)
func TestDenyClearedByReload(t *testing.T) {
	a, post := denyApp(t)
	if _, err := a.operator.SetPlan(context.Background(), "ada", "pro"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got, code := post(t); got != http.StatusOK {
			t.Fatalf("read %d: %d %s", i+1, got, code)
		}
	}
	if got, code := post(t); got != http.StatusTooManyRequests || code != "rate_limited" {
		t.Fatalf("fourth in the minute: %d %s, want 429 rate_limited", got, code)
	}
	next := a.cfg
	next.Limits.User.Rate = 10
	if err := a.Reload(next, "test"); err != nil {
		t.Fatal(err)
	}
	if got, code := post(t); got != http.StatusOK {
		t.Errorf("after the reload raised the rate: %d %s, want 200", got, code)
	}
}

// A refusal answered from memory counts as the first did: in the
// refusal counts (breakwater_refusals_total and the dashboard's) and in
// the statistics events, and no attempt.
func TestDenyCountsAsTheFirstRefusal(t *testing.T) {
	a, post := denyApp(t)
	if got, _ := post(t); got != http.StatusOK {
		t.Fatalf("first read: %d", got)
	}
	const refusals = 20 // the first decided by the layers, the rest from memory
	for range refusals {
		if got, code := post(t); code != "daily_limit" {
			t.Fatalf("over the line: %d %s, want 429 daily_limit", got, code)
		}
	}
	if n := a.deny.Len(); n != 1 {
		t.Fatalf("%d refusals remembered, want 1", n)
	}
	_, counts := a.edge.DirtyRefusals()
	if v := counts["attempts daily_line"]; len(v) != 8 || encbinary.BigEndian.Uint64(v) != refusals {
		t.Errorf("today's count of attempts/daily_line %x, want %d", v, refusals)
	}
	usage, err := a.operator.Usage(context.Background(), "ada")
	if err != nil || len(usage) != 1 || usage[0].AttemptsToday != 1 {
		t.Errorf("usage %+v, %v: want 1 attempt today", usage, err)
	}
	a.Close() // the recorder's last rows are written
	rec, closeDB, err := OpenRecorded(a.cfg, Options{Getenv: env(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	now := time.Now()
	got, err := rec.Recorded(context.Background(), now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var refused int64
	for _, e := range got.Events {
		if e.Outcome == detect.OutcomeLayerRefused && e.Layer == guard.LayerAttempts && e.UserID == "ada" {
			refused += e.N()
		}
	}
	if refused != refusals {
		t.Errorf("%d refusals of the daily line in the statistics, want %d", refused, refusals)
	}
}
