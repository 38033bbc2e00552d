package detect

import (
	"errors"
	"fmt"
	"math"
	"net/mail"
	"net/url"
	"regexp"
	"slices"
	"time"
)

// Defaults for Config.
const (
	DefaultRunAt           = "00:15"
	DefaultGreyRatio       = 0.8
	DefaultGreyDays        = 3
	DefaultFailRatio       = 0.5
	DefaultMinAttempts     = 20
	DefaultSpikeFactor     = 5.0
	DefaultSpikeFloor      = 20
	DefaultIPUsers         = 5
	DefaultInviteCooldowns = 3
	DefaultBudgetWarnRatio = 0.8
	DefaultMaxKeys         = 5000
)

// Config is the [detect] section of config.toml: when the daily run starts
// and the detectors' thresholds. A zero field means its default. The
// thresholds are secret: never shown by a public endpoint or an error.
type Config struct {
	// RunAt is when the daily run starts, "HH:MM" in budget.timezone; it
	// aggregates the day before. Default "00:15".
	RunAt string `koanf:"run_at"`
	// GreyRatio: a user whose attempts reach this share of their daily
	// line on a day was in the grey zone that day. Default 0.8.
	GreyRatio float64 `koanf:"grey_ratio"`
	// GreyDays: grey zone on at least this many of the last 7 days is a
	// finding. Default 3; 1 to 7.
	GreyDays int `koanf:"grey_days"`
	// FailRatio: a user whose failed share of a day's attempts is at least
	// this is a finding... Default 0.5.
	FailRatio float64 `koanf:"fail_ratio"`
	// MinAttempts: ...if they made at least this many attempts. Default 20.
	MinAttempts int64 `koanf:"min_attempts"`
	// SpikeFactor: a user whose attempts are at least this many times
	// their trailing 7-day median is a finding. Default 5.
	SpikeFactor float64 `koanf:"spike_factor"`
	// SpikeFloor is the least median the spike detector uses, so a new user
	// (median 0) is not flagged for a handful of attempts. Default 20.
	SpikeFloor int64 `koanf:"spike_floor"`
	// IPUsers: one IP used by at least this many distinct users in a day is
	// a finding (account farms). Default 5.
	IPUsers int64 `koanf:"ip_users"`
	// InviteCooldowns: an IP or e-mail with at least this many invite
	// cooldowns in a day is a finding. Default 3.
	InviteCooldowns int64 `koanf:"invite_cooldowns"`
	// BudgetWarnRatio: the day's spend or calls (or the month's spend) at
	// or above this share of a global budget ceiling is a finding.
	// Default 0.8.
	BudgetWarnRatio float64 `koanf:"budget_warn_ratio"`
	// MaxKeys is the most client IPs (IPv6: /64s) and the most submitted
	// invite e-mails one day's aggregate keeps, each: whoever sends the
	// requests chooses them, so their number must not decide the memory
	// of a run or the size of the stored day. The heaviest are kept and
	// the rest summed under "other". Default 5000.
	MaxKeys int `koanf:"max_keys"`
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.RunAt == "" {
		c.RunAt = DefaultRunAt
	}
	setF := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	setI := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	setF(&c.GreyRatio, DefaultGreyRatio)
	if c.GreyDays == 0 {
		c.GreyDays = DefaultGreyDays
	}
	setF(&c.FailRatio, DefaultFailRatio)
	setI(&c.MinAttempts, DefaultMinAttempts)
	setF(&c.SpikeFactor, DefaultSpikeFactor)
	setI(&c.SpikeFloor, DefaultSpikeFloor)
	setI(&c.IPUsers, DefaultIPUsers)
	setI(&c.InviteCooldowns, DefaultInviteCooldowns)
	setF(&c.BudgetWarnRatio, DefaultBudgetWarnRatio)
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	return c
}

