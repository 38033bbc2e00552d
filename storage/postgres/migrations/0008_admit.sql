-- The admission of OCR requests in one call: the rate window and burst
-- (layer 1), the daily attempt line (layer 2) and the quota slot (layer
-- 2b) of one user's requests, decided in one statement of the counters
-- lane's group transaction, so that an accepted request makes one round
-- trip before its call, not one for its window and another for its
-- attempt and slot.
--
-- bw_admit decides p_nows' requests of p_user, in their order. For each:
-- the window named p_name (NULL: no rate limit) under p_rate in p_window
-- ns and p_burst a second (bw_window_take: recorded only if admitted);
-- then, unless the window refused it and p_stop_rate (the limit
-- enforces: in shadow mode a refused request goes on), one attempt of
-- p_day under p_line (0: no line; taken only while under it); then,
-- unless the line refused it and p_stop_line, one hold of p_owner on
-- p_month's quota, while the recorded reads plus every live instance's
-- holds (p_owner's own, and those seen after p_alive) stay under p_limit.
-- It returns, per request, the window's wait and reason (0 and '' when
-- admitted), whether its attempt was taken and whether its hold was, and
-- the day's attempts and the month's recorded reads after them all.
--
-- Rows are locked in the order every writer of them keeps: the user's
-- window head, attempts, quota count, then this instance's holds row (the
-- quota count's lock comes before any write of the user's holds, and the
-- holds' sum is read after it, in a statement of its own, so it sees
-- every other instance's committed holds).
CREATE FUNCTION bw_admit(p_name text, p_user text, p_nows bigint[], p_rate integer, p_window bigint, p_burst integer,
    p_stop_rate boolean, p_day text, p_line bigint, p_stop_line boolean, p_month text, p_owner text,
    p_alive timestamptz, p_limit bigint,
    OUT waits bigint[], OUT reasons text[], OUT taken boolean[], OUT held boolean[], OUT attempts bigint, OUT used bigint)
LANGUAGE plpgsql AS $$
DECLARE
    reqs         integer := cardinality(p_nows);
    w            bigint;
    r            text;
    room         bigint;
    ask_attempts bigint := 0; -- requests the window let through
    got_attempts bigint := 0; -- of them, those under the line: the first ones
    ask_slots    bigint := 0; -- requests let through by the window and the line
    got_slots    bigint := 0; -- of them, those the quota holds: the first ones
BEGIN
    -- Layer 1, request by request.
    waits := '{}';
    reasons := '{}';
    FOR i IN 1 .. reqs LOOP
        w := 0;
        r := '';
        IF p_name IS NOT NULL THEN
            SELECT x.wait, x.reason INTO w, r FROM bw_window_take(p_name, p_user, p_nows[i], p_rate, p_window, p_burst) x;
        END IF;
        waits := waits || w;
        reasons := reasons || r;
        IF NOT (w > 0 AND p_stop_rate) THEN
            ask_attempts := ask_attempts + 1;
        END IF;
    END LOOP;

    -- Layer 2: the attempts the window let through, in order, while
    -- under the line. One of them (the common case) is one conditional
    -- upsert, which locks the row whether it counts or not; none (the
    -- window refused them all) only reads the count.
    IF ask_attempts = 0 THEN
        SELECT coalesce(max(a.count), 0) INTO attempts FROM attempt_counts a WHERE a.user_id = p_user AND a.day = p_day;
    ELSIF ask_attempts = 1 THEN
        INSERT INTO attempt_counts AS a (user_id, day, count) VALUES (p_user, p_day, 1)
            ON CONFLICT (user_id, day) DO UPDATE SET count = a.count + 1 WHERE p_line <= 0 OR a.count < p_line
            RETURNING a.count INTO attempts;
        IF FOUND THEN
            got_attempts := 1;
        ELSE
            attempts := p_line;
        END IF;
    ELSE
        INSERT INTO attempt_counts (user_id, day) VALUES (p_user, p_day) ON CONFLICT DO NOTHING;
        SELECT a.count INTO attempts FROM attempt_counts a WHERE a.user_id = p_user AND a.day = p_day FOR UPDATE;
        got_attempts := CASE WHEN p_line <= 0 THEN ask_attempts ELSE least(ask_attempts, greatest(p_line - attempts, 0)) END;
        IF got_attempts > 0 THEN
            attempts := attempts + got_attempts;
            UPDATE attempt_counts SET count = attempts WHERE user_id = p_user AND day = p_day;
        END IF;
    END IF;
    taken := '{}';
    FOR i IN 1 .. reqs LOOP
        IF waits[i] > 0 AND p_stop_rate THEN
            taken := taken || false;
        ELSE
            taken := taken || (got_attempts > 0);
            got_attempts := greatest(got_attempts - 1, 0);
        END IF;
        IF NOT ((waits[i] > 0 AND p_stop_rate) OR (NOT taken[i] AND p_stop_line)) THEN
            ask_slots := ask_slots + 1;
        END IF;
    END LOOP;

    -- Layer 2b: lock the user's quota count (no new row version when it
    -- exists), then, in statements of their own (snapshots taken after
    -- the lock), take the slots that fit; with none asked for, only read
    -- the count.
    IF ask_slots = 0 THEN
        SELECT coalesce(max(q.used), 0) INTO used FROM quota_counts q WHERE q.user_id = p_user AND q.month = p_month;
    ELSE
        SELECT q.used INTO used FROM quota_counts q WHERE q.user_id = p_user AND q.month = p_month FOR UPDATE;
    END IF;
    IF ask_slots > 0 AND NOT FOUND THEN
        INSERT INTO quota_counts AS q (user_id, month) VALUES (p_user, p_month)
            ON CONFLICT (user_id, month) DO UPDATE SET used = q.used RETURNING q.used INTO used;
    END IF;
    IF ask_slots = 1 THEN
        INSERT INTO quota_holds AS h (user_id, month, owner, n)
            SELECT p_user, p_month, p_owner, 1
            WHERE used + (SELECT coalesce(sum(x.n), 0) FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
                          WHERE x.user_id = p_user AND x.month = p_month AND (x.owner = p_owner OR o.seen_at > p_alive)) < p_limit
            ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + 1;
        got_slots := CASE WHEN FOUND THEN 1 ELSE 0 END;
    ELSIF ask_slots > 1 THEN
        SELECT p_limit - used - coalesce(sum(x.n), 0) INTO room FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
            WHERE x.user_id = p_user AND x.month = p_month AND (x.owner = p_owner OR o.seen_at > p_alive);
        got_slots := least(ask_slots, greatest(room, 0));
        IF got_slots > 0 THEN
            INSERT INTO quota_holds AS h (user_id, month, owner, n) VALUES (p_user, p_month, p_owner, got_slots)
                ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + got_slots;
        END IF;
    END IF;
    held := '{}';
    FOR i IN 1 .. reqs LOOP
        IF (waits[i] > 0 AND p_stop_rate) OR (NOT taken[i] AND p_stop_line) OR got_slots <= 0 THEN
            held := held || false;
        ELSE
            held := held || true;
            got_slots := got_slots - 1;
        END IF;
    END LOOP;
END
$$;
