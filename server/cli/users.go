package cli

import (
	"breakwater/server/operator"
	"fmt"

	"github.com/spf13/cobra"
)

func usersCmd(e *env) *cobra.Command {
	return group("users", "ban, unban and move users between plans", usersBanCmd(e, true), usersBanCmd(e, false), usersSetPlanCmd(e))
}

// usersBanCmd is "users ban ID", or "users unban ID" when ban is false.
func usersBanCmd(e *env, ban bool) *cobra.Command {
	use, short := "ban ID", "the user's next request gets 403 banned"
	if !ban {
		use, short = "unban ID", "the user's requests work again"
	}
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              positional(1, "ID"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.SetBanned(c.Context(), args[0], ban)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "user %s: banned=%v\n", info.ID, info.Banned)
				return nil
			})
		},
	}
}

func usersSetPlanCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "set-plan ID PLAN",
		Short:             "move an existing API-key user to another plan at once",
		Args:              positional(2, "ID", "PLAN"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.SetPlan(c.Context(), args[0], args[1])
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "user %s: plan %s\n", info.ID, info.Plan)
				return nil
			})
		},
	}
}
