package postgres

import (
	"time"

	"github.com/jackc/pgx/v5"
)

// Counter rows written by many callers of one group. A group often
// carries several writes of one row: one user's attempts of a day, their
// quota's count, their holds. Each would be a statement of its own, every
// one locking and rewriting the same row; mergeRows makes them one. Takes
// (a conditional write under a bound: an attempt under the day's line, a
// hold under the month's limit) are granted in the callers' order, as many
// as fit, as the statements one by one would have granted them.

// Kinds of row steps.
const (
	rowAttempt  = iota // take one attempt of user's day under bound (the line)
	rowQuota           // add n to user's recorded reads of the month (0: lock the row)
	rowHoldEnd         // end n of this instance's holds of user's month
	rowHoldTake        // take one hold of user's month under bound (the limit)
)

// rowStep is one caller's write of a counter row; the step's rank and key
// name the row. Steps of one row, kind and bound are merged.
type rowStep struct {
	kind         int
	user, period string // the row: a user's day or month
	owner        string // holds: this instance
	alive        time.Time
	n            int64  // rowQuota, rowHoldEnd: what the step adds or ends
	bound        int64  // takes: the line or the limit
	taken        *bool  // takes: set when this caller's take was granted
	value        *int64 // rowAttempt: the count after; rowQuota: the used count after
}

// mergeRows replaces each run of row steps of one row, kind and bound
// (sorted steps: a row's are next to each other, in the callers' order) by
// one statement that answers each of them.
func mergeRows(steps []step) []step {
	return mergeRuns(steps, func(s step) bool { return s.row != nil }, func(a, b step) bool {
		return a.rank == b.rank && a.key == b.key && a.row.kind == b.row.kind && a.row.bound == b.row.bound
	}, func(same []step) step {
		run := make([]*rowStep, len(same))
		for i, s := range same {
			run[i] = s.row
		}
		return step{rank: same[0].rank, key: same[0].key, queue: queueRows(run)}
	})
}

// mergeRuns replaces each run of steps that merge (sorted steps: such a
// run's are next to each other, in the callers' order), which same says
// of two of them, by the one step merge makes of it; other steps stay.
func mergeRuns(steps []step, merges func(s step) bool, same func(a, b step) bool, merge func(run []step) step) []step {
	out := steps[:0:0]
	for i := 0; i < len(steps); {
		if !merges(steps[i]) {
			out = append(out, steps[i])
			i++
			continue
		}
		j := i + 1
		for j < len(steps) && merges(steps[j]) && same(steps[i], steps[j]) {
			j++
		}
		out = append(out, merge(steps[i:j]))
		i = j
	}
	return out
}

// queueRows queues the one statement of run (steps of one row, kind and
// bound) and hands its answer to each step.
func queueRows(run []*rowStep) func(b *pgx.Batch) {
	r := run[0]
	var n int64
	for _, s := range run {
		n += s.n
	}
	switch r.kind {
	case rowQuota:
		return func(b *pgx.Batch) {
			b.Queue(`INSERT INTO quota_counts AS q (user_id, month, used) VALUES ($1, $2, $3)
				ON CONFLICT (user_id, month) DO UPDATE SET used = q.used + $3 RETURNING used`, r.user, r.period, n,
			).QueryRow(func(row pgx.Row) error {
				var used int64
				err := row.Scan(&used)
				for _, s := range run {
					*s.value = used
				}
				return err
			})
		}
	case rowHoldEnd:
		return func(b *pgx.Batch) {
			b.Queue("UPDATE quota_holds SET n = greatest(n - $4, 0) WHERE user_id = $1 AND month = $2 AND owner = $3", r.user, r.period, r.owner, n)
		}
	case rowAttempt:
		if len(run) == 1 {
			return func(b *pgx.Batch) {
				b.Queue(`INSERT INTO attempt_counts AS a (user_id, day, count) VALUES ($1, $2, 1)
					ON CONFLICT (user_id, day) DO UPDATE SET count = a.count + 1 WHERE $3 <= 0 OR a.count < $3
					RETURNING count`, r.user, r.period, r.bound,
				).QueryRow(func(row pgx.Row) error { return scanTaken(row, r.value, r.taken) })
			}
		}
		return func(b *pgx.Batch) {
			b.Queue(`SELECT taken, total FROM bw_take_attempts($1, $2, $3, $4)`, r.user, r.period, int64(len(run)), r.bound).QueryRow(func(row pgx.Row) error {
				var taken, total int64
				err := row.Scan(&taken, &total)
				grant(run, taken, total, err)
				return err
			})
		}
	default: // rowHoldTake
		if len(run) == 1 {
			return func(b *pgx.Batch) {
				b.Queue(`INSERT INTO quota_holds AS h (user_id, month, owner, n)
					SELECT $1, $2, $3, 1
					WHERE (SELECT used FROM quota_counts WHERE user_id = $1 AND month = $2)
					    + (SELECT coalesce(sum(x.n), 0) FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
					       WHERE x.user_id = $1 AND x.month = $2 AND (x.owner = $3 OR o.seen_at > $5)) < $4
					ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + 1
					RETURNING n`, r.user, r.period, r.owner, r.bound, r.alive,
				).QueryRow(func(row pgx.Row) error { var n int64; return scanTaken(row, &n, r.taken) })
			}
		}
		return func(b *pgx.Batch) {
			b.Queue(`SELECT taken FROM bw_take_holds($1, $2, $3, $4, $5, $6)`, r.user, r.period, r.owner, int64(len(run)), r.bound, r.alive).QueryRow(func(row pgx.Row) error {
				var taken int64
				err := row.Scan(&taken)
				grant(run, taken, 0, err)
				return err
			})
		}
	}
}

// grant answers a run of takes of which the first taken were granted, and
// hands each the row's count after them (if it has a place for it).
func grant(run []*rowStep, taken, total int64, err error) {
	if err != nil {
		return
	}
	for i, s := range run {
		*s.taken = int64(i) < taken
		if s.value != nil {
			*s.value = total
		}
	}
}
