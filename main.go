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
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/server/app"
	"breakwater/server/keys"
	"breakwater/server/operator"
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

func cmdConfigCheck(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, path := newFlags("config check", stderr)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	c, err := app.Load(*path, getenv)
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
	if warning := c.JWTAudienceWarning(); warning != "" {
		fmt.Fprintln(stdout, "warning:", warning)
	}
	for _, warning := range c.OCR.Warnings() {
		fmt.Fprintln(stdout, "warning:", warning)
	}
	for _, w := range c.OffSwitches() {
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
	c, err := app.Load(*path, getenv)
	if err != nil {
		return err
	}
	log := newLogger(stderr)
	log.Info("breakwater", "version", versionString())
	a, err := app.Open(ctx, c, app.Options{Getenv: getenv, Logger: log})
	if err != nil {
		return err
	}
	defer a.Close()
	a.Watch(ctx, *path)
	return a.Wait(ctx)
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
	c, err := app.Read(*path, getenv, true)
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
	demoPlan := keys.DefaultPlan
	if _, ok := c.Plans[demoPlan]; !ok {
		c.Plans = map[string]budget.Plan{demoPlan: {MonthlyQuota: 100, DailyAttempts: budget.DefaultDailyAttempts(100)}}
	}
	if err := c.Validate(); err != nil {
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
	a, err := app.Open(ctx, c, app.Options{Getenv: noAdmin, Logger: newLogger(stderr)})
	if err != nil {
		return err
	}
	defer a.Close()
	secret, _, err := a.Keys().Create("demo-user", demoPlan)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Breakwater demo: simulated upstream, throwaway database in %s (deleted on exit).\n", dir)
	fmt.Fprintf(stdout, "API key for user demo-user (plan %s):\n%s\n", demoPlan, secret)
	fmt.Fprintf(stdout, "Try it:\n")
	fmt.Fprintf(stdout, "curl -sS -H 'Authorization: Bearer %s' -H 'Content-Type: image/png' --data-binary @%s http://%s/v1/ocr\n", secret, sample, a.Addr())
	fmt.Fprintf(stdout, "Press Ctrl+C to stop.\n")
	return a.Wait(ctx)
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

	c, err := app.Load(*path, getenv)
	if err != nil {
		return err
	}
	op, closeOp, err := app.OpenOperator(c, app.Options{Getenv: getenv})
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
		var b operator.BudgetInfo
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
func backupTo(ctx context.Context, op operator.Service, path string, stdout io.Writer) error {
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
