package detect

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// SignatureHeader carries "sha256=" and the hex HMAC-SHA256 of a webhook's
// body under its secret_env secret.
const SignatureHeader = "X-Breakwater-Signature"

// DefaultWebhookTimeout bounds one delivery attempt of a webhook.
const DefaultWebhookTimeout = 10 * time.Second

// WebhookOptions are a Webhook's optional parts. Zero fields mean the
// defaults of the Mailer (DefaultMailQueue, DefaultMailAttempts,
// DefaultRetryBase, DefaultRetryMax) and DefaultWebhookTimeout.
type WebhookOptions struct {
	QueueSize int
	Attempts  int
	RetryBase time.Duration
	RetryMax  time.Duration
	Timeout   time.Duration
	Client    *http.Client // default: one of its own, no redirects
	Counters  *Counters
	Logger    *slog.Logger
}

// Webhook delivers notices to one URL in one format, from a bounded queue
// on a goroutine of its own, retrying with doubling waits. Notify never
// waits: a full queue drops the notice and counts it.
type Webhook struct {
	cfg         WebhookConfig
	url, secret string
	o           WebhookOptions
	log         *slog.Logger
	queue       *queue[Notice]
	stop        chan struct{}
	done        chan struct{}
	once        sync.Once
}

var _ Notifier = (*Webhook)(nil)

