package postgres

import (
	"context"
	"fmt"
)

// Found is what Probe found in a database.
type Found struct {
	Server string // the server's version, "15.14 (Debian 15.14-0+deb12u1)"
	// ServerNum is the same as a number, 150014: at least MinServer
	// for every guarantee (see MinServer).
	ServerNum int
	Database  string // the database's name
	Host      string // the host (or socket folder) connected to
	// Schema is the database's schema version, 0 for a database that
	// Breakwater has not used yet; Latest is this binary's.
	Schema, Latest int
	// Keys and Users count the records, when Schema > 0.
	Keys, Users int64
	// SynchronousCommit is the server's own setting (the database's or
	// the role's, if set), what a session starts with; Breakwater's
	// sessions set it on whatever it says.
	SynchronousCommit string
	// Role is the role connected as.
	Role string
	// Conns is what the server has of connections (conns.go).
	Conns Conns
	// SyncStandbyNames is the server's synchronous_standby_names: ""
	// when its commits wait for no standby.
	SyncStandbyNames string
	// Standbys is how many standbys stream from the server
	// (pg_stat_replication), SyncStandbys how many of those are
	// synchronous (sync_state sync or quorum). StandbysHidden is how many
	// whose state the role may not read: only a superuser or a member of
	// pg_read_all_stats sees it, others see each standby's row alone.
	Standbys, SyncStandbys, StandbysHidden int
}

// MinServer is the oldest PostgreSQL (server_version_num) that keeps every
// guarantee: 14 ends a session and waits for it (pg_terminate_backend with
// a timeout), which reading back a commit whose answer was lost needs
// (outcome.go). On an older server such a read is withheld and not undone.
const MinServer = 140000

// Probe connects to the database at url and says what it holds, writing
// nothing (no migration): what `config check` reports. It connects as Open
// does, and so refuses what Open refuses. A database whose
// schema is newer than this binary's is an error, as at Open.
func Probe(ctx context.Context, url string) (Found, error) {
	pool, err := connect(ctx, url, 2, nil, nil, nil) // as serve connects: a pooler that would break serve fails here too
	if err != nil {
		return Found{}, err
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Found{}, fmt.Errorf("postgres: %w", err)
	}
	defer conn.Release()
	cfg := pool.Config().ConnConfig
	f := Found{Database: cfg.Database, Host: cfg.Host, Latest: LatestSchema()}
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('server_version_num')::int, (SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit')").Scan(&f.Server, &f.ServerNum, &f.SynchronousCommit); err != nil {
		return f, fmt.Errorf("postgres: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&f.Role); err != nil {
		return f, fmt.Errorf("postgres: %w", err)
	}
	// What serve would refuse for want of a right, refused here alike
	// (rights.go).
	if err := checkRights(ctx, conn); err != nil {
		return f, err
	}
	if f.Conns, err = readConns(ctx, conn); err != nil {
		return f, err
	}
	err = conn.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names'), count(*)::int,
		(count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')))::int, (count(*) FILTER (WHERE sync_state IS NULL))::int
		FROM pg_stat_replication`).Scan(&f.SyncStandbyNames, &f.Standbys, &f.SyncStandbys, &f.StandbysHidden)
	if err != nil {
		return f, fmt.Errorf("postgres: read the standbys: %w", err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('breakwater_schema') IS NOT NULL").Scan(&exists); err != nil {
		return f, fmt.Errorf("postgres: %w", err)
	}
	if exists {
		if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM breakwater_schema").Scan(&f.Schema); err != nil {
			return f, fmt.Errorf("postgres: read the schema version: %w", err)
		}
	}
	if f.Schema > f.Latest {
		return f, fmt.Errorf("%w: the database is at schema %d, this binary knows up to %d", ErrNewerSchema, f.Schema, f.Latest)
	}
	if f.Schema < f.Latest {
		// The first instance to start makes or upgrades the schema:
		// refused here as serve would refuse it (migrate.go).
		if err := checkCreate(ctx, conn, f.Schema, f.Latest); err != nil {
			return f, err
		}
	}
	if f.Schema >= 3 { // the migration that made money_owners
		if f.Conns.Instances, err = countInstances(ctx, conn); err != nil {
			return f, err
		}
	}
	if f.Schema >= 2 { // the migration that made the keys and users
		err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM api_keys WHERE revoked_at IS NULL), (SELECT count(*) FROM users)").Scan(&f.Keys, &f.Users)
		if err != nil {
			return f, fmt.Errorf("postgres: count keys: %w", err)
		}
	}
	return f, nil
}
