package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"breakwater/server/operator"
)

func invitesCmd(e *env) *cobra.Command {
	return group("invites", "create, list, revoke and delete invite codes",
		invitesCreateCmd(e), invitesListCmd(e), invitesRevokeCmd(e), invitesDeleteCmd(e))
}

func invitesCreateCmd(e *env) *cobra.Command {
	var (
		uses    int
		expires time.Duration
		note    string
	)
	c := &cobra.Command{
		Use:               "create [--uses N] [--expires 72h] [--note TEXT]",
		Short:             "a new invite code, printed alone on the last line and never again",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			switch {
			case uses < 1:
				return usageErrorf(c, "--uses %d: a code needs at least 1 use", uses)
			case expires < 0:
				return usageErrorf(c, "--expires %v: use 0 for a code that never expires", expires)
			}
			return e.operate(func(op operator.Service) error {
				code, info, err := op.CreateInvite(c.Context(), uses, expires, note)
				if err != nil {
					return err
				}
				until := "never expires"
				if !info.ExpiresAt.IsZero() {
					until = "expires " + info.ExpiresAt.Format(time.RFC3339)
				}
				fmt.Fprintf(e.stdout, "created invite %s for %d use(s), %s; the code is shown only now:\n%s\n", info.ID, info.MaxUses, until, code)
				return nil
			})
		},
	}
	c.Flags().IntVar(&uses, "uses", 1, "`N` different e-mails may redeem the code")
	c.Flags().DurationVar(&expires, "expires", 72*time.Hour, "how long the code stays valid, a `duration` such as 72h or 30m; 0 for ever")
	c.Flags().StringVar(&note, "note", "", "`TEXT` for yourself, shown by invites list")
	return c
}

func invitesListCmd(e *env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:               "list [--json]",
		Short:             "every invite: id, uses, created, expires, revoked, note; never the code",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.operate(func(op operator.Service) error {
				list, err := op.ListInvites(c.Context())
				if err != nil {
					return err
				}
				return printOut(e.stdout, asJSON, list, "ID\tUSES\tCREATED\tEXPIRES\tREVOKED\tNOTE", func(row func(...any)) {
					for _, inv := range list {
						row(inv.ID, fmt.Sprintf("%d/%d", inv.Uses, inv.MaxUses), inv.CreatedAt.Format(time.RFC3339), orDash(inv.ExpiresAt), orDash(inv.RevokedAt), inv.Note)
					}
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func invitesRevokeCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "revoke INVITE_ID",
		Short:             "the code is refused from the next verification on",
		Args:              idArg(operator.KindInvite, "INVITE_ID"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.RevokeInvite(c.Context(), args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "revoked invite %s\n", info.ID)
				return nil
			})
		},
	}
}

func invitesDeleteCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "delete INVITE_ID",
		Short:             "the invite and the e-mails that redeemed it, for erasure",
		Args:              idArg(operator.KindInvite, "INVITE_ID"),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				info, err := op.DeleteInvite(c.Context(), args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "deleted invite %s and the e-mails that redeemed it (%d)\n", info.ID, info.Uses)
				return nil
			})
		},
	}
}
