package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"breakwater/server/app"
	"breakwater/server/operator"
	"breakwater/storage"
)

func backupCmd(e *env) *cobra.Command {
	var (
		dir  string
		keep int
	)
	c := &cobra.Command{
		Use:   "backup FILE | --dir DIR [--keep N]",
		Short: "a consistent copy of the database, also while serving",
		Long: `Write a consistent copy of the database to FILE, also while serving (then it
streams through the admin API). The copy is written beside FILE and renamed,
so FILE never holds half a copy. FILE may not be the live database.

On PostgreSQL the copy is a psql script that restores into a new, empty
database: psql -X -v ON_ERROR_STOP=1 --single-transaction -f FILE "$URL".

With --dir instead of FILE the copy is DIR/breakwater-2026-12-01T0315Z.db
(.sql on PostgreSQL), named for the time it was taken (UTC, to the minute;
a second copy in the same minute replaces the first). DIR is made (mode 0700) if it is missing.
--keep N then deletes the oldest copies beyond the newest N; only files
named as this command names them are counted or deleted, never any other
file in DIR (on PostgreSQL, only the .sql ones). --keep 0 (the default)
keeps every copy.`,
		Args: func(c *cobra.Command, args []string) error {
			switch {
			case dir == "" && len(args) == 0:
				return usageErrorf(c, "missing FILE (or --dir DIR)")
			case dir != "" && len(args) > 0:
				return usageErrorf(c, "give FILE or --dir DIR, not both")
			case dir == "" && c.Flags().Changed("keep"):
				return usageErrorf(c, "--keep needs --dir")
			case keep < 0:
				return usageErrorf(c, "--keep %d: must not be negative", keep)
			}
			return positional(0, "FILE")(c, args)
		},
		RunE: func(c *cobra.Command, args []string) error {
			ext := ".db"
			if dir != "" {
				// The config is read again, leniently, by operate; only the
				// backend is taken here, for the copies' names.
				if cfg, _, err := app.LoadForOperator(e.config, e.getenv); err == nil && cfg.Storage.Backend == storage.BackendPostgres {
					ext = ".sql"
				}
			}
			return e.operate(func(op operator.Service) error {
				if dir == "" {
					return backupTo(c.Context(), op, args[0], e.stdout)
				}
				return backupToDir(c.Context(), op, dir, ext, keep, e.now(), e.stdout)
			})
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "write a dated copy into `DIR` (made if missing)")
	c.Flags().IntVar(&keep, "keep", 0, "with --dir, keep the newest `N` dated copies and delete older ones (0: keep all)")
	return c
}

// backupLayout is the time in a dated copy's name: UTC, to the minute.
const backupLayout = "2006-01-02T1504Z"

// backupNameRE matches the names backupName gives and nothing else, so
// pruning never touches a file this command did not write; the extension
// is the backend's (.db for a bolt file, .sql for PostgreSQL's script).
var backupNameRE = regexp.MustCompile(`^breakwater-\d{4}-\d{2}-\d{2}T\d{4}Z(\.db|\.sql)$`)

// backupName is the name of a copy taken at now, with extension ext.
func backupName(now time.Time, ext string) string {
	return "breakwater-" + now.UTC().Format(backupLayout) + ext
}

// backupToDir writes a dated copy named with extension ext into dir (made
// with mode 0700 if missing), then keeps the newest keep dated copies of
// that extension (0: all).
func backupToDir(ctx context.Context, op operator.Service, dir, ext string, keep int, now time.Time, stdout io.Writer) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := backupTo(ctx, op, filepath.Join(dir, backupName(now, ext)), stdout); err != nil {
		return err
	}
	if keep == 0 {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("backup: prune: %w", err)
	}
	var copies []string // names sort by the time in them
	for _, ent := range entries {
		if m := backupNameRE.FindStringSubmatch(ent.Name()); ent.Type().IsRegular() && m != nil && m[1] == ext {
			copies = append(copies, ent.Name())
		}
	}
	slices.Sort(copies)
	for len(copies) > keep {
		old := filepath.Join(dir, copies[0])
		if err := os.Remove(old); err != nil {
			return fmt.Errorf("backup: prune: %w", err)
		}
		fmt.Fprintf(stdout, "removed old backup %s\n", old)
		copies = copies[1:]
	}
	return nil
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