// Validate reports every invalid setting, naming its key. Zero fields are
// valid: they mean the defaults.
func (c Config) Validate() error {
	var errs []error
	if c.RunAt != "" {
		if _, _, err := parseClock(c.RunAt); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range []struct {
		key string
		v   float64
	}{{"detect.grey_ratio", c.GreyRatio}, {"detect.fail_ratio", c.FailRatio}, {"detect.budget_warn_ratio", c.BudgetWarnRatio}} {
		if r.v < 0 || r.v > 1 || r.v != r.v {
			errs = append(errs, fmt.Errorf("%s: must be between 0 and 1, got %v", r.key, r.v))
		}
	}
	if c.GreyDays < 0 || c.GreyDays > 7 {
		errs = append(errs, fmt.Errorf("detect.grey_days: must be between 1 and 7, got %d", c.GreyDays))
	}
	if c.MaxKeys < 0 {
		errs = append(errs, fmt.Errorf("detect.max_keys: must not be negative, got %d", c.MaxKeys))
	}
	if c.SpikeFactor != 0 && !(c.SpikeFactor > 1) {
		errs = append(errs, fmt.Errorf("detect.spike_factor: must be more than 1, got %v", c.SpikeFactor))
	}
	for _, n := range []struct {
		key string
		v   int64
	}{{"detect.min_attempts", c.MinAttempts}, {"detect.spike_floor", c.SpikeFloor}, {"detect.ip_users", c.IPUsers}, {"detect.invite_cooldowns", c.InviteCooldowns}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %d", n.key, n.v))
		}
	}
	return errors.Join(errs...)
}

// parseClock reads "HH:MM".
func parseClock(s string) (hour, minute int, err error) {
	t, err := time.Parse("15:04", s)
	if err != nil || t.Format("15:04") != s {
		return 0, 0, fmt.Errorf("detect.run_at: %q is not a time of day \"HH:MM\"", s)
	}
	return t.Hour(), t.Minute(), nil
}

// Defaults for AlertsConfig.
const (
	DefaultTLS         = "starttls"
	DefaultMinInterval = time.Hour
)

// DefaultWarnAt are the shares of each global budget ceiling whose first
// crossing, each day (each month for monthly_usd), raises an early
// warning: [alerts] warn_at left out.
var DefaultWarnAt = []float64{0.5, 0.8, 0.95}

// Webhook formats.
const (
	FormatSlack = "slack" // {"text": ...}: Slack, Mattermost, Discord's /slack endpoint
	FormatNtfy  = "ntfy"  // plain-text body, Title and Priority headers: ntfy.sh or a server of one's own
	FormatJSON  = "json"  // the documented JSON body of a Notice
)

// WebhookConfig is one [[alerts.webhook]] entry: a channel that gets
// every immediate alert, beside mail or instead of it. The URL and the
// secret are secrets, so config.toml names the environment variables that
// hold them.
type WebhookConfig struct {
	// Format is "slack", "ntfy" or "json". Required.
	Format string `koanf:"format"`
	// URLEnv is the name of the environment variable that holds the URL
	// (http or https). Required.
	URLEnv string `koanf:"url_env"`
	// SecretEnv, when set, is the name of the environment variable that
	// holds the secret of the X-Breakwater-Signature header, an
	// HMAC-SHA256 over the body. Optional.
	SecretEnv string `koanf:"secret_env"`
}

// AlertsConfig is the [alerts] section of config.toml: the early warnings
// and where immediate alerts go (mail, webhooks, or both). Alerts are
// always logged at WARN. Mail is on when smtp_host is set; the SMTP
// password comes only from the environment (BREAKWATER_SMTP_PASSWORD).
type AlertsConfig struct {
	// SMTPHost is the mail server's host name; empty: no mail (webhooks
	// may still be on).
	SMTPHost string `koanf:"smtp_host"`
	// SMTPPort is the mail server's port. Default 587 for "starttls", 465
	// for "tls", 25 for "none".
	SMTPPort int `koanf:"smtp_port"`
	// SMTPUsername is the login; empty means no authentication.
	SMTPUsername string `koanf:"smtp_username"`
	// From is the sender address. Required with smtp_host.
	From string `koanf:"from"`
	// To lists the recipients. At least one with smtp_host.
	To []string `koanf:"to"`
	// TLS is "starttls" (default: upgrade a plain connection, and refuse
	// to go on without TLS), "tls" (TLS from the first byte), or "none"
	// (plain text, for a relay on the same machine).
	TLS string `koanf:"tls"`
	// MinInterval is the least time between two alerts of one kind; a new
	// day (budget.timezone) re-arms every kind. Default 1h. Early
	// warnings are sent once per share and period instead.
	MinInterval time.Duration `koanf:"min_interval"`
	// WarnAt are the shares (between 0 and 1, whole percents) of each
	// global budget ceiling whose first crossing each day (month, for
	// monthly_usd) raises an early warning. Left out: DefaultWarnAt;
	// an explicit empty list switches early warnings off.
	WarnAt []float64 `koanf:"warn_at"`
	// DashboardURL is the link alerts give to the dashboard (the admin
	// listener's /admin/dashboard as the operator reaches it); empty: no
	// link.
	DashboardURL string `koanf:"dashboard_url"`
	// Webhooks are the [[alerts.webhook]] entries.
	Webhooks []WebhookConfig `koanf:"webhook"`
}

