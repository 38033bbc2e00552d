-- The money path: the global budget's ledger, plan quotas and their holds,
-- the daily attempt line, and the usage rows. Every instance of a service
-- writes these rows; each limit is decided by a conditional statement on
-- one row, under that row's lock.

-- One day of the global budget's ledger: upstream calls and micro-dollars
-- counted (settled costs, calls in flight at their worst case, and the
-- unused rest of every instance's lease), and the settled costs alone.
CREATE TABLE ledger_days (
    day               text PRIMARY KEY,           -- "2006-01-02" in the configured zone
    calls             bigint NOT NULL DEFAULT 0,
    micro_usd         bigint NOT NULL DEFAULT 0,
    settled_micro_usd bigint NOT NULL DEFAULT 0
);

-- One month of the ledger: the sum of its days' micro_usd, kept beside
-- them so that monthly_usd is checked on one row.
CREATE TABLE ledger_months (
    month     text PRIMARY KEY,                   -- "2006-01"
    micro_usd bigint NOT NULL DEFAULT 0
);

-- Each user's successful reads per month (the plan quota's count).
CREATE TABLE quota_counts (
    user_id text NOT NULL,
    month   text NOT NULL,
    used    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, month)
);

-- The instances of the service, by owner id, and when each last said it
-- was alive: the quota holds of an instance not seen for a while (it
-- crashed) stop counting.
CREATE TABLE money_owners (
    owner      text PRIMARY KEY,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL
);

-- Reads of a quota in flight (reserved, not yet recorded or released), per
-- user, month and instance.
CREATE TABLE quota_holds (
    user_id text NOT NULL,
    month   text NOT NULL,
    owner   text NOT NULL,
    n       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, month, owner)
);

-- Each user's (or anonymous client's) attempts per day: the daily line.
CREATE TABLE attempt_counts (
    user_id text NOT NULL,
    day     text NOT NULL,
    count   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, day)
);
CREATE INDEX attempt_counts_day ON attempt_counts (day);

-- One successful paid read. body is the whole record as JSON
-- (budget.UsageRecord's field names, as the bolt backend stores it); the
-- columns repeat what the operator's queries select on.
CREATE TABLE usage_rows (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL,
    day           text NOT NULL,
    month         text NOT NULL,
    user_id       text NOT NULL,
    key_id        text NOT NULL,
    request_id    text NOT NULL,
    calls         int NOT NULL,
    micro_usd     bigint NOT NULL,
    input_tokens  bigint NOT NULL,
    output_tokens bigint NOT NULL,
    simulated     bool NOT NULL,
    model         text NOT NULL,
    body          bytea NOT NULL
);
CREATE INDEX usage_rows_at ON usage_rows (at);
CREATE INDEX usage_rows_user_month ON usage_rows (user_id, month);

-- bw_lease adds a lease of p_calls calls and p_micro micro-dollars to day
-- p_day and its month only if every ceiling that is on (> 0) still holds
-- after it, and gives back the unused rest of earlier leases (back_*),
-- never below zero. The give-back is applied whether or not the lease fits.
-- It returns whether the lease was taken and the day's totals (with its
-- settled costs alone) and the month's after it. Rows are locked days first, then months, each in order, as
-- every other writer of the ledger does, so that writers never deadlock.
-- Each UPDATE re-reads its row under the lock (READ COMMITTED), so that
-- the test of a ceiling and the addition are one step.
CREATE FUNCTION bw_lease(
    p_day text, p_calls bigint, p_micro bigint,
    max_calls bigint, max_day bigint, max_month bigint,
    back_days text[], back_calls bigint[], back_micro bigint[],
    OUT ok boolean, OUT day_calls bigint, OUT day_micro bigint, OUT day_settled bigint, OUT month_micro bigint)
LANGUAGE plpgsql AS $$
DECLARE
    d text;
    m text;
    lease boolean := p_day <> '' AND (p_calls <> 0 OR p_micro <> 0);
BEGIN
    ok := true;
    FOR d IN SELECT DISTINCT x FROM unnest(back_days || CASE WHEN lease THEN ARRAY[p_day] ELSE ARRAY[]::text[] END) AS x ORDER BY x LOOP
        UPDATE ledger_days SET
            calls = greatest(calls - coalesce((SELECT sum(c) FROM unnest(back_days, back_calls) AS b(bd, c) WHERE bd = d), 0), 0),
            micro_usd = greatest(micro_usd - coalesce((SELECT sum(u) FROM unnest(back_days, back_micro) AS b(bd, u) WHERE bd = d), 0), 0)
        WHERE day = d;
        IF lease AND d = p_day THEN
            -- Created here, in lock order: a new row is locked too.
            INSERT INTO ledger_days (day) VALUES (p_day) ON CONFLICT DO NOTHING;
            UPDATE ledger_days SET calls = calls + p_calls, micro_usd = micro_usd + p_micro
            WHERE day = p_day
              AND (max_calls <= 0 OR calls + p_calls <= max_calls)
              AND (max_day <= 0 OR micro_usd + p_micro <= max_day);
            ok := FOUND;
        END IF;
    END LOOP;
    FOR m IN SELECT DISTINCT left(x, 7) FROM unnest(back_days || CASE WHEN lease THEN ARRAY[p_day] ELSE ARRAY[]::text[] END) AS x ORDER BY 1 LOOP
        UPDATE ledger_months SET
            micro_usd = greatest(micro_usd - coalesce((SELECT sum(u) FROM unnest(back_days, back_micro) AS b(bd, u) WHERE left(bd, 7) = m), 0), 0)
        WHERE month = m;
        IF lease AND ok AND m = left(p_day, 7) THEN
            INSERT INTO ledger_months (month) VALUES (m) ON CONFLICT DO NOTHING;
            UPDATE ledger_months SET micro_usd = micro_usd + p_micro
            WHERE month = m AND (max_month <= 0 OR micro_usd + p_micro <= max_month);
            IF NOT FOUND THEN
                -- The month refuses: take back what the day took (its row
                -- is already ours).
                UPDATE ledger_days SET calls = calls - p_calls, micro_usd = micro_usd - p_micro WHERE day = p_day;
                ok := false;
            END IF;
        END IF;
    END LOOP;
    SELECT coalesce(max(calls), 0), coalesce(max(micro_usd), 0), coalesce(max(settled_micro_usd), 0)
        INTO day_calls, day_micro, day_settled FROM ledger_days WHERE day = p_day;
    SELECT coalesce(max(micro_usd), 0) INTO month_micro FROM ledger_months WHERE month = left(p_day, 7);
END
$$;
