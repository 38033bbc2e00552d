package smtptest_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"breakwater/detect/smtptest"
)

const body = "Subject: hi\r\n\r\nhello\r\n"

// dial connects a go-smtp client the way mode needs, trusting srv's
// certificate for 127.0.0.1.
func dial(t *testing.T, srv *smtptest.Server, mode smtptest.TLSMode) *smtp.Client {
	t.Helper()
	cfg := &tls.Config{RootCAs: srv.RootCAs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	var c *smtp.Client
	var err error
	switch mode {
	case smtptest.StartTLS:
		c, err = smtp.DialStartTLS(srv.Addr, cfg)
	case smtptest.ImplicitTLS:
		c, err = smtp.DialTLS(srv.Addr, cfg)
	default:
		c, err = smtp.Dial(srv.Addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	c.CommandTimeout = 5 * time.Second
	c.SubmissionTimeout = 5 * time.Second
	t.Cleanup(func() { c.Close() })
	return c
}

func smtpCode(err error) int {
	var e *smtp.SMTPError
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

func TestLoginOverTLS(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     smtptest.TLSMode
		mech     string
		sessions int // STARTTLS starts a second one
	}{
		{"starttls plain", smtptest.StartTLS, sasl.Plain, 2},
		{"starttls login", smtptest.StartTLS, sasl.Login, 2},
		{"implicit plain", smtptest.ImplicitTLS, sasl.Plain, 1},
		{"implicit login", smtptest.ImplicitTLS, sasl.Login, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: tc.mode, Username: "alerts", Password: "s3cret"})
			c := dial(t, srv, tc.mode)
			if !c.SupportsAuth(tc.mech) {
				t.Fatalf("%s not offered", tc.mech)
			}
			auth := sasl.NewPlainClient("", "alerts", "s3cret")
			if tc.mech == sasl.Login {
				auth = sasl.NewLoginClient("alerts", "s3cret")
			}
			if err := c.Auth(auth); err != nil {
				t.Fatal(err)
			}
			if err := c.SendMail("a@example.com", []string{"b@example.com"}, strings.NewReader(body)); err != nil {
				t.Fatal(err)
			}
			msgs := srv.Messages()
			if len(msgs) != 1 {
				t.Fatalf("%d messages, want 1", len(msgs))
			}
			if m := msgs[0]; !m.TLS || m.User != "alerts" || m.From != "a@example.com" || !strings.Contains(m.Data, "hello") {
				t.Errorf("message %+v", m)
			}
			if got, want := srv.Counts(), (smtptest.Counts{Sessions: tc.sessions, AuthOK: 1, Mail: 1}); got != want {
				t.Errorf("counts %+v, want %+v", got, want)
			}
		})
	}
}

func TestWrongLoginRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		auth sasl.Client
	}{
		{"plain wrong password", sasl.NewPlainClient("", "alerts", "guess")},
		{"plain wrong user", sasl.NewPlainClient("", "root", "s3cret")},
		{"plain acting for another", sasl.NewPlainClient("root", "alerts", "s3cret")},
		{"login wrong password", sasl.NewLoginClient("alerts", "guess")},
		{"login wrong user", sasl.NewLoginClient("root", "s3cret")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.ImplicitTLS, Username: "alerts", Password: "s3cret"})
			c := dial(t, srv, smtptest.ImplicitTLS)
			if err := c.Auth(tc.auth); smtpCode(err) != 535 {
				t.Fatalf("AUTH: %v, want a 535 refusal", err)
			}
			if err := c.Mail("a@example.com", nil); smtpCode(err) != 502 {
				t.Errorf("MAIL after a refused AUTH: %v, want a 502 refusal", err)
			}
			if got, want := srv.Counts(), (smtptest.Counts{Sessions: 1, AuthFailed: 1, Mail: 1}); got != want {
				t.Errorf("counts %+v, want %+v", got, want)
			}
			if n := len(srv.Messages()); n != 0 {
				t.Errorf("%d messages kept", n)
			}
		})
	}
}

func TestMailBeforeAuthRefused(t *testing.T) {
	srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.StartTLS, Username: "alerts", Password: "s3cret"})
	c := dial(t, srv, smtptest.StartTLS)
	err := c.SendMail("a@example.com", []string{"b@example.com"}, strings.NewReader(body))
	if smtpCode(err) != 502 {
		t.Fatalf("MAIL before AUTH: %v, want a 502 refusal", err)
	}
	if n := len(srv.Messages()); n != 0 {
		t.Errorf("%d messages kept", n)
	}
}

func TestAuthOfferedOnlyAfterStartTLS(t *testing.T) {
	srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.StartTLS, Username: "alerts", Password: "s3cret"})
	c := dial(t, srv, smtptest.NoTLS)
	if err := c.Hello("localhost"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Extension("STARTTLS"); !ok {
		t.Error("STARTTLS not offered")
	}
	if ok, _ := c.Extension("AUTH"); ok {
		t.Error("AUTH offered in plain text")
	}
}

func TestMechanismsLimitWhatIsOffered(t *testing.T) {
	srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.ImplicitTLS, Username: "alerts", Password: "s3cret", Mechanisms: []string{sasl.Login}})
	c := dial(t, srv, smtptest.ImplicitTLS)
	if !c.SupportsAuth(sasl.Login) || c.SupportsAuth(sasl.Plain) {
		t.Fatal("want LOGIN offered and PLAIN not")
	}
	if err := c.Auth(sasl.NewPlainClient("", "alerts", "s3cret")); err == nil {
		t.Error("PLAIN accepted though not offered")
	}
}

func TestCertificateNotTrustedWithoutRootCAs(t *testing.T) {
	srv := smtptest.StartWith(t, "127.0.0.1:0", smtptest.Options{TLS: smtptest.ImplicitTLS})
	_, err := smtp.DialTLS(srv.Addr, &tls.Config{ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("dial without the server's roots: %v, want an unknown-authority error", err)
	}
}
