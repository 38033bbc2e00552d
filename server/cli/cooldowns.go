package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"breakwater/server/operator"
)

func cooldownsCmd(e *env) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:               "list [--json]",
		Short:             "the keys (ip:..., email:...) in a cooldown, by source (invites, route:NAME), with the time left",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.operate(func(op operator.Service) error {
				list, err := op.Cooldowns(c.Context())
				if err != nil {
					return err
				}
				return printOut(e.stdout, asJSON, list, "SOURCE\tKEY\tUNTIL\tLEFT", func(row func(...any)) {
					for _, cd := range list {
						row(cd.Source, cd.Key, cd.Until.UTC().Format(time.RFC3339), (time.Duration(cd.LeftSeconds) * time.Second).String())
					}
				})
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	var source string
	clearCmd := &cobra.Command{
		Use:   "clear KEY [--source SOURCE]",
		Short: "lift one cooldown now, for a legitimate user",
		Long: `Lift the cooldown on KEY at once (as cooldowns list names it: ip:ADDRESS,
an IPv6 client by its /64, or email:ADDRESS) and forget its run of failures
and its backoff, for a user you know is legitimate. KEY is the invite
guard's unless --source names another fail limit as cooldowns list shows
it: --source route:NAME for the [[routes]] entry NAME.`,
		Args: func(c *cobra.Command, args []string) error {
			if err := operator.CheckID(operator.KindCooldownSource, source); source != "" && err != nil {
				return usageErrorf(c, "--source: %v", err)
			}
			return idArg(operator.KindCooldownKey, "KEY")(c, args)
		},
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.ClearCooldown(c.Context(), source, args[0])
				if errors.Is(err, operator.ErrNoCooldown) {
					return fmt.Errorf("cooldowns clear: no cooldown is on %q in %s (breakwater cooldowns list names them)", args[0], source)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "cooldown on %s %s lifted (it ran until %s)\n", info.Source, info.Key, info.Until.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	clearCmd.Flags().StringVar(&source, "source", operator.SourceInvites, "the fail limit that holds KEY: invites, or route:NAME")
	return group("cooldowns", "list and lift the invite guard's and the routes' cooldowns", list, clearCmd)
}
