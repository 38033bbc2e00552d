package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/budget"
	"breakwater/limiter"
)

// The defense layers' limits shared by every instance (migration 0006):
// rate windows and bursts, a guarded route's daily line, fail limits and
// cooldowns, each decided by one statement or function call in the
// database under its rows' locks, with the semantics of the memory layers
// (package limiter, budget.Attempts). They are defense layers: the wait
// for the database is short (LimitTimeout), and after a failure the
// database is left alone for limitsBackoff, so that a dead database costs
// each request nothing; the layer decides in memory meanwhile and counts
// the fault.

// LimitTimeout bounds one limit decision in the database: a defense layer
// that cannot decide within it decides in memory instead. Far shorter
// than the money path's DefaultOpTimeout, which fails closed.
const LimitTimeout = 300 * time.Millisecond

// limitsBackoff is how long after a failed decision the limits do not ask
// the database at all (ErrLimitsDown), so that a dead or blackholed
// database does not hold every request for LimitTimeout.
const limitsBackoff = time.Second

// ErrLimitsDown is the answer of a shared limit while the database is
// left alone after a failure: the caller decides in memory.
var ErrLimitsDown = errors.New("postgres: shared limits unavailable: deciding in memory")

// Limits are the shared limits of one instance on db. Make one per
// process; its Windows and Fails are the limiter's stores.
type Limits struct {
	db      *DB
	timeout time.Duration
	// since is the time elapsed on the monotonic clock since the Limits
	// were made; downUntil is the value of since until which the
	// database is left alone (0: it is not).
	since     func() time.Duration
	downUntil atomic.Int64
	windows   windowQueue  // the window decisions waiting (windowbatch.go)
	trips     atomic.Int64 // round trips of window decisions made
}

// WindowTrips is how many round trips the window decisions took: under
// load, far fewer than the decisions.
func (l *Limits) WindowTrips() int64 { return l.trips.Load() }

// Limits returns the shared limits on db.
func (db *DB) Limits() *Limits {
	start := time.Now()
	return &Limits{db: db, timeout: db.limitTimeout, since: func() time.Duration { return time.Since(start) }}
}

// run runs one batch of decisions in one round trip, bounded by the
// limits' timeout; a failure to reach the database leaves it alone for
// limitsBackoff (a statement the server refused does not: it answered).
func (l *Limits) run(b *pgx.Batch) error {
	if until := l.downUntil.Load(); until != 0 && int64(l.since()) < until {
		return ErrLimitsDown
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if err := l.db.pool.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			l.downUntil.Store(int64(l.since() + limitsBackoff))
		}
		return err
	}
	if l.downUntil.Load() != 0 {
		l.downUntil.Store(0)
	}
	return nil
}

// Windows is a rate window and burst (limiter.SharedWindows) that every
// instance shares, under name ("user", "invites", "route:NAME").
type Windows struct {
	l    *Limits
	name string
}

var _ limiter.SharedWindows = (*Windows)(nil)

// Windows returns the shared windows named name.
func (l *Limits) Windows(name string) *Windows { return &Windows{l: l, name: name} }

// Take decides a request for key at now under cfg, in the round trip of
// whatever other decisions are waiting (windowbatch.go): nil if admitted
// (and recorded), else the refusal with its exact retry-after.
func (w *Windows) Take(key string, cfg limiter.Config, now time.Time) (*limiter.Refusal, error) {
	c := &windowCall{name: w.name, key: key, cfg: cfg, now: now}
	w.l.decide(c)
	if c.err != nil {
		return nil, c.err
	}
	return c.refusal, nil
}

// queueWindow queues on b the decision of one request for key at now
// under cfg against the windows named name (bw_window_take), so that it
// can share a round trip and a transaction with other statements (the
// money path's for an OCR request); done is called with its answer (nil:
// admitted and recorded) once the batch has been read.
func queueWindow(b *pgx.Batch, name, key string, cfg limiter.Config, now time.Time, done func(*limiter.Refusal)) {
	cfg = cfg.WithDefaults()
	b.Queue("SELECT wait, reason FROM bw_window_take($1, $2, $3, $4, $5, $6)",
		name, key, now.UnixNano(), cfg.Rate, int64(cfg.Window), cfg.Burst,
	).QueryRow(func(row pgx.Row) error {
		var (
			wait   int64
			reason string
		)
		if err := row.Scan(&wait, &reason); err != nil {
			return err
		}
		if wait <= 0 {
			done(nil)
			return nil
		}
		done(&limiter.Refusal{RetryAfter: time.Duration(wait), Reason: reason})
		return nil
	})
}

// PruneWindows deletes, in one statement, the windows named name whose
// newest request no longer counts at now under cfg (they decide nothing
// any more), and the recorded times, of every key, that no longer count
// even for a clock a minute behind now (pruneClockMargin): a key in use
// keeps its last window's times, not the last rate of them. It returns
// how many windows it deleted.
func (w *Windows) PruneWindows(ctx context.Context, cfg limiter.Config, now time.Time) (int64, error) {
	cfg = cfg.WithDefaults()
	horizon := max(cfg.Window, limiter.BurstWindow)
	var n int64
	err := w.l.db.pool.QueryRow(ctx, `WITH
		heads AS (DELETE FROM limit_window_heads WHERE name = $1 AND newest <= $2 RETURNING 1),
		slots AS (DELETE FROM limit_window_slots WHERE name = $1 AND t <= $3)
		SELECT count(*) FROM heads`,
		w.name, now.Add(-horizon).UnixNano(), now.Add(-horizon-pruneClockMargin).UnixNano()).Scan(&n)
	return n, err
}

// pruneClockMargin is how far behind the pruning instance's clock another
// instance's may be without a time the prune deleted still counting for
// its decisions. A key's slots left by its deleted head are never read
// (a new head's ring reads only the slots it wrote), so they may wait.
const pruneClockMargin = time.Minute

// Daily is a daily line (budget.SharedDaily) that every instance shares,
// under name ("route:NAME"): each key's attempts per day.
type Daily struct {
	l    *Limits
	name string
}

var _ budget.SharedDaily = (*Daily)(nil)

// Daily returns the shared daily line named name.
func (l *Limits) Daily(name string) *Daily { return &Daily{l: l, name: name} }

// Take counts one attempt of key on day against line (0: none), unless
// every instance's attempts already reach it, in one conditional upsert.
func (d *Daily) Take(key, day string, line int64) (bool, error) {
	var taken bool
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO limit_days AS d (name, key, day, n) VALUES ($1, $2, $3, 1)
		ON CONFLICT (name, key, day) DO UPDATE SET n = d.n + 1 WHERE $4 <= 0 OR d.n < $4
		RETURNING true`, d.name, key, day, line,
	).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&taken)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // the line: refused
		}
		return err
	})
	if err := d.l.run(b); err != nil {
		return false, err
	}
	return taken, nil
}

// PruneDays deletes the daily counts of days before before.
func (d *Daily) PruneDays(ctx context.Context, before string) (int64, error) {
	tag, err := d.l.db.pool.Exec(ctx, "DELETE FROM limit_days WHERE name = $1 AND day < $2", d.name, before)
	return tag.RowsAffected(), err
}
