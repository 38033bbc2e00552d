package detect

import (
	"context"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"breakwater/detect/smtptest"
)

// Tests of delivery over STARTTLS and implicit TLS with a login, against
// smtptest on 127.0.0.1 with a certificate made for the test.

const (
	tlsUser     = "alerts@example.com"
	tlsPassword = "correct horse"
	tlsAttempts = 3
)

// tlsMailer is a Mailer to srv with fast retries and tlsAttempts tries
// per message, logging into a buffer that logs() reads.
type tlsMailer struct {
	*Mailer
	counters *Counters
	mu       sync.Mutex
	buf      strings.Builder
}

func (m *tlsMailer) logs() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.buf.String()
}

func newTLSMailer(t *testing.T, srv *smtptest.Server, mode, user, password string, roots *x509.CertPool) *tlsMailer {
	t.Helper()
	host, port := splitAddr(t, srv.Addr)
	m := &tlsMailer{counters: &Counters{}}
	var err error
	m.Mailer, err = NewMailer(AlertsConfig{
		SMTPHost: host, SMTPPort: port, SMTPUsername: user, TLS: mode,
		From: "breakwater@example.com", To: []string{"ops@example.com"},
	}, MailerOptions{
		Password: password, RootCAs: roots, Counters: m.counters, Logger: newTestLogger(&m.buf, &m.mu),
		RetryBase: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond, Attempts: tlsAttempts, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.Close(ctx)
	})
	return m
}

// waitGivenUp waits until the mailer has given a message up, and checks
// that every attempt was counted as a failure and none as sent.
func (m *tlsMailer) waitGivenUp(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(m.logs(), "e-mail given up"); {
		if m.counters.AlertsSent.Load() != 0 {
			t.Fatalf("message delivered; logs:\n%s", m.logs())
		}
		if time.Now().After(deadline) {
			t.Fatalf("message not given up within 10s; logs:\n%s", m.logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := m.counters.AlertFailures.Load(), uint64(tlsAttempts); got != want {
		t.Errorf("failures counted %d, want %d", got, want)
	}
	if got := m.counters.AlertsSent.Load(); got != 0 {
		t.Errorf("sent counted %d, want 0", got)
	}
}

func TestMailDeliveredOverTLSWithLogin(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode string // alerts.tls
		srv  smtptest.TLSMode
		mech string // the only AUTH mechanism offered; "" for PLAIN and LOGIN
	}{
		{"starttls", "starttls", smtptest.StartTLS, ""},
		{"starttls login only", "starttls", smtptest.StartTLS, "LOGIN"},
		{"implicit tls", "tls", smtptest.ImplicitTLS, ""},
		{"implicit tls login only", "tls", smtptest.ImplicitTLS, "LOGIN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := smtptest.Options{TLS: tc.srv, Username: tlsUser, Password: tlsPassword}
			if tc.mech != "" {
				o.Mechanisms = []string{tc.mech}
			}
			srv := smtptest.StartWith(t, "127.0.0.1:0", o)
			m := newTLSMailer(t, srv, tc.mode, tlsUser, tlsPassword, srv.RootCAs)
			if !m.Send("alert: brake engaged", "the brake refused 3 calls") {
				t.Fatal("dropped")
			}
			msg := srv.WaitFor(t, 1, 10*time.Second)[0]
			if !msg.TLS || msg.User != tlsUser {
				t.Errorf("came with TLS %v as %q, want TLS as %q", msg.TLS, msg.User, tlsUser)
			}
			if msg.From != "breakwater@example.com" || len(msg.To) != 1 || msg.To[0] != "ops@example.com" {
				t.Errorf("envelope from %q to %v", msg.From, msg.To)
			}
			h := msg.Headers()
			for _, want := range []string{
				"From: <breakwater@example.com>",
				"To: <ops@example.com>",
				"Subject: [breakwater] alert: brake engaged",
			} {
				if !strings.Contains(h, want) {
					t.Errorf("no %q in the headers:\n%s", want, h)
				}
			}
			if _, body, _ := strings.Cut(msg.Data, "\r\n\r\n"); !strings.Contains(body, "the brake refused 3 calls") {
				t.Errorf("body %q", body)
			}
			waitSent(t, m.counters, 1)
			if got := m.counters.AlertFailures.Load(); got != 0 {
				t.Errorf("failures counted %d, want 0; logs:\n%s", got, m.logs())
			}
		})
	}
}

func TestMailNotSentInClearWhenStartTLSIsMissing(t *testing.T) {
	// The server offers no STARTTLS but takes MAIL (and AUTH, when it has
	// a login) in plain text: with alerts.tls = "starttls" the mailer must
	// use neither.
	for _, tc := range []struct {
		name string
		user string
	}{
		{"with login", tlsUser},
		{"without login", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.NoTLS, Username: tc.user, Password: tlsPassword})
			m := newTLSMailer(t, srv, "starttls", tc.user, tlsPassword, nil)
			if !m.Send("alert: brake engaged", "body") {
				t.Fatal("dropped")
			}
			m.waitGivenUp(t)
			if !strings.Contains(m.logs(), "STARTTLS") {
				t.Errorf("the error does not name STARTTLS:\n%s", m.logs())
			}
			c := srv.Counts()
			if c.Sessions != tlsAttempts {
				t.Errorf("%d sessions, want one per attempt (%d)", c.Sessions, tlsAttempts)
			}
			if c.AuthOK+c.AuthFailed != 0 || c.Mail != 0 || len(srv.Messages()) != 0 {
				t.Errorf("sent in clear text: %+v, %d messages", c, len(srv.Messages()))
			}
		})
	}
}

