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
	box         *outbox[Notice]
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
	w := &Webhook{cfg: cfg, url: rawURL, secret: secret, o: o}
	w.box = newOutbox(outboxSpec[Notice]{
		send: func(n Notice) error { _, err := w.SendNow(context.Background(), n); return err },
		size: o.QueueSize, attempts: o.Attempts, base: o.RetryBase, max: o.RetryMax,
		log:   o.Logger.With("component", "webhook", "format", cfg.Format, "url_env", cfg.URLEnv),
		attrs: func(n Notice) []any { return []any{"kind", n.Kind} },
		text: outboxText{
			dropped:  "webhook notice dropped: the queue is full or closed",
			sent:     "webhook delivered",
			retry:    "webhook not delivered: will retry",
			givenUp:  "webhook notice given up",
			shutdown: "webhook notice given up at shutdown",
		},
		sent: &o.Counters.WebhooksSent, failed: &o.Counters.WebhookFailures,
		dropped: &o.Counters.WebhookDropped, givenUp: &o.Counters.WebhookDropped,
	})
	return w, nil
}

// Name says which webhook this is, without its URL (a secret).
func (w *Webhook) Name() string { return fmt.Sprintf("webhook %s ($%s)", w.cfg.Format, w.cfg.URLEnv) }

// Notify queues n without waiting; false means it was dropped and counted.
func (w *Webhook) Notify(n Notice) bool { return w.box.Push(n) }

// Close stops taking notices, cuts retry waits short and tries each
// queued notice once more, until ctx ends.
func (w *Webhook) Close(ctx context.Context) error { return w.box.Close(ctx) }

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
