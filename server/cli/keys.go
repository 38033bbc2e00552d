package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"breakwater/server/operator"
)

func keysCmd(e *env) *cobra.Command {
	return group("keys", "create, list and revoke API keys", keysCreateCmd(e), keysListCmd(e), keysRevokeCmd(e))
}

func keysCreateCmd(e *env) *cobra.Command {
	var user, plan string
	c := &cobra.Command{
		Use:   "create --user ID [--plan NAME]",
		Short: "a new API key, printed alone on the last line and never again",
		Long: `Create an API key for a user and print it alone on the last line; it is
never shown again. Without --plan an existing user keeps theirs and a new
user gets "free"; with it, an existing user moves to that plan.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			if user == "" {
				return usageErrorf(c, "--user is required")
			}
			return e.operateOrCreate(func(op operator.Service) error {
				secret, info, err := op.CreateKey(c.Context(), user, plan)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "created key %s for user %s (plan %s); it is shown only now:\n%s\n", info.ID, info.UserID, info.Plan, secret)
				return nil
			})
		},
	}
	c.Flags().StringVar(&user, "user", "", "the user `ID` the key acts for (required)")
	c.Flags().StringVar(&plan, "plan", "", "a plan `NAME` from the config (default: the user's plan, or \"free\")")
	return c
}

func keysListCmd(e *env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:               "list [--json]",
		Short:             "every key: id, user, plan, created, revoked; never the key itself",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.operate(func(op operator.Service) error {
				list, err := op.ListKeys(c.Context())
				if err != nil {
					return err
				}
				return printOut(e.stdout, asJSON, list, "ID\tUSER\tPLAN\tCREATED\tREVOKED", func(row func(...any)) {
					for _, k := range list {
						row(k.ID, k.UserID, k.Plan, k.CreatedAt.Format(time.RFC3339), orDash(k.RevokedAt))
					}
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func keysRevokeCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "revoke KEY_ID",
		Short:             "the key stops working on the next request",
		Args:              idArg(operator.KindKey, "KEY_ID"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.RevokeKey(c.Context(), args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "revoked key %s of user %s\n", info.ID, info.UserID)
				return nil
			})
		},
	}
}
