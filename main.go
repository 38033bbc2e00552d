// Command breakwater runs a pay-per-use OCR API on the public internet
// without letting the bill run away. See README.md.
//
// This file is the wiring: flags, subcommands, config loading, and the
// start and orderly stop of every component. No other file builds
// components or reads config.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/toml/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/server"
	"breakwater/storage"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const (
	defaultConfigPath = "config.toml"
	envPrefix         = "BREAKWATER_"
	// In-flight requests get the upstream call's own bound (ocr.timeout,
	// its retry included) plus this long to finish: enough for the usage
	// record's wait, so a paid read still gets its record and its answer.
	shutdownSlack  = 15 * time.Second
	flushTimeout   = 5 * time.Second // statistics get this long to reach disk
	cliLockTimeout = 300 * time.Millisecond
)

// errUsage marks a command line that could not be understood (exit 2).
var errUsage = errors.New("usage")

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "breakwater:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "breakwater:", err)
		os.Exit(1)
	}
}

const usageText = `Usage: breakwater [command] [--config FILE]

Commands:
  serve                          run the service (the default)
  demo                           run it with a simulated upstream and a throwaway database
  keys create --user ID [--plan NAME]
  keys list [--json]
  keys revoke KEY_ID
  users ban ID | users unban ID | users set-plan ID PLAN
  usage [ID] [--json]            today's attempts, this month's reads, quota and cost
  budget [--json]                spend against each ceiling, brake state
  brake on|off                   the manual kill switch (survives restarts)
  backup FILE                    a consistent copy of the database, also while serving
  invites create [--uses N] [--expires 72h] [--note TEXT]
  invites list [--json]
  invites revoke INVITE_ID
  invites delete INVITE_ID       the invite and the e-mails that redeemed it, for erasure
  detect run [--day YYYY-MM-DD] [--no-mail] [--json]
                                 run the daily detection now (default: yesterday), print the findings
  config check                   validate config.toml
  version
`

// run is the whole program; main only maps its error to an exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return cmdServe(ctx, args, getenv, stderr)
	case "demo":
		return cmdDemo(ctx, args, getenv, stdout, stderr)
	case "keys", "users", "invites", "usage", "budget", "brake", "backup", "detect":
		return cmdOperator(ctx, cmd, args, getenv, stdout, stderr)
	case "config":
		if len(args) == 0 || args[0] != "check" {
			return fmt.Errorf("%w: breakwater config check [--config FILE]", errUsage)
		}
		return cmdConfigCheck(args[1:], getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "breakwater", versionString())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return nil
	}
	fmt.Fprint(stderr, usageText)
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// newFlags makes a command's flag set with the --config flag every command
// takes.
func newFlags(name string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", defaultConfigPath, "path of config.toml")
	return fs, path
}

// parseNoArgs parses the flags of a command that takes no positional
// arguments.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseFlags(fs, args)
	if err == nil && len(pos) > 0 {
		err = fmt.Errorf("%w: %s takes no argument %q", errUsage, fs.Name(), pos[0])
	}
	return err
}

// parseFlags parses args and returns the positional arguments. Flags may
// come before, between or after them ("keys revoke ID --config f").
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// ---- config ---------------------------------------------------------------

// config is config.toml. Each package owns its section's struct, defaults
// and validation.
type config struct {
	Server  server.Config          `koanf:"server"`
	Storage storage.Config         `koanf:"storage"`
	OCR     ocr.Config             `koanf:"ocr"`
	Budget  budget.Config          `koanf:"budget"`
	Plans   map[string]budget.Plan `koanf:"plans"`
	Limits  struct {
		User limiter.Config `koanf:"user"`
	} `koanf:"limits"`
	Auth struct {
		JWT server.JWTConfig `koanf:"jwt"`
	} `koanf:"auth"`
	Invites server.InviteConfig `koanf:"invites"`
	Detect  detect.Config       `koanf:"detect"`
	// Alerts is nil when config.toml has no [alerts] section: mail is off
	// and alerts are only logged.
	Alerts *detect.AlertsConfig `koanf:"alerts"`
}

