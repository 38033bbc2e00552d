// Package smtptest provides an SMTP server on 127.0.0.1 that keeps every
// message it receives, for tests of e-mail alerts. Only tests import it.
package smtptest

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// Message is one message as received.
type Message struct {
	From string
	To   []string
	Data string // headers and body, CRLF line ends
}

// Headers returns the message's header block (before the first empty
// line).
func (m Message) Headers() string {
	h, _, _ := strings.Cut(m.Data, "\r\n\r\n")
	return h
}

// Server is a running SMTP sink.
type Server struct {
	Addr string // host:port
	srv  *smtp.Server

	mu   sync.Mutex
	msgs []Message
}

// Start runs a server on addr ("127.0.0.1:0" for any port) until the test
// ends.
func Start(tb testing.TB, addr string) *Server {
	tb.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String()}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &session{s: s}, nil
	}))
	s.srv.Domain = "localhost"
	s.srv.AllowInsecureAuth = true
	s.srv.ReadTimeout = 10 * time.Second
	s.srv.WriteTimeout = 10 * time.Second
	go s.srv.Serve(ln)
	tb.Cleanup(func() { s.srv.Close() })
	return s
}

// Messages returns what was received so far.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
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

type session struct {
	s   *Server
	msg Message
}

func (x *session) Reset()        { x.msg = Message{} }
func (x *session) Logout() error { return nil }
func (x *session) Mail(from string, _ *smtp.MailOptions) error {
	x.msg.From = from
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
