package detect_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/detect"
)

// received is one request a test receiver took.
type received struct {
	header http.Header
	body   []byte
}

// receiver is a webhook endpoint on 127.0.0.1 that keeps what it is sent;
// it answers 500 to the first fail requests.
type receiver struct {
	srv  *httptest.Server
	fail atomic.Int64
	mu   sync.Mutex
	got  []received
	hits atomic.Int64
}

func startReceiver(t *testing.T, fail int64) *receiver {
	t.Helper()
	r := &receiver{}
	r.fail.Store(fail)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		body, _ := io.ReadAll(req.Body)
		if r.fail.Add(-1) >= 0 {
			http.Error(w, "try later", http.StatusInternalServerError)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, received{header: req.Header.Clone(), body: body})
		r.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) wait(t *testing.T, n int) []received {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		got := append([]received(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver got %d requests, want %d", len(got), n)
		}
	}
}

func newWebhook(t *testing.T, format, url, secret string, o detect.WebhookOptions) *detect.Webhook {
	t.Helper()
	cfg := detect.WebhookConfig{Format: format, URLEnv: "HOOK_URL"}
	if secret != "" {
		cfg.SecretEnv = "HOOK_SECRET"
	}
	w, err := detect.NewWebhook(cfg, url, secret, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(context.Background()) })
	return w
}

// testNotice is an alert as the Alerter hands it to its channels; its
// detail carries characters a receiver might interpret.
func testNotice() detect.Notice {
	st := detect.AlertState{Kind: detect.KindBrakeEngaged, SentAt: time.Date(2026, 3, 4, 15, 4, 5, 0, time.UTC),
		Summary: "the global budget brake is engaged"}
	return detect.NewNotice(st, map[string]string{"ceiling": "daily_usd", "user": "<!channel> & co"}, time.UTC, "https://ops.example/admin/dashboard")
}

