package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingGemini answers generateContent in Gemini's wire format and
// counts the calls.
func countingGemini(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":0,"totalTokenCount":322},"modelVersion":"gemini-2.5-flash"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// A config saved in two writes, the first valid TOML without [budget] and
// the rest a second later, never runs on the default budget in between:
// the half-written file leaves out budget.daily_requests, which the
// running config set, so its reload is refused, and no upstream call is
// made beyond daily_requests. On the old code the half-written file was
// applied and the service ran on the default 5,000 calls a day.
func TestReloadOfHalfWrittenFileKeepsTheBudget(t *testing.T) {
	const dailyRequests = 5
	gemini, calls := countingGemini(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	first := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n[ocr]\nbase_url = %q\ndedupe_window = \"0s\"\n"+
		"[limits.user]\nrate = 100000\nburst = 100000\n[plans.free]\nmonthly_quota = 100000\ndaily_attempts = 100000\n",
		filepath.Join(dir, "bw.db"), gemini.URL)
	rest := fmt.Sprintf("[budget]\ndaily_requests = %d\n", dailyRequests)
	if err := os.WriteFile(path, []byte(first+rest), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, post := watchedApp(t, path)
	for i := range dailyRequests {
		if got := post(); got != http.StatusOK {
			t.Fatalf("read %d: %d, want 200", i+1, got)
		}
	}
	if got := post(); got == http.StatusOK {
		t.Fatalf("read %d passed the budget of %d calls", dailyRequests+1, dailyRequests)
	}
	logText := func() string {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		return logs.w.(*bytes.Buffer).String()
	}

	// The save's first write: valid TOML, no [budget] yet.
	if err := os.WriteFile(path, []byte(first), 0o600); err != nil {
		t.Fatal(err)
	}
	// A second of requests, and more until the server has looked at the
	// half-written file (a loaded machine may take longer).
	reacted := regexp.MustCompile(`config reload(ed| refused)`)
	start := time.Now()
	for time.Since(start) < time.Second || !reacted.MatchString(logText()) {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("the half-written file was not looked at:\n%s", logText())
		}
		post()
		time.Sleep(20 * time.Millisecond)
	}
	if !regexp.MustCompile(`config reload refused.*budget.daily_requests`).MatchString(logText()) {
		t.Errorf("the log does not say that budget.daily_requests was left out:\n%s", logText())
	}
	// The save's second write completes the file.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(rest); err != nil {
		t.Fatal(err)
	}
	f.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logText(), "config reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("the completed file was not reloaded:\n%s", logText())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := post(); got == http.StatusOK {
		t.Errorf("after the completed save a read passed the budget of %d calls", dailyRequests)
	}
	if got := calls.Load(); got != dailyRequests {
		t.Errorf("upstream calls: %d, want %d (budget.daily_requests)", got, dailyRequests)
	}
}

func reloadImage(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, 64, 16))); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// LostCeilings names each money key the running config set and the next
// leaves out, and nothing else.
func TestLostCeilings(t *testing.T) {
	const plans = "[plans.free]\nmonthly_quota = 10\ndaily_attempts = 4\n[plans.pro]\nmonthly_quota = 100\n"
	running := "[budget]\ndaily_requests = 100\ndaily_usd = 2.5\n" + plans
	tests := []struct {
		name string
		next string
		env  map[string]string
		want []string
	}{
		{"same file", running, nil, nil},
		{"values changed, none left out", "[budget]\ndaily_requests = 900\ndaily_usd = 1\n" + plans, nil, nil},
		{"[budget] left out", plans, nil, []string{"budget.daily_requests", "budget.daily_usd"}},
		{"one budget key left out", "[budget]\ndaily_usd = 2.5\n" + plans, nil, []string{"budget.daily_requests"}},
		{"set from the environment instead", "[budget]\ndaily_usd = 2.5\n" + plans, map[string]string{"BREAKWATER_BUDGET__DAILY_REQUESTS": "100"}, nil},
		{"a plan's daily line left out", "[budget]\ndaily_requests = 100\ndaily_usd = 2.5\n[plans.free]\nmonthly_quota = 10\n[plans.pro]\nmonthly_quota = 100\n", nil,
			[]string{"plans.free.daily_attempts"}},
		{"a plan removed whole: its users are refused", "[budget]\ndaily_requests = 100\ndaily_usd = 2.5\n[plans.pro]\nmonthly_quota = 100\n", nil, nil},
		{"a key added", running + "[limits.user]\nrate = 5\n", nil, nil},
		// A 0 switches a ceiling off: "daily_usd = 2.5" cut after its 2
		// lowers it, after a 0 ("0.5") removes it.
		{"a ceiling switched off", "[budget]\ndaily_requests = 0\ndaily_usd = 2.5\n" + plans, nil, []string{"budget.daily_requests = 0"}},
		{"a default ceiling switched off", "[budget]\ndaily_requests = 100\ndaily_usd = 2.5\nmonthly_usd = 0\n" + plans, nil, []string{"budget.monthly_usd = 0"}},
		{"a plan's daily line switched off", "[budget]\ndaily_requests = 100\ndaily_usd = 2.5\n[plans.free]\nmonthly_quota = 10\ndaily_attempts = 0\n[plans.pro]\nmonthly_quota = 100\n", nil,
			[]string{"plans.free.daily_attempts = 0"}},
	}
	cur, err := Load(writeConfig(t, running), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, err := Load(writeConfig(t, tt.next), env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if got := LostCeilings(cur, next); !slices.Equal(got, tt.want) {
				t.Errorf("LostCeilings = %q, want %q", got, tt.want)
			}
		})
	}
	// The prices apply live: each call is counted against the budget at
	// them.
	priced, err := Load(writeConfig(t, running+"[ocr.price]\ninput_usd_per_million = 30\noutput_usd_per_million = 250\nmax_output_tokens = 512\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ocr.price.input_usd_per_million", "ocr.price.output_usd_per_million"} // not the output cap, which needs a restart
	if got := LostCeilings(priced, cur); !slices.Equal(got, want) {
		t.Errorf("[ocr.price] left out: LostCeilings = %q, want %q", got, want)
	}
}

