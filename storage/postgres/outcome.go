package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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
//
// When the database does not answer (it is stopping, or down), the
// outcome is in doubt: the caller is told so (budget.ErrMaybeCommitted)
// and the transaction is kept as a doubt of its lane, read back once the
// database answers again, before the lane's next transaction (which would
// overwrite the token) and by the heartbeat meanwhile. What its callers
// left undone is then done: a record that did not commit gives its quota
// hold back and settles its call, a give-back is owed again.

// laneLease is the lane of the leases (LeaseUnder), one at a time
// (Money.leasing), beside the group commit's lanes.
const laneLease = lanes

// errUnread is a transaction that committed and whose answers were lost
// with its connection: its writes are done, what it read is unknown.
var errUnread = fmt.Errorf("%w: it committed, its answers were lost with the connection", budget.ErrMaybeCommitted)

// session is a server session: its id, and when it began (a session that
// begins later may have the same id).
type session struct {
	pid   int32
	start time.Time
}

// txn is one money transaction sent by send: its lane and token (and
// leased, the token a lease writes over it once taken; 0 for a group),
// what it carries (for the log), and what is left to do once the outcome
// of one that is in doubt is read back (then), or once one is found
// committed with its answers lost (unread); last is the token read back.
type txn struct {
	lane          int
	token, leased int64
	what          string
	then          func(committed bool, last int64)
	unread        func(last int64)
}

// doubt is a transaction whose outcome could not be read back: the
// session that ran it, and the transaction.
type doubt struct {
	session
	known bool // the session's identity is known
	txn
	since time.Time
}

// doubts holds each lane's doubt (at most one: a lane's next transaction
// reads it back first); resolving[lane] makes one reader at a time.
type doubts struct {
	mu        sync.Mutex
	of        [lanes + 1]*doubt
	resolving [lanes + 1]sync.Mutex
}

func (d *doubts) get(lane int) *doubt {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.of[lane]
}

func (d *doubts) set(lane int, x *doubt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.of[lane] = x
}

// queueToken queues, first in b, the write of a fresh token for lane, and
// returns it; the n-1 tokens after it are the transaction's too.
func (m *Money) queueToken(b *pgx.Batch, lane int, n int64) int64 {
	token := m.tokens.Add(n) - n + 1
	b.Queue(`INSERT INTO money_groups (owner, lane, token) VALUES ($1, $2, $3)
		ON CONFLICT (owner, lane) DO UPDATE SET token = excluded.token`, m.owner, lane, token)
	return token
}

// send runs b (one implicit transaction that wrote t.token first) on a
// connection of its own, once the lane's doubt, if any, is read back.
// When the connection fails after the commit may have been sent, its
// answer is outcome's: the failure if the transaction did not commit,
// errUnread if it did, and an error wrapping budget.ErrMaybeCommitted if
// that cannot be told yet.
func (m *Money) send(ctx context.Context, b *pgx.Batch, t txn) error {
	if err := m.resolve(t.lane); err != nil {
		m.noteReach(err)
		return fmt.Errorf("read back the lane's transaction in doubt: %w", err) // nothing sent
	}
	conn, err := m.db.pool.Acquire(ctx)
	if err != nil {
		m.noteReach(err)
		return err // nothing sent
	}
	err = conn.SendBatch(ctx, b).Close()
	if err == nil || !maybeSent(err) {
		conn.Release()
		m.noteReach(err)
		return err
	}
	m.noteReach(err)
	s, known := conn.Conn().PgConn().CustomData()[sessionKey].(session)
	// Not back to the pool (its session may be the one outcome ends), and
	// its place in the pool free for outcome's own.
	_ = conn.Conn().Close(context.Background())
	conn.Release()
	return m.outcome(&doubt{session: s, known: known, txn: t, since: m.now()}, err)
}

// sessionKey keys a connection's session in pgconn's CustomData.
const sessionKey = "breakwater.session"

// notePID keeps a new connection's session as the server knows it, for
// outcome: pg_backend_pid, not the id the connection's start-up message
// gave (a pooler gives one of its own), and when it began.
func notePID(ctx context.Context, c *pgx.Conn) error {
	// The pool runs it outside the caller's deadline: bounded as the
	// connection's opening is (DefaultConnectTimeout), or a link cut just
	// after the connection opened would hold its place in the pool until
	// the kernel gives the connection up.
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.Config().ConnectTimeout, DefaultConnectTimeout))
	defer cancel()
	var s session
	if err := c.QueryRow(ctx, "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&s.pid, &s.start); err != nil {
		return err
	}
	c.PgConn().CustomData()[sessionKey] = s
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

