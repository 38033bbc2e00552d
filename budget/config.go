package budget

import (
	"errors"
	"fmt"
	"math"
	"time"
	_ "time/tzdata" // time zones work on minimal systems without /usr/share/zoneinfo
)

// Defaults of [Config]: what a key left out of config.toml means. Only an
// explicit 0 switches a ceiling off.
const (
	// DefaultTimezone is the time zone in which days and months are
	// counted when [budget] timezone is not set.
	DefaultTimezone = "UTC"
	// DefaultDailyRequests is the service-wide ceiling on upstream calls
	// per day.
	DefaultDailyRequests = 5000
	// DefaultDailyUSD is the service-wide ceiling on money per day.
	DefaultDailyUSD = 10.0
	// DefaultMonthlyUSD is the service-wide ceiling on money per month.
	DefaultMonthlyUSD = 100.0
	// MinDefaultDailyAttempts is the least daily line a plan without
	// daily_attempts gets; see [DefaultDailyAttempts].
	MinDefaultDailyAttempts = 10
)

// DefaultConfig is the [budget] section of a config.toml that leaves every
// key out. Decode config.toml over it, so that an absent key keeps its
// default and only an explicit 0 switches a ceiling off.
func DefaultConfig() Config {
	return Config{
		Timezone:      DefaultTimezone,
		DailyRequests: DefaultDailyRequests,
		DailyUSD:      DefaultDailyUSD,
		MonthlyUSD:    DefaultMonthlyUSD,
	}
}

// DefaultDailyAttempts is the daily abuse line of a plan whose
// [plans.NAME] section leaves daily_attempts out: half its monthly quota,
// and at least MinDefaultDailyAttempts. A user may then spend half a
// month's reads in one day, but no key can make unbounded calls.
func DefaultDailyAttempts(monthlyQuota int64) int64 {
	return max(monthlyQuota/2, MinDefaultDailyAttempts)
}

// Config is the [budget] section of config.toml.
type Config struct {
	// Timezone is the IANA name of the zone whose midnight starts a new day
	// and whose first of the month starts a new quota month. Default "UTC".
	Timezone string `koanf:"timezone"`
	// DailyRequests is the most upstream calls per day, whole service,
	// retries included. Default DefaultDailyRequests (5000); an explicit
	// 0 switches this ceiling off.
	DailyRequests int64 `koanf:"daily_requests"`
	// DailyUSD is the most money per day, in US dollars, whole service,
	// counting each call at its worst case until its actual cost is known.
	// Default DefaultDailyUSD ($10); an explicit 0 switches this ceiling
	// off.
	DailyUSD float64 `koanf:"daily_usd"`
	// MonthlyUSD is the most money per calendar month, the app-side mirror
	// of the provider's own spend cap. Default DefaultMonthlyUSD ($100);
	// an explicit 0 switches this ceiling off.
	MonthlyUSD float64 `koanf:"monthly_usd"`
	// SoftDailyRequests, SoftDailyUSD and SoftMonthlyUSD are the soft
	// ceilings: above one, reads go to ocr.fallback_model instead of the
	// primary model (degraded mode), and the hard ceilings above still
	// refuse. They are opt-in: 0, the default, switches each off. A soft
	// ceiling must stay below its hard ceiling when that is on.
	SoftDailyRequests int64   `koanf:"soft_daily_requests"`
	SoftDailyUSD      float64 `koanf:"soft_daily_usd"`
	SoftMonthlyUSD    float64 `koanf:"soft_monthly_usd"`
}

// HasSoft reports whether any soft ceiling is on.
func (c Config) HasSoft() bool {
	return c.SoftDailyRequests > 0 || c.SoftDailyUSD > 0 || c.SoftMonthlyUSD > 0
}

// WithDefaults returns c with an empty Timezone set to DefaultTimezone. The
// ceilings are left as they are, since 0 is a setting ("off"): take
// [DefaultConfig] as the starting point instead.
func (c Config) WithDefaults() Config {
	if c.Timezone == "" {
		c.Timezone = DefaultTimezone
	}
	return c
}

// Validate reports the first invalid setting, naming its key.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.Location(); err != nil {
		errs = append(errs, err)
	}
	if c.DailyRequests < 0 {
		errs = append(errs, fmt.Errorf("budget.daily_requests: must not be negative, got %d", c.DailyRequests))
	}
	if c.SoftDailyRequests < 0 {
		errs = append(errs, fmt.Errorf("budget.soft_daily_requests: must not be negative, got %d", c.SoftDailyRequests))
	}
	for _, f := range []struct {
		key string
		usd float64
	}{{"budget.daily_usd", c.DailyUSD}, {"budget.monthly_usd", c.MonthlyUSD},
		{"budget.soft_daily_usd", c.SoftDailyUSD}, {"budget.soft_monthly_usd", c.SoftMonthlyUSD}} {
		if f.usd < 0 || math.IsNaN(f.usd) || f.usd > 1e9 {
			errs = append(errs, fmt.Errorf("%s: must be between 0 and 1e9 dollars, got %v", f.key, f.usd))
		}
	}
	return errors.Join(append(errs, c.validateSoft()...)...)
}