// A reload that loses a money key is refused whole and the running
// config kept; SIGHUP goes through Reload too.
func TestReloadRefusesALostCeiling(t *testing.T) {
	e := startRoutes(t, "http://127.0.0.1:1", "[budget]\ndaily_requests = 7\n")
	next, err := Load(writeConfig(t, "[server]\nlisten = \"127.0.0.1:0\"\n[limits.user]\nrate = 3\n"+minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = e.app.Reload(next, "test")
	if !errors.Is(err, ErrCeilingLost) || !strings.Contains(err.Error(), "budget.daily_requests") {
		t.Fatalf("Reload = %v, want ErrCeilingLost naming budget.daily_requests", err)
	}
	e.app.mu.Lock()
	got := e.app.cfg
	e.app.mu.Unlock()
	if got.Budget.DailyRequests != 7 || got.Limits.User.Rate == 3 {
		t.Errorf("the running config changed: daily_requests %d, rate %d", got.Budget.DailyRequests, got.Limits.User.Rate)
	}
	if !strings.Contains(e.logText(), "config reload refused") {
		t.Errorf("the refusal was not logged:\n%s", e.logText())
	}
}

// settled reads a file once it stays the same for the quiet period, and
// gives up on one that keeps changing.
func TestSettledWaitsForTheFileToStopChanging(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("a = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := settled(context.Background(), path, time.Millisecond, time.Second)
	if err != nil || string(got) != "a = 1\n" {
		t.Errorf("settled = %q, %v", got, err)
	}

	// Looks that differ in one of size, mtime or content, then agree.
	mtime := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	looks := []fileLook{
		{size: 5, mtime: mtime, sum: [32]byte{1}, data: []byte("a = 1")},
		{size: 6, mtime: mtime, sum: [32]byte{1}, data: []byte("a = 12")},
		{size: 6, mtime: mtime.Add(time.Nanosecond), sum: [32]byte{1}, data: []byte("a = 12")},
		{size: 6, mtime: mtime.Add(time.Nanosecond), sum: [32]byte{2}, data: []byte("a = 13")},
		{size: 6, mtime: mtime.Add(time.Nanosecond), sum: [32]byte{2}, data: []byte("a = 13")},
	}
	n := 0
	look := func() (fileLook, error) {
		l := looks[min(n, len(looks)-1)]
		n++
		return l, nil
	}
	got, err = settle(context.Background(), path, look, time.Millisecond, time.Second)
	if err != nil || string(got) != "a = 13" || n != len(looks) {
		t.Errorf("settle = %q, %v after %d looks; want \"a = 13\" after %d", got, err, n, len(looks))
	}

	// A file that changes at every look is refused once bound is spent.
	n = 0
	changing := func() (fileLook, error) {
		n++
		return fileLook{size: int64(n), mtime: mtime, data: []byte("x")}, nil
	}
	_, err = settle(context.Background(), path, changing, time.Millisecond, 10*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "still changing after 10ms") || n != 11 {
		t.Errorf("settle on a file that keeps changing: %v after %d looks, want a refusal after 11", err, n)
	}
}

// A config saved in two writes, the first valid TOML, must not run on a
// lower money ceiling in between, however the file was cut: before its
// [ocr.price] (the default prices are a hundredth of the model's here,
// and every call is counted against daily_usd at them) or inside
// "daily_usd = 0.25" (a 0 switches the ceiling off). On the old code the
// half-written file was applied (prices and ceilings apply live) and 20 of
// 20 further reads passed the brake; now its reload is refused, naming
// the keys.
func TestReloadOfHalfWrittenFileKeepsTheMoneyCeilings(t *testing.T) {
	const price = "[ocr.price]\ninput_usd_per_million = 30.0\noutput_usd_per_million = 250.0\n"
	for _, tc := range []struct {
		name, first, rest, logged string
	}{
		{"cut before the prices", "[budget]\ndaily_usd = 0.25\nOCR", price, "ocr.price.input_usd_per_million ocr.price.output_usd_per_million"},
		{"cut inside daily_usd", "OCR" + price + "[budget]\ndaily_usd = 0", ".25\n", "budget.daily_usd = 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gemini, calls := countingGemini(t)
			dir := t.TempDir()
			path := filepath.Join(dir, "config.toml")
			ocr := fmt.Sprintf("[ocr]\nbase_url = %q\ndedupe_window = \"0s\"\n", gemini.URL)
			first := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n"+
				"[limits.user]\nrate = 100000\nburst = 100000\n[plans.free]\nmonthly_quota = 100000\ndaily_attempts = 100000\n",
				filepath.Join(dir, "bw.db")) + strings.Replace(tc.first, "OCR", ocr, 1)
			if err := os.WriteFile(path, []byte(first+tc.rest), 0o600); err != nil {
				t.Fatal(err)
			}
			logs, post := watchedApp(t, path)
			logText := func() string {
				logs.mu.Lock()
				defer logs.mu.Unlock()
				return logs.w.(*bytes.Buffer).String()
			}
			// At the model's price about $0.015 a call, each reserved at
			// its worst case: daily_usd is spent within a few dozen calls.
			paid := 0
			for post() == http.StatusOK {
				if paid++; paid > 50 {
					t.Fatalf("more than 50 reads within daily_usd 0.25 at the model's price")
				}
			}
			if paid == 0 {
				t.Fatal("no read passed")
			}

			if err := os.WriteFile(path, []byte(first), 0o600); err != nil { // the save's first write
				t.Fatal(err)
			}
			reacted := regexp.MustCompile(`config reload(ed| refused)`)
			start := time.Now()
			for !reacted.MatchString(logText()) {
				if time.Since(start) > 15*time.Second {
					t.Fatalf("the half-written file was not looked at:\n%s", logText())
				}
				time.Sleep(20 * time.Millisecond)
			}
			// At the model's price, 20 more reads would spend about $0.30
			// beyond the $0.25 a day.
			more := 0
			for range 20 {
				if post() == http.StatusOK {
					more++
				}
			}
			if more > 0 {
				t.Errorf("after the half-written save %d reads passed daily_usd", more)
			}
			if !regexp.MustCompile(`config reload refused.*` + regexp.QuoteMeta(tc.logged)).MatchString(logText()) {
				t.Errorf("the log does not name %s:\n%s", tc.logged, logText())
			}
			if got := calls.Load(); got != int64(paid) {
				t.Errorf("upstream calls: %d, want the %d that daily_usd paid for", got, paid)
			}
		})
	}
}

// watchedApp opens an App on the config at path, with its file watched as
// serve does, and a key for user ada: post sends one read with it and
// returns the status; logs holds what the App logged.
func watchedApp(t *testing.T, path string) (logs *lockedWriter, post func() int) {
	t.Helper()
	getenv := env(map[string]string{"GEMINI_API_KEY": "test-key"})
	cfg, err := Load(path, getenv)
	if err != nil {
		t.Fatal(err)
	}
	logs = &lockedWriter{w: &bytes.Buffer{}}
	a, err := Open(context.Background(), cfg, Options{Getenv: getenv, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a.Watch(ctx, path)
	key, _, err := a.Keys().Create("ada", "")
	if err != nil {
		t.Fatal(err)
	}
	img := reloadImage(t)
	post = func() int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/v1/ocr", bytes.NewReader(img))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "image/png")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	return logs, post
}
