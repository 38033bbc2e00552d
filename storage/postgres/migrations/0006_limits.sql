-- The defense layers' limits, shared by every instance: the rate windows
-- and bursts (the users' [limits.user], the invite IP limit, each guarded
-- route's limits), a guarded route's daily line, and the fail limits with
-- their cooldowns (invites and guarded routes). Each decision is one call of a function below, under
-- the lock of the rows it reads, with the semantics of package limiter's
-- memory (limiter/window.go, limiter/fail.go). Keys are what the memory
-- layers key by: a user id, "ip:" and the client key (an IPv6 address by
-- its /64), "email:" and the e-mail of an invite attempt, a route's
-- "json:FIELD:value".
--
-- The tables are UNLOGGED: their rows are not written to the WAL, so a
-- decision waits for no disk flush (a transaction that writes only these
-- tables commits without one whatever synchronous_commit says, and folded
-- into a money transaction it adds nothing to the money's flush), and a
-- flood of refusals and attempts costs no WAL. The price: after a crash of
-- PostgreSQL (not a clean restart) or a failover to a standby they start
-- empty, which lifts every cooldown and empties every window once. These
-- are defense layers, not money: the money path's tables stay logged and
-- commit with synchronous_commit on. A restart of an instance changes
-- nothing here.
--
-- Times are Unix nanoseconds (bigint), exact: the memory limiter stores
-- them to the microsecond, rounded up, so the database may free a slot up
-- to 1µs earlier than memory would; never a request more.

-- A key's sliding log: its most recent admitted requests, at most cap =
-- max(rate, burst) of them (rate when set), so that a decision reads and
-- writes a fixed number of rows whatever the rate. Its head holds the
-- newest time (a key with one request, as most of a flood's, has only
-- its head) and seq, the times recorded since its ring was built; the
-- older ones are in a ring of slots, one row each: the k-th newest time
-- (2 <= k <= least(seq, cap)) is in slot (seq - k) mod cap. A decision
-- locks the key's head, reads at most two times (the rate-th and the
-- burst-th newest) and, when it admits, writes one slot (the newest moves
-- to slot (seq - 1) mod cap, over one no longer read) and the head. An
-- admission under another cap (a reload changed the rate or the burst)
-- first rebuilds the key's ring from its times, once. Times only grow
-- from oldest to newest. Slots other than those of the k above are never
-- read (one is the (cap + 1)-th newest, others are left from an earlier
-- ring of the key); the periodic prune deletes the heads whose newest no
-- longer counts and the slots whose time no longer counts, so a key holds
-- the times of its last window (and a minute), not the last rate of them.
CREATE UNLOGGED TABLE limit_window_heads (
    name   text NOT NULL,       -- the limit: "user", "invites", "route:NAME"
    key    text NOT NULL,
    seq    bigint NOT NULL,     -- times recorded since the ring was built
    cap    integer NOT NULL,    -- the ring's slots
    newest bigint NOT NULL,     -- the newest recorded time
    PRIMARY KEY (name, key)
);
CREATE UNLOGGED TABLE limit_window_slots (
    name text NOT NULL,
    key  text NOT NULL,
    slot integer NOT NULL,      -- 0 <= slot < cap
    t    bigint NOT NULL,
    PRIMARY KEY (name, key, slot)
);

-- A key's run of failures, its attempts in progress (their start times:
-- an instance that crashes in the middle of an attempt leaves one, which
-- stops counting after the ttl bw_fail_begin is given) and its latest
-- cooldown, kept after it ends for the backoff.
CREATE UNLOGGED TABLE limit_fails (
    name        text NOT NULL,
    key         text NOT NULL,
    fails       integer NOT NULL DEFAULT 0,
    last        bigint NOT NULL DEFAULT 0,      -- the last evaluated attempt
    pending     bigint[] NOT NULL DEFAULT '{}',
    cool_until  bigint NOT NULL DEFAULT 0,      -- 0: never cooled down
    cool_length bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (name, key)
);

-- Failures over every key of a fail limit, per minute since the Unix
-- epoch (the service-wide net), and when the net last tripped (its alert
-- is raised at most once an hour, by one instance).
CREATE UNLOGGED TABLE limit_fail_minutes (
    name   text NOT NULL,
    minute bigint NOT NULL,
    n      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (name, minute)
);
CREATE UNLOGGED TABLE limit_fail_trips (
    name text PRIMARY KEY,
    at   bigint NOT NULL
);

