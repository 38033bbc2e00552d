package app

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/toml/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	gotoml "github.com/pelletier/go-toml/v2"

	"breakwater/budget"
	"breakwater/budget/reconcile"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/server/api"
	"breakwater/server/edge"
	"breakwater/server/invites"
	"breakwater/server/jwtauth"
	"breakwater/server/routes"
	"breakwater/storage"
)

// envPrefix starts every environment variable that overrides a key.
const envPrefix = "BREAKWATER_"

// Config is config.toml. Each package owns its section's struct, defaults
// and validation.
type Config struct {
	Server  edge.Config            `koanf:"server"`
	Storage storage.Config         `koanf:"storage"`
	OCR     ocr.Config             `koanf:"ocr"`
	Budget  budget.Config          `koanf:"budget"`
	Plans   map[string]budget.Plan `koanf:"plans"`
	Limits  struct {
		User limiter.Config `koanf:"user"`
	} `koanf:"limits"`
	Auth struct {
		JWT jwtauth.Config `koanf:"jwt"`
	} `koanf:"auth"`
	Invites invites.Config `koanf:"invites"`
	Detect  detect.Config  `koanf:"detect"`
	// Reconcile is how the ledger is checked against Google's bill.
	Reconcile reconcile.Config `koanf:"reconcile"`
	// Alerts is nil when config.toml has no [alerts] section: mail and
	// webhooks are off, alerts are only logged, and the early warnings
	// take their defaults (see AlertSettings).
	Alerts *detect.AlertsConfig `koanf:"alerts"`
	// Routes are the app's own routes that Breakwater guards.
	Routes []routes.Config `koanf:"routes"`

	// warnings are what Read noticed that is not an error; see Warnings.
	warnings []string
	// explicit holds the keys the file or the environment set, as
	// opposed to those left to their defaults; see LostCeilings.
	explicit map[string]bool
}

// Warnings are what reading the config noticed that is not an error but
// is probably a mistake, for serve and config check to show.
func (c Config) Warnings() []string { return c.warnings }

// Today is now's day in budget.timezone, "2006-01-02": the day whose
// prices a call made now is counted at.
func (c Config) Today(now time.Time) string {
	loc, err := c.Budget.Location()
	if err != nil {
		loc = time.UTC // Load refuses a zone it cannot load
	}
	return now.In(loc).Format("2006-01-02")
}

// secretVars are the environment variables with the prefix that are not
// key overrides.
var secretVars = map[string]bool{
	"BREAKWATER_ADMIN_TOKEN": true, "BREAKWATER_SMTP_PASSWORD": true, "BREAKWATER_POSTGRES_URL": true, "BREAKWATER_SECRET": true,
}

// Load reads path (which must exist), applies
// BREAKWATER_SECTION__KEY overrides from the environment, and checks every
// value. An unknown key is an error that names it: a typo must never switch
// a limit off silently.
func Load(path string, getenv func(string) string) (Config, error) {
	return loadData(path, nil, getenv)
}

// Read parses path and the environment overrides into a config with
// defaults applied, without validating values. A missing file is an error
// unless optional.
func Read(path string, getenv func(string) string, optional bool) (Config, error) {
	return read(path, nil, getenv, optional, nil)
}

