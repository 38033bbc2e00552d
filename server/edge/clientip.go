package edge

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// The headers a trusted proxy may name the client in.
const (
	HeaderXFF    = "X-Forwarded-For"
	HeaderRealIP = "X-Real-IP"
	// keyRealIP is X-Real-IP as a header map holds it; looked up so,
	// it is not canonicalised again on every request.
	keyRealIP = "X-Real-Ip"
)

// clientIPHeader returns the canonical spelling of a configured header
// name, and whether it is one of the two.
func clientIPHeader(name string) (string, bool) {
	switch {
	case strings.EqualFold(name, HeaderXFF):
		return HeaderXFF, true
	case strings.EqualFold(name, HeaderRealIP):
		return HeaderRealIP, true
	}
	return "", false
}

// clientIP finds the address of the client behind at most a chain of
// trusted proxies. It is installed as Echo's IPExtractor, so c.RealIP()
// never falls back to Echo's own header handling.
type clientIP struct {
	trusted  []netip.Prefix
	header   string // HeaderXFF or HeaderRealIP
	log      *slog.Logger
	warn     sync.Once
	disagree sync.Once
}

// extract returns the client address for r as a string.
//
// The TCP peer is the client unless it is a trusted proxy. From a trusted
// proxy, only the configured header is read. X-Forwarded-For's entries are
// read from the right, skipping trusted proxies, and the first other entry
// is the client: proxies append the address they saw, and the leftmost
// entry, which the client itself can write, is never believed just for
// being first. X-Real-IP must hold one address. If the header names no
// client, the proxy itself is the client.
func (ci *clientIP) extract(r *http.Request) string {
	peer, host := parseAddrHost(r.RemoteAddr)
	if !peer.IsValid() {
		return r.RemoteAddr
	}
	if !ci.isTrusted(peer) {
		if len(ci.trusted) == 0 && ci.log != nil && (FirstValue(r.Header, HeaderXFF) != "" || FirstValue(r.Header, keyRealIP) != "") {
			ci.warn.Do(func() {
				ci.log.Warn("requests carry X-Forwarded-For or X-Real-IP but server.trusted_proxies is empty: " +
					"the headers are ignored and every client is its TCP peer; behind a reverse proxy, list its address in trusted_proxies")
			})
		}
		return addrString(peer, host)
	}
	forwarded := ci.rightmostUntrusted(r.Header[HeaderXFF])
	real := lastRealIP(r.Header[keyRealIP])
	client, other := forwarded, real
	if ci.header == HeaderRealIP {
		client, other = real, forwarded
	}
	if client.IsValid() && other.IsValid() && client != other && ci.log != nil {
		ci.disagree.Do(func() {
			ci.log.Warn("a trusted proxy sent X-Real-IP and X-Forwarded-For naming different clients: only server.client_ip_header is believed, "+
				"so make sure it names the header your proxy sets itself (see docs/OPERATIONS.md, Behind a reverse proxy)",
				"client_ip_header", ci.header, "x_real_ip", real.String(), "x_forwarded_for", forwarded.String())
		})
	}
	if client.IsValid() {
		return client.String()
	}
	return peer.String()
}

// addrString is a as a string: host itself, without a copy, when it
// already spells a so (as a TCP peer's address from Go's server does).
func addrString(a netip.Addr, host string) string {
	var buf [64]byte
	if string(a.AppendTo(buf[:0])) == host {
		return host
	}
	return a.String()
}

// FirstValue is h.Get(key) for a key in its canonical spelling, which
// Go's server gives every header it reads: looked up as it is, not
// checked and canonicalised again.
func FirstValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// lastRealIP is the address in the last X-Real-IP header: a proxy that adds
// its own header rather than replacing the client's puts it last.
func lastRealIP(values []string) netip.Addr {
	if len(values) == 0 {
		return netip.Addr{}
	}
	return parseAddr(strings.TrimSpace(values[len(values)-1]))
}

// rightmostUntrusted reads the X-Forwarded-For entries from the right,
// skipping trusted proxies, and returns the first other address; the zero
// Addr if there is none or a garbled entry comes first.
func (ci *clientIP) rightmostUntrusted(lines []string) netip.Addr {
	hops := forwardedFor(lines)
	for i := len(hops) - 1; i >= 0; i-- {
		hop := parseAddr(hops[i])
		if !hop.IsValid() {
			return netip.Addr{} // a garbled entry: believe nothing further left
		}
		if !ci.isTrusted(hop) {
			return hop
		}
	}
	return netip.Addr{}
}

// ForwardedFor is the X-Forwarded-For chain a request r passes on to an
// app behind the public listener should carry: the entries a trusted
// proxy sent (none from any other peer), then the peer's own address; and
// whether the peer is a trusted proxy.
func (e *Edge) ForwardedFor(r *http.Request) (chain []string, trusted bool) {
	peer := parseAddr(r.RemoteAddr)
	trusted = peer.IsValid() && e.clients.isTrusted(peer)
	chain = []string{}
	if trusted {
		chain = forwardedFor(r.Header.Values(HeaderXFF))
	}
	if peer.IsValid() {
		chain = append(chain, peer.String())
	}
	return chain, trusted
}

// FromTrustedProxy reports whether r's TCP peer is one of
// server.trusted_proxies.
func (e *Edge) FromTrustedProxy(r *http.Request) bool {
	peer := parseAddr(r.RemoteAddr)
	return peer.IsValid() && e.clients.isTrusted(peer)
}

func (ci *clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range ci.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedFor splits every X-Forwarded-For header line into its entries,
// in order.
func forwardedFor(lines []string) []string {
	var hops []string
	for _, l := range lines {
		for _, h := range strings.Split(l, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	return hops
}

// parseAddr reads "1.2.3.4", "1.2.3.4:5", "[::1]:5" or "::1", with
// IPv4-mapped IPv6 addresses unmapped and zones dropped. It returns the zero
// Addr for anything else.
func parseAddr(s string) netip.Addr {
	a, _ := parseAddrHost(s)
	return a
}

// parseAddrHost is parseAddr that also returns the host part of s it read.
func parseAddrHost(s string) (netip.Addr, string) {
	if s == "" {
		return netip.Addr{}, ""
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, s
	}
	return a.Unmap().WithZone(""), s
}
