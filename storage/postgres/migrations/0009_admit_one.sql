-- bw_admit_one is bw_admit (0008) of one request, the common case: most
-- admissions are alone in their call (one user's single request in a
-- group). It makes the same decisions, locking the same rows in the same
-- order (window head, attempts, quota count, this instance's holds) with
-- the same statements, without bw_admit's arrays and loops, and calls
-- bw_window_take as an expression (plpgsql evaluates it without a
-- statement of its own): a plpgsql function's own steps cost about as
-- much as the rows it writes, and this is about a fifth cheaper for
-- PostgreSQL than bw_admit of one request.
CREATE FUNCTION bw_admit_one(p_name text, p_user text, p_now bigint, p_rate integer, p_window bigint, p_burst integer,
    p_stop_rate boolean, p_day text, p_line bigint, p_stop_line boolean, p_month text, p_owner text,
    p_alive timestamptz, p_limit bigint,
    OUT wait bigint, OUT reason text, OUT taken boolean, OUT held boolean, OUT attempts bigint, OUT used bigint)
LANGUAGE plpgsql AS $$
DECLARE
    wt record;
BEGIN
    wait := 0;
    reason := '';
    taken := false;
    held := false;
    IF p_name IS NOT NULL THEN
        wt := bw_window_take(p_name, p_user, p_now, p_rate, p_window, p_burst);
        wait := wt.wait;
        reason := wt.reason;
    END IF;
    IF wait > 0 AND p_stop_rate THEN
        SELECT coalesce(max(a.count), 0) INTO attempts FROM attempt_counts a WHERE a.user_id = p_user AND a.day = p_day;
        SELECT coalesce(max(q.used), 0) INTO used FROM quota_counts q WHERE q.user_id = p_user AND q.month = p_month;
        RETURN;
    END IF;
    INSERT INTO attempt_counts AS a (user_id, day, count) VALUES (p_user, p_day, 1)
        ON CONFLICT (user_id, day) DO UPDATE SET count = a.count + 1 WHERE p_line <= 0 OR a.count < p_line
        RETURNING a.count INTO attempts;
    taken := FOUND;
    IF NOT taken THEN
        attempts := p_line;
        IF p_stop_line THEN
            SELECT coalesce(max(q.used), 0) INTO used FROM quota_counts q WHERE q.user_id = p_user AND q.month = p_month;
            RETURN;
        END IF;
    END IF;
    SELECT q.used INTO used FROM quota_counts q WHERE q.user_id = p_user AND q.month = p_month FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO quota_counts AS q (user_id, month) VALUES (p_user, p_month)
            ON CONFLICT (user_id, month) DO UPDATE SET used = q.used RETURNING q.used INTO used;
    END IF;
    INSERT INTO quota_holds AS h (user_id, month, owner, n)
        SELECT p_user, p_month, p_owner, 1
        WHERE used + (SELECT coalesce(sum(x.n), 0) FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
                      WHERE x.user_id = p_user AND x.month = p_month AND (x.owner = p_owner OR o.seen_at > p_alive)) < p_limit
        ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + 1;
    held := FOUND;
END
$$;