// loadData is Load of data, the content of the file at path as the
// caller read it: what a reload checked for being settled is what it
// applies.
func loadData(path string, data []byte, getenv func(string) string) (Config, error) {
	c, err := read(path, data, getenv, false, nil)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// read is Read, of data when it is not nil (path then only names the
// file and its folder). With lenient set, what Read refuses in a single key (an
// unknown key, a value that does not decode, an override that names no
// key) is left out instead, and *lenient says which and why.
func read(path string, data []byte, getenv func(string) string, optional bool, lenient *[]string) (Config, error) {
	// refuse is an error, or with lenient a warning that key is left out.
	refuse := func(err error) error {
		if lenient == nil {
			return err
		}
		*lenient = append(*lenient, err.Error()+": left out")
		return nil
	}
	k := koanf.New(".")
	// A relative storage.path is taken from the config file's folder, so
	// an operator command run from elsewhere finds the same database.
	base := "."
	if data != nil {
		if err := k.Load(bytesProvider(data), toml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, syntaxError(err))
		}
		base = filepath.Dir(path)
	} else if _, err := os.Stat(path); err == nil {
		if err := k.Load(file.Provider(path), toml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, syntaxError(err))
		}
		base = filepath.Dir(path)
	} else if !optional {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}

	known := configKeys(reflect.TypeFor[Config](), "", k)
	if err := moneyModes(k.Keys()); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	for _, key := range k.Keys() {
		if m, ok := k.Get(key).(map[string]any); ok && len(m) == 0 {
			continue // an empty section such as [alerts]; the decoder refuses an unknown one
		}
		if _, ok := known[key]; !ok {
			if err := refuse(fmt.Errorf("config %s: unknown key %q", path, key)); err != nil {
				return Config{}, err
			}
			k.Delete(key)
		}
	}
	warnings, err := readEnv(k, known, path, getenv, refuse)
	if err != nil {
		return Config{}, err
	}
	if lenient != nil {
		// Each value on its own: one that does not decode is left out,
		// so the rest of the file still applies.
		for _, key := range k.Keys() {
			one := koanf.New(".")
			if err := one.Set(key, k.Get(key)); err != nil {
				continue
			}
			probe := defaults()
			if err := decode(one, &probe); err != nil {
				refuse(fmt.Errorf("config %s: %s", path, cleanDecodeError(err)))
				k.Delete(key)
			}
		}
	}

	// Decoded over the defaults: a key left out keeps its documented
	// default, and only an explicit 0 switches a limit off.
	c := defaults()
	if err := decode(k, &c); err != nil {
		return Config{}, fmt.Errorf("config %s: %s", path, cleanDecodeError(err))
	}
	for name, p := range c.Plans {
		if !k.Exists("plans." + name + ".daily_attempts") {
			p.DailyAttempts = budget.DefaultDailyAttempts(p.MonthlyQuota)
			c.Plans[name] = p
		}
	}
	c.warnings = warnings
	c.explicit = make(map[string]bool, len(k.Keys()))
	for _, key := range k.Keys() {
		c.explicit[key] = true
	}
	if err := c.finish(path, base); err != nil {
		return Config{}, err
	}
	c.warnings = append(c.warnings, c.Server.Warnings()...)
	return c, nil
}

// syntaxError adds to a TOML syntax error the line and column it was
// found at, which the parser's own message leaves out.
func syntaxError(err error) error {
	var de *gotoml.DecodeError
	if !errors.As(err, &de) {
		return err
	}
	row, col := de.Position()
	return fmt.Errorf("line %d, column %d: %w", row, col, err)
}

// decode decodes k over c strictly: every key must land in a field, and
// strictValues refuses what mapstructure would quietly bend.
func decode(k *koanf.Koanf, c *Config) error {
	return k.UnmarshalWithConf("", c, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook:  strictValues,
		ErrorUnused: true,
		TagName:     "koanf",
		Result:      c,
	}})
}

// LoadForOperator is Load for the operator's commands (brake, keys,
// users, usage, budget, invites, backup, detect, ...), which must work
// when a typo elsewhere in the file would stop serve: the emergency brake
// cannot wait for the file to be fixed. It is Load when the file is
// valid. Otherwise each key that Load refuses is left out (a bad value
// keeps its default, a section that fails its check takes its defaults),
// and the warnings name every key left out. It fails only when what the
// commands themselves need is wrong: storage.path, server.admin_listen
// and budget.timezone. A plan that fails its check is left out.
func LoadForOperator(path string, getenv func(string) string) (Config, []string, error) {
	c, err := Load(path, getenv)
	if err == nil {
		return c, nil, nil
	}
	var warnings []string
	c, rerr := read(path, nil, getenv, false, &warnings)
	if rerr != nil {
		return Config{}, nil, err // the file itself cannot be read
	}
	// Each section that fails its check takes its defaults, which pass.
	if err := c.relax(&warnings); err != nil {
		return Config{}, nil, fmt.Errorf("config %s: %w", path, err)
	}
	warnings = append(warnings, fmt.Sprintf("serve and config check refuse %s until it is fixed", path))
	return c, warnings, nil
}

