-- Every record but the money path (usage rows, the ledger, quota counts
-- and attempts are in the odd-numbered migrations). Times are timestamptz
-- (microseconds); a zero Go time is NULL.

-- Users and their API keys (keys.KeyStore). Only the SHA-256 of a key's
-- secret is kept.
CREATE TABLE users (
    id         text PRIMARY KEY,
    plan       text NOT NULL DEFAULT '',
    banned     boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL
);
CREATE TABLE api_keys (
    id         text PRIMARY KEY,
    hash       bytea NOT NULL UNIQUE,
    user_id    text NOT NULL,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX api_keys_user ON api_keys (user_id);

-- Invite codes, by the keyed hash of the code, and one row per e-mail that
-- redeemed one: the primary key is what makes a redemption one per e-mail
-- across instances.
CREATE TABLE invites (
    hash       bytea PRIMARY KEY,
    id         text NOT NULL UNIQUE,
    max_uses   integer NOT NULL,
    note       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    revoked_at timestamptz,
    used       integer NOT NULL DEFAULT 0
);
CREATE TABLE invite_redemptions (
    hash  bytea NOT NULL,
    email text NOT NULL,
    at    timestamptz NOT NULL,
    PRIMARY KEY (hash, email)
);

-- Marks that must hold for every instance, such as the mark of the server
-- secret the invites are keyed with (RekeyInvites).
CREATE TABLE meta (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);

-- Answers kept for idempotency keys (replayed byte for byte) and for
-- recent reads of the same image (the dedupe window), per user; and the
-- claims of idempotency keys whose read is in flight on some instance.
CREATE TABLE idempotency_answers (
    user_id     text NOT NULL,
    key         text NOT NULL,
    at          timestamptz NOT NULL,
    fingerprint bytea NOT NULL,
    status      integer NOT NULL,
    body        bytea,
    PRIMARY KEY (user_id, key)
);
CREATE INDEX idempotency_answers_at ON idempotency_answers (at);
CREATE TABLE recent_reads (
    user_id     text NOT NULL,
    fingerprint bytea NOT NULL,
    at          timestamptz NOT NULL,
    serials     text[] NOT NULL DEFAULT '{}',
    rejected    text[] NOT NULL DEFAULT '{}',
    simulated   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (user_id, fingerprint)
);
CREATE INDEX recent_reads_at ON recent_reads (at);
CREATE TABLE answer_claims (
    user_id    text NOT NULL,
    key        text NOT NULL,
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, key)
);

-- Statistics events (detect.Event), written in batches apart from billing;
-- read by time, equal times in the order written (id).
CREATE TABLE events (
    id             bigserial PRIMARY KEY,
    at             timestamptz NOT NULL,
    user_id        text NOT NULL DEFAULT '',
    key_id         text NOT NULL DEFAULT '',
    plan           text NOT NULL DEFAULT '',
    ip             text NOT NULL DEFAULT '',
    route          text NOT NULL DEFAULT '',
    layer          text NOT NULL DEFAULT '',
    outcome        text NOT NULL DEFAULT '',
    status         integer NOT NULL DEFAULT 0,
    bytes          bigint NOT NULL DEFAULT 0,
    latency_ms     bigint NOT NULL DEFAULT 0,
    prompt_tokens  integer NOT NULL DEFAULT 0,
    output_tokens  integer NOT NULL DEFAULT 0,
    cost_micro_usd bigint NOT NULL DEFAULT 0,
    count          bigint NOT NULL DEFAULT 0
);
CREATE INDEX events_at ON events (at, id);

-- Detection (layer 4): a day's aggregate, its findings in the order
-- stored, the record of its run, the runs that started and never
-- finished; and when each alert kind was last sent. JSON as the records
-- encode themselves.
CREATE TABLE day_stats (
    day   text PRIMARY KEY,
    stats jsonb NOT NULL
);
CREATE TABLE findings (
    day     text NOT NULL,
    seq     integer NOT NULL,
    finding jsonb NOT NULL,
    PRIMARY KEY (day, seq)
);
CREATE TABLE detect_runs (
    day text PRIMARY KEY,
    run jsonb NOT NULL
);
CREATE TABLE detect_unfinished (
    day  text PRIMARY KEY,
    runs integer NOT NULL
);
CREATE TABLE alert_states (
    kind  text PRIMARY KEY,
    state jsonb NOT NULL
);

-- The write-behind of the layers' memory (limiter windows, counters,
-- cooldowns): opaque values by state name and key.
CREATE TABLE layer_state (
    name  text NOT NULL,
    key   bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (name, key)
);
