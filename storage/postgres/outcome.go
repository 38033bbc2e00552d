package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/budget"
)

// A write whose connection fails after its commit was sent may have
// committed: PostgreSQL commits a transaction it has begun to commit even
// when the client has gone (a commit that waits for a synchronous standby
// or a slow disk past the client's timeout, a connection reset after the
// commit). Undoing it then, as a failed write is undone (a settlement
// given back again, a quota hold released again), or sending it again,
// would count twice. So every money transaction writes a token first, in
// money_groups, on the row of this instance and its lane: a lane runs one
// transaction at a time, so after a failure the row holds the failed one's
// token only if it committed. outcome ends the session that ran it (its
// transaction then has committed or never will) and reads the token back.

// laneLease is the lane of the leases (LeaseUnder), one at a time
// (Money.leasing), beside the group commit's lanes.
const laneLease = lanes

// errUnread is a transaction that committed and whose answers were lost
// with its connection: its writes are done, what it read is unknown.
var errUnread = fmt.Errorf("%w: it committed, its answers were lost with the connection", budget.ErrMaybeCommitted)

// queueToken queues, first in b, the write of a fresh token for lane, and
// returns it.
func (m *Money) queueToken(b *pgx.Batch, lane int) int64 {
	token := m.tokens.Add(1)
	b.Queue(`INSERT INTO money_groups (owner, lane, token) VALUES ($1, $2, $3)
		ON CONFLICT (owner, lane) DO UPDATE SET token = excluded.token`, m.owner, lane, token)
	return token
}

// send runs b (one implicit transaction that wrote token first) on a
// connection of its own. When the connection fails after the commit may
// have been sent, its answer is outcome's: the failure if the transaction
// did not commit, errUnread if it did, and an error wrapping
// budget.ErrMaybeCommitted if that cannot be told.
func (m *Money) send(ctx context.Context, b *pgx.Batch, lane int, token int64) error {
	conn, err := m.db.pool.Acquire(ctx)
	if err != nil {
		return err // nothing sent
	}
	err = conn.SendBatch(ctx, b).Close()
	if err == nil || !maybeSent(err) {
		conn.Release()
		return err
	}
	pid, known := conn.Conn().PgConn().CustomData()[pidKey].(int32)
	// Not back to the pool (its session may be the one outcome ends), and
	// its place in the pool free for outcome's own.
	_ = conn.Conn().Close(context.Background())
	conn.Release()
	if !known {
		return m.unknown(lane, err, errors.New("its session's id is not known"))
	}
	return m.outcome(pid, lane, token, err)
}

// pidKey keys a connection's session id in pgconn's CustomData.
const pidKey = "breakwater.pid"

// notePID keeps a new connection's session id as the server knows it, for
// outcome: pg_backend_pid, not the id the connection's start-up message
// gave (a pooler gives one of its own).
func notePID(ctx context.Context, c *pgx.Conn) error {
	var pid int32
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	c.PgConn().CustomData()[pidKey] = pid
	return nil
}

// maybeSent reports whether a transaction that failed with err may have
// committed: something was sent, and PostgreSQL did not report the error
// that rolls a transaction back (an ERROR; a FATAL ends the session, and
// may come after the commit: a standby wait cut short by a shutdown).
func maybeSent(err error) bool {
	if pgconn.SafeToRetry(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		severity := cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity)
		return severity == "FATAL" || severity == "PANIC"
	}
	return true
}

// outcome finds out whether the transaction of lane that wrote token, run
// by the session pid, committed after it failed with cause. It ends that
// session (pg_terminate_backend, PostgreSQL 14 or later; the role may end
// its own sessions) and waits for it to be gone, then reads lane's token,
// all within the group transaction's time.
func (m *Money) outcome(pid int32, lane int, token int64, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), m.opTO)
	defer cancel()
	conn, err := m.db.pool.Acquire(ctx)
	if err != nil {
		return m.unknown(lane, cause, err)
	}
	defer conn.Release()
	wait := max(m.opTO.Milliseconds()/2, 1)
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1, $2)", pid, wait); err != nil {
		return m.unknown(lane, cause, err)
	}
	var alive bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
		return m.unknown(lane, cause, err)
	}
	if alive {
		return m.unknown(lane, cause, fmt.Errorf("its session %d did not end", pid))
	}
	var last int64
	err = conn.QueryRow(ctx, "SELECT token FROM money_groups WHERE owner = $1 AND lane = $2", m.owner, lane).Scan(&last)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && last != token:
		return cause
	case err != nil:
		return m.unknown(lane, cause, err)
	}
	m.log.Warn("postgres: a money transaction committed, and its connection failed before its answers were read", "lane", lane, "error", cause)
	return fmt.Errorf("%w (%w)", errUnread, cause)
}

// unknown is the answer for a transaction of lane that failed with cause
// and may have committed, when reading it back failed with err.
func (m *Money) unknown(lane int, cause, err error) error {
	m.log.Error("postgres: a money transaction failed after its commit was sent, and whether it committed cannot be told: it is taken as committed, and not undone",
		"lane", lane, "error", cause, "reading back", err)
	return fmt.Errorf("%w: %w (reading it back: %w)", budget.ErrMaybeCommitted, cause, err)
}
