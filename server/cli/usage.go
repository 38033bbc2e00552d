package cli

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"breakwater/server/operator"
)

func usageCmd(e *env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "usage [ID] [--json]",
		Short: "today's attempts, this month's reads, quota and cost, per user",
		Long: `Per user (or for one): attempts today against the daily line, reads
(successes) today and this month against the quota, cost today and this month,
the requests today that a layer in shadow mode would have refused, per
layer, and today's reads per model (ocr.model, or ocr.fallback_model above a
soft ceiling) (while serving, live from the server; stopped, as recorded).`,
		Args:              positional(0, "ID"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			return e.operate(func(op operator.Service) error {
				list, err := op.Usage(c.Context(), id)
				if err != nil {
					return err
				}
				return printOut(e.stdout, asJSON, list, "USER\tPLAN\tBANNED\tATTEMPTS TODAY\tDAILY LINE\tREADS TODAY\tREADS THIS MONTH\tQUOTA\tCOST TODAY\tCOST THIS MONTH\tSHADOW REFUSALS TODAY\tREADS TODAY BY MODEL", func(row func(...any)) {
					for _, u := range list {
						row(u.User, u.Plan, u.Banned, u.AttemptsToday, limitText(u.DailyLine), u.ReadsToday, u.ReadsMonth, u.MonthlyQuota,
							fmt.Sprintf("$%.6f", u.CostTodayUSD), fmt.Sprintf("$%.6f", u.CostMonthUSD), shadowText(u.ShadowToday),
							shadowText(u.ReadsTodayByModel))
					}
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

// shadowText lists counts per name: would-be refusals per layer, "rate 8,
// attempts 2", or reads per model; "-" for none.
func shadowText(byLayer map[string]int64) string {
	if len(byLayer) == 0 {
		return "-"
	}
	var parts []string
	for _, layer := range slices.Sorted(maps.Keys(byLayer)) {
		parts = append(parts, fmt.Sprintf("%s %d", layer, byLayer[layer]))
	}
	return strings.Join(parts, ", ")
}

func budgetCmd(e *env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:               "budget [--json]",
		Short:             "spend against each ceiling, brake state",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.operate(func(op operator.Service) error {
				b, err := op.Budget(c.Context())
				if err != nil {
					return err
				}
				return printBudget(e.stdout, asJSON, b)
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func brakeCmd(e *env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "brake on|off [--json]",
		Short: "the manual kill switch (survives restarts)",
		Long: `Engage (on) or release (off) the manual brake: the paid endpoint answers
503 paused_by_operator (Retry-After: 300) at once, and the switch is stored,
so it survives restarts. Prints the budget as it is then.`,
		Args: func(c *cobra.Command, args []string) error {
			if err := positional(1, "on|off")(c, args); err != nil {
				return err
			}
			if args[0] != "on" && args[0] != "off" {
				return usageErrorf(c, "%q: want on or off", args[0])
			}
			return nil
		},
		ValidArgs: []string{"on", "off"},
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				b, err := op.SetBrake(c.Context(), args[0] == "on")
				if err != nil {
					return err
				}
				return printBudget(e.stdout, asJSON, b)
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

// printBudget prints the spend against each ceiling and the brake state.
func printBudget(w io.Writer, asJSON bool, b operator.BudgetInfo) error {
	return printOut(w, asJSON, b, "CEILING\tSPENT\tLIMIT", func(row func(...any)) {
		row("requests "+b.Day, b.Requests, limitText(b.DailyRequests))
		row("usd "+b.Day, operator.FormatUSD(b.SpendUSD), usdText(b.DailyUSD))
		row("usd "+b.Month, operator.FormatUSD(b.MonthSpendUSD), usdText(b.MonthlyUSD))
		state := "released"
		if b.Engaged {
			state = "ENGAGED by " + b.EngagedBy
		}
		row("brake", state, fmt.Sprintf("manual switch %s", onOff(b.Manual)))
		model := "primary"
		if b.DegradedBy != "" {
			model = "FALLBACK above " + b.DegradedBy
		}
		row("model", model, "reads today: "+shadowText(b.ReadsByModel))
	})
}
