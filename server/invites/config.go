package invites

import (
	"errors"
	"fmt"
	"time"

	"breakwater/limiter"
)

// Defaults for Config.
const (
	DefaultRate              = 50
	DefaultWindow            = 10 * time.Minute
	DefaultBurst             = 3
	DefaultGlobalFailPerHour = 1000
)

// Config is the [invites] section of config.toml: the protections of
// POST /v1/invites/verify. A zero field means its default; none of them can
// be switched off, since this endpoint is the first thing a guessing bot
// meets. Loosen one by raising it.
type Config struct {
	// Rate is the most verifications per client IP (IPv6: per /64) in any
	// interval of length Window. Default 50.
	Rate int `koanf:"rate"`
	// Window is the rate limit's sliding window, 1s to 1h. Default 10m.
	Window time.Duration `koanf:"window"`
	// Burst is the most verifications per client IP in any one second.
	// Default 3.
	Burst int `koanf:"burst"`
	// FailLimit is how many consecutive failures (invalid, expired,
	// used-up or revoked code), per client IP and per e-mail, start a
	// cooldown. Default 5.
	FailLimit int `koanf:"fail_limit"`
	// FailWindow is the most time between an attempt and the next failure
	// for the failure to extend the run. Default 10m.
	FailWindow time.Duration `koanf:"fail_window"`
	// Cooldown is how long every attempt on a key is refused, the right
	// code too, once FailLimit is reached. Default 10m.
	Cooldown time.Duration `koanf:"cooldown"`
	// Backoff doubles a cooldown that starts within 24h of the end of the
	// previous one on the same key, up to MaxCooldown. Default false.
	Backoff bool `koanf:"backoff"`
	// MaxCooldown caps a doubled cooldown. Default 24h.
	MaxCooldown time.Duration `koanf:"max_cooldown"`
	// ResetOnSuccess makes a new redemption clear the failure run; false
	// takes one failure off instead. A repeat of an e-mail's redemption does
	// neither. Default true.
	ResetOnSuccess *bool `koanf:"reset_on_success"`
	// GlobalFailPerHour is the most failures service-wide in the last hour
	// (counted in whole minutes); past it every verification is refused
	// and an alert is raised. Default 1000.
	GlobalFailPerHour int `koanf:"global_fail_per_hour"`
	// Mode is "enforce" (the default) or "shadow": every protection above
	// decides as usual, but a verification it would refuse is counted
	// (breakwater_shadow_refusals_total{layer="invites"}) and goes on. A
	// refusal counts nothing in either mode.
	Mode string `koanf:"mode"`
}

// Shadow reports whether the protections are in shadow mode.
func (c Config) Shadow() bool { return c.Mode == limiter.ModeShadow }

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.ResetOnSuccess == nil {
		reset := true
		c.ResetOnSuccess = &reset
	}
	if c.GlobalFailPerHour == 0 {
		c.GlobalFailPerHour = DefaultGlobalFailPerHour
	}
	if c.Mode == "" {
		c.Mode = limiter.ModeEnforce
	}
	f := c.Fail()
	c.FailLimit, c.FailWindow, c.Cooldown, c.MaxCooldown = f.Limit, f.Window, f.Cooldown, f.MaxCooldown
	return c
}

// Limits is the IP rate limit in the limiter's terms.
func (c Config) Limits() limiter.Config {
	return limiter.Config{Rate: c.Rate, Window: c.Window, Burst: c.Burst}
}

// Fail is the fail limit in the limiter's terms, with its defaults.
func (c Config) Fail() limiter.FailConfig {
	return limiter.FailConfig{
		Limit: c.FailLimit, Window: c.FailWindow, Cooldown: c.Cooldown, Backoff: c.Backoff,
		MaxCooldown: c.MaxCooldown, Decay: c.ResetOnSuccess != nil && !*c.ResetOnSuccess,
		GlobalPerHour: c.GlobalFailPerHour,
	}.WithDefaults()
}

// Validate reports every invalid setting, naming its key.
func (c Config) Validate() error {
	var errs []error
	if err := c.Limits().Validate("invites"); err != nil {
		errs = append(errs, err)
	}
	neg := func(key string, bad bool) {
		if bad {
			errs = append(errs, fmt.Errorf("invites.%s: must not be negative", key))
		}
	}
	neg("fail_limit", c.FailLimit < 0)
	neg("fail_window", c.FailWindow < 0)
	neg("cooldown", c.Cooldown < 0)
	neg("max_cooldown", c.MaxCooldown < 0)
	neg("global_fail_per_hour", c.GlobalFailPerHour < 0)
	if err := limiter.ValidMode("invites.mode", c.Mode); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if f := c.Fail(); f.MaxCooldown < f.Cooldown {
			errs = append(errs, fmt.Errorf("invites.max_cooldown: %s is shorter than invites.cooldown %s", f.MaxCooldown, f.Cooldown))
		}
	}
	return errors.Join(errs...)
}
