package detect

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	gomail "github.com/wneessen/go-mail"
)

// Defaults for MailerOptions.
const (
	DefaultMailQueue    = 64
	DefaultMailAttempts = 8
	DefaultRetryBase    = 5 * time.Second
	DefaultRetryMax     = 5 * time.Minute
	DefaultMailTimeout  = 30 * time.Second
)

// subjectPrefix starts every subject; the rest is fixed text of ours.
const subjectPrefix = "[breakwater] "

// MailerOptions are the Mailer's optional parts. Zero fields mean the
// defaults.
type MailerOptions struct {
	Password  string // BREAKWATER_SMTP_PASSWORD
	QueueSize int
	// Attempts is how many times one message is tried before it is given
	// up; between tries the wait doubles from RetryBase up to RetryMax.
	Attempts  int
	RetryBase time.Duration
	RetryMax  time.Duration
	Timeout   time.Duration // one delivery attempt, connection included
	// RootCAs are the authorities the mail server's certificate must chain
	// to; nil: the system roots. The certificate is always verified, for
	// the configured smtp_host.
	RootCAs  *x509.CertPool
	Counters *Counters
	Logger   *slog.Logger
}

// Mailer delivers plain-text e-mails from a bounded queue on a goroutine
// of its own, retrying with backoff. Send never waits.
//
// Headers come only from config (From, To) and from fixed text (the
// subject is "[breakwater] " and a phrase of this package); text that
// users control goes only in the body, escaped by the caller.
type Mailer struct {
	cfg AlertsConfig
	o   MailerOptions
	box *outbox[message]
}

type message struct{ subject, body string }

var _ Sender = (*Mailer)(nil)

// NewMailer starts a Mailer for cfg (defaults applied).
func NewMailer(cfg AlertsConfig, o MailerOptions) (*Mailer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.MailOn() {
		return nil, errors.New("alerts.smtp_host: required for mail")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultMailTimeout
	}
	if o.Counters == nil {
		o.Counters = &Counters{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m := &Mailer{cfg: cfg, o: o}
	m.box = newOutbox(outboxSpec[message]{
		send: func(msg message) error { _, err := m.sendOnce(msg); return err },
		size: o.QueueSize, attempts: o.Attempts, base: o.RetryBase, max: o.RetryMax,
		log:   o.Logger.With("component", "mail"),
		attrs: func(msg message) []any { return []any{"subject", msg.subject} },
		text: outboxText{
			dropped:  "e-mail dropped: the mail queue is full or closed",
			sent:     "e-mail sent",
			retry:    "e-mail not sent: will retry",
			givenUp:  "e-mail given up",
			shutdown: "e-mail given up at shutdown",
		},
		sent: &o.Counters.AlertsSent, failed: &o.Counters.AlertFailures, dropped: &o.Counters.AlertFailures,
	})
	return m, nil
}

// Send queues a message without waiting; false means it was dropped (a
// full queue or a closed Mailer) and counted.
func (m *Mailer) Send(subject, body string) bool {
	return m.box.Push(message{subject: subject, body: body})
}

// Close stops taking messages, cuts retry waits short and tries each
// queued message once more, until ctx ends.
func (m *Mailer) Close(ctx context.Context) error { return m.box.Close(ctx) }

// SendNow sends one message at once over a new connection, past the
// queue and without retries, and returns what the SMTP server answered to
// it ("250 2.0.0 Ok: queued as ..."); its error holds the server's
// refusal. For breakwater alerts test, whose operator is waiting.
func (m *Mailer) SendNow(subject, body string) (reply string, err error) {
	return m.sendOnce(message{subject: subject, body: body})
}

// sendOnce makes one delivery attempt over a new connection, and returns
// the server's answer to the message.
func (m *Mailer) sendOnce(msg message) (string, error) {
	// 8bit: the body is sent as written, UTF-8, so that it reads cleanly
	// in a terminal mail reader (quoted-printable, go-mail's default,
	// shows "=3D" and soft line breaks there). Bodies are short lines.
	mm := gomail.NewMsg(gomail.WithEncoding(gomail.NoEncoding))
	if err := mm.From(m.cfg.From); err != nil {
		return "", fmt.Errorf("from: %w", err)
	}
	if err := mm.To(m.cfg.To...); err != nil {
		return "", fmt.Errorf("to: %w", err)
	}
	mm.Subject(subjectPrefix + Escape(msg.subject))
	mm.SetDate()
	mm.SetMessageID()
	mm.SetBodyString(gomail.TypeTextPlain, foldLong(msg.body))

	opts := []gomail.Option{
		gomail.WithPort(m.cfg.SMTPPort), gomail.WithTimeout(m.o.Timeout),
		gomail.WithTLSConfig(&tls.Config{ServerName: m.cfg.SMTPHost, RootCAs: m.o.RootCAs, MinVersion: tls.VersionTLS12}),
	}
	switch m.cfg.TLS {
	case "tls":
		opts = append(opts, gomail.WithSSL(), gomail.WithTLSPolicy(gomail.TLSMandatory))
	case "none":
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS))
	default:
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSMandatory))
	}
	if m.cfg.SMTPUsername != "" {
		opts = append(opts, gomail.WithSMTPAuth(gomail.SMTPAuthAutoDiscover),
			gomail.WithUsername(m.cfg.SMTPUsername), gomail.WithPassword(m.o.Password))
	}
	c, err := gomail.NewClient(m.cfg.SMTPHost, opts...)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.o.Timeout)
	defer cancel()
	if err := c.DialAndSendWithContext(ctx, mm); err != nil {
		return "", errors.New(Escape(err.Error()))
	}
	return Escape(mm.ServerResponse()), nil
}

// maxLine is the most bytes foldLong leaves on one line of a body sent
// 8bit; a mail line may hold 998 (RFC 5322).
const maxLine = 900

// foldLong breaks every line longer than maxLine bytes, at a character
// boundary, so that an 8bit body stays within the mail line limit
// whatever a detail holds.
func foldLong(body string) string {
	lines := strings.Split(body, "\n")
	for i, line := range lines {
		var b strings.Builder
		for len(line) > maxLine {
			cut := maxLine
			for cut > 0 && !utf8.RuneStart(line[cut]) {
				cut--
			}
			b.WriteString(line[:cut] + "\n")
			line = line[cut:]
		}
		b.WriteString(line)
		lines[i] = b.String()
	}
	return strings.Join(lines, "\n")
}