// relax replaces each section that fails its check with its defaults,
// saying so in *warnings, except for what the operator's commands need:
// then it is an error.
func (c *Config) relax(warnings *[]string) error {
	fallback := func(err error, what string) {
		*warnings = append(*warnings, fmt.Sprintf("%v: %s", err, what))
	}
	if err := c.Server.Validate(); err != nil {
		admin := c.Server.AdminListen
		if _, _, aerr := net.SplitHostPort(admin); aerr != nil {
			return fmt.Errorf("server.admin_listen: %q is not host:port", admin)
		}
		c.Server = edge.Config{AdminListen: admin}.WithDefaults()
		fallback(err, "[server] takes its defaults, but for admin_listen")
	}
	if err := c.Storage.Validate(); err != nil {
		if err := (storage.Config{Backend: c.Storage.Backend}).Validate(); err != nil {
			return err // the commands cannot guess where the records are
		}
		c.Storage = storage.Config{Backend: c.Storage.Backend, Path: c.Storage.Path}.WithDefaults()
		fallback(err, "[storage] takes its defaults, but for backend and path")
	}
	if err := c.OCR.Validate(); err != nil {
		c.OCR = ocr.Config{}.WithDefaults()
		fallback(err, "[ocr] takes its defaults")
	}
	if err := c.Budget.Validate(); err != nil {
		if _, lerr := c.Budget.Location(); lerr != nil {
			return lerr
		}
		tz := c.Budget.Timezone
		c.Budget = budget.DefaultConfig().WithDefaults()
		c.Budget.Timezone = tz
		fallback(err, "[budget] takes its defaults, but for timezone")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Plans)) {
		if err := budget.ValidatePlans(map[string]budget.Plan{name: c.Plans[name]}); err != nil {
			delete(c.Plans, name)
			*warnings = append(*warnings, fmt.Sprintf("%v: plan %s is left out", err, name))
		}
	}
	if len(c.Plans) == 0 {
		c.Plans = map[string]budget.Plan{} // the brake and the listings need none
	}
	if err := c.Limits.User.Validate("limits.user"); err != nil {
		c.Limits.User = api.DefaultUserLimits().WithDefaults()
		fallback(err, "[limits.user] takes its defaults")
	}
	if err := errors.Join(c.Auth.JWT.Validate(), c.jwtPlan()); err != nil {
		c.Auth.JWT = jwtauth.Config{}.WithDefaults()
		*warnings = append(*warnings, fmt.Sprintf("%v: JWT sign-in is left off", err))
	}
	if err := c.Invites.Validate(); err != nil {
		c.Invites = invites.Config{}.WithDefaults()
		fallback(err, "[invites] takes its defaults")
	}
	if err := c.Detect.Validate(); err != nil {
		c.Detect = detect.Config{}.WithDefaults()
		fallback(err, "[detect] takes its defaults")
	}
	if err := c.Reconcile.Validate(c.knownModel); err != nil {
		c.Reconcile = reconcile.DefaultConfig().WithDefaults()
		fallback(err, "[reconcile] takes its defaults")
	}
	if c.Alerts != nil {
		if err := c.Alerts.Validate(); err != nil {
			c.Alerts = nil
			*warnings = append(*warnings, fmt.Sprintf("%v: mail and webhooks are off, early warnings take their defaults", err))
		}
	}
	if err := routes.Validate(c.Routes); err != nil {
		c.Routes = nil
		*warnings = append(*warnings, fmt.Sprintf("%v: [[routes]] are left out", err))
	}
	return nil
}

// moneyModes refuses a mode on the layers that cannot be shadowed, and
// says why: a plain "unknown key" would leave the operator guessing.
func moneyModes(keys []string) error {
	for _, key := range keys {
		parts := strings.Split(key, ".")
		last := parts[len(parts)-1]
		if last != "mode" && !strings.HasSuffix(last, "_mode") {
			continue
		}
		switch {
		case parts[0] == "budget":
			return fmt.Errorf("%s: the global budget cannot be shadowed: it is money, and a brake that only counts would let the bill run; shadow limits.user.mode, invites.mode or plans.NAME.daily_mode instead", key)
		case parts[0] == "plans" && len(parts) == 3 && last != "daily_mode":
			return fmt.Errorf("%s: a plan's monthly quota cannot be shadowed: it is what the user paid for; only its daily line can, with plans.%s.daily_mode", key, parts[1])
		}
	}
	return nil
}

// defaults is what a config.toml without any key means, for the
// sections whose zero values are settings (0 switches a limit off). The
// other sections fill their zero fields in WithDefaults.
func defaults() Config {
	var c Config
	c.Budget = budget.DefaultConfig()
	c.Limits.User = api.DefaultUserLimits()
	c.OCR.DedupeWindow = ocr.DefaultDedupeWindow // "0s" is a setting: off
	c.Reconcile = reconcile.DefaultConfig()      // max_drift = 0 is refused, not taken for the default
	return c
}

