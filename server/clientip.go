package server

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// clientIP finds the address of the client behind at most a chain of
// trusted proxies. It is installed as Echo's IPExtractor, so c.RealIP()
// never falls back to Echo's own header handling.
type clientIP struct {
	trusted  []netip.Prefix
	log      *slog.Logger
	warn     sync.Once
	disagree sync.Once
}

// extract returns the client address for r as a string.
//
// The TCP peer is the client unless it is a trusted proxy. From a trusted
// proxy, the X-Forwarded-For entries are read from the right, skipping
// trusted proxies, and the first other entry is the client: proxies append
// the address they saw, so that entry is the proxy's own word, and the
// leftmost entry, which the client itself can write, is never believed just
// for being first. X-Real-IP is believed only when X-Forwarded-For names no
// client: many proxies (Caddy by default, HAProxy) pass a client's own
// X-Real-IP through untouched, and believing it first would let every
// client choose its address.
func (ci *clientIP) extract(r *http.Request) string {
	peer := parseAddr(r.RemoteAddr)
	if !peer.IsValid() {
		return r.RemoteAddr
	}
	if !ci.isTrusted(peer) {
		if len(ci.trusted) == 0 && ci.log != nil && (r.Header.Get("X-Forwarded-For") != "" || r.Header.Get("X-Real-IP") != "") {
			ci.warn.Do(func() {
				ci.log.Warn("requests carry X-Forwarded-For or X-Real-IP but server.trusted_proxies is empty: " +
					"the headers are ignored and every client is its TCP peer; behind a reverse proxy, list its address in trusted_proxies")
			})
		}
		return peer.String()
	}
	forwarded := ci.rightmostUntrusted(r.Header.Values("X-Forwarded-For"))
	real := parseAddr(strings.TrimSpace(r.Header.Get("X-Real-IP")))
	if forwarded.IsValid() {
		if real.IsValid() && real != forwarded && ci.log != nil {
			ci.disagree.Do(func() {
				ci.log.Warn("a trusted proxy sent X-Real-IP and X-Forwarded-For naming different clients; X-Forwarded-For is believed, "+
					"so make sure the proxy appends the address it saw to it (nginx: proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for)",
					"x_real_ip", real.String(), "x_forwarded_for", forwarded.String())
			})
		}
		return forwarded.String()
	}
	if real.IsValid() {
		return real.String()
	}
	return peer.String()
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
	if s == "" {
		return netip.Addr{}
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}
