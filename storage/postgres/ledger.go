package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// The global budget's ledger, shared by the instances: ledger_days (calls
// and micro-dollars per day, the rest of every lease included) and
// ledger_months (the days' micro-dollars per month). A lease is one call
// of bw_lease (migrations/0003_money.sql): one statement, its own
// transaction, committed with synchronous_commit on before the calls it
// covers; it is taken only if every ceiling holds after it, so N instances
// together never lease past a ceiling. A settlement moves its day and month
// from the call's leased worst case to its actual cost, in the group
// transaction of the usage record that carries it, or in one of its own.

var (
	_ budget.Ledger       = (*Money)(nil)
	_ budget.SharedLedger = (*Money)(nil)
)

// Lease adds calls and microUSD to day unconditionally (the ceilings are
// the caller's), and gives back giveBack; budget.Global uses LeaseUnder
// instead, and Lease only to give back (Close).
func (m *Money) Lease(ctx context.Context, day string, calls, microUSD int64, giveBack ...budget.LedgerDay) error {
	_, _, err := m.LeaseUnder(ctx, day, calls, microUSD, budget.Ceilings{}, giveBack...)
	return err
}

// LeaseUnder adds calls and microUSD to day and its month if every ceiling
// of lim that is on still holds after it, and gives back giveBack in the
// same transaction whether or not it does; it returns the totals after
// it. day may be "" when calls and microUSD are 0; with nothing to lease
// nor to give back, it only reads the totals. An error wrapping
// budget.ErrMaybeCommitted is a lease and give-back that may have been
// written (outcome.go): the caller takes the give-back as written and the
// lease as not taken; when it is known (at once, or once the database
// answers again), a lease that was taken is given back, and a give-back
// that was not written is written, by a later call. It waits for the
// database no longer than MoneyOptions.OpTimeout.
func (m *Money) LeaseUnder(ctx context.Context, day string, calls, microUSD int64, lim budget.Ceilings, giveBack ...budget.LedgerDay) (budget.SharedTotals, bool, error) {
	if calls < 0 || microUSD < 0 {
		return budget.SharedTotals{}, false, errors.New("postgres: negative lease")
	}
	if (calls != 0 || microUSD != 0) && !validDay(day) {
		return budget.SharedTotals{}, false, fmt.Errorf("postgres: lease on %q: not a day", day)
	}
	for _, b := range giveBack {
		if !validDay(b.Day) || b.Requests < 0 || b.SpendMicroUSD < 0 {
			return budget.SharedTotals{}, false, fmt.Errorf("postgres: lease given back to %q: invalid", b.Day)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, m.opTO)
	defer cancel()
	l := leaseCall{day: day, calls: calls, micro: microUSD, lim: lim}
	if calls == 0 && microUSD == 0 && len(giveBack) == 0 && m.owedBack.none() {
		return m.readTotals(ctx, l)
	}
	select {
	case m.leasing <- struct{}{}:
		defer func() { <-m.leasing }()
	case <-ctx.Done():
		return budget.SharedTotals{}, false, fmt.Errorf("postgres: lease budget on %s: %w", day, ctx.Err())
	}
	// What earlier leases could not give back goes with this one.
	owed := m.owedBack.take()
	l.back = append(slices.Clip(giveBack), owed...)
	var err error
	for range retries { // a deadlock's victim is rolled back whole: run it again
		b := &pgx.Batch{}
		token := m.queueToken(b, laneLease, 2)
		l.queue(b, m, token+1)
		err = m.send(ctx, b, m.leaseTxn(l, token))
		if !retryable(err) {
			break
		}
	}
	if err != nil {
		if !errors.Is(err, budget.ErrMaybeCommitted) {
			m.owedBack.add(owed...) // not written: owed still
		}
		return budget.SharedTotals{}, false, fmt.Errorf("postgres: lease budget on %s: %w", day, err)
	}
	m.txs.Add(1)
	m.writes.Add(1)
	return l.tot, l.ok, nil
}

// leaseCall is one call of bw_lease: its arguments, and its answers once
// run.
type leaseCall struct {
	day         string
	calls       int64
	micro       int64
	lim         budget.Ceilings
	back        []budget.LedgerDay
	tot         budget.SharedTotals
	ok          bool
	leasedToken int64
}

// queue queues l's call in b, after the token of its transaction: when
// the lease is taken (not a give-back alone), the same statement writes
// leased over the token, so that a transaction whose answers are lost
// tells whether its lease was taken (outcome.go).
func (l *leaseCall) queue(b *pgx.Batch, m *Money, leased int64) {
	days := make([]string, 0, len(l.back))
	backCalls := make([]int64, 0, len(l.back))
	backMicro := make([]int64, 0, len(l.back))
	for _, g := range l.back {
		days = append(days, g.Day)
		backCalls = append(backCalls, g.Requests)
		backMicro = append(backMicro, g.SpendMicroUSD)
	}
	l.leasedToken = leased
	b.Queue(`WITH l AS (SELECT * FROM bw_lease($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)),
		t AS (UPDATE money_groups SET token = $12 FROM l WHERE l.ok AND $13 AND owner = $10 AND lane = $14)
		SELECT ok, day_calls, day_micro, day_settled, month_micro, day_settled_calls, day_dead_micro FROM l`,
		l.day, l.calls, l.micro, l.lim.DailyRequests, l.lim.DailyMicroUSD, l.lim.MonthlyMicroUSD, days, backCalls, backMicro,
		m.owner, m.now().Add(-HoldTTL), leased, l.leases(), laneLease,
	).QueryRow(func(row pgx.Row) error {
		t := &l.tot
		return row.Scan(&l.ok, &t.Requests, &t.SpendMicroUSD, &t.SettledMicroUSD, &t.MonthMicroUSD, &t.SettledCalls, &t.DeadMicroUSD)
	})
	if l.day != "" { // the month's settled costs, for the figures (day keys sort as text)
		month := l.day[:len("2006-01")]
		b.Queue("SELECT coalesce(sum(settled_micro_usd), 0) FROM ledger_days WHERE day >= $1 AND day < $2",
			month+"-01", month+"-32").QueryRow(func(row pgx.Row) error { return row.Scan(&l.tot.MonthSettledMicroUSD) })
	}
}

// leases reports whether l takes a lease (and does not only give back).
func (l *leaseCall) leases() bool { return l.day != "" && (l.calls != 0 || l.micro != 0) }

// leaseTxn is l's transaction for send: what it carries, and what is
// left to do once its outcome is known after its answers were lost. A
// lease that was taken (its second token) holds headroom this instance
// does not know it has (its caller was refused): it is given back. A
// transaction in doubt that did not commit owes its give-back still.
func (m *Money) leaseTxn(l leaseCall, token int64) txn {
	t := txn{lane: laneLease, token: token, leased: l.leasedToken, what: l.what()}
	orphan := func(last int64) {
		if l.leases() && last == l.leasedToken {
			m.owedBack.add(budget.LedgerDay{Day: l.day, DayTotals: budget.DayTotals{Requests: l.calls, SpendMicroUSD: l.micro}})
		}
	}
	t.unread = orphan
	t.then = func(committed bool, last int64) {
		if !committed {
			m.owedBack.add(l.back...)
			return
		}
		orphan(last)
	}
	return t
}

// what says what l writes, for the log.
func (l *leaseCall) what() string {
	var calls, micro int64
	for _, g := range l.back {
		calls += g.Requests
		micro += g.SpendMicroUSD
	}
	var parts []string
	if l.leases() {
		parts = append(parts, fmt.Sprintf("a budget lease of %d calls and %d micro-dollars on %s", l.calls, l.micro, l.day))
	}
	if len(l.back) > 0 {
		parts = append(parts, fmt.Sprintf("a give-back of unused budget headroom (%d calls, %d micro-dollars)", calls, micro))
	}
	return strings.Join(parts, " and ")
}

// readTotals is LeaseUnder of nothing: the totals read, nothing written
// (bw_lease writes nothing when it has nothing to lease or give back), so
// nothing is in doubt when it fails.
func (m *Money) readTotals(ctx context.Context, l leaseCall) (budget.SharedTotals, bool, error) {
	b := &pgx.Batch{}
	l.queue(b, m, 0)
	err := m.db.pool.SendBatch(ctx, b).Close()
	m.noteReach(err)
	if err != nil {
		return budget.SharedTotals{}, false, fmt.Errorf("postgres: read the budget's totals on %s: %w", l.day, err)
	}
	return l.tot, true, nil
}

// owedBack is the give-backs of leases to write again: those of a
// transaction in doubt that turned out not to have committed, and leases
// taken for callers that were told they failed.
type owedBack struct {
	mu   sync.Mutex
	days []budget.LedgerDay
}

func (o *owedBack) add(b ...budget.LedgerDay) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range b {
		if d.DayTotals != (budget.DayTotals{}) {
			o.days = append(o.days, d)
		}
	}
}

