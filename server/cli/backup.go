package cli

import (
	"breakwater/server/operator"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func backupCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "backup FILE",
		Short: "a consistent copy of the database, also while serving",
		Long: `Write a consistent copy of the database to FILE, also while serving (then it
streams through the admin API). The copy is written beside FILE and renamed,
so FILE never holds half a copy. FILE may not be the live database.`,
		Args: positional(1, "FILE"),
		RunE: func(c *cobra.Command, args []string) error {
			return e.operate(func(op operator.Service) error {
				return backupTo(c.Context(), op, args[0], e.stdout)
			})
		},
	}
}

// backupTo writes a consistent copy of the database to path: into a
// temporary file beside it first, synced, then renamed, so path never holds
// half a database.
func backupTo(ctx context.Context, op operator.Service, path string, stdout io.Writer) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(abs), filepath.Base(abs)+".part-*")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if err := op.Backup(ctx, tmp, abs); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("backup: %w", err)
	}
	info, err := tmp.Stat()
	if err != nil {
		tmp.Close()
		return fmt.Errorf("backup: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil { // make the rename itself durable
		dir.Sync()
		dir.Close()
	}
	fmt.Fprintf(stdout, "backup written to %s (%d bytes)\n", path, info.Size())
	return nil
}