// OffSwitches names every ceiling and layer that the config switches off
// with an explicit 0, for serve and config check to warn about: a key left
// out takes its default, so each of these was written on purpose, or by
// mistake.
func (c Config) OffSwitches() []string {
	var out []string
	off := func(key, what string) {
		out = append(out, fmt.Sprintf("%s = 0 switches %s off", key, what))
	}
	if c.Budget.DailyRequests == 0 {
		off("budget.daily_requests", "the service-wide ceiling on upstream calls per day")
	}
	if c.Budget.DailyUSD == 0 {
		off("budget.daily_usd", "the service-wide ceiling on money per day")
	}
	if c.Budget.MonthlyUSD == 0 {
		off("budget.monthly_usd", "the service-wide ceiling on money per month")
	}
	if c.Limits.User.Rate == 0 {
		off("limits.user.rate", "the per-user rate limit (layer 1)")
	}
	if c.Limits.User.Burst == 0 {
		off("limits.user.burst", "the per-user burst limit (layer 1)")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Plans)) {
		if c.Plans[name].DailyAttempts == 0 {
			off("plans."+name+".daily_attempts", "the daily abuse line of plan "+name+" (layer 2)")
		}
	}
	return out
}

// LayersText says in one line which layers are on and with what lines,
// for the log at start.
func (c Config) LayersText() string {
	onOff := func(n int64, text string) string {
		if n == 0 {
			return "off"
		}
		return text
	}
	u, b := c.Limits.User, c.Budget
	parts := []string{
		"rate " + onOff(int64(u.Rate), fmt.Sprintf("%d/%s", u.Rate, u.Window)),
		"burst " + onOff(int64(u.Burst), fmt.Sprintf("%d/s", u.Burst)),
	}
	if u.Shadow() {
		parts = append(parts, "limits.user in SHADOW mode (counts, refuses nothing)")
	}
	if c.Invites.Shadow() {
		parts = append(parts, "invites in SHADOW mode (counts, refuses nothing)")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Plans)) {
		p := c.Plans[name]
		line := onOff(p.DailyAttempts, strconv.FormatInt(p.DailyAttempts, 10))
		if p.ShadowDaily() && p.DailyAttempts > 0 {
			line += " (shadow)"
		}
		parts = append(parts, fmt.Sprintf("plan %s: quota %d/month, daily line %s", name, p.MonthlyQuota, line))
	}
	parts = append(parts,
		"budget: "+onOff(b.DailyRequests, fmt.Sprintf("%d calls", b.DailyRequests))+"/day, "+
			onOff(budget.MicroUSD(b.DailyUSD), fmt.Sprintf("$%g", b.DailyUSD))+"/day, "+
			onOff(budget.MicroUSD(b.MonthlyUSD), fmt.Sprintf("$%g", b.MonthlyUSD))+"/month",
		"jwt "+onOff(boolInt(c.Auth.JWT.Enabled()), "on"),
		"mail "+onOff(boolInt(c.AlertSettings().MailOn()), "on"),
		fmt.Sprintf("webhooks %d", len(c.AlertSettings().Webhooks)))
	return strings.Join(parts, "; ")
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// AlertSettings is the [alerts] section, or its defaults without one:
// no mail, no webhook, the default early warnings.
func (c Config) AlertSettings() detect.AlertsConfig {
	if c.Alerts == nil {
		return detect.AlertsConfig{}.WithDefaults()
	}
	return *c.Alerts
}

// Validate checks every section; errors name the key.
func (c Config) Validate() error {
	var alerts error
	if c.Alerts != nil {
		alerts = c.Alerts.Validate()
	}
	return errors.Join(c.Server.Validate(), c.Storage.Validate(), c.OCR.Validate(), c.Budget.Validate(),
		budget.ValidatePlans(c.Plans), c.Limits.User.Validate("limits.user"), c.Auth.JWT.Validate(), c.jwtPlan(), c.Invites.Validate(),
		c.Detect.Validate(), alerts, routes.Validate(c.Routes), c.fallback(), c.Reconcile.Validate(c.knownModel))
}

// knownModel reports whether name is a model of the table or of
// ocr.model_overrides, for [[reconcile.sku]]'s models.
func (c Config) knownModel(name string) bool {
	_, ok := c.OCR.Lookup(name)
	return ok
}

// ModelNames are the names a billing row's description is matched
// against: the table's families and the overrides' names.
func (c Config) ModelNames() []string {
	names := ocr.KnownModels()
	for _, o := range c.OCR.ModelOverrides {
		names = append(names, o.Name)
	}
	return names
}

