// Package smtptest provides an SMTP server on 127.0.0.1 that keeps every
// message it receives, for tests of e-mail alerts. It can offer STARTTLS
// or speak TLS from the first byte, with a certificate made at start, and
// can require a login. Only tests import it; it delivers nothing.
package smtptest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Message is one message as received.
type Message struct {
	From string
	To   []string
	Data string // headers and body, CRLF line ends
	TLS  bool   // it came over TLS (STARTTLS or implicit)
	User string // the login it came under; empty without AUTH
}

// Headers returns the message's header block (before the first empty
// line).
func (m Message) Headers() string {
	h, _, _ := strings.Cut(m.Data, "\r\n\r\n")
	return h
}

// TLSMode is how a Server offers TLS.
type TLSMode int

// TLS modes for Options.TLS.
const (
	NoTLS       TLSMode = iota // plain text only, no STARTTLS
	StartTLS                   // plain text, STARTTLS offered
	ImplicitTLS                // TLS from the first byte
)

// Options configure StartWith. The zero Options is the server of Start:
// plain text, no login.
type Options struct {
	TLS TLSMode
	// Username and Password, when Username is not empty, are the only
	// login accepted, and MAIL is refused before a successful AUTH. AUTH
	// is offered only over TLS, unless TLS is NoTLS.
	Username, Password string
	// Mechanisms are the AUTH mechanisms offered, among "PLAIN" and
	// "LOGIN". Default both.
	Mechanisms []string
}

// Counts are what a Server saw besides the messages it kept.
type Counts struct {
	Sessions   int // EHLO or HELO greetings; a STARTTLS upgrade starts another
	AuthOK     int // successful AUTH exchanges
	AuthFailed int // refused AUTH exchanges
	Mail       int // MAIL commands, accepted or refused
}

// Server is a running SMTP sink.
type Server struct {
	Addr string // host:port
	// RootCAs holds the server's self-signed certificate, for clients to
	// trust; nil when the server has no TLS.
	RootCAs *x509.CertPool
	// Certificate is the server's certificate, valid for 127.0.0.1, ::1
	// and localhost; nil when the server has no TLS.
	Certificate *x509.Certificate

	o   Options
	srv *smtp.Server

	mu     sync.Mutex
	msgs   []Message
	counts Counts
}

// Start runs a plain-text server without login on addr ("127.0.0.1:0" for
// any port) until the test ends.
func Start(tb testing.TB, addr string) *Server {
	tb.Helper()
	return StartWith(tb, addr, Options{})
}

// StartWith runs a server on addr configured by o until the test ends.
func StartWith(tb testing.TB, addr string, o Options) *Server {
	tb.Helper()
	if len(o.Mechanisms) == 0 {
		o.Mechanisms = []string{sasl.Plain, sasl.Login}
	}
	for _, m := range o.Mechanisms {
		if m != sasl.Plain && m != sasl.Login {
			tb.Fatalf("smtptest: mechanism %q is not PLAIN or LOGIN", m)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), o: o}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		s.mu.Lock()
		s.counts.Sessions++
		s.mu.Unlock()
		return &session{s: s, conn: c}, nil
	}))
	s.srv.Domain = "localhost"
	s.srv.AllowInsecureAuth = o.TLS == NoTLS
	s.srv.ReadTimeout = 10 * time.Second
	s.srv.WriteTimeout = 10 * time.Second
	errLog := &testLog{tb: tb}
	s.srv.ErrorLog = errLog
	if o.TLS != NoTLS {
		cert, err := selfSigned(time.Now())
		if err != nil {
			ln.Close()
			tb.Fatal(err)
		}
		s.Certificate = cert.Leaf
		s.RootCAs = x509.NewCertPool()
		s.RootCAs.AddCert(cert.Leaf)
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if o.TLS == StartTLS {
			s.srv.TLSConfig = cfg
		} else {
			ln = tls.NewListener(ln, cfg)
		}
	}
	go s.srv.Serve(ln)
	tb.Cleanup(func() {
		s.srv.Close()
		errLog.stop()
	})
	return s
}

// Messages returns what was received so far.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

