-- What the ledger's figures show, and which of its gap is in flight.
--
-- settled_calls: the calls a day really made (settled), beside
-- settled_micro_usd, so that the figures shown (the dashboard, /metrics,
-- the budget command) are the service's calls made, not the ledger's
-- totals, which hold every instance's unused lease. Days before this
-- migration take their usage rows' count (failed calls settled at cost are
-- not among them).
ALTER TABLE ledger_days ADD COLUMN settled_calls bigint NOT NULL DEFAULT 0;
UPDATE ledger_days l SET settled_calls = (SELECT count(*) FROM usage_rows u WHERE u.day = l.day);

-- ledger_rests: per day and instance, what its leases added to the day and
-- has not yet settled or given back (its unused lease and its calls in
-- flight at their worst case). A live instance's rest settles within a
-- call's time; the rest of an instance not seen for HoldTTL (it crashed)
-- never will: it counts as spent, so that a ceiling it holds is reached
-- (budget_paused), not busy. Rows of days before this migration are absent:
-- their rests count as spent.
CREATE TABLE ledger_rests (
    day       text NOT NULL,
    owner     text NOT NULL,
    calls     bigint NOT NULL DEFAULT 0,
    micro_usd bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (day, owner)
);

-- bw_lease as in 0003, and: the lease and the give-back also move p_owner's
-- rest (rows locked after the months, as every writer of the ledger does);
-- it returns the day's settled calls and the rests of instances not seen
-- since p_dead_before (dead), besides the totals. 0003's bw_lease (nine
-- arguments) stays beside it, for instances of the previous version still
-- running during a rolling deploy.
CREATE FUNCTION bw_lease(
    p_day text, p_calls bigint, p_micro bigint,
    max_calls bigint, max_day bigint, max_month bigint,
    back_days text[], back_calls bigint[], back_micro bigint[],
    p_owner text, p_dead_before timestamptz,
    OUT ok boolean, OUT day_calls bigint, OUT day_micro bigint, OUT day_settled bigint, OUT month_micro bigint,
    OUT day_settled_calls bigint, OUT day_dead_micro bigint)
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
                UPDATE ledger_days SET calls = calls - p_calls, micro_usd = micro_usd - p_micro WHERE day = p_day;
                ok := false;
            END IF;
        END IF;
    END LOOP;
    IF p_owner <> '' THEN
        FOR d IN SELECT DISTINCT x FROM unnest(back_days || CASE WHEN lease AND ok THEN ARRAY[p_day] ELSE ARRAY[]::text[] END) AS x ORDER BY x LOOP
            INSERT INTO ledger_rests AS r (day, owner, calls, micro_usd)
            VALUES (d, p_owner,
                CASE WHEN lease AND ok AND d = p_day THEN p_calls ELSE 0 END
                    - coalesce((SELECT sum(c) FROM unnest(back_days, back_calls) AS b(bd, c) WHERE bd = d), 0),
                CASE WHEN lease AND ok AND d = p_day THEN p_micro ELSE 0 END
                    - coalesce((SELECT sum(u) FROM unnest(back_days, back_micro) AS b(bd, u) WHERE bd = d), 0))
            ON CONFLICT (day, owner) DO UPDATE SET
                calls = greatest(r.calls + excluded.calls, 0), micro_usd = greatest(r.micro_usd + excluded.micro_usd, 0);
        END LOOP;
    END IF;
    SELECT coalesce(max(calls), 0), coalesce(max(micro_usd), 0), coalesce(max(settled_micro_usd), 0), coalesce(max(settled_calls), 0)
        INTO day_calls, day_micro, day_settled, day_settled_calls FROM ledger_days WHERE day = p_day;
    SELECT coalesce(max(micro_usd), 0) INTO month_micro FROM ledger_months WHERE month = left(p_day, 7);
    SELECT coalesce(sum(r.micro_usd), 0) INTO day_dead_micro FROM ledger_rests r
        WHERE r.day = p_day AND r.owner <> p_owner AND r.micro_usd > 0
          AND NOT EXISTS (SELECT 1 FROM money_owners o WHERE o.owner = r.owner AND o.seen_at >= p_dead_before);
END
$$;