// fallback checks that ocr.fallback_model is set where it is needed: a
// soft ceiling of [budget], or a plan that always reads with it; and that
// it is not ocr.model itself. Only main knows both sections.
func (c Config) fallback() error {
	model, fallback := c.OCR.WithDefaults().Model, c.OCR.FallbackModel
	if fallback != "" && strings.TrimPrefix(fallback, "models/") == strings.TrimPrefix(model, "models/") {
		return fmt.Errorf("ocr.fallback_model: must differ from ocr.model (%s): name the cheaper model reads go to above a soft ceiling", model)
	}
	if fallback != "" {
		return nil
	}
	if c.Budget.HasSoft() {
		return errors.New("ocr.fallback_model: required when a soft ceiling of [budget] is set (soft_daily_requests, soft_daily_usd or " +
			"soft_monthly_usd): name the cheaper model reads go to above it, such as \"gemini-2.5-flash-lite\", or set the soft ceilings to 0")
	}
	names := slices.Sorted(maps.Keys(c.Plans))
	for _, name := range names {
		if c.Plans[name].Model == budget.PlanModelFallback {
			return fmt.Errorf("plans.%s.model: \"fallback\" needs ocr.fallback_model; set it, or use \"auto\" or \"primary\"", name)
		}
	}
	return nil
}

// JWTAudienceWarning explains the risk of accepting every token the issuer
// signs, when JWT sign-in is on with neither an audience nor authorized
// parties to narrow it.
func (c Config) JWTAudienceWarning() string {
	j := c.Auth.JWT
	if !j.Enabled() || j.Audience != "" || len(j.AuthorizedParties) > 0 {
		return ""
	}
	return "auth.jwt has neither audience nor authorized_parties: every token your issuer signs is accepted, " +
		"including ID tokens and tokens for your other APIs; set audience (Auth0, Supabase) or authorized_parties (Clerk)"
}

// jwtPlan checks that JWT users' default plan exists; only main knows
// both sections.
func (c Config) jwtPlan() error {
	if !c.Auth.JWT.Enabled() {
		return nil
	}
	if _, ok := c.Plans[c.Auth.JWT.DefaultPlan]; !ok {
		return fmt.Errorf("auth.jwt.default_plan: plan %q is not defined: add [plans.%s] or name another plan", c.Auth.JWT.DefaultPlan, c.Auth.JWT.DefaultPlan)
	}
	return nil
}

// configKeys lists every key config.toml may hold ("server.listen", ...)
// with the kind of its value. Plans are a map: their keys are listed for
// each plan name present in k.
func configKeys(t reflect.Type, prefix string, k *koanf.Koanf) map[string]reflect.Kind {
	out := map[string]reflect.Kind{}
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("koanf")
		if name == "" {
			continue
		}
		key := prefix + name
		ft := f.Type
		if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct {
			ft = ft.Elem() // an optional section such as [alerts]
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Duration]():
			for sub, kind := range configKeys(ft, key+".", k) {
				out[sub] = kind
			}
		case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
			for _, entry := range k.MapKeys(key) {
				for sub, kind := range configKeys(f.Type.Elem(), key+"."+entry+".", k) {
					out[sub] = kind
				}
			}
		case f.Type.Kind() == reflect.Pointer:
			out[key] = f.Type.Elem().Kind() // an optional value, such as a bool whose default is true
		default:
			out[key] = f.Type.Kind()
		}
	}
	return out
}

// environ lists the process environment; a variable so tests can vary it.
var environ = os.Environ

// envName is the environment variable that overrides key:
// "ocr.price.max_output_tokens" is BREAKWATER_OCR__PRICE__MAX_OUTPUT_TOKENS.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}

// finish applies each section's WithDefaults, and takes a relative
// storage.path from base, the config file's folder.
func (c *Config) finish(path, base string) error {
	c.Server, c.Storage, c.OCR, c.Budget = c.Server.WithDefaults(), c.Storage.WithDefaults(), c.OCR.WithDefaults(), c.Budget.WithDefaults()
	if !filepath.IsAbs(c.Storage.Path) {
		var err error
		if c.Storage.Path, err = filepath.Abs(filepath.Join(base, c.Storage.Path)); err != nil {
			return fmt.Errorf("config %s: storage.path: %w", path, err)
		}
	}
	c.Limits.User = c.Limits.User.WithDefaults()
	c.Auth.JWT = c.Auth.JWT.WithDefaults()
	c.Invites = c.Invites.WithDefaults()
	c.Detect = c.Detect.WithDefaults()
	c.Reconcile = c.Reconcile.WithDefaults()
	if c.Alerts != nil {
		a := c.Alerts.WithDefaults()
		c.Alerts = &a
	}
	return nil
}