func (o *owedBack) take() []budget.LedgerDay {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.days
	o.days = nil
	return b
}

func (o *owedBack) none() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.days) == 0
}

// Settle settles one call at its actual cost (see budget.Settlement), in
// a group transaction. A settlement with an ID (a reservation row of the
// bolt backend's earlier versions, which this backend never has) is
// settled by its day as one without.
func (m *Money) Settle(ctx context.Context, s budget.Settlement) error {
	steps, err := settleSteps(s, m.owner)
	if err != nil || len(steps) == 0 {
		return err
	}
	if err := m.do(ctx, &groupOp{what: "settlement", steps: steps}); !errors.Is(err, errUnread) {
		return err
	}
	return nil // committed: a settlement reads nothing
}

// settleSteps are the statements that settle s, a call of owner's: its
// day's row, then its month's, then owner's rest of the day (what its
// leases hold unsettled) loses what the call's lease held. A call no lease
// counted is added to its day. Every settlement is one call made
// (settled_calls).
func settleSteps(s budget.Settlement, owner string) ([]step, error) {
	if s == (budget.Settlement{}) {
		return nil, nil
	}
	if s.ActualMicroUSD < 0 || s.LeasedMicroUSD < 0 {
		return nil, errors.New("postgres: settlement with a negative cost")
	}
	if !validDay(s.Day) {
		return nil, fmt.Errorf("postgres: settlement on %q: not a day", s.Day)
	}
	sum := &ledgerSum{calls: 1, n: 1, settled: s.ActualMicroUSD, owner: owner}
	if s.Leased {
		sum.calls = 0
	}
	if delta := s.ActualMicroUSD - s.LeasedMicroUSD; delta < 0 {
		sum.less = delta
	} else {
		sum.more = delta
	}
	steps := []step{
		{rank: rankDay, key: s.Day, sum: sum},
		{rank: rankMonth, key: s.Day[:len("2006-01")], sum: sum},
	}
	if s.Leased || s.LeasedMicroUSD > 0 {
		rest := &ledgerSum{restMicro: s.LeasedMicroUSD, owner: owner}
		if s.Leased {
			rest.restCalls = 1
		}
		steps = append(steps, step{rank: rankRest, key: s.Day, sum: rest})
	}
	return steps, nil
}

