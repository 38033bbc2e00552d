package limiter

import "net/netip"

// ClientKey is the key a client address is limited and counted under: the
// address itself for IPv4 (an IPv4-mapped IPv6 address included), its /64
// for IPv6, since one host usually holds a whole /64 and could otherwise
// rotate through 2^64 keys. Anything that is not an address is returned
// as it is.
func ClientKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	if a.Is4() {
		return ip // netip reads an IPv4 address in one spelling only, its own: no copy
	}
	a = a.Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.WithZone("").Prefix(64)
	return p.String()
}
