-- money_groups: per instance and lane of its money path (see money.go), the
-- token of the last group transaction that committed there. A group writes
-- its token first; when its connection fails after the commit was sent,
-- the instance ends the session that ran it and reads the token back: its
-- own means the group committed, and its writes must not be undone nor
-- sent again. Each row is written by one instance's one lane, one group at
-- a time: it is never waited on.
CREATE TABLE money_groups (
    owner text NOT NULL,
    lane  integer NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (owner, lane)
);
