package edge

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// FuzzClientIP feeds client-IP extraction a TCP peer, a trusted_proxies
// list, X-Forwarded-For lines and X-Real-IP values, and checks the result
// against what the extractor promises rather than against a copy of its
// walk:
//   - a peer that is not an address is returned as it came;
//   - from an untrusted peer the client is the peer, whatever the headers
//     say (so never the leftmost X-Forwarded-For entry it wrote);
//   - from a trusted peer the client is the peer or a valid, untrusted,
//     plain address named by the configured header: in X-Forwarded-For
//     mode an entry all of whose right-hand neighbours are valid trusted
//     proxies, and the peer only when there is no such entry; in X-Real-IP
//     mode the last X-Real-IP value, or the peer if that is no address;
//   - entries a client prepends to X-Forwarded-For never change a client
//     found further right.
func FuzzClientIP(f *testing.F) {
	const trusted = "10.0.0.0/8, 127.0.0.1, ::1"
	f.Add("203.0.113.9:5000", trusted, false, "2.2.2.2", "1.1.1.1", "6.6.6.6")
	f.Add("127.0.0.1:5000", trusted, false, "6.6.6.6, 198.51.100.7", "", "9.9.9.9")
	f.Add("10.1.2.3:80", trusted, false, "6.6.6.6\n198.51.100.7, 10.0.0.5", "", "1.2.3.4")
	f.Add("127.0.0.1:80", trusted, false, "198.51.100.7, nonsense", "", "5.5.5.5")
	f.Add("127.0.0.1:80", trusted, true, "6.6.6.6", "198.51.100.7", "")
	f.Add("[::ffff:127.0.0.1]:80", trusted, true, "", "not-an-ip\n198.51.100.7", "")
	f.Add("[::1]:80", trusted, false, "2001:db8::1, [fe80::1%eth0]:443", "", "::ffff:1.2.3.4")
	f.Add("@", "", false, "1.2.3.4", "", "")
	f.Add("127.0.0.1:80", "0.0.0.0/0, ::/0", false, "1.2.3.4, 5.6.7.8", "", "")
	f.Fuzz(func(t *testing.T, peer, proxies string, realMode bool, xff, realIP, prepend string) {
		prefixes, err := ParsePrefixes(strings.Split(proxies, ","))
		if err != nil {
			prefixes = nil
		}
		ci := &clientIP{trusted: prefixes, header: HeaderXFF}
		if realMode {
			ci.header = HeaderRealIP
		}
		xffLines, realLines := headerLines(xff), headerLines(realIP)
		got := ci.extract(request(peer, xffLines, realLines))

		p := parseAddr(peer)
		if !p.IsValid() {
			if got != peer {
				t.Fatalf("peer %q is no address, client %q", peer, got)
			}
			return
		}
		if !ci.isTrusted(p) {
			if got != p.String() {
				t.Fatalf("untrusted peer %s, headers %q %q: client %q", p, xffLines, realLines, got)
			}
			return
		}
		a, err := netip.ParseAddr(got)
		if err != nil || a.Is4In6() || a.Zone() != "" || a.String() != got {
			t.Fatalf("client %q is not a plain address (%v)", got, err)
		}
		if realMode {
			// The proxy names the client itself: the last value if it
			// is an address, else the proxy is the client.
			want := p
			if r := parseAddr(strings.TrimSpace(lastValue(realLines))); r.IsValid() {
				want = r
			}
			if a != want {
				t.Fatalf("X-Real-IP %q from %s: client %s, want %s", realLines, p, a, want)
			}
			return
		}
		if a == p {
			// The peer, only if no entry names a client (a client is
			// never trusted, and the peer is).
			if i := forwardedClient(ci, xffLines); i >= 0 {
				t.Fatalf("X-Forwarded-For %q names hop %d, but the client is the peer", xffLines, i)
			}
			return
		}
		if ci.isTrusted(a) {
			t.Fatalf("client %s is a trusted proxy", a)
		}
		i := forwardedClient(ci, xffLines)
		hops := forwardedFor(xffLines)
		if i < 0 || parseAddr(hops[i]) != a {
			t.Fatalf("client %s is not the rightmost untrusted entry of %q", a, xffLines)
		}
		// Whatever the client writes to the left does not move it.
		spoofed := append([]string{prepend}, xffLines...)
		if again := ci.extract(request(peer, spoofed, realLines)); again != got {
			t.Fatalf("prepending %q to %q moved the client from %s to %s", prepend, xffLines, got, again)
		}
	})
}

// forwardedClient is the index of the X-Forwarded-For entry that names
// the client by the rule: a valid untrusted address all of whose
// right-hand neighbours are valid trusted addresses; -1 if there is none.
func forwardedClient(ci *clientIP, lines []string) int {
	hops := forwardedFor(lines)
	for i := range hops {
		a := parseAddr(hops[i])
		if !a.IsValid() || ci.isTrusted(a) {
			continue
		}
		right := true
		for _, h := range hops[i+1:] {
			if b := parseAddr(h); !b.IsValid() || !ci.isTrusted(b) {
				right = false
				break
			}
		}
		if right {
			return i
		}
	}
	return -1
}

// headerLines splits s into header values at newlines; "" is none.
func headerLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func lastValue(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

func request(peer string, xff, realIP []string) *http.Request {
	r := &http.Request{Method: http.MethodGet, Header: http.Header{}, RemoteAddr: peer}
	for _, v := range xff {
		r.Header.Add(HeaderXFF, v)
	}
	for _, v := range realIP {
		r.Header.Add(HeaderRealIP, v)
	}
	return r
}
