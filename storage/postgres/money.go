package postgres

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/budget"
)

// The money path of one instance: the ledger of the global budget, plan
// quotas, the daily attempt line and the usage records, each exact across
// every instance that shares the database. Their writes (an attempt taken,
// a quota slot reserved or released, a usage record) go through one group
// commit: whatever callers are waiting when the writer is free share one
// transaction, so that under load an accepted read costs a fraction of a
// PostgreSQL transaction. Each limit is still decided row by row, under
// the row's lock, by a conditional statement: sharing a transaction
// changes when a decision is durable, not what it is.

// Money sizing and timing.
const (
	// maxGroup is the most writes one transaction carries.
	maxGroup = 512
	// DefaultOpTimeout bounds one group transaction, and the wait of a
	// caller that has no context of its own (Reserve, Take): with the
	// database unreachable, the request fails closed after it.
	DefaultOpTimeout = 5 * time.Second
	// HoldHeartbeat is how often an instance says it is alive, which
	// keeps its quota holds counting.
	HoldHeartbeat = 5 * time.Second
	// HoldTTL is how long after its last heartbeat an instance's quota
	// holds stop counting: a crashed instance's reads in flight hold their
	// slots for at most this long. It is far longer than HoldHeartbeat and
	// than any clock skew between the instances' hosts.
	HoldTTL = 30 * time.Second
	// staleOwner is how long after its last heartbeat an instance's rows
	// are removed by the next instance that starts.
	staleOwner = 24 * time.Hour
	// writers is how many group transactions one instance runs at once,
	// one per lane (see lanes).
	writers = lanes
	// retries is how often a group transaction that PostgreSQL aborted
	// to break a deadlock or a serialisation conflict is run again.
	retries = 5
)

// MoneyOptions tune NewMoney.
type MoneyOptions struct {
	// Location is the zone of the budget's days and months (required).
	Location *time.Location
	// Now is the clock of the heartbeat. Default time.Now.
	Now func() time.Time
	// OpTimeout bounds one group transaction. Default DefaultOpTimeout.
	OpTimeout time.Duration
	// Logger receives the few log lines. Default the DB's.
	Logger *slog.Logger
	// KeepAnswer, when set, queues in a usage record's transaction the
	// statements that keep rec.Answer (the kept answers' part of the
	// backend), so that a read and its answer are one commit. Without it
	// a record's Answer is not kept.
	KeepAnswer func(b *pgx.Batch, rec budget.UsageRecord) error
}

// Money is one instance's money path on db. Make one per process
// (NewMoney) and Close it on a clean stop, before db. Wiring, in order:
//
//	db, err := postgres.Open(ctx, os.Getenv(postgres.EnvURL), postgres.Options{...})
//	m, err := postgres.NewMoney(ctx, db, postgres.MoneyOptions{Location: loc, Now: now})
//	st, err := m.GlobalState(ctx, now())
//	brake, err := budget.NewGlobal(cfg, loc, m, st) // m is a budget.SharedLedger
//	guard.Layers{Attempts: m.Attempts(), Quotas: m.Quotas(), Brake: brake, Usage: m, ...}
//	every second or so: brake.Refresh(ctx, now())
//	at a clean stop, no request in flight: brake.Close(ctx); m.Close(ctx); db.Close()
type Money struct {
	db    *DB
	loc   *time.Location
	cal   *budget.Calendar
	now   func() time.Time
	log   *slog.Logger
	owner string // this instance's id in money_owners and quota_holds
	opTO  time.Duration
	keep  func(b *pgx.Batch, rec budget.UsageRecord) error

	leasing chan struct{} // one lease at a time: its lane's token is read back alone (outcome.go)

	queue   chan *groupOp
	groups  chan []*groupOp // from the dispatcher to the committers
	freed   chan int        // a committer of this lane is free again
	stop    chan struct{}
	stopped chan struct{} // closed once the writers have ended
	done    sync.WaitGroup
	once    sync.Once

	// txs counts the transactions committed (groups and leases), writes
	// the writes they carried, for metrics and benchmarks.
	txs, writes atomic.Int64
	// tokens numbers the transactions for outcome (outcome.go).
	tokens atomic.Int64

	cache    quotaCache
	attempts attemptCache
	releases releaseDebt
	owedBack owedBack // give-backs of leases to write again (ledger.go)

	doubts doubts                 // transactions whose outcome is in doubt (outcome.go)
	down   atomic.Bool            // the database did not answer the last write or read
	onBack atomic.Pointer[func()] // called when it answers again (OnBack)
}

