-- Cooldowns survive a failover (issue 40, item 2). The fail limits' state
-- is in UNLOGGED tables (0006), which a standby never receives: after a
-- failover, or a crash of PostgreSQL, they start empty. For a rate window,
-- a run of failures, the net's hour or a route's daily line that costs one
-- window's worth at most (a key may use it once more). A cooldown is
-- longer than the failures that earned it and is a security decision
-- (an invite guesser, a route's fail limit): losing it would reopen the
-- door for the rest of it, and losing its length would reset the backoff.
-- So each cooldown, when it starts, is also written to a logged table,
-- limit_fail_cooldowns, one row per key: written rarely (once per
-- cooldown), read only when a key's row in limit_fails is made (a key
-- seen for the first time, or again after a failover or a prune), which
-- then starts with the cooldown and its length the logged row holds.
-- Decisions still read limit_fails alone: an attempt on a key already
-- seen does exactly what it did before (TestFailsRefusalDoesTheWorkOfAFailure).
--
-- The transaction that starts a cooldown commits without waiting for the
-- disk or a standby (synchronous_commit off for it alone): the failure
-- that starts a cooldown is answered as fast as any other, so that its
-- time does not tell a guesser that the cooldown began (a wait for a
-- flush or a synchronous standby would). PostgreSQL writes and streams it
-- within a fraction of a second; a crash of the primary in that fraction
-- loses that cooldown, as 0006 lost them all.

CREATE TABLE limit_fail_cooldowns (
    name        text NOT NULL,
    key         text NOT NULL,
    cool_until  bigint NOT NULL,    -- Unix ns
    cool_length bigint NOT NULL,    -- ns, for the backoff
    PRIMARY KEY (name, key)
);

-- The cooldowns in force (or remembered by the backoff) at the upgrade.
INSERT INTO limit_fail_cooldowns (name, key, cool_until, cool_length)
    SELECT name, key, cool_until, cool_length FROM limit_fails WHERE cool_length > 0;

