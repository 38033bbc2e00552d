package edge

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Defaults for Config.
const (
	DefaultListen         = ":8080"
	DefaultAdminListen    = "127.0.0.1:8081"
	DefaultMaxImageBytes  = 10 << 20   // 10 MiB
	DefaultMaxImagePixels = 40_000_000 // 40 megapixels
	DefaultMaxImageSide   = 8192

	DefaultMaxBodyMemory           = 128 << 20 // 128 MiB
	DefaultMaxInFlightPerUser      = 4
	DefaultMinUploadBytesPerSecond = 32 << 10 // 32 KiB/s
	DefaultUploadGrace             = 5 * time.Second
	DefaultMaxMultipartParts       = 16
	DefaultMaxHeaderBytes          = 32 << 10 // 32 KiB
	DefaultMaxHeaderLines          = 100
	DefaultMaxHeaderMemory         = 4 << 20 // 4 MiB
	DefaultMaxConnections          = 1024
	DefaultIdleTimeout             = 30 * time.Second
)

// minMaxHeaderBytes is the smallest max_header_bytes: a JWT alone can be
// 8 KiB.
const minMaxHeaderBytes = 8 << 10

// Config is the [server] section of config.toml.
type Config struct {
	// Listen is the public address, host:port. Default ":8080".
	Listen string `koanf:"listen"`
	// AdminListen is the admin API's address. Default "127.0.0.1:8081".
	// A non-loopback address needs an admin token of 32 characters or more.
	// It must not be Listen's address, however spelled: Validate refuses it.
	AdminListen string `koanf:"admin_listen"`
	// TrustedProxies lists the reverse proxies (CIDR ranges or single
	// addresses) whose X-Real-IP / X-Forwarded-For headers are believed.
	// Default empty: the client is always the TCP peer. A range that holds
	// every address (0.0.0.0/0, ::/0) is allowed, and Warnings names it.
	TrustedProxies []string `koanf:"trusted_proxies"`
	// ClientIPHeader names the header a trusted proxy gives the client's
	// address in: "X-Forwarded-For" (the default; its rightmost entry that
	// is not a trusted proxy) or "X-Real-IP". Only the one named is read:
	// a proxy passes the other through from the client untouched, so
	// believing it would let clients pick their address.
	ClientIPHeader string `koanf:"client_ip_header"`
	// MaxImageBytes is the largest accepted request body, in bytes.
	// Default 10 MiB.
	MaxImageBytes int64 `koanf:"max_image_bytes"`
	// MaxImagePixels is the most pixels (width × height) an image may
	// claim. Default 40,000,000.
	MaxImagePixels int64 `koanf:"max_image_pixels"`
	// MaxImageSide is the longest side, in pixels, an image may claim.
	// Default 8192. With max_image_pixels it bounds the worst-case cost
	// of a call, which grows with the image's 768-pixel tiles.
	MaxImageSide int `koanf:"max_image_side"`

	// The transport bounds, which keep memory and connections within a
	// small machine's means whatever clients send.

	// MaxBodyMemory is the most bytes of request bodies held in memory at
	// once, service-wide: an upload takes its declared Content-Length (at
	// most max_image_bytes) before its first byte is read, one of unknown
	// length takes more as its bytes arrive, and both are given back when
	// the request ends. An upload that finds too little left is refused
	// at once with 503 server_busy and Retry-After. Default 128 MiB; at
	// least max_image_bytes.
	MaxBodyMemory int64 `koanf:"max_body_memory"`
	// MaxInFlightPerUser is the most POST /v1/ocr requests one user may
	// have in progress at once (upload, call and commit); one more gets
	// 429 too_many_in_flight. Default 4.
	MaxInFlightPerUser int `koanf:"max_in_flight_per_user"`
	// MinUploadBytesPerSecond is the slowest accepted upload: within every
	// UploadGrace the body must bring MinUploadBytesPerSecond ×
	// UploadGrace bytes (or end), or the request is cut off with 408
	// upload_too_slow. Default 32 KiB/s.
	MinUploadBytesPerSecond int64 `koanf:"min_upload_bytes_per_second"`
	// UploadGrace is the interval over which the upload rate is judged,
	// so the longest an upload may stall. Default 5s.
	UploadGrace time.Duration `koanf:"upload_grace"`
	// MaxMultipartParts is the most parts a multipart/form-data upload may
	// have, the image included; more gets 400 too_many_parts. Default 16.
	MaxMultipartParts int `koanf:"max_multipart_parts"`
	// MaxHeaderBytes bounds a request's line and headers, in bytes (Go's
	// server allows 4 KiB of slack on top); more gets 431. Default
	// 32 KiB; at least 8 KiB.
	MaxHeaderBytes int `koanf:"max_header_bytes"`
	// MaxHeaderLines bounds the header lines of a request, the request
	// line not counted: Go's server allocates for each line, so short lines
	// cost several times their bytes. More gets 431 and the connection is
	// closed. Default 100 (Apache's LimitRequestFields).
	MaxHeaderLines int `koanf:"max_header_lines"`
	// MaxHeaderMemory is the most bytes of unfinished header blocks the
	// connections of each listener hold at once. At the cap the
	// connection whose block began longest ago is closed: a client's
	// headers arrive in moments, a flood's are held. Default 4 MiB; at
	// least max_header_bytes.
	MaxHeaderMemory int64 `koanf:"max_header_memory"`
	// MaxConnections is the most connections each listener holds open.
	// At the cap a new connection closes the one that has waited longest
	// without a request in progress (idle keep-alive, or connected and
	// silent), sparing a new connection for its first second and one
	// whose request has arrived; when every connection has a request in
	// progress, the new one is closed at once. Default 1024.
	MaxConnections int `koanf:"max_connections"`
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request. Default 30s.
	IdleTimeout time.Duration `koanf:"idle_timeout"`
	// AccessLog logs one line per request of the public listener: method,
	// route pattern, status, latency, user (once known), client IP and
	// request id. Default false.
	AccessLog bool `koanf:"access_log"`
	// AdminPprof serves Go's profiler (net/http/pprof) on the admin
	// listener under /debug/pprof/, behind the admin token like every
	// admin route. A profile shows the request path's internals and a CPU
	// profile costs CPU while it runs, so it stays off in normal running;
	// it is read at start only. Default false.
	AdminPprof bool `koanf:"admin_pprof"`
}