// validateSoft refuses a soft ceiling at or above its hard ceiling: it
// would never switch to the fallback model before the brake refuses.
func (c Config) validateSoft() []error {
	var errs []error
	if c.SoftDailyRequests > 0 && c.DailyRequests > 0 && c.SoftDailyRequests >= c.DailyRequests {
		errs = append(errs, fmt.Errorf("budget.soft_daily_requests: must be below budget.daily_requests (%d), got %d",
			c.DailyRequests, c.SoftDailyRequests))
	}
	for _, f := range []struct {
		key, hardKey string
		soft, hard   float64
	}{{"budget.soft_daily_usd", "budget.daily_usd", c.SoftDailyUSD, c.DailyUSD},
		{"budget.soft_monthly_usd", "budget.monthly_usd", c.SoftMonthlyUSD, c.MonthlyUSD}} {
		if f.soft > 0 && f.hard > 0 && f.soft >= f.hard {
			errs = append(errs, fmt.Errorf("%s: must be below %s ($%g), got $%g", f.key, f.hardKey, f.hard, f.soft))
		}
	}
	return errs
}

// Location loads the configured time zone.
func (c Config) Location() (*time.Location, error) {
	loc, err := time.LoadLocation(c.WithDefaults().Timezone)
	if err != nil {
		return nil, fmt.Errorf("budget.timezone: unknown time zone %q", c.Timezone)
	}
	return loc, nil
}

// Plan is one [plans.NAME] section: what a user on that plan may use.
type Plan struct {
	// MonthlyQuota is the number of successful reads per calendar month,
	// the figure users see in every response. Must be at least 1.
	MonthlyQuota int64 `koanf:"monthly_quota"`
	// DailyAttempts is the daily abuse line: the most requests per day that
	// reach the upstream, success or failure. Never shown to users. Left
	// out of config.toml it is [DefaultDailyAttempts] of MonthlyQuota; an
	// explicit 0 means no line.
	DailyAttempts int64 `koanf:"daily_attempts"`
	// DailyMode is "enforce" (the default) or "shadow": a request over the
	// daily line is counted as a would-be refusal and goes on. The
	// monthly quota has no mode: it is what the user paid for.
	DailyMode string `koanf:"daily_mode"`
	// Model is which model reads for the plan's users: "auto" (the
	// default, also when left out) reads with the primary model and with
	// ocr.fallback_model above a soft ceiling; "primary" always reads with
	// the primary model (refused at the hard ceilings only); "fallback"
	// always reads with ocr.fallback_model.
	Model string `koanf:"model"`
}

// Plan.Model values.
const (
	PlanModelAuto     = "auto"
	PlanModelPrimary  = "primary"
	PlanModelFallback = "fallback"
)

// ShadowDaily reports whether the plan's daily line is in shadow mode.
func (p Plan) ShadowDaily() bool { return p.DailyMode == "shadow" }

// ValidatePlans reports the first invalid plan, naming its key. At least one
// plan must exist, since every API key belongs to a plan.
func ValidatePlans(plans map[string]Plan) error {
	if len(plans) == 0 {
		return fmt.Errorf("plans: no [plans.NAME] section; define at least one plan")
	}
	for name, p := range plans {
		if name == "" {
			return fmt.Errorf("plans: a plan needs a name")
		}
		if p.MonthlyQuota < 1 {
			return fmt.Errorf("plans.%s.monthly_quota: must be at least 1, got %d", name, p.MonthlyQuota)
		}
		if p.DailyAttempts < 0 {
			return fmt.Errorf("plans.%s.daily_attempts: must not be negative, got %d", name, p.DailyAttempts)
		}
		if m := p.DailyMode; m != "" && m != "enforce" && m != "shadow" {
			return fmt.Errorf("plans.%s.daily_mode: must be \"enforce\" or \"shadow\", got %q", name, m)
		}
		if m := p.Model; m != "" && m != PlanModelAuto && m != PlanModelPrimary && m != PlanModelFallback {
			return fmt.Errorf("plans.%s.model: must be \"auto\", \"primary\" or \"fallback\", got %q", name, m)
		}
	}
	return nil
}

// MonthKey names the calendar month of t in loc, as "2006-01".
func MonthKey(t time.Time, loc *time.Location) string {
	return t.In(loc).Format("2006-01")
}

// DayKey names the calendar day of t in loc, as "2006-01-02".
func DayKey(t time.Time, loc *time.Location) string {
	return t.In(loc).Format("2006-01-02")
}

// nextMonth is the first instant of the month after the one holding t, in loc.
func nextMonth(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month()+1, 1, 0, 0, 0, 0, loc)
}