// NewMoney registers this instance as a quota holder, starts its
// heartbeat and the group writer, and returns its money path.
func NewMoney(ctx context.Context, db *DB, opts MoneyOptions) (*Money, error) {
	if db == nil || opts.Location == nil {
		return nil, errors.New("postgres: the money path needs a database and a time zone")
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	m := &Money{
		db: db, loc: opts.Location, cal: budget.NewCalendar(opts.Location), now: opts.Now, log: opts.Logger,
		owner: hex.EncodeToString(id[:]), opTO: opts.OpTimeout, keep: opts.KeepAnswer,
		queue: make(chan *groupOp, maxGroup), leasing: make(chan struct{}, 1), groups: make(chan []*groupOp), freed: make(chan int, writers),
		stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	if m.now == nil {
		m.now = time.Now
	}
	if m.log == nil {
		m.log = db.log
	}
	if m.opTO <= 0 {
		m.opTO = DefaultOpTimeout
	}
	if err := m.heartbeat(ctx); err != nil {
		return nil, fmt.Errorf("postgres: register the instance: %w", err)
	}
	// Instances gone for a day (crashed, never restarted with this id)
	// leave rows that no longer count: remove them. No one else writes
	// them, so this takes no lock out of order.
	_, err := db.pool.Exec(ctx, `WITH gone AS (DELETE FROM money_owners WHERE seen_at < $1 RETURNING owner),
		holds AS (DELETE FROM quota_holds WHERE owner IN (SELECT owner FROM gone))
		DELETE FROM money_groups WHERE owner IN (SELECT owner FROM gone)`, m.now().Add(-staleOwner))
	if err != nil {
		return nil, fmt.Errorf("postgres: remove stale instances: %w", err)
	}
	var writing sync.WaitGroup
	writing.Add(writers + 1)
	go func() { defer writing.Done(); m.dispatch() }()
	for range writers {
		go func() { defer writing.Done(); m.commit() }()
	}
	m.done.Add(2)
	go func() { defer m.done.Done(); writing.Wait(); close(m.stopped) }()
	go m.beat()
	return m, nil
}

// Owner is this instance's id among the quota holders.
func (m *Money) Owner() string { return m.owner }

// Transactions is how many transactions this instance's money path
// committed: group transactions and leases.
func (m *Money) Transactions() int64 { return m.txs.Load() }

// Writes is how many writes (an attempt, a reservation, a usage record, a
// settlement, a lease) those transactions carried.
func (m *Money) Writes() int64 { return m.writes.Load() }

// Close stops the writer and the heartbeat, and gives back this
// instance's quota holds and registration: call it once no request is in
// flight, after budget.Global.Close and before db.Close. A process that
// dies without it leaves its holds to expire (HoldTTL).
func (m *Money) Close(ctx context.Context) error {
	m.once.Do(func() { close(m.stop) })
	m.done.Wait()
	_, err := m.db.pool.Exec(ctx, `WITH h AS (DELETE FROM quota_holds WHERE owner = $1),
		g AS (DELETE FROM money_groups WHERE owner = $1)
		DELETE FROM money_owners WHERE owner = $1`, m.owner)
	if err != nil {
		return fmt.Errorf("postgres: give the quota holds back: %w", err)
	}
	return nil
}

// heartbeat says this instance is alive: its quota holds keep counting
// for HoldTTL from now.
func (m *Money) heartbeat(ctx context.Context) error {
	now := m.now()
	_, err := m.db.pool.Exec(ctx, `INSERT INTO money_owners (owner, started_at, seen_at) VALUES ($1, $2, $2)
		ON CONFLICT (owner) DO UPDATE SET seen_at = $2`, m.owner, now)
	return err
}

// beat runs the heartbeat until Close, and writes the releases of quota
// holds that failed to write.
func (m *Money) beat() {
	defer m.done.Done()
	t := time.NewTicker(HoldHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), m.opTO)
		err := m.heartbeat(ctx)
		m.noteReach(err)
		if err != nil {
			m.log.Warn("postgres heartbeat failed: this instance's quota holds stop counting after the TTL", "error", err, "ttl", HoldTTL)
		}
		cancel()
		m.resolveAll()
		m.retryReleases()
	}
}