// readEnv applies the BREAKWATER_SECTION__KEY overrides to k, refusing
// (through refuse) one that names no key or does not parse, and returns
// the warnings about look-alikes: a BREAKWATER_X_Y with single
// underscores looks like an override but is none, and the operator surely
// meant one.
func readEnv(k *koanf.Koanf, known map[string]reflect.Kind, path string, getenv func(string) string, refuse func(error) error) ([]string, error) {
	byEnv := make(map[string]string, len(known))
	for key, kind := range known {
		name := envName(key)
		byEnv[name] = key
		v := getenv(name)
		if v == "" {
			continue
		}
		val, err := envValue(v, kind)
		if err != nil {
			if err := refuse(fmt.Errorf("environment %s (%s): %w", name, key, err)); err != nil {
				return nil, err
			}
			continue
		}
		if err := k.Set(key, val); err != nil {
			return nil, fmt.Errorf("environment %s: %w", name, err)
		}
	}
	// A BREAKWATER_SECTION__KEY that names no key is a typo, refused like
	// one in the file. A variable the config names to read a secret from
	// is none of these, whatever its spelling.
	named := map[string]bool{}
	namedVars(k.Raw(), named)
	var warnings []string
	for _, kv := range environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || getenv(name) == "" || secretVars[name] || named[name] {
			continue
		}
		if _, ok := byEnv[name]; !ok && strings.Contains(name, "__") {
			if err := refuse(fmt.Errorf("environment %s: names no key of config.toml", name)); err != nil {
				return nil, err
			}
			continue
		}
		if !strings.Contains(name, "__") {
			hint := ""
			if key := lookAlike(name, byEnv); key != "" {
				hint = fmt.Sprintf(" (for %s write %s)", key, envName(key))
			}
			warnings = append(warnings, fmt.Sprintf("environment %s is not read: an override separates section and key with two underscores, BREAKWATER_SECTION__KEY%s", name, hint))
		}
	}
	return warnings, nil
}

// namedVars adds to into the environment variables that the config
// tree v names by a key ending in "_env" (alerts.webhook's url_env and
// secret_env, in each entry of the array): variables that hold what the
// config reads from the environment, such as a webhook's URL, and that
// are no override.
func namedVars(v any, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for key, val := range v {
			if name, ok := val.(string); ok && strings.HasSuffix(key, "_env") {
				into[name] = true
			}
			namedVars(val, into)
		}
	case []any:
		for _, e := range v {
			namedVars(e, into)
		}
	case []map[string]any:
		for _, e := range v {
			namedVars(e, into)
		}
	}
}

// lookAlike is the key whose override name is name with its double
// underscores written single, "" if none is.
func lookAlike(name string, byEnv map[string]string) string {
	for env, key := range byEnv {
		if strings.ReplaceAll(env, "__", "_") == name {
			return key
		}
	}
	return ""
}

// envValue types an environment value for the key's kind, so that the
// decoder can stay strict about the file's own values.
func envValue(v string, kind reflect.Kind) (any, error) {
	switch kind {
	case reflect.Slice:
		return splitList(v), nil
	case reflect.Bool:
		return strconv.ParseBool(v)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32:
		return strconv.ParseInt(v, 10, 64)
	case reflect.Int64:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n, nil
		}
		return v, nil // a duration such as "30s"
	case reflect.Float32, reflect.Float64:
		return strconv.ParseFloat(v, 64)
	}
	return v, nil
}

var durationType = reflect.TypeFor[time.Duration]()

// strictValues decodes durations from strings and refuses what
// mapstructure would otherwise quietly accept: a fraction for a whole
// number (2.9 would become 2) and a bare number for a duration (30 would
// become 30 nanoseconds). A bad duration names the value and the units.
func strictValues(from, to reflect.Type, data any) (any, error) {
	switch {
	case to == durationType && from.Kind() != reflect.String:
		return nil, fmt.Errorf("a duration is written as a string such as \"30s\", got %v", data)
	case to == durationType:
		d, err := time.ParseDuration(data.(string))
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration; use e.g. \"90s\", \"10m\", \"1h\" (units ms, s, m, h)", data)
		}
		return d, nil
	case from.Kind() == reflect.Float64 && to.Kind() >= reflect.Int && to.Kind() <= reflect.Int64:
		f := data.(float64)
		if f != math.Trunc(f) {
			return nil, fmt.Errorf("%v is not a whole number", f)
		}
		return int64(f), nil
	case from.Kind() == reflect.String && to.Kind() == reflect.Float64:
		// An element of a list of numbers set from the environment
		// (BREAKWATER_ALERTS__WARN_AT=0.5,0.9), which envValue splits
		// into strings: it must be a number all the same.
		f, err := strconv.ParseFloat(strings.TrimSpace(data.(string)), 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", data)
		}
		return f, nil
	}
	return data, nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

