package cli

import (
	"github.com/spf13/cobra"

	"breakwater/server/app"
)

func migrateCmd(e *env) *cobra.Command {
	var from app.MigrateSource
	c := &cobra.Command{
		Use:   "migrate --from PATH.db [--merge]",
		Short: "copy a bolt database into PostgreSQL, for more than one instance",
		Long: `Copy the bolt database at PATH.db into the PostgreSQL database of the config
([storage] backend = "postgres", its URL in BREAKWATER_POSTGRES_URL): users,
API keys (every key keeps working), invites and their redemptions, usage rows,
plan quotas, the budget's ledger and the brake. Stop the server first: a
database a server holds is refused. It prints what it copied of each kind;
records PostgreSQL already holds are left as they are, and the bolt file's
identity is recorded with the money it brings, so a second run copies
nothing twice.

If PostgreSQL already counts spend on a day the bolt file counts, or a
user's quota in a month it counts (an instance has served), migrate refuses
before copying anything and names them; with --merge it adds the bolt
file's figures to the ones there, once. Statistics events, detection findings, kept answers and the
rate windows are not copied: they are short-lived or remade.

Run the instances with the bolt server's secret as BREAKWATER_SECRET (the
contents of breakwater.secret beside its database, if it made one), or
invite codes made before will not verify.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			if from.Path == "" {
				return usageErrorf(c, "missing --from PATH.db")
			}
			cfg, err := app.Load(e.config, e.getenv)
			if err != nil {
				return err
			}
			_, err = app.MigrateFromBolt(c.Context(), cfg, from, app.Options{Getenv: e.getenv}, e.stdout)
			return err
		},
	}
	c.Flags().StringVar(&from.Path, "from", "", "the bolt database `PATH.db` to copy")
	c.Flags().BoolVar(&from.Merge, "merge", false, "add the bolt database's spend and quota counts to those PostgreSQL already holds for the same days and users")
	return c
}