-- A guarded route's daily line: each key's attempts per day (the route's
-- time zone's "2006-01-02"), counted by one conditional upsert.
CREATE UNLOGGED TABLE limit_days (
    name text NOT NULL,
    key  text NOT NULL,
    day  text NOT NULL,
    n    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (name, key, day)
);

-- bw_window_take decides one request of p_key at p_now against a rate
-- (p_rate requests in any p_window ns; 0: off) and a burst (p_burst in any
-- second; 0: off), and records it when admitted, no earlier than the
-- newest recorded (a clock that went back admits nothing extra). It
-- returns 0 and '' when admitted, else how long until the request would
-- be, and the limit that frees last ('rate' or 'burst'). A new key is
-- admitted at once.
CREATE FUNCTION bw_window_take(p_name text, p_key text, p_now bigint, p_rate integer, p_window bigint, p_burst integer,
    OUT wait bigint, OUT reason text) LANGUAGE plpgsql AS $$
DECLARE
    n_cap integer := CASE WHEN p_rate > 0 THEN p_rate ELSE p_burst END;
    h     limit_window_heads;
    x     bigint;             -- a recorded time
BEGIN
    wait := 0;
    reason := '';
    IF n_cap <= 0 THEN
        RETURN;
    END IF;
    LOOP -- the head, or a new one; again if another call made it meanwhile
        SELECT * INTO h FROM limit_window_heads WHERE name = p_name AND key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO limit_window_heads (name, key, seq, cap, newest) VALUES (p_name, p_key, 1, n_cap, p_now)
            ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    IF p_rate > 0 AND p_rate <= least(h.seq, h.cap) THEN
        x := bw_window_nth(h, p_rate);
        IF x + p_window - p_now > 0 THEN
            wait := x + p_window - p_now;
            reason := 'rate';
        END IF;
    END IF;
    IF p_burst > 0 AND p_burst <= least(h.seq, h.cap) THEN
        IF p_burst <> p_rate THEN -- else x is that time already
            x := bw_window_nth(h, p_burst);
        END IF;
        IF x + 1000000000 - p_now > wait THEN
            wait := x + 1000000000 - p_now;
            reason := 'burst';
        END IF;
    END IF;
    IF wait > 0 THEN
        RETURN;
    END IF;
    IF h.cap <> n_cap THEN
        h.seq := bw_window_rebuild(h, n_cap);
    END IF;
    IF n_cap > 1 AND h.seq > 0 THEN
        INSERT INTO limit_window_slots (name, key, slot, t) VALUES (p_name, p_key, (h.seq - 1) % n_cap, h.newest)
            ON CONFLICT (name, key, slot) DO UPDATE SET t = excluded.t;
    END IF;
    UPDATE limit_window_heads SET seq = h.seq + 1, cap = n_cap, newest = greatest(p_now, h.newest)
        WHERE name = p_name AND key = p_key;
END
$$;

-- bw_window_nth is the k-th newest time of head h's log, 1 <= k <=
-- least(h.seq, h.cap); NULL when the prune deleted it.
CREATE FUNCTION bw_window_nth(h limit_window_heads, k integer) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    x bigint;
BEGIN
    IF k = 1 THEN
        RETURN h.newest;
    END IF;
    SELECT s.t INTO x FROM limit_window_slots s WHERE s.name = h.name AND s.key = h.key AND s.slot = (h.seq - k) % h.cap;
    RETURN x;
END
$$;

-- bw_window_rebuild lays the log of head h out again for a ring of p_cap
-- slots, before a request is recorded in it: it keeps the newest p_cap - 1
-- times (the newest stays in the head, the others go to slots 0 and up,
-- oldest first) and returns their number, the head's new seq. The caller
-- holds h's lock.
CREATE FUNCTION bw_window_rebuild(h limit_window_heads, p_cap integer) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    ts bigint[];
    m  integer;
BEGIN
    -- Times grow with seq, so the newest are the greatest (equal times
    -- are interchangeable).
    SELECT array_agg(k.t ORDER BY k.t DESC) INTO ts FROM (
        SELECT s.t FROM generate_series(2, least(h.seq, h.cap)) AS n
        JOIN limit_window_slots s ON s.name = h.name AND s.key = h.key AND s.slot = (h.seq - n) % h.cap
        ORDER BY s.t DESC LIMIT greatest(p_cap - 2, 0)) k;
    ts := (h.newest || coalesce(ts, '{}'))[1 : p_cap - 1];
    DELETE FROM limit_window_slots WHERE name = h.name AND key = h.key;
    m := cardinality(ts);
    INSERT INTO limit_window_slots (name, key, slot, t)
        SELECT h.name, h.key, m - i, ts[i] FROM generate_series(2, m) AS i;
    RETURN m;
END
$$;

-- bw_fail_run is a key's failures that still count at p_now: none once
-- p_window ns have passed since its last evaluated attempt.
CREATE FUNCTION bw_fail_run(r limit_fails, p_now bigint, p_window bigint) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN r.fails > 0 AND p_now - r.last > p_window THEN 0 ELSE r.fails END
$$;

-- bw_fail_begin starts an attempt on every key of p_keys at p_now, or
-- refuses it and records nothing: 'global' (60s) when the failures of the
-- last hour (minutes p_minute-59 to p_minute) reach p_global (0: off),
-- else the first key in p_keys' order in a cooldown ('cooldown', until its
-- end) or whose run plus attempts in progress reach p_limit ('in_flight',
-- 1s). An attempt in progress started before p_now - p_ttl no longer
-- counts. Rows are locked in key order, so that attempts on overlapping
-- keys cannot deadlock.
CREATE FUNCTION bw_fail_begin(p_name text, p_keys text[], p_now bigint, p_minute bigint, p_limit integer, p_window bigint,
    p_global bigint, p_ttl bigint, OUT wait bigint, OUT reason text) LANGUAGE plpgsql AS $$