// A step is one statement of a group write, queued in lock order: by rank
// (the inserts, then the users' rows, then the ledger's days, its months,
// and this instance's rests), then by key (the row). A user's rows are one
// rank, keyed user first (userKey): all of one user's rows are locked
// before the next user's, in the order of the kinds (their admission, the
// attempts, the quota count, the holds). Every writer of these tables
// locks in this order, so that two transactions never wait on each other
// in a circle: not two instances', nor two groups of one instance (its
// writers run two at once), nor an admission that locks all of a user's
// rows in one statement (bw_admit) and the steps that lock them one by
// one. The rows every instance writes (a user's counts, the ledger's day
// and month) come after the inserts, so that a group holds them only from
// its update to its commit, not while its inserts run: the other
// instances' groups wait on them for no longer than that.
type step struct {
	rank  int
	key   string
	queue func(b *pgx.Batch)
	// sum, if set, replaces queue: the steps of one row with a sum are
	// summed into one statement (sumSteps).
	sum *ledgerSum
	// row, if set, replaces queue: the steps of one counter row are
	// merged into one statement (mergeRows).
	row *rowStep
	// admit, if set, replaces queue: the admissions of one user under the
	// same limits are decided by one call (admit.go).
	admit *admitStep
	// usage, if set, replaces queue: a group's usage rows are inserted by
	// one statement (usage.go).
	usage *usageRow
}

// Ranks of the steps, in lock order.
const (
	rankInsert = iota
	rankUser   // a user's rows: keyed by userKey
	rankDay
	rankMonth
	rankRest
)

// The kinds of a user's rows, in the order they are locked.
const (
	userAdmit   = '0' // all of them, in this order (bw_admit)
	userAttempt = '1' // the day's attempts
	userQuota   = '2' // the month's recorded reads
	userHolds   = '3' // the month's holds of this instance
)

// userKey is the key of a step of user's row of kind for period (a day or
// a month).
func userKey(user string, kind byte, period string) string {
	return user + "\x00" + string(kind) + period
}

// groupOp is one caller's write: its statements, and reset, which clears
// what their callbacks recorded before a run (a group may run more than
// once).
type groupOp struct {
	lane  int
	steps []step
	reset func()
	done  chan error // buffered
	// what names the write, for the log ("usage record", ...).
	what string
	// then, if set, is called once the outcome of the op's transaction,
	// which was in doubt (its caller was answered with an error wrapping
	// budget.ErrMaybeCommitted that is not errUnread), is read back.
	then func(committed bool)
}

// do runs op in the next group transaction and returns once that
// transaction committed (or failed). ctx bounds only the wait for a place
// in the queue: once queued, the caller must learn its write's fate.
func (m *Money) do(ctx context.Context, op *groupOp) error {
	op.done = make(chan error, 1)
	op.lane = laneOf(op.steps)
	select {
	case <-m.stop:
		return ErrClosed
	default:
	}
	select {
	case m.queue <- op:
	case <-m.stop:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("postgres: money queue: %w", ctx.Err())
	}
	select {
	case err := <-op.done:
		return err
	case <-m.stopped: // queued as the writers ended: answered, or never
		select {
		case err := <-op.done:
			return err
		default:
			return ErrClosed
		}
	}
}

// The writes go in two lanes, each its own group transaction, one of
// each at a time: the money (usage records and settlements, which write
// the ledger rows every instance writes), and the counters (attempts,
// quota slots taken or given back). A reservation then does not wait
// behind the ledger rows' locks, which the usage records of every
// instance take in turn, each until its commit reaches the disk. Both
// lock in the one order of the steps, so that they never wait on each
// other in a circle.
//
// The money lane commits with synchronous_commit on, as every session of
// the backend does: a usage record is on the disk before its answer. The
// counters lane commits without waiting for the disk (PostgreSQL writes
// it within a fraction of a second): its writes are seen by every
// instance the moment they commit, which is what makes the line and the
// quota exact across instances, and they need no more durability than
// the bolt backend gives them (attempts written behind every second,
// holds that a crash gives back). A crash of PostgreSQL itself may lose
// its last fraction of a second of them: a few attempts not counted, and
// the holds of reads in flight, which the quota then does not count until
// they are recorded (a user at the edge may pass it by that many reads).
// A read would then wait for two disk writes, not one.
//
// With a synchronous standby (the server's synchronous_standby_names is
// set) the counters lane commits as the money lane does, waiting for the
// standby: a failover to it then loses no attempt and no quota hold. An
// asynchronous commit there would be lost with the primary while the
// instance that made it goes on, and the give-back of a hold the new
// primary never had would end another read's hold (holds are counted per
// user and instance): a user at the edge of their quota would pass it by
// the reads in flight at the failover (TestFailoverToSynchronousStandby).
const (
	laneRows   = iota // counters: no ledger row, no usage row
	laneLedger        // a ledger row or a usage row
	lanes
)

// laneOf is the lane of a write of steps.
func laneOf(steps []step) int {
	for _, s := range steps {
		if s.rank != rankUser {
			return laneLedger
		}
	}
	return laneRows
}