// MailOn reports whether the section sends mail: smtp_host is set.
func (c AlertsConfig) MailOn() bool { return c.SMTPHost != "" }

// WithDefaults returns c with every zero field set to its default.
func (c AlertsConfig) WithDefaults() AlertsConfig {
	if c.TLS == "" {
		c.TLS = DefaultTLS
	}
	if c.SMTPPort == 0 {
		switch c.TLS {
		case "tls":
			c.SMTPPort = 465
		case "none":
			c.SMTPPort = 25
		default:
			c.SMTPPort = 587
		}
	}
	if c.MinInterval == 0 {
		c.MinInterval = DefaultMinInterval
	}
	if c.WarnAt == nil {
		c.WarnAt = slices.Clone(DefaultWarnAt)
	}
	return c
}

// Validate reports every invalid setting, naming its key.
func (c AlertsConfig) Validate() error {
	var errs []error
	if c.MailOn() {
		errs = append(errs, c.validateMail()...)
	} else if c.From != "" || len(c.To) > 0 || c.SMTPUsername != "" {
		errs = append(errs, errors.New("alerts.smtp_host: required when from, to or smtp_username are set"))
	}
	if c.MinInterval < 0 {
		errs = append(errs, fmt.Errorf("alerts.min_interval: must not be negative, got %s", c.MinInterval))
	}
	seen := map[int]bool{}
	for _, s := range c.WarnAt {
		pct := sharePercent(s)
		if !(s > 0 && s < 1) || math.Abs(s*100-float64(pct)) > 1e-9 || pct < 1 || pct > 99 {
			errs = append(errs, fmt.Errorf("alerts.warn_at: %v is not a whole percent between 0.01 and 0.99", s))
		} else if seen[pct] {
			errs = append(errs, fmt.Errorf("alerts.warn_at: %v is listed twice", s))
		}
		seen[pct] = true
	}
	if c.DashboardURL != "" {
		if u, err := url.Parse(c.DashboardURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("alerts.dashboard_url: %q is not an http or https URL", c.DashboardURL))
		}
	}
	for i, w := range c.Webhooks {
		errs = append(errs, w.validate(i)...)
	}
	return errors.Join(errs...)
}

// sharePercent is a share of warn_at in whole percents.
func sharePercent(s float64) int { return int(math.Round(s * 100)) }

func (c AlertsConfig) validateMail() []error {
	var errs []error
	if c.SMTPPort < 0 || c.SMTPPort > 65535 {
		errs = append(errs, fmt.Errorf("alerts.smtp_port: %d is not a port", c.SMTPPort))
	}
	if _, err := mail.ParseAddress(c.From); err != nil {
		errs = append(errs, fmt.Errorf("alerts.from: %q is not an e-mail address", c.From))
	}
	if len(c.To) == 0 {
		errs = append(errs, errors.New("alerts.to: list at least one recipient"))
	}
	for _, to := range c.To {
		if _, err := mail.ParseAddress(to); err != nil {
			errs = append(errs, fmt.Errorf("alerts.to: %q is not an e-mail address", to))
		}
	}
	switch c.TLS {
	case "", "starttls", "tls", "none":
	default:
		errs = append(errs, fmt.Errorf("alerts.tls: %q is not \"starttls\", \"tls\" or \"none\"", c.TLS))
	}
	return errs
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

func (w WebhookConfig) validate(i int) []error {
	var errs []error
	key := fmt.Sprintf("alerts.webhook[%d]", i+1)
	switch w.Format {
	case FormatSlack, FormatNtfy, FormatJSON:
	default:
		errs = append(errs, fmt.Errorf("%s.format: %q is not \"slack\", \"ntfy\" or \"json\"", key, w.Format))
	}
	if !envName.MatchString(w.URLEnv) {
		errs = append(errs, fmt.Errorf("%s.url_env: %q is not the name of an environment variable", key, w.URLEnv))
	}
	if w.SecretEnv != "" && !envName.MatchString(w.SecretEnv) {
		errs = append(errs, fmt.Errorf("%s.secret_env: %q is not the name of an environment variable", key, w.SecretEnv))
	}
	return errs
}