// WithDefaults returns c with every zero field set to its documented default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.ClientIPHeader == "" {
		c.ClientIPHeader = HeaderXFF
	}
	if c.MaxImageBytes == 0 {
		c.MaxImageBytes = DefaultMaxImageBytes
	}
	if c.MaxImagePixels == 0 {
		c.MaxImagePixels = DefaultMaxImagePixels
	}
	if c.MaxImageSide == 0 {
		c.MaxImageSide = DefaultMaxImageSide
	}
	if c.MaxBodyMemory == 0 {
		c.MaxBodyMemory = DefaultMaxBodyMemory
	}
	if c.MaxInFlightPerUser == 0 {
		c.MaxInFlightPerUser = DefaultMaxInFlightPerUser
	}
	if c.MinUploadBytesPerSecond == 0 {
		c.MinUploadBytesPerSecond = DefaultMinUploadBytesPerSecond
	}
	if c.UploadGrace == 0 {
		c.UploadGrace = DefaultUploadGrace
	}
	if c.MaxMultipartParts == 0 {
		c.MaxMultipartParts = DefaultMaxMultipartParts
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxHeaderLines == 0 {
		c.MaxHeaderLines = DefaultMaxHeaderLines
	}
	if c.MaxHeaderMemory == 0 {
		c.MaxHeaderMemory = DefaultMaxHeaderMemory
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	return c
}

// Validate reports the first invalid setting, naming its key.
func (c Config) Validate() error {
	if c.MaxImageBytes < 0 {
		return fmt.Errorf("server.max_image_bytes: must not be negative, got %d", c.MaxImageBytes)
	}
	if c.MaxImagePixels < 0 {
		return fmt.Errorf("server.max_image_pixels: must not be negative, got %d", c.MaxImagePixels)
	}
	if c.MaxImageSide < 0 {
		return fmt.Errorf("server.max_image_side: must not be negative, got %d", c.MaxImageSide)
	}
	for _, key := range []struct {
		name  string
		value int64
	}{
		{"max_body_memory", c.MaxBodyMemory},
		{"max_in_flight_per_user", int64(c.MaxInFlightPerUser)},
		{"min_upload_bytes_per_second", c.MinUploadBytesPerSecond},
		{"upload_grace", int64(c.UploadGrace)},
		{"max_multipart_parts", int64(c.MaxMultipartParts)},
		{"max_header_bytes", int64(c.MaxHeaderBytes)},
		{"max_header_lines", int64(c.MaxHeaderLines)},
		{"max_header_memory", c.MaxHeaderMemory},
		{"max_connections", int64(c.MaxConnections)},
		{"idle_timeout", int64(c.IdleTimeout)},
	} {
		if key.value < 0 {
			return fmt.Errorf("server.%s: must not be negative", key.name)
		}
	}
	if d := c.WithDefaults(); d.MaxBodyMemory < d.MaxImageBytes {
		return fmt.Errorf("server.max_body_memory: %d is less than server.max_image_bytes %d: no image could be uploaded", d.MaxBodyMemory, d.MaxImageBytes)
	}
	if d := c.WithDefaults(); d.MaxHeaderMemory < int64(d.MaxHeaderBytes) {
		return fmt.Errorf("server.max_header_memory: %d is less than server.max_header_bytes %d", d.MaxHeaderMemory, d.MaxHeaderBytes)
	}
	if d := c.WithDefaults(); d.MaxHeaderBytes < minMaxHeaderBytes {
		return fmt.Errorf("server.max_header_bytes: must be at least %d (a JWT alone can be 8 KiB), got %d", minMaxHeaderBytes, d.MaxHeaderBytes)
	}
	for _, key := range []struct{ name, addr string }{{"server.listen", c.Listen}, {"server.admin_listen", c.AdminListen}} {
		if key.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(key.addr); err != nil {
			return fmt.Errorf("%s: %q is not host:port", key.name, key.addr)
		}
	}
	if err := distinctListeners(c.WithDefaults()); err != nil {
		return err
	}
	if _, ok := clientIPHeader(c.ClientIPHeader); !ok {
		return fmt.Errorf("server.client_ip_header: must be %q or %q, got %q", HeaderXFF, HeaderRealIP, c.ClientIPHeader)
	}
	if _, err := ParsePrefixes(c.TrustedProxies); err != nil {
		return err
	}
	return nil
}

// distinctListeners refuses a public and an admin address that would
// be the same listening socket, however spelled (":8080", "0.0.0.0:8080",
// "[::]:8080"; a wildcard host covers every address of its port): the
// admin API must never share the public port. Port 0 (a free port each)
// never collides.
func distinctListeners(c Config) error {
	pub, err1 := listenAddr(c.Listen)
	adm, err2 := listenAddr(c.AdminListen)
	if err1 != nil || err2 != nil || pub.port == 0 || pub.port != adm.port {
		return nil // a malformed address is refused on its own
	}
	overlap := pub.host == adm.host || pub.host.IsUnspecified() && (pub.host.Is6() || adm.host.Is4()) ||
		adm.host.IsUnspecified() && (adm.host.Is6() || pub.host.Is4())
	if overlap {
		return fmt.Errorf("server.admin_listen: %q is the same address as server.listen %q: the admin API must have its own port (default %s)",
			c.AdminListen, c.Listen, DefaultAdminListen)
	}
	return nil
}

// hostPort is a listening address as the socket sees it.
type hostPort struct {
	host netip.Addr
	port int
}

// listenAddr is addr's host and port: an empty host is "::" (every
// address, as net.Listen takes it), "localhost" is 127.0.0.1 (the address
// net.Listen binds for it) and a named port is looked up.
func listenAddr(addr string) (hostPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return hostPort{}, err
	}
	n, err := net.LookupPort("tcp", port)
	if err != nil {
		return hostPort{}, err
	}
	var ip netip.Addr
	switch strings.ToLower(host) {
	case "":
		ip = netip.IPv6Unspecified()
	case "localhost":
		ip = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	default:
		if ip, err = netip.ParseAddr(host); err != nil {
			return hostPort{}, err // a host name: not compared
		}
		ip = ip.Unmap().WithZone("")
	}
	return hostPort{host: ip, port: n}, nil
}

// Warnings are what in c is valid but probably a mistake, for serve and
// config check to show.
func (c Config) Warnings() []string {
	var out []string
	prefixes, _ := ParsePrefixes(c.TrustedProxies) // Validate reports an error
	for _, p := range prefixes {
		if p.Bits() == 0 {
			out = append(out, fmt.Sprintf("server.trusted_proxies holds %s, every %s address: any client can then set its own forwarded address "+
				"(X-Forwarded-For or X-Real-IP) and pick the IP its limits, invite checks and statistics count; list only your proxies' addresses",
				p, map[bool]string{true: "IPv4", false: "IPv6"}[p.Addr().Is4()]))
		}
	}
	return out
}

// ParsePrefixes parses trusted_proxies entries: CIDR ranges or single
// addresses (a single address becomes a /32 or /128).
func ParsePrefixes(entries []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(entries))
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if strings.Contains(e, "/") {
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("server.trusted_proxies: %q is not a CIDR range or an address", e)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(e)
		if err != nil {
			return nil, fmt.Errorf("server.trusted_proxies: %q is not a CIDR range or an address", e)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