-- bw_fail_rows makes the rows of p_keys in limit_fails that do not exist
-- yet, each with the cooldown its logged row holds, if any. Called before
-- the rows are locked, in bw_fail_begin and bw_fail_finish.
CREATE FUNCTION bw_fail_rows(p_name text, p_keys text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    made text[];
BEGIN
    WITH m AS (INSERT INTO limit_fails (name, key) SELECT p_name, x FROM unnest(p_keys) AS x ORDER BY x
            ON CONFLICT DO NOTHING RETURNING key)
        SELECT array_agg(key) INTO made FROM m;
    IF made IS NOT NULL THEN
        UPDATE limit_fails f SET cool_until = c.cool_until, cool_length = c.cool_length FROM limit_fail_cooldowns c
            WHERE f.name = p_name AND f.key = ANY (made) AND c.name = f.name AND c.key = f.key;
    END IF;
END
$$;

-- 0012's bw_fail_begin, its rows made by bw_fail_rows.
CREATE OR REPLACE FUNCTION bw_fail_begin(p_name text, p_keys text[], p_now bigint, p_minute bigint, p_limit integer,
    p_window bigint, p_global bigint, p_ttl bigint, OUT wait bigint, OUT reason text) LANGUAGE plpgsql AS $$
DECLARE
    r limit_fails;
    k text;
    pend integer;
    run integer;
BEGIN
    wait := 0;
    reason := '';
    IF p_global > 0 AND (SELECT coalesce(sum(n), 0) FROM limit_fail_minutes
            WHERE name = p_name AND minute > p_minute - 60 AND minute <= p_minute) >= p_global THEN
        wait := 60000000000;
        reason := 'global';
    END IF;
    PERFORM bw_fail_rows(p_name, p_keys);
    PERFORM 1 FROM limit_fails WHERE name = p_name AND key = ANY (p_keys) ORDER BY key FOR UPDATE;
    FOREACH k IN ARRAY p_keys LOOP -- every key is read, also after a refusal
        SELECT * INTO r FROM limit_fails WHERE name = p_name AND key = k;
        SELECT count(*), bw_fail_run(r, p_now, p_window) INTO pend, run FROM unnest(r.pending) AS b WHERE b > p_now - p_ttl;
        IF reason = '' AND p_now < r.cool_until THEN
            wait := r.cool_until - p_now;
            reason := 'cooldown';
        ELSIF reason = '' AND (run + pend >= p_limit OR pend >= 65535) THEN
            wait := 1000000000;
            reason := 'in_flight';
        END IF;
    END LOOP;
    UPDATE limit_fails SET pending = array(SELECT b FROM unnest(pending) AS b WHERE b > p_now - p_ttl)
            || CASE WHEN reason = '' THEN ARRAY[p_now] ELSE '{}'::bigint[] END
        WHERE name = p_name AND key = ANY (p_keys);
END
$$;

-- 0012's bw_fail_finish, its rows made by bw_fail_rows, and each cooldown
-- it starts also written to limit_fail_cooldowns.
CREATE OR REPLACE FUNCTION bw_fail_finish(p_name text, p_keys text[], p_outcome text, p_begun bigint, p_now bigint,
    p_minute bigint, p_limit integer, p_window bigint, p_cooldown bigint, p_backoff boolean, p_max_cooldown bigint,
    p_memory bigint, p_decay boolean, p_global bigint, OUT started text[], OUT tripped boolean) LANGUAGE plpgsql AS $$
DECLARE
    r limit_fails;
    k text;
    i integer;
    run integer;
    len bigint;
    cooling boolean;
    refused boolean := p_outcome = 'release' AND p_begun = 0; -- EndRefused's: the work of a failure
    counted integer := CASE WHEN p_outcome = 'fail' THEN 1 ELSE 0 END;
BEGIN
    started := '{}';
    tripped := false;
    PERFORM bw_fail_rows(p_name, p_keys);
    PERFORM 1 FROM limit_fails WHERE name = p_name AND key = ANY (p_keys) ORDER BY key FOR UPDATE;
    FOREACH k IN ARRAY p_keys LOOP -- one path for every outcome, decided in the values written
        SELECT * INTO r FROM limit_fails WHERE name = p_name AND key = k;
        i := coalesce(array_position(r.pending, p_begun), 0); -- 0: none, and the slices keep them all
        run := bw_fail_run(r, p_now, p_window);
        len := CASE WHEN p_backoff AND r.cool_length > 0 AND p_now - r.cool_until < p_memory
            THEN least(2 * r.cool_length, p_max_cooldown) ELSE p_cooldown END;
        cooling := counted = 1 AND run + 1 >= p_limit;
        UPDATE limit_fails SET
            fails = CASE WHEN cooling THEN 0 WHEN counted = 1 THEN run + 1
                WHEN p_outcome <> 'succeed' THEN r.fails WHEN p_decay THEN greatest(run - 1, 0) ELSE 0 END,
            last = CASE WHEN counted = 1 OR p_outcome = 'succeed' THEN p_now ELSE r.last END,
            pending = r.pending[:i - 1] || r.pending[i + 1:],
            cool_until = CASE WHEN cooling THEN p_now + len ELSE r.cool_until END,
            cool_length = CASE WHEN cooling THEN len ELSE r.cool_length END
            WHERE name = p_name AND key = k;
        IF cooling THEN
            started := started || k;
            INSERT INTO limit_fail_cooldowns AS c (name, key, cool_until, cool_length) VALUES (p_name, k, p_now + len, len)
                ON CONFLICT (name, key) DO UPDATE SET cool_until = excluded.cool_until, cool_length = excluded.cool_length;
        END IF;
    END LOOP;
    IF cardinality(started) > 0 THEN
        -- For this transaction only: a limits transaction of its own
        -- (Limits.run), never a money one.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF counted = 0 AND NOT refused THEN
        RETURN;
    END IF;
    INSERT INTO limit_fail_minutes AS m (name, minute, n) VALUES (p_name, p_minute, counted)
        ON CONFLICT (name, minute) DO UPDATE SET n = m.n + counted;
    IF p_global > 0 AND (SELECT coalesce(sum(n), 0) FROM limit_fail_minutes
            WHERE name = p_name AND minute > p_minute - 60 AND minute <= p_minute) >= p_global AND counted > 0 THEN
        INSERT INTO limit_fail_trips AS t (name, at) VALUES (p_name, p_now)
            ON CONFLICT (name) DO UPDATE SET at = p_now WHERE p_now - t.at >= 3600000000000;
        tripped := FOUND;
    END IF;
END
$$;
