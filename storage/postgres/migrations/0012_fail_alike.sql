-- A fail limit's refusal does the work of a failure (issue 38, item 5).
-- The invite check answers a wrong code, a cooldown and the net alike and
-- must take as long for each: a wrong code's attempt is begun and ended
-- as a failure, a refused one is refused by bw_fail_begin and ended on
-- nothing (limiter.FailLimiter.EndRefused: 'release' with p_begun 0).
-- The functions of 0006 did less for a refusal: bw_fail_begin stopped at
-- the first key in a cooldown (at the net, before any key) and wrote no
-- attempt in progress, and bw_fail_finish counted nothing towards the
-- net for a release, so a cooldown was answered about 110µs sooner than a
-- wrong code. They now take one path whatever they decide, the same
-- statements on the same rows, and the decision is in the values they
-- write:
--
-- bw_fail_begin reads every key and rewrites every key's attempts in
-- progress: those that still count, and this one when it is begun (the
-- ones past p_ttl, which count nowhere, are dropped either way); at the
-- net it makes and locks the keys' rows as an attempt does. bw_fail_finish
-- runs one update per key for every outcome, and for a failure or a
-- refused attempt adds to the minute's failures (1, or 0 that no sum
-- feels, making the minute's row if it has none) and reads the net's
-- hour; only a failure can trip the net. The decisions, their order (the
-- net, then the first key in p_keys' order in a cooldown or full) and
-- what the functions return are 0006's. A refusal rewrites rows as they
-- were: an UNLOGGED table's update, a few µs and no WAL, the least that
-- leaves a failure's time no different (TestFailsRefusalDoesTheWorkOfAFailure
-- counts the work, TestInviteRefusalsTakeAlikeOnPostgres times it).

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
    INSERT INTO limit_fails (name, key) SELECT p_name, x FROM unnest(p_keys) AS x ORDER BY x ON CONFLICT DO NOTHING;
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
    INSERT INTO limit_fails (name, key) SELECT p_name, x FROM unnest(p_keys) AS x ORDER BY x ON CONFLICT DO NOTHING;
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
        END IF;
    END LOOP;
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