// ledgerSum is what settlements add to one ledger row: a group's
// settlements of one day are summed into one update of its day's row, one
// of its month's and one of this instance's rest, not one each, so that a
// group holds those rows (every instance's settlements write them) for
// fewer statements. A row's micro-dollars never go below zero: the sum
// takes the decreases first, then the increases, which counts at least
// as much as any order of the settlements one by one would.
type ledgerSum struct {
	calls   int64 // calls no lease counted
	less    int64 // the sum of the negative deltas (actual - leased)
	more    int64 // the sum of the positive ones
	settled int64 // actual micro-dollars settled
	n       int64 // settlements
	owner   string

	restCalls, restMicro int64 // what leaves the owner's rest of the day
}

// plus is the sum of a and b.
func (a ledgerSum) plus(b *ledgerSum) ledgerSum {
	a.calls += b.calls
	a.less += b.less
	a.more += b.more
	a.settled += b.settled
	a.n += b.n
	a.restCalls += b.restCalls
	a.restMicro += b.restMicro
	return a
}

// queue queues the one statement of sum on the row of rank and key.
func (sum ledgerSum) queue(rank int, key string) func(b *pgx.Batch) {
	switch rank {
	case rankDay:
		return func(b *pgx.Batch) {
			b.Queue(`INSERT INTO ledger_days AS l (day, calls, micro_usd, settled_micro_usd, settled_calls) VALUES ($1, $2, $4, $5, $6)
				ON CONFLICT (day) DO UPDATE SET calls = l.calls + $2, micro_usd = greatest(l.micro_usd + $3, 0) + $4,
				settled_micro_usd = l.settled_micro_usd + $5, settled_calls = l.settled_calls + $6`,
				key, sum.calls, sum.less, sum.more, sum.settled, sum.n)
		}
	case rankMonth:
		return func(b *pgx.Batch) {
			b.Queue(`INSERT INTO ledger_months AS l (month, micro_usd) VALUES ($1, $3)
				ON CONFLICT (month) DO UPDATE SET micro_usd = greatest(l.micro_usd + $2, 0) + $3`, key, sum.less, sum.more)
		}
	default:
		return func(b *pgx.Batch) {
			b.Queue(`UPDATE ledger_rests SET calls = greatest(calls - $3, 0), micro_usd = greatest(micro_usd - $4, 0)
				WHERE day = $1 AND owner = $2`, key, sum.owner, sum.restCalls, sum.restMicro)
		}
	}
}

