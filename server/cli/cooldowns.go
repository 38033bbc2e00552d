package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"breakwater/server/operator"
	"breakwater/storage"
)

func cooldownsCmd(e *env) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:               "list [--json]",
		Short:             "the invite keys (ip:..., email:...) in a cooldown, with the time left",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.operate(func(op operator.Service) error {
				list, err := op.Cooldowns(c.Context())
				if err != nil {
					return err
				}
				return printOut(e.stdout, asJSON, list, "KEY\tUNTIL\tLEFT", func(row func(...any)) {
					for _, cd := range list {
						row(cd.Key, cd.Until.UTC().Format(time.RFC3339), (time.Duration(cd.LeftSeconds) * time.Second).String())
					}
				})
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	clearCmd := &cobra.Command{
		Use:   "clear KEY",
		Short: "lift one cooldown now, for a legitimate user",
		Long: `Lift the cooldown on KEY at once (as cooldowns list names it: ip:ADDRESS,
an IPv6 client by its /64, or email:ADDRESS) and forget its run of failures
and its backoff, for a user you know is legitimate.`,
		Args:              positional(1, "KEY"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.ClearCooldown(c.Context(), args[0])
				if errors.Is(err, operator.ErrNoCooldown) || errors.Is(err, storage.ErrNotFound) {
					return fmt.Errorf("cooldowns clear: no cooldown is on %q (breakwater cooldowns list names them)", args[0])
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "cooldown on %s lifted (it ran until %s)\n", info.Key, info.Until.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	return group("cooldowns", "list and lift invite cooldowns", list, clearCmd)
}