func verify(t *testing.T, secret string, r received) {
	t.Helper()
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(r.body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if got := r.header.Get(detect.SignatureHeader); !hmac.Equal([]byte(got), []byte(want)) {
		t.Errorf("signature %q, want %q", got, want)
	}
}

func TestWebhookFormats(t *testing.T) {
	n := testNotice()
	t.Run("json", func(t *testing.T) {
		r := startReceiver(t, 0)
		w := newWebhook(t, detect.FormatJSON, r.srv.URL, "s3cret", detect.WebhookOptions{})
		w.Notify(n)
		got := r.wait(t, 1)[0]
		verify(t, "s3cret", got)
		if ct := got.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
		var body map[string]any
		if err := json.Unmarshal(got.body, &body); err != nil {
			t.Fatal(err)
		}
		for k, want := range map[string]string{
			"kind": "brake_engaged", "severity": "critical", "summary": "the global budget brake is engaged",
			"time": "2026-03-04T15:04:05Z", "dashboard": "https://ops.example/admin/dashboard",
		} {
			if got := body[k]; got != want {
				t.Errorf("%s = %v, want %q", k, got, want)
			}
		}
		details, _ := body["details"].(map[string]any)
		if details["ceiling"] != "daily_usd" || details["user"] != "<!channel> & co" {
			t.Errorf("details %v", details)
		}
		if text, _ := body["text"].(string); !strings.Contains(text, "What to do:") {
			t.Errorf("text %q lacks the actions", text)
		}
	})
	t.Run("slack", func(t *testing.T) {
		r := startReceiver(t, 0)
		w := newWebhook(t, detect.FormatSlack, r.srv.URL, "", detect.WebhookOptions{})
		w.Notify(n)
		got := r.wait(t, 1)[0]
		if sig := got.header.Get(detect.SignatureHeader); sig != "" {
			t.Errorf("unsigned webhook sent a signature %q", sig)
		}
		var body map[string]string
		if err := json.Unmarshal(got.body, &body); err != nil {
			t.Fatal(err)
		}
		if len(body) != 1 {
			t.Errorf("slack body has fields %v, want text only", body)
		}
		text := body["text"]
		for _, want := range []string{"[breakwater] critical: alert: brake engaged", "ceiling: daily_usd", "user: &lt;!channel&gt; &amp; co", "breakwater budget"} {
			if !strings.Contains(text, want) {
				t.Errorf("text lacks %q:\n%s", want, text)
			}
		}
		if strings.Contains(text, "<!channel>") {
			t.Errorf("a user's value reached Slack unescaped:\n%s", text)
		}
	})
	t.Run("ntfy", func(t *testing.T) {
		r := startReceiver(t, 0)
		w := newWebhook(t, detect.FormatNtfy, r.srv.URL, "k", detect.WebhookOptions{})
		w.Notify(n)
		got := r.wait(t, 1)[0]
		verify(t, "k", got)
		for k, want := range map[string]string{
			"Title": "[breakwater] alert: brake engaged", "Priority": "urgent", "Tags": "critical",
			"Click": "https://ops.example/admin/dashboard", "Content-Type": "text/plain; charset=utf-8",
		} {
			if got := got.header.Get(k); got != want {
				t.Errorf("header %s = %q, want %q", k, got, want)
			}
		}
		if string(got.body) != n.Text {
			t.Errorf("body %q, want the mail's text %q", got.body, n.Text)
		}
	})
}

func TestWebhookRetriesUntilTheReceiverRecovers(t *testing.T) {
	r := startReceiver(t, 5)
	counters := &detect.Counters{}
	w := newWebhook(t, detect.FormatJSON, r.srv.URL, "", detect.WebhookOptions{
		RetryBase: time.Millisecond, RetryMax: 4 * time.Millisecond, Counters: counters,
	})
	w.Notify(testNotice())
	got := r.wait(t, 1)
	// The receiver holds the body before the sender has read the answer
	// and counted it; Close waits for the sender to finish that.
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || r.hits.Load() != 6 {
		t.Errorf("%d delivered in %d requests, want 1 in 6", len(got), r.hits.Load())
	}
	if counters.WebhookFailures.Load() != 5 || counters.WebhooksSent.Load() != 1 || counters.WebhookDropped.Load() != 0 {
		t.Errorf("failures %d sent %d dropped %d, want 5, 1, 0", counters.WebhookFailures.Load(), counters.WebhooksSent.Load(), counters.WebhookDropped.Load())
	}
}

func TestWebhookGivesUpOnARefusal(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		http.Error(w, "no such hook", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	counters := &detect.Counters{}
	w := newWebhook(t, detect.FormatJSON, srv.URL, "", detect.WebhookOptions{RetryBase: time.Millisecond, Counters: counters})
	reply, err := w.SendNow(context.Background(), testNotice())
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("SendNow = %q, %v; want the 404 as an error", reply, err)
	}
	w.Notify(testNotice())
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if hits.Load() != 2 || counters.WebhookDropped.Load() != 1 {
		t.Errorf("%d requests, %d dropped; want 2 and 1 (a 404 is not retried)", hits.Load(), counters.WebhookDropped.Load())
	}
}

// TestWebhookNeverWaitsOnADeadReceiver: a receiver that takes the
// connection and never answers holds the webhook's goroutine, never the
// caller. Notify returns at once whatever the receiver does, and once the
// queue is full a notice is dropped and counted, not waited for.
func TestWebhookNeverWaitsOnADeadReceiver(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	t.Cleanup(srv.Close)
	counters := &detect.Counters{}
	w := newWebhook(t, detect.FormatJSON, srv.URL, "", detect.WebhookOptions{QueueSize: 4, Timeout: time.Minute, Counters: counters})
	n := testNotice()
	start := time.Now()
	queued := 0
	for range 100 {
		if w.Notify(n) {
			queued++
		}
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("100 notices to a dead receiver took %s", elapsed)
	}
	// One is held by the goroutine, four wait in the queue (the
	// goroutine may not have taken the first yet).
	if queued < 4 || queued > 5 || counters.WebhookDropped.Load() != uint64(100-queued) {
		t.Errorf("%d queued, %d dropped; want 4 or 5 queued and the rest dropped", queued, counters.WebhookDropped.Load())
	}
	close(release) // the receiver answers now: what is queued leaves
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWebhookConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  detect.AlertsConfig
		want string
	}{
		{"webhook without mail", detect.AlertsConfig{Webhooks: []detect.WebhookConfig{{Format: "slack", URLEnv: "SLACK_URL"}}}, ""},
		{"unknown format", detect.AlertsConfig{Webhooks: []detect.WebhookConfig{{Format: "teams", URLEnv: "X"}}}, "alerts.webhook[1].format"},
		{"bad env name", detect.AlertsConfig{Webhooks: []detect.WebhookConfig{{Format: "json", URLEnv: "https://hooks.example"}}}, "alerts.webhook[1].url_env"},
		{"mail keys without a host", detect.AlertsConfig{From: "a@example.com"}, "alerts.smtp_host"},
		{"share out of range", detect.AlertsConfig{WarnAt: []float64{1.5}}, "alerts.warn_at"},
		{"share not a whole percent", detect.AlertsConfig{WarnAt: []float64{0.555}}, "alerts.warn_at"},
		{"share twice", detect.AlertsConfig{WarnAt: []float64{0.5, 0.5}}, "listed twice"},
		{"warnings off", detect.AlertsConfig{WarnAt: []float64{}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if got := (detect.AlertsConfig{}).WithDefaults().WarnAt; len(got) != 3 || got[0] != 0.5 || got[2] != 0.95 {
		t.Errorf("warn_at left out = %v, want the default", got)
	}
	if got := (detect.AlertsConfig{WarnAt: []float64{}}).WithDefaults().WarnAt; len(got) != 0 {
		t.Errorf("warn_at = [] became %v, want it kept off", got)
	}
}

// A receiver that cannot be reached: the error names the variable, never
// the URL (a secret), even one with a login in it.
func TestWebhookErrorHidesTheURL(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	secretURL := strings.Replace(srv.URL, "http://", "http://user:pw@", 1) + "/T000/B000/XXXXsecretpath"
	srv.Close() // nothing listens there now
	w := newWebhook(t, detect.FormatSlack, secretURL, "", detect.WebhookOptions{Timeout: 5 * time.Second})
	_, err := w.SendNow(context.Background(), testNotice())
	if err == nil || !strings.Contains(err.Error(), "$HOOK_URL") {
		t.Fatalf("SendNow = %v, want an error naming $HOOK_URL", err)
	}
	if strings.Contains(err.Error(), "secretpath") || strings.Contains(err.Error(), "pw") {
		t.Errorf("the error shows the URL: %v", err)
	}
}
