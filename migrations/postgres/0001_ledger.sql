-- opmark ledger on PostgreSQL, schema version 1: the same tables as the SQLite ledger's
-- schema version 2 (src/ledger/schema.rs), in PostgreSQL types. Applied by
-- src/ledger/postgres.rs under an advisory lock, recorded in opmark_schema. Once shipped
-- this file is never edited: changes are new files 0002_*.sql, ...

-- Events: the source of truth, hash-chained. `payload` is the exact JSON text the hash
-- covers (TEXT, not JSONB, which would normalise it).
CREATE TABLE events (
    seq        BIGINT PRIMARY KEY,
    op_id      TEXT NOT NULL,
    host       TEXT NOT NULL,
    at         TEXT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX events_by_operation ON events (op_id, host, seq);
CREATE INDEX events_by_kind ON events (kind);

-- The chain head: ONE row, present from the start (seq 0, the genesis hash), so every
-- append can lock it (SELECT ... FOR UPDATE): appends from any number of machines are
-- serialised on it and the chain stays linear.
CREATE TABLE chain_head (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    seq   BIGINT NOT NULL,
    hash  TEXT NOT NULL,
    mac   TEXT
);
INSERT INTO chain_head (id, seq, hash, mac)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000', NULL);

-- Projection of each operation's events; rebuilt from events, never the truth.
CREATE TABLE operations (
    op_id           TEXT NOT NULL,
    host            TEXT NOT NULL,
    family          TEXT NOT NULL,
    display         TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    rule            TEXT NOT NULL,
    session         TEXT NOT NULL,
    state           TEXT NOT NULL,
    verdict         TEXT,
    exit_code       INTEGER,
    attempts        BIGINT NOT NULL DEFAULT 0,
    last_attempt    TEXT,
    unresolved      BOOLEAN NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    first_seq       BIGINT NOT NULL,
    last_seq        BIGINT NOT NULL,
    contradictions  BIGINT NOT NULL DEFAULT 0,
    settled_attempt TEXT,
    PRIMARY KEY (op_id, host)
);
CREATE INDEX operations_by_recency ON operations (last_seq);
CREATE INDEX operations_unresolved ON operations (unresolved, last_seq);

-- name/value facts about the ledger: `key_check`, `chain_keyed_from` and its MAC.
CREATE TABLE meta (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
