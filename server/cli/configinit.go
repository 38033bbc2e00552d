package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/cobra"
)

func configInitCmd(e *env) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "init [FILE] [--force]",
		Short: "write the commented default config to FILE (default: --config)",
		Long: `Write the shipped config.toml, with a comment on every key, to FILE (default:
the --config file, ./config.toml). An existing file is never replaced unless
--force.`,
		Args: positional(0, "FILE"),
		RunE: func(c *cobra.Command, args []string) error {
			path := e.config
			if len(args) == 1 {
				path = args[0]
			}
			return writeShippedConfig(path, force, e)
		},
	}
	c.Flags().BoolVar(&force, "force", false, "replace FILE if it exists")
	return c
}

// writeShippedConfig writes the shipped config to path; without force an
// existing file is refused, checked and created in one step.
func writeShippedConfig(path string, force bool, e *env) error {
	if len(e.shipped) == 0 {
		return errors.New("config init: this binary carries no default config")
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("config init: %s exists; it is left as it is (--force replaces it)", path)
	}
	if err != nil {
		return fmt.Errorf("config init: %w", err)
	}
	if _, err := f.Write(e.shipped); err != nil {
		f.Close()
		return fmt.Errorf("config init: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("config init: %w", err)
	}
	fmt.Fprintf(e.stdout, "wrote the default config to %s; check it with breakwater config check --config %s\n", path, path)
	return nil
}
