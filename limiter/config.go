package limiter

import (
	"errors"
	"fmt"
	"time"
)

// Defaults and bounds of a [Config].
const (
	// DefaultWindow is the Window used when Config.Window is zero.
	DefaultWindow = time.Minute
	// MinWindow is the shortest Window allowed when Rate is set.
	MinWindow = time.Second
	// MaxWindow is the longest Window allowed; per-key timestamps are 32-bit
	// microsecond offsets, which span about 71 minutes.
	MaxWindow = time.Hour
	// MaxRate is the largest Rate, and the largest Burst, allowed. A key
	// holds up to this many timestamps of 4 bytes each.
	MaxRate = 100_000
	// BurstWindow is the length of the interval that Burst applies to.
	BurstWindow = time.Second
	// Resolution is the granularity of stored timestamps; they are rounded
	// up to it, so a slot may free up to this much later than exact.
	Resolution = time.Microsecond
	// DefaultMaxKeys is the most keys a Limiter holds when Config.MaxKeys
	// is zero: about 25 MB for keys of one request each, up to 4 bytes
	// more a key per request its window holds.
	DefaultMaxKeys = 250_000
)

// Modes of a limit, as in [Config.Mode]. The limiter itself always
// decides; the mode tells its caller what to do with a refusal.
const (
	// ModeEnforce refuses what the limit refuses: the default.
	ModeEnforce = "enforce"
	// ModeShadow lets a request the limit refuses pass, and counts the
	// would-be refusal. A refusal records nothing in either mode.
	ModeShadow = "shadow"
)

// ErrInvalidConfig is wrapped by every error that [Config.Validate] returns.
var ErrInvalidConfig = errors.New("limiter: invalid config")

// Config is one [limits.*] section of config.toml, for example [limits.user].
// A zero field means its documented default.
type Config struct {
	// Rate is the most requests admitted in any interval of length Window,
	// per key. 0 switches the rate limit off. At most MaxRate.
	Rate int `koanf:"rate"`
	// Window is the length of the sliding window for Rate. 0 means
	// DefaultWindow (1m). At most MaxWindow (1h), and at least MinWindow
	// (1s) when Rate is set.
	Window time.Duration `koanf:"window"`
	// Burst is the most requests admitted in any one-second interval, per
	// key. 0 switches the burst limit off. At most MaxRate.
	Burst int `koanf:"burst"`
	// Mode is ModeEnforce or ModeShadow (a refusal is counted and the
	// request passes). Empty means ModeEnforce. The limiter ignores it:
	// its caller applies it.
	Mode string `koanf:"mode"`
	// MaxKeys bounds the keys held at once (users, or client IPs where
	// there is no user), so that a flood of distinct clients cannot grow
	// memory without end. 0 means DefaultMaxKeys (250,000). The bound
	// holds per shard (MaxKeys/64 each): a new key in a full shard
	// displaces an idle key if one of a few it samples is, else the
	// sampled key whose newest request is oldest. A displaced key that
	// comes back starts a fresh window: the limit fails open for the
	// longest quiet of the keys, as a defense layer does, rather than
	// refuse every newcomer.
	MaxKeys int `koanf:"max_keys"`
}

// Shadow reports whether c is in shadow mode.
func (c Config) Shadow() bool { return c.Mode == ModeShadow }

// ValidMode checks a mode value of key: "", ModeEnforce or ModeShadow.
func ValidMode(key, mode string) error {
	if mode == "" || mode == ModeEnforce || mode == ModeShadow {
		return nil
	}
	return fmt.Errorf("%w: %s must be %q or %q, got %q", ErrInvalidConfig, key, ModeEnforce, ModeShadow, mode)
}

// WithDefaults returns c with every zero field that has a default set to it.
func (c Config) WithDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Mode == "" {
		c.Mode = ModeEnforce
	}
	return c
}

// Validate reports every problem in c, each naming its field as
// prefix+".rate", prefix+".window" or prefix+".burst" (the bare field name
// when prefix is empty). A zero Window is valid: it means DefaultWindow. The
// error wraps [ErrInvalidConfig]; nil means c is usable.
func (c Config) Validate(prefix string) error {
	name := func(field string) string {
		if prefix == "" {
			return field
		}
		return prefix + "." + field
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s %s", ErrInvalidConfig, name(field), fmt.Sprintf(format, args...)))
	}
	switch {
	case c.Rate < 0:
		bad("rate", "must not be negative, got %d", c.Rate)
	case c.Rate > MaxRate:
		bad("rate", "must be at most %d, got %d", MaxRate, c.Rate)
	}
	switch {
	case c.Burst < 0:
		bad("burst", "must not be negative, got %d", c.Burst)
	case c.Burst > MaxRate:
		bad("burst", "must be at most %d, got %d", MaxRate, c.Burst)
	}
	w := c.WithDefaults().Window
	switch {
	case w < 0:
		bad("window", "must not be negative, got %s", w)
	case w > MaxWindow:
		bad("window", "must be at most %s, got %s", MaxWindow, w)
	case c.Rate > 0 && w < MinWindow:
		bad("window", "must be at least %s when rate is set, got %s", MinWindow, w)
	}
	if c.MaxKeys < 0 {
		bad("max_keys", "must not be negative, got %d", c.MaxKeys)
	}
	if err := ValidMode(name("mode"), c.Mode); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