// loadConfig reads path (which must exist), applies
// BREAKWATER_SECTION__KEY overrides from the environment, and checks every
// value. An unknown key is an error that names it: a typo must never switch
// a limit off silently.
func loadConfig(path string, getenv func(string) string) (config, error) {
	c, err := readConfig(path, getenv, false)
	if err != nil {
		return config{}, err
	}
	if err := c.validate(); err != nil {
		return config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// readConfig parses path and the environment overrides into a config with
// defaults applied, without validating values. A missing file is an error
// unless optional.
func readConfig(path string, getenv func(string) string, optional bool) (config, error) {
	k := koanf.New(".")
	if _, err := os.Stat(path); err == nil {
		if err := k.Load(file.Provider(path), toml.Parser()); err != nil {
			return config{}, fmt.Errorf("config %s: %w", path, err)
		}
	} else if !optional {
		return config{}, fmt.Errorf("config %s: %w", path, err)
	}

	known := configKeys(reflect.TypeFor[config](), "", k)
	for _, key := range k.Keys() {
		if m, ok := k.Get(key).(map[string]any); ok && len(m) == 0 {
			continue // an empty section such as [alerts]; the decoder refuses an unknown one
		}
		if _, ok := known[key]; !ok {
			return config{}, fmt.Errorf("config %s: unknown key %q", path, key)
		}
	}
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
			return config{}, fmt.Errorf("environment %s (%s): %w", name, key, err)
		}
		if err := k.Set(key, val); err != nil {
			return config{}, fmt.Errorf("environment %s: %w", name, err)
		}
	}
	// A BREAKWATER_SECTION__KEY that names no key is a typo, refused like
	// one in the file.
	for _, kv := range environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && strings.Contains(name, "__") && getenv(name) != "" {
			if _, ok := byEnv[name]; !ok {
				return config{}, fmt.Errorf("environment %s: names no key of config.toml", name)
			}
		}
	}

	// Decoded over the defaults: a key left out keeps its documented
	// default, and only an explicit 0 switches a limit off.
	c := defaultConfig()
	err := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook:  mapstructure.ComposeDecodeHookFunc(strictNumbers, mapstructure.StringToTimeDurationHookFunc()),
		ErrorUnused: true,
		TagName:     "koanf",
		Result:      &c,
	}})
	if err != nil {
		return config{}, fmt.Errorf("config %s: %s", path, cleanDecodeError(err))
	}
	for name, p := range c.Plans {
		if !k.Exists("plans." + name + ".daily_attempts") {
			p.DailyAttempts = budget.DefaultDailyAttempts(p.MonthlyQuota)
			c.Plans[name] = p
		}
	}
	c.Server, c.Storage, c.OCR, c.Budget = c.Server.WithDefaults(), c.Storage.WithDefaults(), c.OCR.WithDefaults(), c.Budget.WithDefaults()
	c.Limits.User = c.Limits.User.WithDefaults()
	c.Auth.JWT = c.Auth.JWT.WithDefaults()
	c.Invites = c.Invites.WithDefaults()
	c.Detect = c.Detect.WithDefaults()
	if c.Alerts != nil {
		a := c.Alerts.WithDefaults()
		c.Alerts = &a
	}
	return c, nil
}

// defaultConfig is what a config.toml without any key means, for the
// sections whose zero values are settings (0 switches a limit off). The
// other sections fill their zero fields in WithDefaults.
func defaultConfig() config {
	var c config
	c.Budget = budget.DefaultConfig()
	c.Limits.User = server.DefaultUserLimits()
	return c
}

// offSwitches names every ceiling and layer that the config switches off
// with an explicit 0, for serve and config check to warn about: a key left
// out takes its default, so each of these was written on purpose, or by
// mistake.
func offSwitches(c config) []string {
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

// validate checks every section; errors name the key.
func (c config) validate() error {
	var alerts error
	if c.Alerts != nil {
		alerts = c.Alerts.Validate()
	}
	return errors.Join(c.Server.Validate(), c.Storage.Validate(), c.OCR.Validate(), c.Budget.Validate(),
		budget.ValidatePlans(c.Plans), c.Limits.User.Validate("limits.user"), c.Auth.JWT.Validate(), c.jwtPlan(), c.Invites.Validate(),
		c.Detect.Validate(), alerts)
}

// jwtAudienceWarning explains the risk of accepting every token the issuer
// signs, when JWT sign-in is on with neither an audience nor authorized
// parties to narrow it.
func jwtAudienceWarning(c config) string {
	j := c.Auth.JWT
	if !j.Enabled() || j.Audience != "" || len(j.AuthorizedParties) > 0 {
		return ""
	}
	return "auth.jwt has neither audience nor authorized_parties: every token your issuer signs is accepted, " +
		"including ID tokens and tokens for your other APIs; set audience (Auth0, Supabase) or authorized_parties (Clerk)"
}

// jwtPlan checks that JWT users' default plan exists; only main knows
// both sections.
func (c config) jwtPlan() error {
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

// strictNumbers refuses what mapstructure would otherwise quietly accept:
// a fraction for a whole number (2.9 would become 2) and a bare number for
// a duration (30 would become 30 nanoseconds).
func strictNumbers(from, to reflect.Type, data any) (any, error) {
	switch {
	case to == durationType && from.Kind() != reflect.String:
		return nil, fmt.Errorf("a duration is written as a string such as \"30s\", got %v", data)
	case from.Kind() == reflect.Float64 && to.Kind() >= reflect.Int && to.Kind() <= reflect.Int64:
		f := data.(float64)
		if f != math.Trunc(f) {
			return nil, fmt.Errorf("%v is not a whole number", f)
		}
		return int64(f), nil
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

func cmdConfigCheck(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, path := newFlags("config check", stderr)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, getenv)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: OK\n", *path)
	switch {
	case c.OCR.Provider == "simulated":
		fmt.Fprintln(stdout, "note: ocr.provider is \"simulated\": no real reads are made")
	case getenv("GEMINI_API_KEY") == "":
		fmt.Fprintln(stdout, "note: GEMINI_API_KEY is not set: serve will refuse to start")
	}
	if getenv("BREAKWATER_ADMIN_TOKEN") == "" {
		fmt.Fprintln(stdout, "note: BREAKWATER_ADMIN_TOKEN is not set: the admin API is off, so the operator commands work only while the server is stopped")
	}
	if a := c.Alerts; a == nil {
		fmt.Fprintln(stdout, "note: no [alerts] section: mail is off; alerts and findings are only logged (WARN)")
	} else {
		fmt.Fprintf(stdout, "mail: alerts go to %s through %s:%d (tls %s)\n", strings.Join(a.To, ", "), a.SMTPHost, a.SMTPPort, a.TLS)
		if a.SMTPUsername != "" && getenv("BREAKWATER_SMTP_PASSWORD") == "" {
			fmt.Fprintln(stdout, "note: alerts.smtp_username is set but BREAKWATER_SMTP_PASSWORD is not: the mail server will refuse the login")
		}
	}
	if warning := jwtAudienceWarning(c); warning != "" {
		fmt.Fprintln(stdout, "warning:", warning)
	}
	for _, warning := range c.OCR.Warnings() {
		fmt.Fprintln(stdout, "warning:", warning)
	}
	for _, w := range offSwitches(c) {
		fmt.Fprintln(stdout, "WARNING: limit off:", w)
	}
	return nil
}

// ---- serve ----------------------------------------------------------------

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func cmdServe(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs, path := newFlags("serve", stderr)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, getenv)
	if err != nil {
		return err
	}
	return serve(ctx, c, getenv, newLogger(stderr), func(st *started) {
		r := &reloader{path: *path, getenv: getenv, log: st.log, cur: c, layers: st.layers, guard: st.guard, plans: st.plans, srv: st.srv, detect: st.detect}
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		go func() {
			defer signal.Stop(hup)
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					r.reload("SIGHUP")
				}
			}
		}()
		if err := watchFile(ctx, *path, reloadDebounce, func() { r.reload("file changed") }); err != nil {
			st.log.Warn("config.toml is not watched; reload with SIGHUP", "err", err)
		}
	})
}

