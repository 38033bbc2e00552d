package server

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Defaults for Config.
const (
	DefaultListen         = ":8080"
	DefaultAdminListen    = "127.0.0.1:8081"
	DefaultMaxImageBytes  = 10 << 20   // 10 MiB
	DefaultMaxImagePixels = 40_000_000 // 40 megapixels
)

// Config is the [server] section of config.toml.
type Config struct {
	// Listen is the public address, host:port. Default ":8080".
	Listen string `koanf:"listen"`
	// AdminListen is the admin API's address. Default "127.0.0.1:8081".
	// A non-loopback address needs an admin token of 32 characters or more.
	AdminListen string `koanf:"admin_listen"`
	// TrustedProxies lists the reverse proxies (CIDR ranges or single
	// addresses) whose X-Real-IP / X-Forwarded-For headers are believed.
	// Default empty: the client is always the TCP peer.
	TrustedProxies []string `koanf:"trusted_proxies"`
	// MaxImageBytes is the largest accepted request body, in bytes.
	// Default 10 MiB.
	MaxImageBytes int64 `koanf:"max_image_bytes"`
	// MaxImagePixels is the most pixels (width × height) an image may
	// claim. Default 40,000,000.
	MaxImagePixels int64 `koanf:"max_image_pixels"`
}

// WithDefaults returns c with every zero field set to its documented default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.MaxImageBytes == 0 {
		c.MaxImageBytes = DefaultMaxImageBytes
	}
	if c.MaxImagePixels == 0 {
		c.MaxImagePixels = DefaultMaxImagePixels
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
	for _, key := range []struct{ name, addr string }{{"server.listen", c.Listen}, {"server.admin_listen", c.AdminListen}} {
		if key.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(key.addr); err != nil {
			return fmt.Errorf("%s: %q is not host:port", key.name, key.addr)
		}
	}
	if _, err := ParsePrefixes(c.TrustedProxies); err != nil {
		return err
	}
	return nil
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
