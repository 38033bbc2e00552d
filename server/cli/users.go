package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"breakwater/server/keys"
	"breakwater/server/operator"
)

func usersCmd(e *env) *cobra.Command {
	return group("users", "ban, unban and move users between plans", usersBanCmd(e, true), usersBanCmd(e, false), usersSetPlanCmd(e))
}

// usersBanCmd is "users ban ID [--create]", or "users unban ID" when ban
// is false.
func usersBanCmd(e *env, ban bool) *cobra.Command {
	var create bool
	use, short := "ban ID [--create]", "the user's next request gets 403 banned"
	long := `Ban a user: their next request gets 403 banned. An id that names no user
is refused, so a typo cannot ban a phantom; --create bans it anyway, for a
user the service has not seen yet. Sign-in users have no record until they
are banned, so banning one takes --create: users ban --create jwt:SUB.`
	if !ban {
		use, short, long = "unban ID", "the user's requests work again", ""
	}
	c := &cobra.Command{
		Use:               use,
		Short:             short,
		Long:              long,
		Args:              positional(1, "ID"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.SetBanned(c.Context(), args[0], ban, create)
				if errors.Is(err, keys.ErrNotFound) {
					hint := ""
					if ban {
						hint = "; to ban an id not seen yet, such as a sign-in user (jwt:SUB), add --create"
					}
					return fmt.Errorf("%s %s: no user has that id%s", name(c), args[0], hint)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "user %s: banned=%v\n", info.ID, info.Banned)
				return nil
			})
		},
	}
	if ban {
		c.Flags().BoolVar(&create, "create", false, "ban an id that names no user yet (a sign-in user: jwt:SUB)")
	}
	return c
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