// started is what serve hands to its caller once the service accepts
// requests.
type started struct {
	addr   string
	keys   *server.Keyring
	layers server.Layers
	guard  *server.InviteGuard
	plans  *server.Plans
	srv    *server.Server
	detect *detect.Runner
	log    *slog.Logger
}

// reloadDebounce gathers the several events one save makes into one reload.
const reloadDebounce = 300 * time.Millisecond

// reloader applies a changed config.toml to the running service: the
// thresholds (rate limits, budget ceilings, plans, prices, detectors) are
// swapped at once and no counter is lost. A config with an error is refused whole and
// the running one kept; settings that cannot change live are reported as
// needing a restart.
type reloader struct {
	path   string
	getenv func(string) string
	log    *slog.Logger
	layers server.Layers
	guard  *server.InviteGuard
	plans  *server.Plans
	srv    *server.Server
	detect *detect.Runner

	mu  sync.Mutex
	cur config // the config in force
}

func (r *reloader) reload(trigger string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next, err := loadConfig(r.path, r.getenv)
	if err != nil {
		r.log.Error("config reload refused: the running config is kept", "trigger", trigger, "err", err)
		return
	}
	for _, key := range needsRestart(r.cur, next) {
		r.log.Warn("config change needs a restart to apply", "key", key)
	}
	for _, w := range offSwitches(next) {
		r.log.Warn("LIMIT OFF: " + w)
	}
	r.layers.Windows.SetConfig(next.Limits.User)
	r.guard.Windows.SetConfig(next.Invites.Limits())
	r.layers.Brake.SetConfig(next.Budget)
	r.plans.Set(next.Plans)
	if err := r.detect.SetConfig(next.Detect); err != nil { // validated by loadConfig: not expected
		r.log.Error("detect thresholds not reloaded", "err", err)
	}
	// What needs a restart stays as it runs, so it is reported again if
	// changed again.
	next.Server, next.Storage, next.Budget.Timezone, next.Auth = r.cur.Server, r.cur.Storage, r.cur.Budget.Timezone, r.cur.Auth
	next.Invites = keepFailLimit(next.Invites, r.cur.Invites)
	next.Detect.RunAt, next.Alerts = r.cur.Detect.RunAt, r.cur.Alerts
	// Prices apply live; the output cap is sent by the OCR client made at
	// start, so the worst case must keep using the cap it sends.
	price := next.OCR.Price
	price.MaxOutputTokens = r.cur.OCR.Price.MaxOutputTokens
	next.OCR = r.cur.OCR
	next.OCR.Price = price
	r.srv.SetPrice(price)
	r.cur = next
	r.log.Info("config reloaded", "trigger", trigger)
}

// needsRestart names the changed settings that only a restart applies.
func needsRestart(old, next config) []string {
	var keys []string
	if !reflect.DeepEqual(old.Server, next.Server) {
		keys = append(keys, "server")
	}
	if old.Storage != next.Storage {
		keys = append(keys, "storage")
	}
	oldOCR, nextOCR := old.OCR, next.OCR
	oldOCR.Price, nextOCR.Price = ocr.Price{}, ocr.Price{}
	if oldOCR != nextOCR {
		keys = append(keys, "ocr (all but the prices)")
	}
	if old.OCR.Price.MaxOutputTokens != next.OCR.Price.MaxOutputTokens {
		keys = append(keys, "ocr.price.max_output_tokens")
	}
	if old.Budget.Timezone != next.Budget.Timezone {
		keys = append(keys, "budget.timezone")
	}
	if !reflect.DeepEqual(old.Auth, next.Auth) {
		keys = append(keys, "auth.jwt")
	}
	if !reflect.DeepEqual(old.Invites.Fail(), next.Invites.Fail()) || old.Invites.GlobalFailPerHour != next.Invites.GlobalFailPerHour {
		keys = append(keys, "invites (all but rate, window and burst)")
	}
	if old.Detect.RunAt != next.Detect.RunAt {
		keys = append(keys, "detect.run_at")
	}
	if !reflect.DeepEqual(old.Alerts, next.Alerts) {
		keys = append(keys, "alerts")
	}
	return keys
}