// Counts returns what the server saw so far.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// WaitFor polls, up to timeout, until n messages were received, and
// returns them.
func (s *Server) WaitFor(tb testing.TB, n int, timeout time.Duration) []Message {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msgs := s.Messages()
		if len(msgs) >= n {
			return msgs
		}
		if time.Now().After(deadline) {
			tb.Fatalf("SMTP server got %d messages within %s, want %d", len(msgs), timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// session is one greeting's worth of a connection; go-smtp makes a new
// one after STARTTLS, so user starts empty on the encrypted side.
type session struct {
	s    *Server
	conn *smtp.Conn
	user string // after a successful AUTH
	msg  Message
}

var _ smtp.AuthSession = (*session)(nil)

func (x *session) Reset()        { x.msg = Message{} }
func (x *session) Logout() error { return nil }

func (x *session) AuthMechanisms() []string {
	if x.s.o.Username == "" {
		return nil
	}
	return x.s.o.Mechanisms
}

func (x *session) Auth(mech string) (sasl.Server, error) {
	if x.s.o.Username == "" {
		return nil, smtp.ErrAuthUnsupported
	}
	for _, m := range x.s.o.Mechanisms {
		if m != mech {
			continue
		}
		if mech == sasl.Plain {
			return sasl.NewPlainServer(func(identity, user, pass string) error {
				if identity != "" && identity != user {
					return x.check("", "") // acting for another user: refused
				}
				return x.check(user, pass)
			}), nil
		}
		return &loginServer{check: x.check}, nil
	}
	return nil, smtp.ErrAuthUnknownMechanism
}

// check accepts only the configured login, and counts the outcome.
func (x *session) check(user, pass string) error {
	ok := user == x.s.o.Username && pass == x.s.o.Password
	x.s.mu.Lock()
	defer x.s.mu.Unlock()
	if !ok {
		x.s.counts.AuthFailed++
		return smtp.ErrAuthFailed
	}
	x.s.counts.AuthOK++
	x.user = user
	return nil
}

func (x *session) Mail(from string, _ *smtp.MailOptions) error {
	x.s.mu.Lock()
	x.s.counts.Mail++
	x.s.mu.Unlock()
	if x.s.o.Username != "" && x.user == "" {
		return smtp.ErrAuthRequired
	}
	_, isTLS := x.conn.TLSConnectionState()
	x.msg = Message{From: from, TLS: isTLS, User: x.user}
	return nil
}

func (x *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	x.msg.To = append(x.msg.To, to)
	return nil
}

func (x *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	x.msg.Data = string(data)
	x.s.mu.Lock()
	x.s.msgs = append(x.s.msgs, x.msg)
	x.s.mu.Unlock()
	return nil
}

// loginServer is the server side of the LOGIN mechanism, which go-sasl
// has only as a client: it asks for the user name, then the password.
type loginServer struct {
	step  int
	user  string
	check func(user, pass string) error
}

func (l *loginServer) Next(response []byte) ([]byte, bool, error) {
	switch l.step {
	case 0:
		if len(response) == 0 { // no initial response
			l.step = 1
			return []byte("Username:"), false, nil
		}
		l.user, l.step = string(response), 2
		return []byte("Password:"), false, nil
	case 1:
		l.user, l.step = string(response), 2
		return []byte("Password:"), false, nil
	case 2:
		l.step = 3
		return nil, true, l.check(l.user, string(response))
	}
	return nil, false, sasl.ErrUnexpectedClientResponse
}

// testLog passes go-smtp's internal errors (a client that refused the
// certificate, say) to the test log, until the test ends.
type testLog struct {
	tb      testing.TB
	mu      sync.Mutex
	stopped bool
}

func (l *testLog) Printf(format string, v ...any) { l.log(fmt.Sprintf(format, v...)) }
func (l *testLog) Println(v ...any)               { l.log(fmt.Sprintln(v...)) }

func (l *testLog) log(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.tb.Log("smtptest: " + strings.TrimSuffix(s, "\n"))
	}
}

func (l *testLog) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
}

// Blackhole accepts connections on addr and never answers, like a mail
// server that hangs; Close releases the address.
type Blackhole struct {
	Addr string
	ln   net.Listener
	mu   sync.Mutex
	cons []net.Conn
}

// StartBlackhole listens on addr until Close or the end of the test.
func StartBlackhole(tb testing.TB, addr string) *Blackhole {
	tb.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	b := &Blackhole{Addr: ln.Addr().String(), ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.cons = append(b.cons, c)
			b.mu.Unlock()
		}
	}()
	tb.Cleanup(b.Close)
	return b
}

// Close stops listening and drops every connection.
func (b *Blackhole) Close() {
	b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.cons {
		c.Close()
	}
	b.cons = nil
}
