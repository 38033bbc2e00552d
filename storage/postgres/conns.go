package postgres

import (
	"context"
	"fmt"
)

// Conns is what a server has of connections, as Probe reads it for
// config check: every instance opens up to its pool
// (storage.postgres_max_connections) and one listener, and a server
// refuses a connection past max_connections less the reserved ones.
type Conns struct {
	// Max is max_connections; Reserved is superuser_reserved_connections
	// plus, from PostgreSQL 16, reserved_connections: what an ordinary
	// role may not use.
	Max, Reserved int
	// InUse counts the client connections open now but the probe's own;
	// Breakwater those of them that Breakwater's instances and commands
	// opened (application_name "breakwater", as far as the role may see).
	InUse, Breakwater int
	// Instances counts the instances that said they were alive within
	// HoldTTL (money_owners).
	Instances int
}

// Usable is how many connections ordinary roles may open.
func (c Conns) Usable() int { return c.Max - c.Reserved }

// Room is how many instances whose pool is pool fit beside the clients
// other than Breakwater's, each at its full pool and its listener.
func (c Conns) Room(pool int) int {
	free := c.Usable() - (c.InUse - c.Breakwater)
	if free <= 0 || pool < 0 {
		return 0
	}
	return free / (pool + 1)
}

// readConns reads the server's connection settings and use.
func readConns(ctx context.Context, q rowQuerier) (Conns, error) {
	var c Conns
	err := q.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0),
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()),
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name = 'breakwater')`).
		Scan(&c.Max, &c.Reserved, &c.InUse, &c.Breakwater)
	if err != nil {
		return c, fmt.Errorf("postgres: read the server's connections: %w", err)
	}
	return c, nil
}

// countInstances counts the instances alive (money_owners): those that
// said so within HoldTTL.
func countInstances(ctx context.Context, q rowQuerier) (int, error) {
	var n int
	err := q.QueryRow(ctx, "SELECT count(*) FROM money_owners WHERE seen_at > now() - $1::interval",
		fmt.Sprintf("%d seconds", int(HoldTTL.Seconds()))).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("postgres: count the instances: %w", err)
	}
	return n, nil
}
