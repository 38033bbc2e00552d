package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"breakwater/server/app"
	"breakwater/server/cli/selftest"
)

func selftestCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "selftest",
		Short: "prove the config's limits on a throwaway copy of the service",
		Long: `Run the real pipeline with the config's limits against the simulated
upstream, on a fresh throwaway database (never the live one), with the
listener on 127.0.0.1 and the admin API, mail and JWT sign-in off. Fire
parallel requests at each limit and print, per limit, what was proved.
A limit too large to reach in seconds is tested scaled down, and the line
says so. A limit in shadow mode is tested enforced, and its line says that
live it is counted, not enforced. Exit 1 if any limit does not hold.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := app.Load(e.config, e.getenv)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "selftest of %s: simulated upstream, throwaway database\n", e.config)
			_, err = selftest.Run(c.Context(), cfg, e.stdout, selftest.Options{})
			return err
		},
	}
}