DECLARE
    r limit_fails;
    k text;
    pend integer;
BEGIN
    wait := 0;
    reason := '';
    IF p_global > 0 AND (SELECT coalesce(sum(n), 0) FROM limit_fail_minutes
            WHERE name = p_name AND minute > p_minute - 60 AND minute <= p_minute) >= p_global THEN
        wait := 60000000000;
        reason := 'global';
        RETURN;
    END IF;
    INSERT INTO limit_fails (name, key) SELECT p_name, x FROM unnest(p_keys) AS x ORDER BY x ON CONFLICT DO NOTHING;
    PERFORM 1 FROM limit_fails WHERE name = p_name AND key = ANY (p_keys) ORDER BY key FOR UPDATE;
    FOREACH k IN ARRAY p_keys LOOP
        SELECT * INTO r FROM limit_fails WHERE name = p_name AND key = k;
        IF p_now < r.cool_until THEN
            wait := r.cool_until - p_now;
            reason := 'cooldown';
            RETURN;
        END IF;
        SELECT count(*) INTO pend FROM unnest(r.pending) AS b WHERE b > p_now - p_ttl;
        IF bw_fail_run(r, p_now, p_window) + pend >= p_limit OR pend >= 65535 THEN
            wait := 1000000000;
            reason := 'in_flight';
            RETURN;
        END IF;
    END LOOP;
    UPDATE limit_fails SET pending = array(SELECT b FROM unnest(pending) AS b WHERE b > p_now - p_ttl) || p_now
        WHERE name = p_name AND key = ANY (p_keys);
END
$$;

-- bw_fail_finish ends an attempt begun at p_begun with its outcome at
-- p_now: 'fail' extends each key's run and starts a cooldown where it
-- reaches p_limit (doubled, with p_backoff, when the key's previous one
-- ended within p_memory ns, up to p_max_cooldown), and counts one failure
-- towards the net; 'succeed' resets each run (p_decay: takes one off);
-- 'release' (neutral, cancelled) only ends the attempt. It returns the keys
-- whose cooldown this failure started, and whether it tripped the net (at
-- most once an hour).
CREATE FUNCTION bw_fail_finish(p_name text, p_keys text[], p_outcome text, p_begun bigint, p_now bigint, p_minute bigint,
    p_limit integer, p_window bigint, p_cooldown bigint, p_backoff boolean, p_max_cooldown bigint, p_memory bigint,
    p_decay boolean, p_global bigint, OUT started text[], OUT tripped boolean) LANGUAGE plpgsql AS $$
DECLARE
    r limit_fails;
    k text;
    i integer;
    run integer;
    len bigint;
BEGIN
    started := '{}';
    tripped := false;
    INSERT INTO limit_fails (name, key) SELECT p_name, x FROM unnest(p_keys) AS x ORDER BY x ON CONFLICT DO NOTHING;
    PERFORM 1 FROM limit_fails WHERE name = p_name AND key = ANY (p_keys) ORDER BY key FOR UPDATE;
    FOREACH k IN ARRAY p_keys LOOP
        SELECT * INTO r FROM limit_fails WHERE name = p_name AND key = k;
        i := array_position(r.pending, p_begun);
        IF i IS NOT NULL THEN
            r.pending := r.pending[:i - 1] || r.pending[i + 1:];
        END IF;
        run := bw_fail_run(r, p_now, p_window);
        IF p_outcome = 'fail' THEN
            r.fails := run + 1;
            r.last := p_now;
            IF r.fails >= p_limit THEN
                len := p_cooldown;
                IF p_backoff AND r.cool_length > 0 AND p_now - r.cool_until < p_memory THEN
                    len := least(2 * r.cool_length, p_max_cooldown);
                END IF;
                r.cool_until := p_now + len;
                r.cool_length := len;
                r.fails := 0;
                started := started || k;
            END IF;
        ELSIF p_outcome = 'succeed' THEN
            r.fails := CASE WHEN p_decay THEN greatest(run - 1, 0) ELSE 0 END;
            r.last := p_now;
        END IF;
        UPDATE limit_fails SET fails = r.fails, last = r.last, pending = r.pending, cool_until = r.cool_until,
            cool_length = r.cool_length WHERE name = p_name AND key = k;
    END LOOP;
    IF p_outcome <> 'fail' THEN
        RETURN;
    END IF;
    INSERT INTO limit_fail_minutes AS m (name, minute, n) VALUES (p_name, p_minute, 1)
        ON CONFLICT (name, minute) DO UPDATE SET n = m.n + 1;
    IF p_global > 0 AND (SELECT coalesce(sum(n), 0) FROM limit_fail_minutes
            WHERE name = p_name AND minute > p_minute - 60 AND minute <= p_minute) >= p_global THEN
        INSERT INTO limit_fail_trips AS t (name, at) VALUES (p_name, p_now)
            ON CONFLICT (name) DO UPDATE SET at = p_now WHERE p_now - t.at >= 3600000000000;
        tripped := FOUND;
    END IF;
END
$$;