// NewWebhook starts a Webhook for cfg, posting to rawURL (the value of
// url_env) and signing with secret (of secret_env; empty: unsigned).
func NewWebhook(cfg WebhookConfig, rawURL, secret string, o WebhookOptions) (*Webhook, error) {
	if err := errors.Join(cfg.validate(0)...); err != nil {
		return nil, err
	}
	if u, err := url.Parse(rawURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("alerts.webhook: %s does not hold an http or https URL", cfg.URLEnv)
	}
	if cfg.SecretEnv != "" && secret == "" {
		return nil, fmt.Errorf("alerts.webhook: %s is empty", cfg.SecretEnv)
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultMailQueue
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultMailAttempts
	}
	if o.RetryBase <= 0 {
		o.RetryBase = DefaultRetryBase
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultWebhookTimeout
	}
	if o.Client == nil {
		o.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if o.Counters == nil {
		o.Counters = &Counters{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Webhook{
		cfg: cfg, url: rawURL, secret: secret, o: o,
		log:   o.Logger.With("component", "webhook", "format", cfg.Format, "url_env", cfg.URLEnv),
		queue: newQueue[Notice](o.QueueSize), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go w.loop()
	return w, nil
}

// Name says which webhook this is, without its URL (a secret).
func (w *Webhook) Name() string { return fmt.Sprintf("webhook %s ($%s)", w.cfg.Format, w.cfg.URLEnv) }

// Notify queues n without waiting; false means it was dropped and counted.
func (w *Webhook) Notify(n Notice) bool {
	if w.queue.Push(n) {
		return true
	}
	w.o.Counters.WebhookDropped.Add(1)
	w.log.Error("webhook notice dropped: the queue is full or closed", "kind", n.Kind)
	return false
}

// Close stops taking notices, cuts retry waits short and tries each
// queued notice once more, until ctx ends.
func (w *Webhook) Close(ctx context.Context) error {
	w.once.Do(func() {
		w.queue.Close()
		close(w.stop)
	})
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *Webhook) loop() {
	defer close(w.done)
	for n := range w.queue.Items() {
		w.deliver(n)
	}
}

// errPermanent marks an answer that a retry cannot change (a 4xx other
// than 408 and 429).
var errPermanent = errors.New("refused")

// deliver tries n until it is taken, refused for good, its attempts are
// used up, or the Webhook stops.
func (w *Webhook) deliver(n Notice) {
	wait := w.o.RetryBase
	for attempt := 1; ; attempt++ {
		_, err := w.SendNow(context.Background(), n)
		if err == nil {
			w.o.Counters.WebhooksSent.Add(1)
			w.log.Info("webhook delivered", "kind", n.Kind, "attempt", attempt)
			return
		}
		w.o.Counters.WebhookFailures.Add(1)
		if attempt >= w.o.Attempts || errors.Is(err, errPermanent) {
			w.o.Counters.WebhookDropped.Add(1)
			w.log.Error("webhook notice given up", "kind", n.Kind, "attempts", attempt, "err", err)
			return
		}
		w.log.Warn("webhook not delivered: will retry", "kind", n.Kind, "attempt", attempt, "retry_in", wait, "err", err)
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-w.stop:
			timer.Stop()
			if _, err := w.SendNow(context.Background(), n); err == nil {
				w.o.Counters.WebhooksSent.Add(1)
			} else {
				w.o.Counters.WebhookFailures.Add(1)
				w.o.Counters.WebhookDropped.Add(1)
				w.log.Error("webhook notice given up at shutdown", "kind", n.Kind, "err", err)
			}
			return
		}
		wait = min(wait*2, w.o.RetryMax)
	}
}

// SendNow posts n once, past the queue and without retries, and returns
// the receiver's answer ("200 OK: ok"); a status other than 2xx is an
// error holding it. For breakwater alerts test, whose operator waits.
func (w *Webhook) SendNow(ctx context.Context, n Notice) (string, error) {
	body, header, err := WebhookBody(w.cfg.Format, n)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, w.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", "breakwater-alerts")
	if w.secret != "" {
		req.Header.Set(SignatureHeader, Sign(w.secret, body))
	}
	resp, err := w.o.Client.Do(req)
	if err != nil {
		// The URL is a secret: say what failed without it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("post to $%s: %s", w.cfg.URLEnv, Escape(strings.ReplaceAll(err.Error(), w.url, "$"+w.cfg.URLEnv)))
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	reply := Escape(strings.TrimSpace(resp.Status + ": " + strings.TrimSpace(string(answer))))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		return reply, nil
	case resp.StatusCode >= 400 && resp.StatusCode <= 499 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return "", fmt.Errorf("%w: %s", errPermanent, reply)
	}
	return "", errors.New(reply)
}

// Sign is the value of SignatureHeader for body under secret:
// "sha256=" and the hex HMAC-SHA256.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// JSONNotice is the body of a "json" webhook.
type JSONNotice struct {
	Kind      string            `json:"kind"`
	Severity  string            `json:"severity"`
	Summary   string            `json:"summary"`
	Details   map[string]string `json:"details"`
	Time      string            `json:"time"` // RFC 3339, UTC
	Dashboard string            `json:"dashboard,omitempty"`
	Text      string            `json:"text"` // the mail's body
}

// ntfyPriority maps a severity to ntfy's Priority header.
var ntfyPriority = map[string]string{SeverityCritical: "urgent", SeverityWarning: "high", SeverityInfo: "default"}

// WebhookBody is the body and the headers a webhook of format posts for n.
func WebhookBody(format string, n Notice) ([]byte, http.Header, error) {
	h := http.Header{}
	switch format {
	case FormatSlack:
		h.Set("Content-Type", "application/json")
		b, err := json.Marshal(map[string]string{"text": slackEscape(fmt.Sprintf("[breakwater] %s: %s\n\n%s", n.Severity, n.Subject, n.Text))})
		return b, h, err
	case FormatNtfy:
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Title", "[breakwater] "+n.Subject) // fixed text: the kind matched kindPattern
		h.Set("Priority", ntfyPriority[n.Severity])
		h.Set("Tags", n.Severity)
		if n.Dashboard != "" {
			h.Set("Click", n.Dashboard)
		}
		return []byte(n.Text), h, nil
	case FormatJSON:
		h.Set("Content-Type", "application/json")
		b, err := json.Marshal(JSONNotice{
			Kind: n.Kind, Severity: n.Severity, Summary: n.Summary, Details: n.Details,
			Time: n.Time.UTC().Format(time.RFC3339), Dashboard: n.Dashboard, Text: n.Text,
		})
		return b, h, err
	}
	return nil, nil, fmt.Errorf("alerts.webhook: unknown format %q", format)
}

// slackEscape escapes the three characters Slack's message text gives a
// meaning (<!channel>, <url|label>): values from users stay plain text.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
