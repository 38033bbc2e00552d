package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"breakwater/detect"
	"breakwater/server/app"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

func configCmd(e *env) *cobra.Command {
	check := &cobra.Command{
		Use:   "check",
		Short: "validate the config and say what is missing from the environment",
		Long: `Validate the config file as serve would (an unknown key, a bad value or a
missing plan is an error, exit 1), then say what the environment lacks and
which limits are off, and which image-token rule, prices and thinking
setting apply to the calls (and the day the model table was checked).
What would make serve refuse to start (GEMINI_API_KEY
unset with ocr.provider "gemini", an admin_listen off loopback with a short
BREAKWATER_ADMIN_TOKEN) is an error too. It names the money keys the file
leaves to their defaults: a running server whose config set one of them
refuses to reload this file, and keeps its config.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(c *cobra.Command, _ []string) error { return e.configCheck() },
	}
	return group("config", "check the config file, or write the default one", check, configInitCmd(e))
}

func (e *env) configCheck() error {
	c, err := app.Load(e.config, e.getenv)
	if err != nil {
		return err
	}
	out, getenv := e.stdout, e.getenv
	fmt.Fprintf(out, "%s: the file is valid\n", e.config)
	if c.OCR.Provider == "simulated" {
		fmt.Fprintln(out, "note: ocr.provider is \"simulated\": no real reads are made")
	}
	if c.Storage.Backend == storage.BackendPostgres {
		if err := e.checkPostgres(c.Storage.PostgresMaxConnections); err != nil {
			return fmt.Errorf("serve would refuse to start: %w", err)
		}
	} else if getenv("BREAKWATER_ADMIN_TOKEN") == "" {
		fmt.Fprintln(out, "note: BREAKWATER_ADMIN_TOKEN is not set: the admin API is off, so the operator commands work only while the server is stopped")
	}
	printAlerts(out, c.AlertSettings(), getenv)
	if warning := c.JWTAudienceWarning(); warning != "" {
		fmt.Fprintln(out, "warning:", warning)
	}
	today := c.Today(time.Now())
	if c.OCR.Provider != "simulated" {
		for _, rule := range c.OCR.Rules(today) {
			fmt.Fprintln(out, "ocr:", rule)
		}
	}
	for _, warning := range c.OCR.Warnings(today) {
		fmt.Fprintln(out, "warning:", warning)
	}
	for _, w := range c.OffSwitches() {
		fmt.Fprintln(out, "WARNING: limit off:", w)
	}
	for _, w := range c.Warnings() {
		fmt.Fprintln(out, "warning:", w)
	}
	if left := c.MoneyDefaults(); len(left) > 0 {
		fmt.Fprintf(out, "note: this file leaves money keys to their defaults: %s; a running server whose config set one of them "+
			"refuses to reload this file (it keeps its config and logs the keys): write them back, or restart to apply the file\n", strings.Join(left, ", "))
	}
	// The file is valid, but serve would still refuse to start: exit 1.
	if err := app.CheckStart(c, getenv); err != nil {
		return fmt.Errorf("serve would refuse to start: %w", err)
	}
	return nil
}

// printAlerts says where alerts go: mail, each webhook (by the variable
// that holds its URL, never the URL), or only the log.
func printAlerts(out io.Writer, a detect.AlertsConfig, getenv func(string) string) {
	if !a.MailOn() && len(a.Webhooks) == 0 {
		fmt.Fprintln(out, "note: no [alerts] channel (smtp_host or [[alerts.webhook]]): alerts and findings are only logged (WARN)")
	}
	if a.MailOn() {
		fmt.Fprintf(out, "mail: alerts go to %s through %s:%d (tls %s)\n", strings.Join(a.To, ", "), a.SMTPHost, a.SMTPPort, a.TLS)
		if a.SMTPUsername != "" && getenv("BREAKWATER_SMTP_PASSWORD") == "" {
			fmt.Fprintln(out, "note: alerts.smtp_username is set but BREAKWATER_SMTP_PASSWORD is not: the mail server will refuse the login")
		}
	}
	for i, w := range a.Webhooks {
		fmt.Fprintf(out, "webhook %d: %s to $%s", i+1, w.Format, w.URLEnv)
		if w.SecretEnv != "" {
			fmt.Fprintf(out, ", signed with $%s", w.SecretEnv)
		}
		fmt.Fprintln(out)
		if getenv(w.URLEnv) == "" {
			fmt.Fprintf(out, "warning: %s is not set: serve leaves this webhook out\n", w.URLEnv)
		}
	}
	if len(a.WarnAt) == 0 {
		fmt.Fprintln(out, "note: alerts.warn_at = []: no early warning before the brake engages")
	}
}

// checkStandbys says whether the server's commits wait for a synchronous
// standby, which a failover must be to lose nothing, and warns when they
// do not, or wait for one that is not there.
func checkStandbys(out io.Writer, f postgres.Found) {
	names := f.SyncStandbyNames
	switch {
	case names == "":
		async := ""
		if f.Standbys > 0 {
			async = fmt.Sprintf(" (%d asynchronous %s streaming)", f.Standbys, plural(f.Standbys, "standby", "standbys"))
		}
		fmt.Fprintf(out, "warning: the server has no synchronous standby%s (synchronous_standby_names is empty): a failover to a standby may lose "+
			"the last commits (budget leases, usage rows of answered reads, attempts, quota holds); see docs/INSTANCES.md, Failover to a standby\n", async)
	case f.SyncStandbys > 0:
		fmt.Fprintf(out, "storage: %d synchronous %s streaming (synchronous_standby_names = %q): every commit of the money waits for it\n",
			f.SyncStandbys, plural(f.SyncStandbys, "standby", "standbys"), names)
	case f.StandbysHidden > 0:
		fmt.Fprintf(out, "note: synchronous_standby_names = %q, and the role %s may not read the standbys' state (pg_stat_replication needs "+
			"pg_read_all_stats): whether a synchronous standby is connected is not known; while none is, every commit waits\n", names, f.Role)
	default:
		fmt.Fprintf(out, "warning: synchronous_standby_names = %q but no synchronous standby is connected: every commit waits for one, "+
			"and paid reads stop, until one connects\n", names)
	}
}

// checkPostgres connects to the database of storage.backend = "postgres"
// and says what it found, writing nothing; pool is the instances'
// storage.postgres_max_connections.
func (e *env) checkPostgres(pool int) error {
	out, getenv := e.stdout, e.getenv
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := postgres.Probe(ctx, getenv(postgres.EnvURL))
	if err != nil {
		return fmt.Errorf("storage.backend = \"postgres\": %w", err)
	}
	fmt.Fprintf(out, "storage: postgres, database %s at %s (PostgreSQL %s)\n", f.Database, f.Host, f.Server)
	records := fmt.Sprintf("%d active %s, %d %s", f.Keys, plural(int(f.Keys), "key", "keys"), f.Users, plural(int(f.Users), "user", "users"))
	switch {
	case f.Schema == 0:
		fmt.Fprintf(out, "storage: no Breakwater tables yet: serve (or keys create, or migrate) makes them (schema %d)\n", f.Latest)
	case f.Schema < f.Latest:
		fmt.Fprintf(out, "storage: schema %d, this binary's is %d: the first instance to start migrates it; %s\n", f.Schema, f.Latest, records)
	default:
		fmt.Fprintf(out, "storage: schema %d (current); %s\n", f.Schema, records)
	}
	printConns(out, f.Conns, pool)
	if f.ServerNum < postgres.MinServer {
		fmt.Fprintf(out, "warning: PostgreSQL %s is older than 14: a usage record whose connection fails after its commit cannot be read back, and its read is then withheld (503) though it may be charged\n", f.Server)
	}
	checkStandbys(out, f)
	if f.SynchronousCommit != "on" {
		fmt.Fprintf(out, "note: the server's synchronous_commit is %q; Breakwater's sessions set it on\n", f.SynchronousCommit)
	}
	if getenv("BREAKWATER_ADMIN_TOKEN") == "" {
		fmt.Fprintln(out, "note: BREAKWATER_ADMIN_TOKEN is not set: the admin API and the dashboard are off; the operator commands work on the database directly")
	}
	return nil
}
