package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"breakwater/detect"
	"breakwater/server/app"
)

func alertsCmd(e *env) *cobra.Command {
	test := &cobra.Command{
		Use:   "test",
		Short: "send a test alert now to every [alerts] channel and print each answer",
		Long: `Send one test alert now to every channel of [alerts]: mail to alerts.to
through its SMTP server (when smtp_host is set) and each [[alerts.webhook]],
at once and without retries (alerts themselves are queued and retried), and
print what each answered: its acceptance, or its refusal. Any refusal makes
the command exit 1, after trying the other channels. Needs no database and
no running server.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(c *cobra.Command, _ []string) error { return e.alertsTest(c.Context()) },
	}
	return group("alerts", "send a test alert to every [alerts] channel", test)
}

// testNotice is the alert breakwater alerts test sends.
func testNotice(a detect.AlertsConfig, now time.Time) detect.Notice {
	st := detect.AlertState{Kind: detect.KindTest, SentAt: now,
		Summary: "This is a test alert from breakwater alerts test: alerts and findings reach this channel."}
	return detect.NewNotice(st, nil, time.UTC, a.DashboardURL)
}

func (e *env) alertsTest(ctx context.Context) error {
	c, err := e.loadForOperator()
	if err != nil {
		return err
	}
	a := c.AlertSettings()
	if !a.MailOn() && len(a.Webhooks) == 0 {
		return errors.New("alerts test: no [alerts] channel (neither smtp_host nor [[alerts.webhook]]): alerts are only logged; add one (see config.toml)")
	}
	n := testNotice(a, time.Now())
	var failed []string
	if a.MailOn() {
		if err := e.testMail(ctx, a, n); err != nil {
			failed = append(failed, fmt.Sprintf("mail: %v", err))
		}
	}
	for _, w := range app.Webhooks(a, e.getenv, &detect.Counters{}, nil) {
		if w.Err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", w.Name, w.Err))
			continue
		}
		reply, err := w.Hook.SendNow(ctx, n)
		w.Hook.Close(ctx)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", w.Name, err))
			continue
		}
		fmt.Fprintf(e.stdout, "%s: the receiver said: %s\n", w.Name, reply)
	}
	if len(failed) > 0 {
		return fmt.Errorf("alerts test: %s", strings.Join(failed, "; "))
	}
	return nil
}

// testMail sends n by mail at once and prints the server's answer.
func (e *env) testMail(ctx context.Context, a detect.AlertsConfig, n detect.Notice) error {
	m, err := detect.NewMailer(a, detect.MailerOptions{Password: e.getenv("BREAKWATER_SMTP_PASSWORD"), Counters: &detect.Counters{}})
	if err != nil {
		return err
	}
	defer m.Close(ctx)
	server := fmt.Sprintf("%s:%d (tls %s)", a.SMTPHost, a.SMTPPort, a.TLS)
	reply, err := m.SendNow(n.Subject, n.Text)
	if err != nil {
		return fmt.Errorf("%s refused the mail: %w", server, err)
	}
	fmt.Fprintf(e.stdout, "mail: test mail to %s sent through %s; the server said: %s\n", strings.Join(a.To, ", "), server, reply)
	return nil
}