// keepFailLimit is next with the fail-limit settings of running, which
// only a restart changes; its rate, window and burst apply live.
func keepFailLimit(next, running server.InviteConfig) server.InviteConfig {
	running.Rate, running.Window, running.Burst = next.Rate, next.Window, next.Burst
	return running
}

// watchFile calls changed, at most once per quiet period, after path is
// written, replaced or re-created. It watches the folder, not the file,
// so editors that save by renaming a new file over the old one, or by
// deleting and re-creating it, are followed.
func watchFile(ctx context.Context, path string, quiet time.Duration, changed func()) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		w.Close()
		return err
	}
	go func() {
		defer w.Close()
		timer := time.NewTimer(quiet)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if filepath.Clean(ev.Name) == abs {
					timer.Reset(quiet)
				}
			case <-w.Errors:
			case <-timer.C:
				changed()
			}
		}
	}()
	return nil
}

// serve runs the service until ctx ends, then stops it in reverse order:
// HTTP first (in-flight requests finish), then the statistics writer, then
// the database, which commits every queued write before it closes. ready,
// if not nil, is called with the public address once it accepts requests.
func serve(ctx context.Context, c config, getenv func(string) string, log *slog.Logger, ready func(*started)) error {
	log.Info("starting breakwater", "version", versionString(), "storage", c.Storage.Path, "provider", c.OCR.Provider)
	for _, w := range offSwitches(c) {
		log.Warn("LIMIT OFF: " + w)
	}
	adminToken := getenv("BREAKWATER_ADMIN_TOKEN")
	if err := checkAdminListen(c.Server.AdminListen, adminToken); err != nil {
		return err
	}

	reader, err := newReader(c.OCR, getenv("GEMINI_API_KEY"), log)
	if err != nil {
		return err
	}
	db, err := storage.Open(c.Storage.Path, storage.Options{Timeout: time.Second, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		if err := db.Close(); err != nil {
			log.Error("close database", "err", err)
		}
	}()

	loc, _ := c.Budget.Location() // checked by loadConfig
	layers, err := server.LoadLayers(db, c.Limits.User, c.Budget, loc, time.Now(), log)
	if err != nil {
		return err
	}
	if err := server.LoadBrake(layers.Brake, db.Flag); err != nil {
		return err
	}
	guard, err := server.LoadInviteGuard(db, c.Invites, time.Now())
	if err != nil {
		return err
	}
	invites, err := server.NewInvites(db)
	if err != nil {
		return err
	}
	plans := server.NewPlans(c.Plans)
	keys, err := server.NewKeyring(db, plans.Has)
	if err != nil {
		return err
	}
	// JWT sign-in: the verifier fetches the JWKS in the background until
	// it is closed, after HTTP has stopped. An unreachable JWKS is logged,
	// not fatal: API keys work meanwhile and JWTs are refused.
	var verifier *server.Verifier
	if c.Auth.JWT.Enabled() {
		verifier, err = server.NewVerifier(context.WithoutCancel(ctx), c.Auth.JWT, plans.Has, server.VerifierOptions{Logger: log})
		if err != nil {
			return err
		}
		defer verifier.Close()
		log.Info("JWT sign-in on", "issuer", c.Auth.JWT.Issuer, "jwks_url", c.Auth.JWT.JWKSURL)
		if warning := jwtAudienceWarning(c); warning != "" {
			log.Warn(warning)
		}
	}
	events := detect.NewRecorder(db, detect.RecorderOptions{Logger: log})
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := events.Close(fctx); err != nil {
			log.Warn("statistics not all written", "err", err)
		}
	}()

	// Layer 4: detection and alerts. Stopped after HTTP, before the
	// statistics writer and the database.
	counters := &detect.Counters{}
	det, err := newDetection(c, db, keys, plans, layers, getenv, counters, log)
	if err != nil {
		return err
	}
	defer det.close(log)
	alerter, err := detect.NewAlerter(db, detect.AlerterOptions{
		MinInterval: alertInterval(c), Location: loc, Mail: det.sender, Counters: counters, Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		actx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := alerter.Close(actx); err != nil {
			log.Warn("alerts not all handed to the mailer", "err", err)
		}
	}()
	scheduler, err := detect.NewScheduler(det.runner, c.Detect, loc, detect.SchedulerOptions{Logger: log})
	if err != nil {
		return err
	}
	schedCtx, stopScheduler := context.WithCancel(context.Background())
	schedDone := make(chan struct{})
	go func() { defer close(schedDone); scheduler.Run(schedCtx) }()
	defer func() { stopScheduler(); <-schedDone }()

	operator := server.NewOperator(keys, invites, layers, db, plans.All, loc)
	operator.SetDetection(det.runner)
	srv, err := server.New(c.Server, server.Deps{
		Keys: keys, JWT: verifier, Limiter: layers.Windows, Attempts: layers.Attempts, Quotas: layers.Quotas, Brake: layers.Brake,
		Plans: plans, Reader: reader, Usage: db, Events: events, Price: c.OCR.Price,
		Invites: invites, InviteCodes: db, InviteGuard: guard,
		Operator: operator, Alerts: alerter, DetectCounters: counters,
		AdminToken: adminToken, Logger: log,
	})
	if err != nil {
		return err
	}
	// Defense state is written behind every second; the last flush runs
	// after HTTP has stopped and before the database closes.
	wbCtx, stopWriteBehind := context.WithCancel(context.Background())
	wbDone := make(chan struct{})
	go func() {
		defer close(wbDone)
		srv.NewWriteBehind(db, layers.Windows, layers.Attempts).Run(wbCtx, server.DefaultWriteBehindInterval)
	}()
	defer func() { stopWriteBehind(); <-wbDone }()

	servers := []*http.Server{}
	errc := make(chan error, 2)
	listen := func(name, addr string, h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return "", fmt.Errorf("%s listener: %w", name, err)
		}
		hs, ln := srv.HTTPServer(ln, h)
		servers = append(servers, hs)
		go func() {
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s listener: %w", name, err)
			}
		}()
		log.Info("listening", "listener", name, "addr", ln.Addr().String())
		return ln.Addr().String(), nil
	}
	addr, err := listen("public", c.Server.Listen, srv.Handler())
	if err == nil && adminToken != "" {
		_, err = listen("admin", c.Server.AdminListen, srv.AdminHandler())
	} else if adminToken == "" {
		log.Warn("BREAKWATER_ADMIN_TOKEN is not set: the admin API is off, so the operator commands work only while the server is stopped")
	}
	if err == nil && ready != nil {
		ready(&started{addr: addr, keys: keys, layers: layers, guard: guard, plans: plans, srv: srv, detect: det.runner, log: log})
	}
	if err == nil {
		select {
		case <-ctx.Done():
			log.Info("shutting down: finishing in-flight requests", "timeout", shutdownTimeout(c))
		case err = <-errc:
		}
	}

	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout(c))
	defer cancel()
	for _, hs := range servers {
		if serr := hs.Shutdown(sctx); serr != nil {
			log.Error("shutdown", "addr", hs.Addr, "err", serr)
		}
	}
	return err
}

