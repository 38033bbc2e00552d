package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the release, set at build time with
// -ldflags "-X breakwater/server/cli.Version=v1.2.3". A build without it
// says "dev", with the commit when the build recorded one.
var Version = "dev"

func versionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "version",
		Short:             "print the version",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			fmt.Fprintln(e.stdout, "breakwater", versionString())
			return nil
		},
	}
}

func versionString() string {
	if info, ok := debug.ReadBuildInfo(); ok && Version == "dev" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return Version
}