func TestMailWrongPasswordNotDelivered(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode string
		srv  smtptest.TLSMode
	}{
		{"starttls", "starttls", smtptest.StartTLS},
		{"implicit tls", "tls", smtptest.ImplicitTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: tc.srv, Username: tlsUser, Password: tlsPassword})
			m := newTLSMailer(t, srv, tc.mode, tlsUser, "wrong horse", srv.RootCAs)
			if !m.Send("alert: brake engaged", "body") {
				t.Fatal("dropped")
			}
			m.waitGivenUp(t)
			if !strings.Contains(m.logs(), "535") {
				t.Errorf("the error does not carry the server's 535:\n%s", m.logs())
			}
			if strings.Contains(m.logs(), "wrong horse") {
				t.Errorf("the password reached the log:\n%s", m.logs())
			}
			c := srv.Counts()
			if c.AuthFailed != tlsAttempts || c.AuthOK != 0 || c.Mail != 0 || len(srv.Messages()) != 0 {
				t.Errorf("counts %+v and %d messages, want %d refused logins and nothing else", c, len(srv.Messages()), tlsAttempts)
			}
		})
	}
}

func TestMailUntrustedCertificateNotDelivered(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  string
		srv   smtptest.TLSMode
		roots func(other *smtptest.Server) *x509.CertPool
	}{
		{"starttls system roots", "starttls", smtptest.StartTLS, func(*smtptest.Server) *x509.CertPool { return nil }},
		{"implicit tls system roots", "tls", smtptest.ImplicitTLS, func(*smtptest.Server) *x509.CertPool { return nil }},
		{"implicit tls another server's certificate", "tls", smtptest.ImplicitTLS, func(o *smtptest.Server) *x509.CertPool { return o.RootCAs }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: tc.srv, Username: tlsUser, Password: tlsPassword})
			other := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.ImplicitTLS})
			m := newTLSMailer(t, srv, tc.mode, tlsUser, tlsPassword, tc.roots(other))
			if !m.Send("alert: brake engaged", "body") {
				t.Fatal("dropped")
			}
			m.waitGivenUp(t)
			if !strings.Contains(m.logs(), "certificate") {
				t.Errorf("the error does not name the certificate:\n%s", m.logs())
			}
			c := srv.Counts()
			if c.AuthOK+c.AuthFailed != 0 || c.Mail != 0 || len(srv.Messages()) != 0 {
				t.Errorf("counts %+v and %d messages, want no login and no mail", c, len(srv.Messages()))
			}
		})
	}
}

func TestFoldLong(t *testing.T) {
	long := strings.Repeat("é", 1000) // 2000 bytes
	for _, tc := range []struct{ name, in string }{
		{"short", "a\nb\n"},
		{"long", "x\n" + long + "\ny"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := foldLong(tc.in)
			for _, line := range strings.Split(got, "\n") {
				if len(line) > maxLine || !utf8.ValidString(line) {
					t.Errorf("line of %d bytes (valid UTF-8: %v)", len(line), utf8.ValidString(line))
				}
			}
			if strings.ReplaceAll(got, "\n", "") != strings.ReplaceAll(tc.in, "\n", "") {
				t.Error("folding changed the text")
			}
		})
	}
}
