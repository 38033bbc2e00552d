-- Takes of one row made together. When a group transaction carries several
-- takes of one row (one user's attempts on one day under one line, or one
-- user's quota slots in one month under one limit), they are made by one
-- call of these functions instead of one statement each: the row is
-- locked once, and as many are granted as fit under the bound, in the
-- order of the callers. A single take still uses its one statement.

-- bw_take_attempts adds up to p_n attempts to p_user's count of p_day,
-- as many as keep it at or under p_line (every one when p_line <= 0); it
-- returns how many it took and the count after them. The SELECT ... FOR
-- UPDATE runs after the insert in a new snapshot, so it reads the row as
-- the last writer committed it.
CREATE FUNCTION bw_take_attempts(p_user text, p_day text, p_n bigint, p_line bigint, OUT taken bigint, OUT total bigint)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_counts (user_id, day) VALUES (p_user, p_day) ON CONFLICT DO NOTHING;
    SELECT count INTO total FROM attempt_counts WHERE user_id = p_user AND day = p_day FOR UPDATE;
    taken := CASE WHEN p_line <= 0 THEN p_n ELSE least(p_n, greatest(p_line - total, 0)) END;
    IF taken > 0 THEN
        total := total + taken;
        UPDATE attempt_counts SET count = total WHERE user_id = p_user AND day = p_day;
    END IF;
END
$$;

-- bw_take_holds adds up to p_n holds of p_owner to p_user's quota of
-- p_month, as many as keep the recorded reads plus every live instance's
-- holds (p_owner's own, and those seen after p_alive) at or under p_limit;
-- it returns how many it took. The caller has locked the user's
-- quota_counts row earlier in the same transaction (every writer of a
-- user's holds does), and this function's statements take their
-- snapshots after that lock: they see every other instance's committed
-- holds.
CREATE FUNCTION bw_take_holds(p_user text, p_month text, p_owner text, p_n bigint, p_limit bigint, p_alive timestamptz, OUT taken bigint)
LANGUAGE plpgsql AS $$
DECLARE
    room bigint;
BEGIN
    SELECT p_limit - coalesce((SELECT used FROM quota_counts WHERE user_id = p_user AND month = p_month), 0)
         - (SELECT coalesce(sum(x.n), 0) FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
            WHERE x.user_id = p_user AND x.month = p_month AND (x.owner = p_owner OR o.seen_at > p_alive))
      INTO room;
    taken := least(p_n, greatest(room, 0));
    IF taken > 0 THEN
        INSERT INTO quota_holds AS h (user_id, month, owner, n) VALUES (p_user, p_month, p_owner, taken)
        ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + taken;
    END IF;
END
$$;
