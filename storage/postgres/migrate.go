package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The schema is a series of migrations, migrations/NNNN_what.sql, applied
// in order of NNNN, each in its own transaction together with the row that
// records it in breakwater_schema. A migration, once released, never
// changes: a change to the schema is a new file.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLock is the advisory lock key that serialises migrations
// between instances starting together ("breakwat" in ASCII).
const migrationLock int64 = 0x627265616b776174

type migrationFile struct {
	version int
	name    string
	sql     string
}

// migrationList reads the embedded migrations in order; a file whose name
// does not start with a number is a build mistake.
func migrationList() ([]migrationFile, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var list []migrationFile
	for _, path := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
		num, _, _ := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("postgres: migration %s does not start with its version number", path)
		}
		body, err := migrationFiles.ReadFile(path)
		if err != nil {
			return nil, err
		}
		list = append(list, migrationFile{version: v, name: name, sql: string(body)})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].version < list[j].version })
	for i := 1; i < len(list); i++ {
		if list[i].version == list[i-1].version {
			return nil, fmt.Errorf("postgres: migrations %s and %s share a version", list[i-1].name, list[i].name)
		}
	}
	return list, nil
}

// LatestSchema is the schema version this binary writes.
func LatestSchema() int {
	list, err := migrationList()
	if err != nil || len(list) == 0 {
		return 0
	}
	return list[len(list)-1].version
}

// schemaTable is the table that records each migration applied, as
// CREATE TABLE takes it (migrate, and a backup's script, make it).
const schemaTable = `breakwater_schema (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`

// migrate brings the database up to LatestSchema under the advisory lock and
// returns the version it is at. A database at a newer version is refused
// with ErrNewerSchema, before anything is written.
func migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (int, error) {
	list, err := migrationList()
	if err != nil {
		return 0, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("postgres: %w", err)
	}
	defer conn.Release()
	latest := 0
	if len(list) > 0 {
		latest = list[len(list)-1].version
	}
	// A schema already current needs no DDL, nor the lock: a role with
	// only the table rights serves (rights.go). Its rights are checked
	// first, so that a role lacking one is refused at start with what to
	// grant, not at its first request.
	if err := checkRights(ctx, conn); err != nil {
		return 0, err
	}
	var found bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('breakwater_schema') IS NOT NULL").Scan(&found); err != nil {
		return 0, fmt.Errorf("postgres: read the schema version: %w", err)
	}
	var current int
	if found {
		if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM breakwater_schema").Scan(&current); err != nil {
			return 0, fmt.Errorf("postgres: read the schema version: %w", err)
		}
		if current == latest {
			return current, nil
		}
		if current > latest {
			return current, newerSchema(current, latest)
		}
	}
	if err := checkCreate(ctx, conn, current, latest); err != nil {
		return current, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return 0, fmt.Errorf("postgres: take the migration lock: %w", err)
	}
	defer func() {
		// A session lock outlives a failed statement; unlock on a fresh
		// context so that a cancelled ctx does not leave it held.
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", migrationLock)
	}()
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+schemaTable); err != nil {
		return 0, fmt.Errorf("postgres: create breakwater_schema: %w", err)
	}
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM breakwater_schema").Scan(&current); err != nil {
		return 0, fmt.Errorf("postgres: read the schema version: %w", err)
	}
	if current > latest {
		return current, newerSchema(current, latest)
	}
	for _, m := range list {
		if m.version <= current {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO breakwater_schema (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return current, fmt.Errorf("postgres: migration %s: %w", m.name, err)
		}
		log.Info("postgres schema migrated", "version", m.version, "migration", m.name)
		current = m.version
	}
	return current, nil
}

// newerSchema is Open's refusal of a database a newer Breakwater wrote.
func newerSchema(current, latest int) error {
	return fmt.Errorf("%w: the database is at schema %d, this binary knows up to %d; run the newer breakwater, or restore a backup taken before the upgrade", ErrNewerSchema, current, latest)
}
