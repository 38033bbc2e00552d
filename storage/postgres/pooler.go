package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPooledTransactions means the URL reaches a connection pooler that
// hands a server session to a client for one transaction (or one
// statement) only: PgBouncer's pool_mode transaction or statement, the
// transaction ports of hosted poolers. Breakwater needs whole sessions:
// its LISTEN (operator changes reaching every instance), its session
// advisory locks (migrations, the daily detection's lead), its sessions'
// synchronous_commit, and the read-back of a commit whose answer was lost
// (which ends the session that sent it) would all be lost or wrong.
var ErrPooledTransactions = errors.New("postgres: " + EnvURL + " reaches a connection pooler in transaction (or statement) mode: " +
	"a LISTEN did not outlive its transaction, so operator changes would not reach the other instances, " +
	"and session locks, session settings (synchronous_commit) and the read-back of a commit whose answer was lost would not hold; " +
	"use the pooler's session mode instead (its session port, e.g. Supabase's session pooler on port 5432 rather than 6543; " +
	"PgBouncer's pool_mode = session) or connect to the database directly")

// sessionProbeWait bounds the wait for the probe's notification. Through
// whole sessions it comes within milliseconds of the NOTIFY's commit;
// through a transaction pooler it never comes, so only that case waits
// this long.
const sessionProbeWait = 5 * time.Second

// ErrStandby means the URL reaches a standby, which takes no writes (nor
// LISTEN): Breakwater needs the primary.
var ErrStandby = errors.New("postgres: the server is a standby (read-only): Breakwater needs the primary; " +
	"list both in the URL, the primary first, with target_session_attrs=read-write, and each connection finds the one that takes writes")

// checkSessions tells whether the pool's connections are whole server
// sessions, or pass through a pooler in transaction or statement mode,
// and answers ErrPooledTransactions for the latter.
//
// The method: connection A runs LISTEN on a channel of its own (a random
// name), in a transaction of its own, and then sends nothing; connection B
// then runs pg_notify on that channel, in another. Between its
// transactions A holds a server session only if the pooler gives it one
// for the whole client session: then the notification reaches A, within
// milliseconds. A transaction pooler takes A's server session back when
// the LISTEN commits, and A, sending nothing, is given none: nothing can
// carry the notification to A, whichever server session B's NOTIFY runs
// on and however many the pooler has (PgBouncer drops it, logging "got
// packet 'A' from server when not linked"). It is not timing that decides,
// only where the notification can go: with a pool of one server session
// (or PgBouncer's default reuse, last released first) B's NOTIFY runs on
// the very session that listens, and the notification comes back to B
// itself, which is told at once; otherwise A waits sessionProbeWait for
// nothing. A direct connection, or a pooler in session mode, delivers it.
//
// Every statement goes in the simple protocol: pgx's prepared statements
// would collide behind a transaction pooler (two clients preparing the
// same name on one server session) and fail with a message that names
// something else. A standby is refused first (ErrStandby): it takes no
// LISTEN, and serve needs the primary.
func checkSessions(ctx context.Context, pool *pgxpool.Pool) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	channel := "breakwater_session_probe_" + hex.EncodeToString(b[:])
	a, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	// Neither connection goes back to the pool: a listening session, or
	// a notification waiting in one, would be given to a caller.
	defer destroy(a)
	var standby bool
	if err := a.QueryRow(ctx, "SELECT pg_is_in_recovery()", pgx.QueryExecModeSimpleProtocol).Scan(&standby); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if standby {
		return ErrStandby
	}
	if _, err := a.Exec(ctx, "LISTEN "+channel, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("postgres: check that sessions are whole (LISTEN): %w", err)
	}
	bc, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: check that sessions are whole (a second connection): %w", err)
	}
	defer destroy(bc)
	if _, err := bc.Exec(ctx, "SELECT pg_notify($1, 'probe')", pgx.QueryExecModeSimpleProtocol, channel); err != nil {
		return fmt.Errorf("postgres: check that sessions are whole (NOTIFY): %w", err)
	}
	// B ran on the session that listens: its server session is not its
	// own for longer than a transaction.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if n, err := bc.Conn().WaitForNotification(done); err == nil && n.Channel == channel {
		return ErrPooledTransactions
	}
	wait, cancel := context.WithTimeout(ctx, sessionProbeWait)
	defer cancel()
	n, err := a.Conn().WaitForNotification(wait)
	switch {
	case err == nil && n.Channel == channel:
		return nil
	case err == nil:
		return fmt.Errorf("postgres: check that sessions are whole: a notification on %q, not the probe's channel", n.Channel)
	case ctx.Err() != nil:
		return fmt.Errorf("postgres: check that sessions are whole: %w", ctx.Err())
	case wait.Err() != nil:
		return ErrPooledTransactions
	default:
		return fmt.Errorf("postgres: check that sessions are whole (waiting for the notification): %w", err)
	}
}

// destroy closes c's connection rather than give it back to the pool.
func destroy(c *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Hijack().Close(ctx)
}
