package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/limiter"
)

// PendingTTL is how long an attempt in progress counts against its keys
// (a fail limit's in_flight refusal) without an outcome: an instance that
// crashes in the middle of an attempt leaves it behind, and no attempt
// (an invite check, a guarded route's call) lasts this long.
const PendingTTL = 10 * time.Minute

// operatorTimeout bounds the operator's reads and changes of a fail limit
// (cooldowns listed or cleared).
const operatorTimeout = 2 * time.Second

// Fails is a fail limit (limiter.SharedFails) that every instance
// shares, under name ("invites", "route:NAME"): runs of failures,
// attempts in progress, cooldowns and the service-wide net.
type Fails struct {
	l    *Limits
	name string
}

var _ limiter.SharedFails = (*Fails)(nil)

// Fails returns the shared fail limit named name.
func (l *Limits) Fails(name string) *Fails { return &Fails{l: l, name: name} }

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Begin starts an attempt on every key at now, or refuses it (bw_fail_begin).
func (f *Fails) Begin(keys []string, cfg limiter.FailConfig, now time.Time) (*limiter.Refusal, error) {
	var r *limiter.Refusal
	b := &pgx.Batch{}
	f.queueBegin(b, keys, cfg, now, &r)
	if err := f.l.run(b); err != nil {
		return nil, err
	}
	return r, nil
}

// queueBegin queues Begin's call on b; *r is its refusal once b has run.
func (f *Fails) queueBegin(b *pgx.Batch, keys []string, cfg limiter.FailConfig, now time.Time, r **limiter.Refusal) {
	cfg = cfg.WithDefaults()
	b.Queue("SELECT wait, reason FROM bw_fail_begin($1, $2, $3, $4, $5, $6, $7, $8)",
		f.name, keys, now.UnixNano(), now.Unix()/60, cfg.Limit, int64(cfg.Window), cfg.GlobalPerHour, int64(PendingTTL),
	).QueryRow(func(row pgx.Row) error {
		var (
			wait   int64
			reason string
		)
		if err := row.Scan(&wait, &reason); err != nil {
			return err
		}
		if wait > 0 {
			*r = &limiter.Refusal{RetryAfter: time.Duration(wait), Reason: reason}
		}
		return nil
	})
}

// Finish ends an attempt begun at begun with its outcome at now
// (bw_fail_finish). A release with a zero begun, an attempt Begin
// refused (limiter.FailLimiter.EndRefused), does a failure's work and
// changes nothing.
func (f *Fails) Finish(keys []string, outcome limiter.FailOutcome, cfg limiter.FailConfig, begun, now time.Time) ([]string, bool, error) {
	var (
		started []string
		tripped bool
	)
	b := &pgx.Batch{}
	f.queueFinish(b, keys, outcome, cfg, begun, now, &started, &tripped)
	if err := f.l.run(b); err != nil {
		return nil, false, err
	}
	if len(started) == 0 {
		started = nil
	}
	return started, tripped, nil
}

// queueFinish queues Finish's call on b, which sets *started and
// *tripped.
func (f *Fails) queueFinish(b *pgx.Batch, keys []string, outcome limiter.FailOutcome, cfg limiter.FailConfig, begun, now time.Time,
	started *[]string, tripped *bool) {
	cfg = cfg.WithDefaults()
	b.Queue("SELECT started, tripped FROM bw_fail_finish($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
		f.name, keys, string(outcome), unixNano(begun), unixNano(now), now.Unix()/60,
		cfg.Limit, int64(cfg.Window), int64(cfg.Cooldown), cfg.Backoff, int64(cfg.MaxCooldown), int64(limiter.BackoffMemory),
		cfg.Decay, cfg.GlobalPerHour,
	).QueryRow(func(row pgx.Row) error { return row.Scan(started, tripped) })
}

// Cooling lists the keys in a cooldown at now, sorted by key.
func (f *Fails) Cooling(now time.Time) ([]limiter.Cooldown, error) {
	ctx, cancel := context.WithTimeout(context.Background(), operatorTimeout)
	defer cancel()
	// limit_fail_cooldowns holds every cooldown started (migration
	// 0014), also those a failover emptied limit_fails of.
	rows, err := f.l.db.pool.Query(ctx, `SELECT key, max(cool_until) FROM (
		SELECT key, cool_until FROM limit_fails WHERE name = $1 AND cool_until > $2
		UNION ALL SELECT key, cool_until FROM limit_fail_cooldowns WHERE name = $1 AND cool_until > $2) c
		GROUP BY key ORDER BY key`,
		f.name, now.UnixNano())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (limiter.Cooldown, error) {
		var (
			c     limiter.Cooldown
			until int64
		)
		err := row.Scan(&c.Key, &until)
		c.Until = time.Unix(0, until)
		return c, err
	})
}

// Clear lifts key's cooldown and forgets its run and its backoff; false if
// the key has no state.
func (f *Fails) Clear(key string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), operatorTimeout)
	defer cancel()
	var n int64
	err := f.l.db.pool.QueryRow(ctx, `WITH
		logged AS (DELETE FROM limit_fail_cooldowns WHERE name = $1 AND key = $2 RETURNING 1),
		live AS (UPDATE limit_fails SET fails = 0, cool_until = 0, cool_length = 0 WHERE name = $1 AND key = $2 RETURNING 1)
		SELECT (SELECT count(*) FROM logged) + (SELECT count(*) FROM live)`,
		f.name, key).Scan(&n)
	return n > 0, err
}

// GlobalFailures returns the failures over every key in the last hour at
// now, counted in whole minutes.
func (f *Fails) GlobalFailures(now time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.l.timeout)
	defer cancel()
	m := now.Unix() / 60
	var n int
	err := f.l.db.pool.QueryRow(ctx, "SELECT coalesce(sum(n), 0)::bigint FROM limit_fail_minutes WHERE name = $1 AND minute > $2 AND minute <= $3",
		f.name, m-60, m).Scan(&n)
	return n, err
}

// PruneFails deletes what no longer affects any decision at now under
// cfg: keys with no attempt in progress, no run and no cooldown (nor one
// the backoff remembers), the logged copies of such cooldowns, and
// minutes out of the net's hour.
func (f *Fails) PruneFails(ctx context.Context, cfg limiter.FailConfig, now time.Time) (int64, error) {
	cfg = cfg.WithDefaults()
	t := now.UnixNano()
	coolCutoff := t // a cooldown that has ended no longer counts...
	if cfg.Backoff {
		coolCutoff = t - int64(limiter.BackoffMemory) // ...unless the backoff remembers it
	}
	tag, err := f.l.db.pool.Exec(ctx, `DELETE FROM limit_fails WHERE name = $1
		AND NOT EXISTS (SELECT 1 FROM unnest(pending) AS b WHERE b > $2)
		AND (fails = 0 OR last < $3) AND cool_until <= $4`,
		f.name, t-int64(PendingTTL), t-int64(cfg.Window), coolCutoff)
	if err != nil {
		return 0, err
	}
	if _, err := f.l.db.pool.Exec(ctx, "DELETE FROM limit_fail_cooldowns WHERE name = $1 AND cool_until <= $2", f.name, coolCutoff); err != nil {
		return 0, err
	}
	if _, err := f.l.db.pool.Exec(ctx, "DELETE FROM limit_fail_minutes WHERE name = $1 AND minute <= $2", f.name, now.Unix()/60-60); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
