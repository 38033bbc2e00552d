package edge

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
	const xff, real = HeaderXFF, HeaderRealIP
	cases := []struct {
		name    string
		trusted bool   // use the trusted list above
		header  string // client_ip_header
		peer    string
		realIP  string
		xff     []string
		want    string
	}{
		{"direct peer", true, xff, "203.0.113.9:5000", "", nil, "203.0.113.9"},
		{"untrusted peer's headers ignored", true, xff, "203.0.113.9:5000", "1.1.1.1", []string{"2.2.2.2"}, "203.0.113.9"},
		{"untrusted peer's X-Real-IP ignored", true, real, "203.0.113.9:5000", "1.1.1.1", nil, "203.0.113.9"},
		{"no trusted proxies: headers ignored", false, xff, "127.0.0.1:5000", "1.1.1.1", []string{"2.2.2.2"}, "127.0.0.1"},
		{"trusted proxy, rightmost XFF", true, xff, "127.0.0.1:5000", "", []string{"6.6.6.6, 198.51.100.7"}, "198.51.100.7"},
		{"XFF mode: the client's own X-Real-IP ignored", true, xff, "127.0.0.1:5000", "6.6.6.6", []string{"198.51.100.7"}, "198.51.100.7"},
		{"XFF mode: X-Real-IP alone ignored", true, xff, "127.0.0.1:5000", "198.51.100.7", nil, "127.0.0.1"},
		{"X-Real-IP mode", true, real, "127.0.0.1:5000", "198.51.100.7", nil, "198.51.100.7"},
		{"X-Real-IP mode: the client's own XFF ignored", true, real, "127.0.0.1:5000", "198.51.100.7", []string{"6.6.6.6"}, "198.51.100.7"},
		{"X-Real-IP mode: XFF alone ignored", true, real, "127.0.0.1:5000", "", []string{"6.6.6.6"}, "127.0.0.1"},
		{"X-Real-IP mode: garbled", true, real, "127.0.0.1:80", "not-an-ip", []string{"198.51.100.7"}, "127.0.0.1"},
		{"spoofed leftmost never believed", true, xff, "10.1.2.3:80", "", []string{"6.6.6.6", "198.51.100.7, 10.0.0.5"}, "198.51.100.7"},
		{"all hops trusted: the proxy", true, xff, "127.0.0.1:80", "", []string{"10.0.0.1, 10.0.0.2"}, "127.0.0.1"},
		{"garbled hop stops the walk", true, xff, "127.0.0.1:80", "", []string{"198.51.100.7, nonsense"}, "127.0.0.1"},
		{"IPv4-mapped peer", true, xff, "[::ffff:203.0.113.9]:80", "", nil, "203.0.113.9"},
		{"IPv4-mapped trusted peer", true, real, "[::ffff:127.0.0.1]:80", "198.51.100.7", nil, "198.51.100.7"},
		{"IPv6 via trusted ::1", true, xff, "[::1]:80", "", []string{"2001:db8::1"}, "2001:db8::1"},
		{"XFF with port", true, xff, "127.0.0.1:80", "", []string{"198.51.100.7:4711"}, "198.51.100.7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ci := &clientIP{header: c.header}
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
	for _, name := range []string{"x-forwarded-for", "X-REAL-IP"} {
		if _, ok := clientIPHeader(name); !ok {
			t.Errorf("%q refused", name)
		}
	}
	if _, ok := clientIPHeader("Forwarded"); ok {
		t.Error("Forwarded accepted")
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
	ci := &clientIP{trusted: trusted, header: HeaderXFF, log: slog.New(slog.NewTextHandler(&logs, nil))}
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
	agree := &clientIP{trusted: trusted, header: HeaderXFF, log: slog.New(slog.NewTextHandler(&logs, nil))}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "127.0.0.1:4000"
	r.Header.Set("X-Real-IP", "198.51.100.7")
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	agree.extract(r)
	if logs.Len() != 0 {
		t.Errorf("warned although the headers agree:\n%s", logs.String())
	}
}

// TestClientIPTwoRealIPHeaders: a proxy that adds its own X-Real-IP rather
// than replacing the client's puts it last; the last one is believed.
func TestClientIPTwoRealIPHeaders(t *testing.T) {
	trusted, _ := ParsePrefixes([]string{"127.0.0.1"})
	ci := &clientIP{trusted: trusted, header: HeaderRealIP}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "127.0.0.1:4000"
	r.Header.Add("X-Real-IP", "6.6.6.6")      // the client's
	r.Header.Add("X-Real-IP", "198.51.100.7") // the proxy's
	if got := ci.extract(r); got != "198.51.100.7" {
		t.Errorf("client %q, want the last X-Real-IP 198.51.100.7", got)
	}
}

// TestAddrString: the client address is always the address's own
// spelling, taken from the peer's without a copy only when it matches.
func TestAddrString(t *testing.T) {
	for _, remote := range []string{
		"127.0.0.1:5000", "203.0.113.7:1", "[::1]:5000", "[2001:db8::1]:443", "[2001:DB8:0:0::1]:443",
		"[::ffff:192.0.2.1]:80", "[fe80::1%eth0]:80", "192.0.2.1",
	} {
		t.Run(remote, func(t *testing.T) {
			a, host := parseAddrHost(remote)
			if got, want := addrString(a, host), a.String(); got != want {
				t.Errorf("addrString(%v, %q) = %q, want %q", a, host, got, want)
			}
		})
	}
	if allocs := testing.AllocsPerRun(100, func() { addrString(parseAddrHost("127.0.0.1:5000")) }); allocs != 0 {
		t.Errorf("a peer already spelled so: %v allocations, want 0", allocs)
	}
}
