package server

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func TestClientIP(t *testing.T) {
	trusted, err := ParsePrefixes([]string{"10.0.0.0/8", "127.0.0.1", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		trusted bool // use the trusted list above
		peer    string
		realIP  string
		xff     []string
		want    string
	}{
		{"direct peer", true, "203.0.113.9:5000", "", nil, "203.0.113.9"},
		{"untrusted peer's headers ignored", true, "203.0.113.9:5000", "1.1.1.1", []string{"2.2.2.2"}, "203.0.113.9"},
		{"no trusted proxies: headers ignored", false, "127.0.0.1:5000", "1.1.1.1", []string{"2.2.2.2"}, "127.0.0.1"},
		{"trusted proxy, X-Real-IP alone", true, "127.0.0.1:5000", "198.51.100.7", nil, "198.51.100.7"},
		{"client's own X-Real-IP passed through: XFF wins", true, "127.0.0.1:5000", "6.6.6.6", []string{"198.51.100.7"}, "198.51.100.7"},
		{"all XFF hops trusted: X-Real-IP", true, "127.0.0.1:5000", "198.51.100.7", []string{"10.0.0.1"}, "198.51.100.7"},
		{"trusted proxy, rightmost XFF", true, "127.0.0.1:5000", "", []string{"6.6.6.6, 198.51.100.7"}, "198.51.100.7"},
		{"spoofed leftmost never believed", true, "10.1.2.3:80", "", []string{"6.6.6.6", "198.51.100.7, 10.0.0.5"}, "198.51.100.7"},
		{"all hops trusted: the leftmost trusted", true, "127.0.0.1:80", "", []string{"10.0.0.1, 10.0.0.2"}, "127.0.0.1"},
		{"garbled hop stops the walk", true, "127.0.0.1:80", "", []string{"198.51.100.7, nonsense"}, "127.0.0.1"},
		{"garbled X-Real-IP falls back to XFF", true, "127.0.0.1:80", "not-an-ip", []string{"198.51.100.7"}, "198.51.100.7"},
		{"IPv4-mapped peer", true, "[::ffff:203.0.113.9]:80", "", nil, "203.0.113.9"},
		{"IPv4-mapped trusted peer", true, "[::ffff:127.0.0.1]:80", "198.51.100.7", nil, "198.51.100.7"},
		{"IPv6 via trusted ::1", true, "[::1]:80", "", []string{"2001:db8::1"}, "2001:db8::1"},
		{"XFF with port", true, "127.0.0.1:80", "", []string{"198.51.100.7:4711"}, "198.51.100.7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ci := &clientIP{}
			if c.trusted {
				ci.trusted = trusted
			}
			r, _ := http.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = c.peer
			if c.realIP != "" {
				r.Header.Set("X-Real-IP", c.realIP)
			}
			for _, x := range c.xff {
				r.Header.Add("X-Forwarded-For", x)
			}
			if got := ci.extract(r); got != c.want {
				t.Errorf("client %q, want %q", got, c.want)
			}
		})
	}
}

func TestParsePrefixes(t *testing.T) {
	for _, bad := range []string{"", "10.0.0.0/33", "example.com", "1.2.3"} {
		if _, err := ParsePrefixes([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	got, err := ParsePrefixes([]string{"10.1.2.3/8", " 192.168.0.1 ", "::ffff:127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].String() != "10.0.0.0/8" || got[1].String() != "192.168.0.1/32" || got[2].String() != "127.0.0.1/32" {
		t.Errorf("prefixes %v", got)
	}
}

// TestClientIPWarnsWhenHeadersDisagree: a proxy that passes a client's own
// X-Real-IP through (Caddy's default) must not let clients pick their
// address: X-Forwarded-For, which the proxy appends to, is believed, and
// the disagreement is logged once.
func TestClientIPWarnsWhenHeadersDisagree(t *testing.T) {
	trusted, _ := ParsePrefixes([]string{"127.0.0.1"})
	var logs bytes.Buffer
	ci := &clientIP{trusted: trusted, log: slog.New(slog.NewTextHandler(&logs, nil))}
	for range 3 {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "127.0.0.1:4000"
		r.Header.Set("X-Real-IP", "6.6.6.6")
		r.Header.Set("X-Forwarded-For", "198.51.100.7")
		if got := ci.extract(r); got != "198.51.100.7" {
			t.Errorf("client %q, want X-Forwarded-For's 198.51.100.7", got)
		}
	}
	if n := strings.Count(logs.String(), "naming different clients"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
	logs.Reset()
	agree := &clientIP{trusted: trusted, log: slog.New(slog.NewTextHandler(&logs, nil))}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "127.0.0.1:4000"
	r.Header.Set("X-Real-IP", "198.51.100.7")
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	agree.extract(r)
	if logs.Len() != 0 {
		t.Errorf("warned although the headers agree:\n%s", logs.String())
	}
}
