package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"breakwater/detect"
	"breakwater/server/operator"
)

func detectCmd(e *env) *cobra.Command {
	var (
		day            string
		noMail, asJSON bool
	)
	run := &cobra.Command{
		Use:   "run [--day YYYY-MM-DD] [--no-mail] [--json]",
		Short: "run the daily detection now (default: yesterday), print the findings",
		Long: `Run the daily detection now for a day (default: yesterday in budget.timezone):
aggregate it again, replacing an earlier run of that day, print the day's
figures and the findings, and mail the digest unless --no-mail. A day whose
events are past storage.stats_retention_days is refused.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.operate(func(op operator.Service) error {
				rep, err := op.DetectRun(c.Context(), day, !noMail)
				if err != nil {
					return err
				}
				if asJSON {
					return printOut(e.stdout, true, rep, "", nil)
				}
				return printReport(e.stdout, rep)
			})
		},
	}
	run.Flags().StringVar(&day, "day", "", "the day to run the detection for, `YYYY-MM-DD` (default: yesterday)")
	run.Flags().BoolVar(&noMail, "no-mail", false, "do not send the digest")
	run.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return group("detect", "run the daily detection", run)
}

// printReport prints a detection run: the day's figures, then the findings.
func printReport(w io.Writer, rep detect.Report) error {
	s := rep.Service
	fmt.Fprintf(w, "detection for %s: %d attempts (%d ok, %d failed) by %d users from %d IPs, $%.6f; %d invite checks; %d old events pruned\n",
		rep.Day, s.Attempts, s.Successes, s.Failures, s.Users, s.IPs, float64(s.CostMicroUSD)/1e6, s.Invites, rep.Pruned)
	switch {
	case len(rep.Findings) == 0:
		fmt.Fprintln(w, "no findings")
		return nil
	case rep.Mailed:
		fmt.Fprintf(w, "%d findings; digest queued for mail\n", len(rep.Findings))
	default:
		fmt.Fprintf(w, "%d findings\n", len(rep.Findings))
	}
	return printOut(w, false, rep, "DETECTOR\tSUBJECT\tFIGURES", func(row func(...any)) {
		for _, f := range rep.Findings {
			row(f.Detector, detect.Escape(f.Subject), detect.FiguresText(f.Figures))
		}
	})
}
