-- What each bolt database brought to the shared figures (issue 40, item 0).
-- `breakwater migrate --from OLD.db` once skipped a ledger day or a quota
-- count the database already held, so a bolt server's spend on a day an
-- instance had already served was dropped. An import now adds what the
-- source holds beyond what that same source added before: its identity
-- (the bolt file's database_id, which a copy of the file keeps) and the
-- figures it brought are recorded here in the transaction that adds them,
-- so a rerun adds nothing and a file that served more since adds the rest.

CREATE TABLE imported_days (
    source            text NOT NULL,              -- the bolt file's database_id
    day               text NOT NULL,
    calls             bigint NOT NULL,
    micro_usd         bigint NOT NULL,
    settled_micro_usd bigint NOT NULL,
    PRIMARY KEY (source, day)
);

CREATE TABLE imported_quotas (
    source  text NOT NULL,
    month   text NOT NULL,
    user_id text NOT NULL,
    used    bigint NOT NULL,
    PRIMARY KEY (source, month, user_id)
);
