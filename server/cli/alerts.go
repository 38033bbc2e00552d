package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"breakwater/detect"
)

func alertsCmd(e *env) *cobra.Command {
	test := &cobra.Command{
		Use:   "test",
		Short: "send a test mail now through [alerts] and print what the SMTP server said",
		Long: `Send one test mail now to alerts.to through the SMTP server of [alerts], at
once and without retries (alerts themselves are queued and retried), and
print what the server answered: its acceptance, or its refusal as the
error (exit 1). Needs no database and no running server.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(c *cobra.Command, _ []string) error { return e.alertsTest(c.Context()) },
	}
	return group("alerts", "send a test mail through the [alerts] settings", test)
}

func (e *env) alertsTest(ctx context.Context) error {
	c, err := e.loadForOperator()
	if err != nil {
		return err
	}
	if c.Alerts == nil {
		return errors.New("alerts test: config.toml has no [alerts] section, so mail is off; add one (see config.toml)")
	}
	a := *c.Alerts
	m, err := detect.NewMailer(a, detect.MailerOptions{Password: e.getenv("BREAKWATER_SMTP_PASSWORD"), Counters: &detect.Counters{}})
	if err != nil {
		return err
	}
	defer m.Close(ctx)
	server := fmt.Sprintf("%s:%d (tls %s)", a.SMTPHost, a.SMTPPort, a.TLS)
	reply, err := m.SendNow("test mail", "This is a test mail from breakwater alerts test: alerts and findings reach this address.\n")
	if err != nil {
		return fmt.Errorf("alerts test: %s refused the mail: %w", server, err)
	}
	fmt.Fprintf(e.stdout, "test mail to %s sent through %s; the server said: %s\n", strings.Join(a.To, ", "), server, reply)
	return nil
}