// shutdownTimeout is how long in-flight requests get to finish: a read
// that started just before the signal must still be recorded and answered.
func shutdownTimeout(c config) time.Duration {
	return c.OCR.WithDefaults().Timeout + shutdownSlack
}

// detection is layer 4's daily run and the mailer it shares with the
// alerts (nil when there is no [alerts] section).
type detection struct {
	runner *detect.Runner
	mail   *detect.Mailer
	sender detect.Sender // mail as a Sender, nil (not a nil *Mailer) when off
}

// newDetection builds the daily detection over db, and the mailer when
// config.toml has an [alerts] section.
func newDetection(c config, db *storage.DB, keys *server.Keyring, plans *server.Plans, layers server.Layers,
	getenv func(string) string, counters *detect.Counters, log *slog.Logger) (*detection, error) {
	loc, _ := c.Budget.Location() // checked by loadConfig
	d := &detection{}
	var mail detect.Sender
	if c.Alerts != nil {
		m, err := detect.NewMailer(*c.Alerts, detect.MailerOptions{
			Password: getenv("BREAKWATER_SMTP_PASSWORD"), Counters: counters, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		d.mail, mail = m, m
	}
	d.sender = mail
	runner, err := detect.NewRunner(db, detect.RunnerOptions{
		Config: c.Detect, Location: loc, RetentionDays: c.Storage.StatsRetentionDays,
		Lines: func() detect.Lines {
			all := plans.All()
			lines := detect.Lines{ByPlan: map[string]int64{}, ByUser: map[string]int64{}}
			for name, p := range all {
				lines.ByPlan[name] = p.DailyAttempts
			}
			for _, u := range keys.Users() {
				lines.ByUser[u.ID] = all[u.Plan].DailyAttempts
			}
			return lines
		},
		Ceilings: func() detect.Ceilings {
			st := layers.Brake.Status(time.Now())
			return detect.Ceilings{DailyRequests: st.DailyRequests, DailyMicroUSD: st.DailyMicroUSD, MonthlyMicroUSD: st.MonthlyMicroUSD}
		},
		Mail: mail, Counters: counters, Logger: log,
	})
	if err != nil {
		d.close(log)
		return nil, err
	}
	d.runner = runner
	return d, nil
}

// close delivers the mail still queued, for at most flushTimeout.
func (d *detection) close(log *slog.Logger) {
	if d.mail == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	if err := d.mail.Close(ctx); err != nil {
		log.Warn("e-mails not all delivered before shutdown", "err", err)
	}
}

// alertInterval is [alerts] min_interval, or its default without mail.
func alertInterval(c config) time.Duration {
	if c.Alerts == nil {
		return detect.DefaultMinInterval
	}
	return c.Alerts.MinInterval
}

// checkAdminListen refuses an admin API reachable from other machines
// unless its token is long enough to resist guessing.
func checkAdminListen(addr, token string) error {
	if token == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("server.admin_listen: %q is not host:port", addr)
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if !loopback && len(token) < 32 {
		return fmt.Errorf("server.admin_listen %q is not a loopback address: BREAKWATER_ADMIN_TOKEN must then be at least 32 characters", addr)
	}
	return nil
}

func newReader(c ocr.Config, apiKey string, log *slog.Logger) (server.Reader, error) {
	if c.Provider == "simulated" {
		log.Warn("ocr.provider is \"simulated\": answers are made up locally and marked \"simulated\": true; no real reads")
		return ocr.NewSimulated(c)
	}
	if apiKey == "" {
		return nil, errors.New("GEMINI_API_KEY is not set: put your Gemini API key in the environment, or set ocr.provider = \"simulated\" to try the service without one")
	}
	for _, warning := range c.Warnings() {
		log.Warn(warning)
	}
	return ocr.NewGemini(c, apiKey, nil, log)
}

func versionString() string {
	if info, ok := debug.ReadBuildInfo(); ok && version == "dev" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return version
}

// ---- demo -----------------------------------------------------------------

func cmdDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, path := newFlags("demo", stderr)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	c, err := readConfig(*path, getenv, true)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "breakwater-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	c.OCR.Provider = "simulated"
	c.Storage.Path = filepath.Join(dir, "breakwater.db")
	c.Server.Listen = "127.0.0.1:0"
	demoPlan := server.DefaultPlan
	if _, ok := c.Plans[demoPlan]; !ok {
		c.Plans = map[string]budget.Plan{demoPlan: {MonthlyQuota: 100, DailyAttempts: budget.DefaultDailyAttempts(100)}}
	}
	if err := c.validate(); err != nil {
		return fmt.Errorf("config %s: %w", *path, err)
	}
	sample := filepath.Join(dir, "label.png")
	if err := writeSampleImage(sample); err != nil {
		return err
	}
	noAdmin := func(key string) string {
		if key == "BREAKWATER_ADMIN_TOKEN" || key == "GEMINI_API_KEY" {
			return "" // the demo never exposes an admin API nor spends real money
		}
		return getenv(key)
	}
	var readyErr error
	err = serve(ctx, c, noAdmin, newLogger(stderr), func(st *started) {
		addr := st.addr
		secret, _, err := st.keys.Create("demo-user", demoPlan)
		if err != nil {
			readyErr = err
			return
		}
		fmt.Fprintf(stdout, "Breakwater demo: simulated upstream, throwaway database in %s (deleted on exit).\n", dir)
		fmt.Fprintf(stdout, "API key for user demo-user (plan %s):\n%s\n", demoPlan, secret)
		fmt.Fprintf(stdout, "Try it:\n")
		fmt.Fprintf(stdout, "curl -sS -H 'Authorization: Bearer %s' -H 'Content-Type: image/png' --data-binary @%s http://%s/v1/ocr\n", secret, sample, addr)
		fmt.Fprintf(stdout, "Press Ctrl+C to stop.\n")
	})
	return errors.Join(err, readyErr)
}

// writeSampleImage draws a small label-like PNG for the demo's curl line.
func writeSampleImage(path string) error {
	img := image.NewGray(image.Rect(0, 0, 320, 96))
	for y := range 96 {
		for x := range 320 {
			v := uint8(255)
			if (y > 30 && y < 66) && (x/8)%3 == 0 && x > 20 && x < 300 {
				v = 0
			}
			img.SetGray(x, y, color.Gray{Y: v})
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ---- operator commands -----------------------------------------------------

// operator is what the operator's commands need: the running server's admin
// API (server.AdminClient) or, while the server is stopped, the same
// commands straight on the database (server.Operator).
type operator interface {
	CreateKey(ctx context.Context, user, plan string) (string, server.KeyInfo, error)
	ListKeys(ctx context.Context) ([]server.KeyInfo, error)
	RevokeKey(ctx context.Context, id string) (server.KeyInfo, error)
	SetBanned(ctx context.Context, user string, banned bool) (server.UserInfo, error)
	SetPlan(ctx context.Context, user, plan string) (server.UserInfo, error)
	Usage(ctx context.Context, user string) ([]server.UsageInfo, error)
	Budget(ctx context.Context) (server.BudgetInfo, error)
	SetBrake(ctx context.Context, on bool) (server.BudgetInfo, error)
	Backup(ctx context.Context, w io.Writer, target string) error
	CreateInvite(ctx context.Context, uses int, ttl time.Duration, note string) (string, server.InviteInfo, error)
	ListInvites(ctx context.Context) ([]server.InviteInfo, error)
	RevokeInvite(ctx context.Context, id string) (server.InviteInfo, error)
	DeleteInvite(ctx context.Context, id string) (server.InviteInfo, error)
	DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error)
}

var (
	_ operator = (*server.Operator)(nil)
	_ operator = (*server.AdminClient)(nil)
)

// openOperator reaches the service: the database directly if no server
// holds it, else the server's admin API.
func openOperator(c config, getenv func(string) string) (operator, func(), error) {
	db, err := storage.Open(c.Storage.Path, storage.Options{Timeout: cliLockTimeout, Logger: slog.New(slog.DiscardHandler)})
	if errors.Is(err, storage.ErrLocked) {
		token := getenv("BREAKWATER_ADMIN_TOKEN")
		if token == "" {
			return nil, nil, fmt.Errorf("the server is running and holds %s: set BREAKWATER_ADMIN_TOKEN so this command can use its admin API at %s", c.Storage.Path, c.Server.AdminListen)
		}
		return server.NewAdminClient(c.Server.AdminListen, token), func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	op, closeDet, err := newOperator(c, db, getenv)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return op, func() { closeDet(); db.Close() }, nil
}

// newOperator builds the operator's commands over an open database, with
// the layers' state as the server would load it, and the daily detection.
// The returned func delivers the mail a command queued (the digest of
// detect run); call it before closing db.
func newOperator(c config, db *storage.DB, getenv func(string) string) (*server.Operator, func(), error) {
	loc, _ := c.Budget.Location() // checked by loadConfig
	plans := server.NewPlans(c.Plans)
	keys, err := server.NewKeyring(db, plans.Has)
	if err != nil {
		return nil, nil, err
	}
	log := slog.New(slog.DiscardHandler)
	layers, err := server.LoadLayers(db, c.Limits.User, c.Budget, loc, time.Now(), log)
	if err != nil {
		return nil, nil, err
	}
	if err := server.LoadBrake(layers.Brake, db.Flag); err != nil {
		return nil, nil, err
	}
	invites, err := server.NewInvites(db)
	if err != nil {
		return nil, nil, err
	}
	det, err := newDetection(c, db, keys, plans, layers, getenv, &detect.Counters{}, log)
	if err != nil {
		return nil, nil, err
	}
	op := server.NewOperator(keys, invites, layers, db, plans.All, loc)
	op.SetDetection(det.runner)
	return op, func() { det.close(log) }, nil
}

// operatorUsage lists the operator's commands, for usage errors.
const operatorUsage = `breakwater keys create --user ID [--plan NAME] | keys list | keys revoke KEY_ID
breakwater users ban ID | users unban ID | users set-plan ID PLAN
breakwater invites create [--uses N] [--expires 72h] [--note TEXT] | invites list | invites revoke INVITE_ID | invites delete INVITE_ID
breakwater usage [ID] | budget | brake on|off | backup FILE
breakwater detect run [--day YYYY-MM-DD] [--no-mail]
(each takes --config FILE; listings take --json)`

// cmdOperator runs keys, users, usage, budget, brake and backup.
func cmdOperator(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	sub := ""
	if cmd == "keys" || cmd == "users" || cmd == "invites" || cmd == "detect" {
		if len(args) == 0 {
			return fmt.Errorf("%w: %s", errUsage, operatorUsage)
		}
		sub, args = args[0], args[1:]
	}
	fs, path := newFlags(strings.TrimSpace(cmd+" "+sub), stderr)
	user := fs.String("user", "", "user id the key acts for (keys create)")
	plan := fs.String("plan", "", "plan from config.toml (keys create; default: the user's plan, or \"free\")")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	uses := fs.Int("uses", 1, "how many different e-mails may redeem the code (invites create)")
	expires := fs.Duration("expires", 72*time.Hour, "how long the code stays valid; 0 for ever (invites create)")
	note := fs.String("note", "", "a note for yourself, shown by invites list (invites create)")
	day := fs.String("day", "", "day to run detection for, YYYY-MM-DD (detect run; default: yesterday)")
	noMail := fs.Bool("no-mail", false, "do not send the digest (detect run)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	want := map[string]int{ // positional arguments each command takes
		"keys create": 0, "keys list": 0, "keys revoke": 1,
		"users ban": 1, "users unban": 1, "users set-plan": 2,
		"invites create": 0, "invites list": 0, "invites revoke": 1, "invites delete": 1,
		"budget": 0, "brake": 1, "backup": 1, "detect run": 0,
	}
	name := strings.TrimSpace(cmd + " " + sub)
	n, known := want[name]
	switch {
	case name == "usage" && len(pos) <= 1:
	case !known || len(pos) != n || (name == "keys create" && *user == ""):
		return fmt.Errorf("%w: %s", errUsage, operatorUsage)
	case name == "brake" && pos[0] != "on" && pos[0] != "off":
		return fmt.Errorf("%w: breakwater brake on|off", errUsage)
	case name == "invites create" && (*uses < 1 || *expires < 0):
		return fmt.Errorf("%w: breakwater invites create [--uses N (at least 1)] [--expires 72h] [--note TEXT]", errUsage)
	}

	c, err := loadConfig(*path, getenv)
	if err != nil {
		return err
	}
	op, closeOp, err := openOperator(c, getenv)
	if err != nil {
		return err
	}
	defer closeOp()

	switch name {
	case "keys create":
		secret, info, err := op.CreateKey(ctx, *user, *plan)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created key %s for user %s (plan %s); it is shown only now:\n%s\n", info.ID, info.UserID, info.Plan, secret)
	case "keys list":
		list, err := op.ListKeys(ctx)
		if err != nil {
			return err
		}
		return printOut(stdout, *asJSON, list, "ID\tUSER\tPLAN\tCREATED\tREVOKED", func(row func(...any)) {
			for _, k := range list {
				revoked := "-"
				if !k.RevokedAt.IsZero() {
					revoked = k.RevokedAt.Format(time.RFC3339)
				}
				row(k.ID, k.UserID, k.Plan, k.CreatedAt.Format(time.RFC3339), revoked)
			}
		})
	case "keys revoke":
		info, err := op.RevokeKey(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked key %s of user %s\n", info.ID, info.UserID)
	case "users ban", "users unban":
		info, err := op.SetBanned(ctx, pos[0], sub == "ban")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "user %s: banned=%v\n", info.ID, info.Banned)
	case "users set-plan":
		info, err := op.SetPlan(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "user %s: plan %s\n", info.ID, info.Plan)
	case "invites create":
		code, info, err := op.CreateInvite(ctx, *uses, *expires, *note)
		if err != nil {
			return err
		}
		until := "never expires"
		if !info.ExpiresAt.IsZero() {
			until = "expires " + info.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(stdout, "created invite %s for %d use(s), %s; the code is shown only now:\n%s\n", info.ID, info.MaxUses, until, code)
	case "invites list":
		list, err := op.ListInvites(ctx)
		if err != nil {
			return err
		}
		return printOut(stdout, *asJSON, list, "ID\tUSES\tCREATED\tEXPIRES\tREVOKED\tNOTE", func(row func(...any)) {
			for _, inv := range list {
				row(inv.ID, fmt.Sprintf("%d/%d", inv.Uses, inv.MaxUses), inv.CreatedAt.Format(time.RFC3339), orDash(inv.ExpiresAt), orDash(inv.RevokedAt), inv.Note)
			}
		})
	case "invites revoke":
		info, err := op.RevokeInvite(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked invite %s\n", info.ID)
	case "invites delete":
		info, err := op.DeleteInvite(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted invite %s and the e-mails that redeemed it (%d)\n", info.ID, info.Uses)
	case "usage":
		id := ""
		if len(pos) == 1 {
			id = pos[0]
		}
		list, err := op.Usage(ctx, id)
		if err != nil {
			return err
		}
		return printOut(stdout, *asJSON, list, "USER\tPLAN\tBANNED\tATTEMPTS TODAY\tDAILY LINE\tREADS TODAY\tREADS THIS MONTH\tQUOTA\tCOST TODAY\tCOST THIS MONTH", func(row func(...any)) {
			for _, u := range list {
				row(u.User, u.Plan, u.Banned, u.AttemptsToday, limitText(u.DailyLine), u.ReadsToday, u.ReadsMonth, u.MonthlyQuota,
					fmt.Sprintf("$%.6f", u.CostTodayUSD), fmt.Sprintf("$%.6f", u.CostMonthUSD))
			}
		})
	case "budget", "brake":
		var b server.BudgetInfo
		if name == "budget" {
			b, err = op.Budget(ctx)
		} else {
			b, err = op.SetBrake(ctx, pos[0] == "on")
		}
		if err != nil {
			return err
		}
		return printOut(stdout, *asJSON, b, "CEILING\tSPENT\tLIMIT", func(row func(...any)) {
			row("requests "+b.Day, b.Requests, limitText(b.DailyRequests))
			row("usd "+b.Day, fmt.Sprintf("$%.6f", b.SpendUSD), usdText(b.DailyUSD))
			row("usd "+b.Month, fmt.Sprintf("$%.6f", b.MonthSpendUSD), usdText(b.MonthlyUSD))
			state := "released"
			if b.Engaged {
				state = "ENGAGED by " + b.EngagedBy
			}
			row("brake", state, fmt.Sprintf("manual switch %s", onOff(b.Manual)))
		})
	case "backup":
		return backupTo(ctx, op, pos[0], stdout)
	case "detect run":
		rep, err := op.DetectRun(ctx, *day, !*noMail)
		if err != nil {
			return err
		}
		if *asJSON {
			return printOut(stdout, true, rep, "", nil)
		}
		s := rep.Service
		fmt.Fprintf(stdout, "detection for %s: %d attempts (%d ok, %d failed) by %d users from %d IPs, $%.6f; %d invite checks; %d old events pruned\n",
			rep.Day, s.Attempts, s.Successes, s.Failures, s.Users, s.IPs, float64(s.CostMicroUSD)/1e6, s.Invites, rep.Pruned)
		switch {
		case len(rep.Findings) == 0:
			fmt.Fprintln(stdout, "no findings")
			return nil
		case rep.Mailed:
			fmt.Fprintf(stdout, "%d findings; digest queued for mail\n", len(rep.Findings))
		default:
			fmt.Fprintf(stdout, "%d findings\n", len(rep.Findings))
		}
		return printOut(stdout, false, rep, "DETECTOR\tSUBJECT\tFIGURES", func(row func(...any)) {
			for _, f := range rep.Findings {
				row(f.Detector, detect.Escape(f.Subject), detect.FiguresText(f.Figures))
			}
		})
	}
	return nil
}

// backupTo writes a consistent copy of the database to path: into a
// temporary file beside it first, synced, then renamed, so path never holds
// half a database.
func backupTo(ctx context.Context, op operator, path string, stdout io.Writer) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(abs), filepath.Base(abs)+".part-*")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if err := op.Backup(ctx, tmp, abs); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("backup: %w", err)
	}
	info, err := tmp.Stat()
	if err != nil {
		tmp.Close()
		return fmt.Errorf("backup: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil { // make the rename itself durable
		dir.Sync()
		dir.Close()
	}
	fmt.Fprintf(stdout, "backup written to %s (%d bytes)\n", path, info.Size())
	return nil
}

// printOut prints v as JSON, or as a table whose rows fill calls.
func printOut(w io.Writer, asJSON bool, v any, header string, fill func(row func(...any))) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	fill(func(cells ...any) {
		for i, c := range cells {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
	})
	return tw.Flush()
}

// orDash formats t for a table, "-" for the zero time.
func orDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}

func limitText(n int64) string {
	if n == 0 {
		return "off"
	}
	return strconv.FormatInt(n, 10)
}

func usdText(v float64) string {
	if v == 0 {
		return "off"
	}
	return fmt.Sprintf("$%.2f", v)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