// outcome finds out whether d's transaction, which failed with cause,
// committed. It ends d's session (pg_terminate_backend, PostgreSQL 14 or
// later; the role may end its own sessions) and waits for it to be gone,
// then reads the lane's token, all within the group transaction's time.
// If the database does not answer, d is kept to be read back later.
func (m *Money) outcome(d *doubt, cause error) error {
	if !d.known {
		return m.unknown(d, cause, errors.New("its session's id is not known"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opTO)
	defer cancel()
	conn, err := m.db.pool.Acquire(ctx)
	if err != nil {
		return m.inDoubt(d, cause, err)
	}
	defer conn.Release()
	ended, err := m.endSession(ctx, conn, d.session)
	switch {
	case err != nil:
		return m.inDoubt(d, cause, err)
	case !ended:
		return m.unknown(d, cause, fmt.Errorf("its session %d did not end", d.pid))
	}
	last, err := m.lastToken(ctx, conn, d.lane)
	switch {
	case err != nil:
		return m.inDoubt(d, cause, err)
	case !committed(d.txn, last):
		return cause
	}
	m.log.Warn("postgres: a money transaction committed, and its connection failed before its answers were read",
		"carried", d.what, "lane", d.lane, "error", cause)
	if d.unread != nil {
		d.unread(last)
	}
	return fmt.Errorf("%w (%w)", errUnread, cause)
}

// committed reports whether the token last read back from t's lane is
// one t wrote: a lease writes a second one when it is taken (ledger.go).
func committed(t txn, last int64) bool {
	return last == t.token || t.leased != 0 && last == t.leased
}

// endSession ends session s, if it still runs, and reports whether it is
// gone.
func (m *Money) endSession(ctx context.Context, conn *pgxpool.Conn, s session) (bool, error) {
	wait := max(m.opTO.Milliseconds()/2, 1)
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid, $3) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2",
		s.pid, s.start, wait); err != nil {
		return false, err
	}
	var alive bool
	err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)", s.pid, s.start).Scan(&alive)
	return !alive, err
}

// lastToken reads the token of this instance's lane: 0 when it has none.
func (m *Money) lastToken(ctx context.Context, conn *pgxpool.Conn, lane int) (int64, error) {
	var last int64
	err := conn.QueryRow(ctx, "SELECT token FROM money_groups WHERE owner = $1 AND lane = $2", m.owner, lane).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return last, err
}

// inDoubt is the answer for d's transaction, which failed with cause and
// may have committed, when the database did not answer the reading back
// (err): d is kept, and read back once the database answers.
func (m *Money) inDoubt(d *doubt, cause, err error) error {
	m.doubts.set(d.lane, d)
	m.log.Warn("postgres: a money transaction failed after its commit was sent, and the database does not answer to tell whether it committed: "+
		"it is taken as committed until it is read back, when the database answers again",
		"carried", d.what, "lane", d.lane, "error", cause, "reading back", err)
	return fmt.Errorf("%w: %w (reading it back: %w)", budget.ErrMaybeCommitted, cause, err)
}

// unknown is the answer for d's transaction, which failed with cause and
// may have committed, when it can never be read back (err): it is taken
// as committed, and not undone.
func (m *Money) unknown(d *doubt, cause, err error) error {
	m.log.Error("postgres: a money transaction failed after its commit was sent, and whether it committed cannot be told: it is taken as committed, and not undone",
		"carried", d.what, "lane", d.lane, "error", cause, "reading back", err)
	return fmt.Errorf("%w: %w (reading it back: %w)", budget.ErrMaybeCommitted, cause, err)
}

// resolve reads back lane's doubt, if it has one, and does what its
// callers left to do; an error means the database did not answer, and
// the doubt is kept.
func (m *Money) resolve(lane int) error {
	if m.doubts.get(lane) == nil {
		return nil
	}
	m.doubts.resolving[lane].Lock()
	defer m.doubts.resolving[lane].Unlock()
	d := m.doubts.get(lane)
	if d == nil {
		return nil // read back meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opTO)
	defer cancel()
	conn, err := m.db.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	ended, err := m.endSession(ctx, conn, d.session)
	if err != nil {
		return err
	}
	if !ended {
		m.doubts.set(lane, nil)
		m.unknown(d, errors.New("its outcome was in doubt"), fmt.Errorf("its session %d did not end", d.pid))
		return nil
	}
	last, err := m.lastToken(ctx, conn, lane)
	if err != nil {
		return err
	}
	m.doubts.set(lane, nil)
	done := committed(d.txn, last)
	m.log.Info("postgres: a money transaction whose outcome was in doubt is read back",
		"carried", d.what, "lane", lane, "committed", done, "in_doubt_for", m.now().Sub(d.since).Round(time.Millisecond))
	if d.then != nil {
		go d.then(done, last) // it may write, through this lane
	}
	return nil
}

// resolveAll reads back every lane's doubt that the database answers for.
func (m *Money) resolveAll() {
	for lane := range lanes + 1 {
		_ = m.resolve(lane)
	}
}

// noteReach follows whether the database answers, from the result of a
// write or a read of the money path: the first answer after it did not
// reads the doubts back and calls the OnBack function.
func (m *Money) noteReach(err error) {
	switch {
	case err == nil:
		if m.down.CompareAndSwap(true, false) {
			go m.resolveAll()
			if f := m.onBack.Load(); f != nil {
				(*f)()
			}
		}
	case unreachable(err):
		m.down.Store(true)
	}
}

// unreachable reports whether err is the database not answering (no
// connection, a connection lost, no answer in time, a session ended by
// the server), not a statement it refused.
func unreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		severity := cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity)
		return severity == "FATAL" || severity == "PANIC"
	}
	return !errors.Is(err, ErrClosed) && !errors.Is(err, context.Canceled)
}

// OnBack sets f to be called when the database answers the money path
// again after it did not (stopped, restarted, cut off): the wiring lets
// paid calls, paused after failed usage records, try again at once
// rather than at the pause's end. f must not block.
func (m *Money) OnBack(f func()) { m.onBack.Store(&f) }