var mapIndex = regexp.MustCompile(`\[([^\]]*)\]`)

// cleanDecodeError turns mapstructure's "'ocr.timeout' time: invalid
// duration" into "ocr.timeout: time: invalid duration".
func cleanDecodeError(err error) string {
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "* "))
		if l == "" || strings.HasPrefix(l, "decoding failed") {
			continue
		}
		if strings.HasPrefix(l, "'") {
			if end := strings.Index(l[1:], "'"); end >= 0 {
				// Map entries come as plans[free].monthly_quota.
				key := mapIndex.ReplaceAllString(l[1:end+1], ".$1")
				l = key + ":" + l[end+2:]
			}
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "; ")
}

// ChangedKeys names, sorted, the keys whose values differ between old and
// next ("limits.user.rate", "plans.pro.monthly_quota", ...); a section
// that comes or goes, such as [alerts], is named whole.
func ChangedKeys(old, next Config) []string {
	a, b := flatten(old), flatten(next)
	var keys []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			keys = append(keys, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// NeedsRestart names the changed keys that only a restart applies: all
// but the thresholds (limits.user, the budget's ceilings, the plans, the
// token prices, the invite rate limit, the detectors).
func NeedsRestart(old, next Config) []string {
	var keys []string
	for _, k := range ChangedKeys(old, next) {
		if !appliesLive(k) {
			keys = append(keys, k)
		}
	}
	return append(keys, routeRestartKeys(old.Routes, next.Routes)...)
}

// appliesLive reports whether Reload applies key without a restart.
func appliesLive(key string) bool {
	switch key {
	case "routes": // routeRestartKeys names what of it needs a restart
		return true
	case "budget.timezone", "detect.run_at", "ocr.price.max_output_tokens":
		return false
	case "ocr.price.input_usd_per_million", "ocr.price.output_usd_per_million",
		"invites.rate", "invites.window", "invites.burst", "invites.mode":
		return true
	}
	// routes.NAME.KEY: routeRestartKeys names what of it needs a restart.
	for _, prefix := range []string{"limits.user.", "budget.", "plans.", "detect.", "routes."} {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// flatten lists every key of c with its value as text, for comparison.
func flatten(c Config) map[string]string {
	out := map[string]string{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		t := v.Type()
		for i := range t.NumField() {
			name := t.Field(i).Tag.Get("koanf")
			if name == "" || name == "-" {
				continue
			}
			key, fv := prefix+name, v.Field(i)
			switch {
			case fv.Kind() == reflect.Pointer && fv.Type().Elem().Kind() == reflect.Struct:
				if fv.IsNil() {
					out[key] = "(none)" // an optional section left out
				} else {
					walk(fv.Elem(), key+".")
				}
			case fv.Kind() == reflect.Struct && fv.Type() != durationType:
				walk(fv, key+".")
			case fv.Kind() == reflect.Map:
				for _, k := range fv.MapKeys() {
					walk(fv.MapIndex(k), key+"."+k.String()+".")
				}
			case fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct:
				// Each entry by its name ([[routes]]), key by key: printed
				// whole, its pointers ([routes.fail]) would differ on
				// every load.
				for i := range fv.Len() {
					walk(fv.Index(i), key+"."+entryName(fv.Index(i), i)+".")
				}
			case fv.Kind() == reflect.Pointer:
				out[key] = ""
				if !fv.IsNil() {
					out[key] = fmt.Sprint(fv.Elem().Interface())
				}
			default:
				out[key] = fmt.Sprint(fv.Interface())
			}
		}
	}
	walk(reflect.ValueOf(c), "")
	return out
}

// LostCeilings names, sorted, the money keys that running set
// explicitly and next leaves out: a key of [budget], a price of
// [ocr.price] (which applies live: every call is counted against the
// budget at it), or a plan's monthly_quota or daily_attempts for a plan
// next still has. Left out, each takes its default, which may be a higher
// ceiling than the one running enforces (budget.daily_requests 100 would
// become 5,000; a model's price of 30 USD per million input tokens would
// become 0.30, and daily_usd would let a hundred times as many calls
// through): a file caught half-written, or a section deleted by mistake,
// must not raise what the service may spend. So is, as "KEY = 0", a
// ceiling that running enforces and next switches off with a 0 (of
// [budget], or a plan's daily_attempts): a save caught half-written
// makes "daily_usd = 0.5" "daily_usd = 0"; a restart switches it off. A
// plan next removes whole is not named: its users are refused until it
// is back.
func LostCeilings(running, next Config) []string {
	var lost []string
	for key := range running.explicit {
		if next.explicit[key] {
			continue
		}
		parts := strings.Split(key, ".")
		switch {
		case parts[0] == "budget", key == keyInputPrice, key == keyOutputPrice:
		case len(parts) == 3 && parts[0] == "plans" && (parts[2] == "monthly_quota" || parts[2] == "daily_attempts"):
			if _, ok := next.Plans[parts[1]]; !ok {
				continue
			}
		default:
			continue
		}
		lost = append(lost, key)
	}
	// A ceiling switched off: "daily_usd = 0.5" caught half-written is
	// "daily_usd = 0", valid TOML, and 0 means no ceiling at all.
	off := func(key string, was, is bool) {
		if was && is && !slices.Contains(lost, key) {
			lost = append(lost, key+" = 0")
		}
	}
	off("budget.daily_requests", running.Budget.DailyRequests > 0, next.Budget.DailyRequests == 0)
	off("budget.daily_usd", running.Budget.DailyUSD > 0, next.Budget.DailyUSD == 0)
	off("budget.monthly_usd", running.Budget.MonthlyUSD > 0, next.Budget.MonthlyUSD == 0)
	for name, p := range running.Plans {
		if q, ok := next.Plans[name]; ok {
			off("plans."+name+".daily_attempts", p.DailyAttempts > 0, q.DailyAttempts == 0)
		}
	}
	slices.Sort(lost)
	return lost
}

// The price keys that LostCeilings guards.
const (
	keyInputPrice  = "ocr.price.input_usd_per_million"
	keyOutputPrice = "ocr.price.output_usd_per_million"
)

// MoneyDefaults names, sorted, the money keys that c leaves to their
// defaults (the keys of [budget], the prices of [ocr.price], and
// daily_attempts of each plan), each with the default it takes, for
// config check to say which keys a running server that set them would
// refuse to lose on a reload.
func (c Config) MoneyDefaults() []string {
	var out []string
	b := budget.DefaultConfig()
	for key, def := range map[string]string{
		"budget.timezone":       b.Timezone,
		"budget.daily_requests": strconv.FormatInt(b.DailyRequests, 10),
		"budget.daily_usd":      strconv.FormatFloat(b.DailyUSD, 'f', -1, 64),
		"budget.monthly_usd":    strconv.FormatFloat(b.MonthlyUSD, 'f', -1, 64),
		// A price left out is ocr.model's list price on each day.
		keyInputPrice:  "ocr.model's list price on each day, now " + strconv.FormatFloat(c.OCR.WithDefaults().Price.On(c.Today(time.Now())).InputUSDPerMillion, 'f', -1, 64),
		keyOutputPrice: "ocr.model's list price on each day, now " + strconv.FormatFloat(c.OCR.WithDefaults().Price.On(c.Today(time.Now())).OutputUSDPerMillion, 'f', -1, 64),
	} {
		if !c.explicit[key] {
			out = append(out, key+" (default "+def+")")
		}
	}
	for name, p := range c.Plans {
		if key := "plans." + name + ".daily_attempts"; !c.explicit[key] {
			out = append(out, fmt.Sprintf("%s (default %d)", key, p.DailyAttempts))
		}
	}
	slices.Sort(out)
	return out
}

// entryName names the i-th entry of a list of sections: by its name key
// when it has one, else by its index.
func entryName(v reflect.Value, i int) string {
	t := v.Type()
	for j := range t.NumField() {
		if t.Field(j).Tag.Get("koanf") == "name" && v.Field(j).Kind() == reflect.String && v.Field(j).String() != "" {
			return v.Field(j).String()
		}
	}
	return strconv.Itoa(i)
}

// keepFailLimit is next with the fail-limit settings of running, which
// only a restart changes; its rate, window, burst and mode apply live.
func keepFailLimit(next, running invites.Config) invites.Config {
	running.Rate, running.Window, running.Burst, running.Mode = next.Rate, next.Window, next.Burst, next.Mode
	return running
}