// dispatch forms the groups: it gathers the waiting writes by lane and
// hands a lane's to a free committer once that lane has no group being
// committed. On Close it fails what is left.
func (m *Money) dispatch() {
	var (
		group [lanes][]*groupOp
		busy  [lanes]bool
	)
	for {
		var send chan []*groupOp
		lane := 0
		for l := range lanes {
			if len(group[l]) > 0 && !busy[l] {
				send, lane = m.groups, l
				break
			}
		}
		queue := m.queue
		if len(group[laneRows]) >= maxGroup || len(group[laneLedger]) >= maxGroup {
			queue = nil
		}
		select {
		case op := <-queue:
			group[op.lane] = append(group[op.lane], op)
		case send <- group[lane]:
			group[lane], busy[lane] = nil, true
		case l := <-m.freed:
			busy[l] = false
		case <-m.stop:
			close(m.groups)
			for _, op := range append(group[laneRows], group[laneLedger]...) {
				op.done <- ErrClosed
			}
			for {
				select {
				case op := <-m.queue:
					op.done <- ErrClosed
				default:
					return
				}
			}
		}
	}
}

// commit commits the groups dispatch hands it, until Close.
func (m *Money) commit() {
	for group := range m.groups {
		m.commitGroup(group)
		m.freed <- group[0].lane // buffered for every committer: never blocks
	}
}

// commitGroup runs ops in one transaction and tells each its outcome. A
// statement that fails with the server's error (one op's bad input) would
// fail them all: the group is then run again one op at a time, so that
// only that op fails; not a group that may have committed (outcome.go).
func (m *Money) commitGroup(ops []*groupOp) {
	err := m.runGroup(ops)
	var pgErr *pgconn.PgError
	if err != nil && len(ops) > 1 && errors.As(err, &pgErr) && !errors.Is(err, budget.ErrMaybeCommitted) {
		for _, op := range ops {
			op.done <- m.runGroup([]*groupOp{op})
		}
		return
	}
	for _, op := range ops {
		op.done <- err
	}
}

// runGroup runs ops in one transaction, again after a deadlock or a
// serialisation failure.
func (m *Money) runGroup(ops []*groupOp) error {
	var steps []step
	for _, op := range ops {
		steps = append(steps, op.steps...)
	}
	sort.SliceStable(steps, func(i, j int) bool {
		if steps[i].rank != steps[j].rank {
			return steps[i].rank < steps[j].rank
		}
		return steps[i].key < steps[j].key
	})
	steps = mergeUsage(mergeAdmits(mergeRows(sumSteps(steps))))
	var err error
	for range retries {
		for _, op := range ops {
			if op.reset != nil {
				op.reset()
			}
		}
		if err = m.runSteps(ops, steps); err == nil || !retryable(err) {
			break
		}
	}
	if err == nil {
		m.writes.Add(int64(len(ops)))
	}
	return err
}

// runSteps is one try of the group transaction of ops.
func (m *Money) runSteps(ops []*groupOp, steps []step) error {
	ctx, cancel := context.WithTimeout(context.Background(), m.opTO)
	defer cancel()
	lane := ops[0].lane
	// One pipeline with one Sync: PostgreSQL runs it as one implicit
	// transaction (all or nothing), in one round trip.
	b := &pgx.Batch{}
	t := txn{lane: lane, token: m.queueToken(b, lane, 1), what: groupWhat(ops), then: groupThen(ops)}
	if lane == laneRows && !m.db.syncStandby.Load() {
		// For this transaction only (is_local): the session keeps on.
		b.Queue("SELECT set_config('synchronous_commit', 'off', true)")
	}
	for _, s := range steps {
		s.queue(b)
	}
	if err := m.send(ctx, b, t); err != nil {
		return fmt.Errorf("postgres: money transaction: %w", err)
	}
	m.txs.Add(1)
	return nil
}

// groupWhat says what a group of ops carries: each kind of write and how
// many.
func groupWhat(ops []*groupOp) string {
	n := map[string]int{}
	var kinds []string
	for _, op := range ops {
		what := cmp.Or(op.what, "write")
		if n[what] == 0 {
			kinds = append(kinds, what)
		}
		n[what]++
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d %s", n[k], k)
	}
	return strings.Join(parts, ", ")
}

// groupThen is what ops leave to do once their transaction's outcome,
// in doubt, is read back; nil if nothing.
func groupThen(ops []*groupOp) func(committed bool, last int64) {
	var then []func(bool)
	for _, op := range ops {
		if op.then != nil {
			then = append(then, op.then)
		}
	}
	if len(then) == 0 {
		return nil
	}
	return func(committed bool, _ int64) {
		for _, f := range then {
			f(committed)
		}
	}
}

// retryable reports a transaction PostgreSQL aborted so that another could
// go on: run again, it succeeds.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// ctx is a context for a caller that brings none (Reserve, Take).
func (m *Money) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), m.opTO)
}