// sumSteps replaces each run of steps with a sum on the same row (sorted
// steps: a row's are next to each other) by one statement.
func sumSteps(steps []step) []step {
	return mergeRuns(steps, func(s step) bool { return s.sum != nil }, func(a, b step) bool {
		return a.rank == b.rank && a.key == b.key
	}, func(same []step) step {
		var total ledgerSum
		total.owner = same[0].sum.owner
		for _, s := range same {
			total = total.plus(s.sum)
		}
		return step{rank: same[0].rank, key: same[0].key, queue: total.queue(same[0].rank, same[0].key)}
	})
}

// LedgerDay is day's totals in the shared ledger, and the settled costs
// alone; a day without calls is zero.
func (m *Money) LedgerDay(ctx context.Context, day string) (t budget.DayTotals, settled int64, err error) {
	err = m.db.pool.QueryRow(ctx, `SELECT coalesce(max(calls), 0), coalesce(max(micro_usd), 0), coalesce(max(settled_micro_usd), 0)
		FROM ledger_days WHERE day = $1`, day).Scan(&t.Requests, &t.SpendMicroUSD, &settled)
	if err != nil {
		return budget.DayTotals{}, 0, fmt.Errorf("postgres: ledger day %s: %w", day, err)
	}
	return t, settled, nil
}

// GlobalState is what budget.NewGlobal starts from at now: the shared
// ledger's totals of today and this month, every instance's included (a
// lease of nothing returns them, with the settled figures and the dead
// instances' rests).
func (m *Money) GlobalState(ctx context.Context, now time.Time) (budget.GlobalState, error) {
	st := budget.GlobalState{Day: m.cal.Day(now), Month: m.cal.Month(now)}
	tot, _, err := m.LeaseUnder(ctx, st.Day, 0, 0, budget.Ceilings{})
	if err != nil {
		return budget.GlobalState{}, err
	}
	st.Requests, st.Spend, st.MonthSpend = tot.Requests, tot.SpendMicroUSD, tot.MonthMicroUSD
	st.SettledCalls, st.Settled, st.MonthSettled, st.Dead = tot.SettledCalls, tot.SettledMicroUSD, tot.MonthSettledMicroUSD, tot.DeadMicroUSD
	return st, nil
}

// validDay reports whether day is "2006-01-02".
func validDay(day string) bool {
	_, err := time.Parse(time.DateOnly, day)
	return err == nil && len(day) == len(time.DateOnly)
}
