//! Schema migrations keyed by SQLite's `user_version`.
//!
//! Each entry of [`MIGRATIONS`] moves the schema from version `i` to `i + 1`. Once a
//! version has shipped its SQL is never edited: changes are new entries at the end.

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::ledger::error::LedgerError;

/// Migration `i` upgrades `user_version` `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: events (source of truth, hash-chained), chain head, operations projection.
    r#"
    CREATE TABLE events (
        seq        INTEGER PRIMARY KEY,   -- global sequence, 1, 2, 3, ...
        op_id      TEXT NOT NULL,
        host       TEXT NOT NULL,
        at         TEXT NOT NULL,          -- UTC RFC 3339, microseconds
        kind       TEXT NOT NULL,          -- the payload's serde tag
        payload    TEXT NOT NULL,          -- JSON, redacted; exactly what the hash covers
        prev_hash  TEXT NOT NULL,
        hash       TEXT NOT NULL
    );
    CREATE INDEX events_by_operation ON events (op_id, host, seq);
    CREATE INDEX events_by_kind ON events (kind);

    -- One row: the last event's seq and hash, so appends read the predecessor in O(1)
    -- and a deleted last event is noticed.
    CREATE TABLE chain_head (
        id    INTEGER PRIMARY KEY CHECK (id = 1),
        seq   INTEGER NOT NULL,
        hash  TEXT NOT NULL
    );

    -- Projection of each operation's events; rebuilt from events, never the truth.
    CREATE TABLE operations (
        op_id        TEXT NOT NULL,
        host         TEXT NOT NULL,
        family       TEXT NOT NULL,
        display      TEXT NOT NULL,
        fingerprint  TEXT NOT NULL,
        rule         TEXT NOT NULL,
        session      TEXT NOT NULL,
        state        TEXT NOT NULL,
        verdict      TEXT,
        exit_code    INTEGER,
        attempts     INTEGER NOT NULL DEFAULT 0,
        last_attempt TEXT,
        unresolved   INTEGER NOT NULL,
        created_at   TEXT NOT NULL,
        updated_at   TEXT NOT NULL,
        first_seq    INTEGER NOT NULL,
        last_seq     INTEGER NOT NULL,
        PRIMARY KEY (op_id, host)
    ) WITHOUT ROWID;
    CREATE INDEX operations_by_recency ON operations (last_seq);
    CREATE INDEX operations_unresolved ON operations (unresolved, last_seq);
    "#,
    // 2: the ledger binds its installation key and keys its chain (docs/ledger.md#the-installation-key);
    // contradictions between evidence are counted in the projection.
    r#"
    -- name/value facts about the ledger itself: `key_check` (HMAC of a fixed text under
    -- the key), `chain_keyed_from` (first seq whose hash is an HMAC; older events keep
    -- the plain SHA-256 they were written with) and its MAC.
    CREATE TABLE meta (
        name   TEXT PRIMARY KEY,
        value  TEXT NOT NULL
    ) WITHOUT ROWID;

    -- HMAC over (seq, hash) of the head, so a deleted tail cannot be hidden by copying the
    -- new last event's hash into the head without the key.
    ALTER TABLE chain_head ADD COLUMN mac TEXT;

    ALTER TABLE operations ADD COLUMN contradictions INTEGER NOT NULL DEFAULT 0;
    -- The attempt whose exit the settling verdict returned (what later probes must agree with).
    ALTER TABLE operations ADD COLUMN settled_attempt TEXT;
    "#,
    // 3: everyday commands cost what their answer costs (issue 30): counters kept by
    // every append for `stats`, counted once here from the events already stored; the
    // indexes `list --unresolved`, `reconcile`, `gc` and `list --host` walk. The index on
    // `kind` served only `stats` and cost ~30 bytes an event.
    r#"
    CREATE TABLE counters (
        name  TEXT PRIMARY KEY,
        n     INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO counters SELECT 'events', COUNT(*) FROM events;
    INSERT INTO counters SELECT 'operations', COUNT(*) FROM operations;
    INSERT INTO counters SELECT 'unresolved', COUNT(*) FROM operations WHERE unresolved = 1;
    INSERT INTO counters SELECT 'contradicted', COUNT(*) FROM operations WHERE contradictions > 0;
    INSERT INTO counters SELECT 'state/' || state, COUNT(*) FROM operations GROUP BY state;
    INSERT INTO counters SELECT 'family/' || family, COUNT(*) FROM operations GROUP BY family;
    INSERT INTO counters SELECT 'kind/' || kind, COUNT(*) FROM events GROUP BY kind;
    INSERT INTO counters
        SELECT 'verdict/' || json_extract(payload, '$.verdict'), COUNT(*) FROM events
        WHERE kind = 'verdict' GROUP BY 1;
    INSERT INTO counters
        SELECT 'retries/' || o.family, COUNT(*) FROM events e
        JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
        WHERE e.kind = 'attempt_dispatched' AND json_extract(e.payload, '$.number') > 1
        GROUP BY o.family;
    DROP INDEX events_by_kind;
    DROP INDEX operations_unresolved;
    CREATE INDEX operations_unresolved ON operations (last_seq) WHERE unresolved = 1;
    CREATE INDEX operations_contradicted ON operations (last_seq) WHERE contradictions > 0;
    CREATE INDEX operations_by_host ON operations (host, last_seq);
    "#,
    // 4: health counts (docs/ledger.md#health): the events `stats` counts per family
    // (replays, conflicts, approval interruptions, contradictions, repetitions held and
    // declared, reconciliations by outcome), counted once here from the history and kept
    // by every append since (`health::count`, names `h/<kind>/<word>/<family>`); and the
    // index that finds one intent's operations on a host (suspected duplicate effects; the
    // repetition check of issue 27 reads the same index).
    r#"
    INSERT INTO counters
        SELECT 'h/' || e.kind || '/' || CASE e.kind
             WHEN 'verdict' THEN json_extract(e.payload, '$.verdict') WHEN 'reconciled' THEN json_extract(e.payload, '$.decision')
             WHEN 'repetition_held' THEN json_extract(e.payload, '$.action') ELSE '' END
             || '/' || COALESCE(o.family, 'unknown'), COUNT(*)
         FROM events e LEFT JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
         WHERE (e.kind IN ('contradiction', 'repetition_held', 'reconciled')
             OR (e.kind = 'verdict' AND json_extract(e.payload, '$.verdict') IN ('replayed', 'conflict', 'blocked'))
             OR (e.kind = 'linked' AND json_extract(e.payload, '$.relation') = 'repeats'))
         GROUP BY 1;
    INSERT INTO counters
        SELECT 'h/' || 'refused_retry//' || COALESCE(o.family, 'unknown'), COUNT(*)
         FROM events b
         JOIN events d ON d.op_id = b.op_id AND d.host = b.host AND d.kind = 'attempt_dispatched'
             AND json_extract(d.payload, '$.attempt_id') = json_extract(b.payload, '$.attempt_id')
         LEFT JOIN operations o ON o.op_id = b.op_id AND o.host = b.host
         WHERE b.kind = 'boundary_reached' AND json_extract(b.payload, '$.boundary') = 'refused'
             AND CAST(json_extract(d.payload, '$.number') AS BIGINT) > 1
         GROUP BY 1;
    CREATE INDEX operations_by_fingerprint ON operations (fingerprint, host, first_seq);
    "#,
    // 5: the compact event layout (issue 30, docs/ledger.md#storage): what repeats is
    // stored once (the operation key in `op_keys`, keys and repeating text in `atoms`), the
    // payload as a lossless transcoding of its JSON text (src/ledger/codec.rs), times and
    // hashes as numbers and bytes, the predecessor hash and the kind only where they are
    // not implied. The chain still covers the same text; `migrate_to_compact` (Rust, run
    // between this and the next statement list) moves the old rows over.
    r#"
    ALTER TABLE events RENAME TO events_v3;
    DROP INDEX events_by_operation;
    CREATE TABLE atoms (
        id      INTEGER PRIMARY KEY,
        digest  INTEGER NOT NULL,   -- first 8 bytes of the text's SHA-256
        text    TEXT NOT NULL
    );
    CREATE INDEX atoms_by_digest ON atoms (digest);
    CREATE TABLE op_keys (
        id     INTEGER PRIMARY KEY,
        op_id  TEXT NOT NULL,
        host   TEXT NOT NULL,
        UNIQUE (op_id, host)
    );
    CREATE TABLE events (
        seq   INTEGER PRIMARY KEY,
        op    INTEGER NOT NULL,     -- op_keys.id
        at    NOT NULL,             -- micros since the epoch, or the stamp's text
        payload NOT NULL,           -- compact (blob, src/ledger/codec.rs), or the JSON text
        hash  NOT NULL,             -- 32 bytes, or text when not a SHA-256 hex
        prev_hash,                  -- NULL: the hash of event seq - 1 as stored
        kind  TEXT                  -- NULL: the payload's tag
    );
    "#,
    // 6: the intents recorded under more than one op id on a host (issue 30: `stats`'s
    // suspected duplicate effects read this table, not a GROUP BY over every operation).
    // Kept by triggers in the transaction that writes the operation's row, so no append
    // path can forget it. It only grows: a row whose operations were archived or rebuilt
    // away stays a candidate, and `health::duplicates` counts an intent only when it
    // finds two executed operations, so a stale row changes no count.
    r#"
    CREATE TABLE shared_intents (
        fingerprint TEXT NOT NULL,
        host        TEXT NOT NULL,
        PRIMARY KEY (fingerprint, host)
    ) WITHOUT ROWID;
    INSERT INTO shared_intents
        SELECT fingerprint, host FROM operations GROUP BY fingerprint, host HAVING COUNT(*) > 1;
    CREATE TRIGGER shared_intents_on_insert AFTER INSERT ON operations
        WHEN EXISTS (SELECT 1 FROM operations d WHERE d.fingerprint = NEW.fingerprint
            AND d.host = NEW.host AND d.op_id <> NEW.op_id)
    BEGIN
        INSERT OR IGNORE INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host);
    END;
    CREATE TRIGGER shared_intents_on_update AFTER UPDATE OF fingerprint, host ON operations
        WHEN (OLD.fingerprint IS NOT NEW.fingerprint OR OLD.host IS NOT NEW.host)
            AND EXISTS (SELECT 1 FROM operations d WHERE d.fingerprint = NEW.fingerprint
                AND d.host = NEW.host AND d.op_id <> NEW.op_id)
    BEGIN
        INSERT OR IGNORE INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host);
    END;
    "#,
    // 7: smaller events (issue 30, docs/ledger.md#storage): each event keeps a tag of its
    // hash (8 bytes of a keyed one, 16 of a plain one; every 256th, `chain::ANCHOR`, all
    // of it) and a back link to its operation's
    // previous event instead of the full hash and an index over all events; times are
    // micros after the operation's first event's; an implied predecessor hash is the one
    // the walk recomputes for event seq - 1 (it differs from the stored one only where
    // that event itself fails its check, so every break is found as before). What the
    // chain covers is unchanged, and the full hash stays where a walk starts or ends: the
    // head, the verified checkpoint, the archive cut.
    r#"
    ALTER TABLE events RENAME TO events_v6;
    ALTER TABLE op_keys ADD COLUMN base INTEGER;      -- micros of its first event's time
    ALTER TABLE op_keys ADD COLUMN last_seq INTEGER;  -- its last event here
    UPDATE op_keys SET
        base = (SELECT MIN(at) FROM events_v6 WHERE op = op_keys.id AND typeof(at) = 'integer'),
        last_seq = (SELECT MAX(seq) FROM events_v6 WHERE op = op_keys.id);
    CREATE TABLE events (
        seq       INTEGER PRIMARY KEY,
        op        INTEGER NOT NULL,  -- op_keys.id
        back      INTEGER,           -- seq minus the seq of the op's previous event; NULL: its first
        at        NOT NULL,          -- micros after op_keys.base, or the stamp's text
        payload   NOT NULL,          -- compact (blob, src/ledger/codec.rs), or the JSON text
        hash      NOT NULL,          -- the tag (bytes), or the hash's text when not a SHA-256 hex
        prev_hash,                   -- NULL: implied (the recomputed hash of event seq - 1)
        kind      TEXT               -- NULL: the payload's tag
    );
    INSERT INTO events (seq, op, back, at, payload, hash, prev_hash, kind)
        SELECT e.seq, e.op,
            e.seq - LAG(e.seq) OVER (PARTITION BY e.op ORDER BY e.seq),
            CASE WHEN typeof(e.at) = 'integer' THEN e.at - k.base ELSE e.at END,
            e.payload,
            CASE WHEN typeof(e.hash) = 'blob' AND length(e.hash) = 32 AND e.seq % 256 <> 0
                THEN substr(e.hash, 1, CASE WHEN e.seq >= kf.seq THEN 8 ELSE 16 END)
                ELSE e.hash END,
            e.prev_hash, e.kind
        FROM events_v6 e JOIN op_keys k ON k.id = e.op,
            (SELECT COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'chain_keyed_from'),
                9223372036854775807) AS seq) kf
        ORDER BY e.seq;
    DROP TABLE events_v6;
    -- One intent's operations are found by the first 16 hex digits of the fingerprint
    -- (then compared in full): the index entry is a quarter the size.
    DROP INDEX operations_by_fingerprint;
    CREATE INDEX operations_by_intent ON operations (substr(fingerprint, 1, 16), host, first_seq);
    DROP TRIGGER shared_intents_on_insert;
    DROP TRIGGER shared_intents_on_update;
    CREATE TRIGGER shared_intents_on_insert AFTER INSERT ON operations
        WHEN EXISTS (SELECT 1 FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16)
            AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.op_id <> NEW.op_id)
    BEGIN
        INSERT OR IGNORE INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host);
    END;
    CREATE TRIGGER shared_intents_on_update AFTER UPDATE OF fingerprint, host ON operations
        WHEN (OLD.fingerprint IS NOT NEW.fingerprint OR OLD.host IS NOT NEW.host)
            AND EXISTS (SELECT 1 FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16)
                AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.op_id <> NEW.op_id)
    BEGIN
        INSERT OR IGNORE INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host);
    END;
    "#,
    // 8: an operation's `created_at` and `updated_at` as micros since the epoch (8 bytes
    // instead of the stamp's 27; `codec::stored_stamp`), or the text of a stamp that would
    // not come back byte for byte. A column's type cannot change in place, and a TEXT
    // column would turn the integers back into text, so the table is rebuilt (without a
    // declared type: any value is kept as written) with its indexes and triggers.
    r#"
    ALTER TABLE operations RENAME TO operations_v7;
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
        attempts        INTEGER NOT NULL DEFAULT 0,
        last_attempt    TEXT,
        unresolved      INTEGER NOT NULL,
        created_at      NOT NULL,  -- micros since the epoch, or the stamp's text
        updated_at      NOT NULL,
        first_seq       INTEGER NOT NULL,
        last_seq        INTEGER NOT NULL,
        contradictions  INTEGER NOT NULL DEFAULT 0,
        settled_attempt TEXT,
        PRIMARY KEY (op_id, host)
    ) WITHOUT ROWID;
    INSERT INTO operations (op_id, host, family, display, fingerprint, rule, session, state,
            verdict, exit_code, attempts, last_attempt, unresolved, created_at, updated_at,
            first_seq, last_seq, contradictions, settled_attempt)
        SELECT op_id, host, family, display, fingerprint, rule, session, state,
            verdict, exit_code, attempts, last_attempt, unresolved,
            CASE WHEN typeof(created_at) = 'text' AND length(created_at) = 27
            AND created_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9][0-9][0-9][0-9]Z'
            AND strftime('%Y-%m-%dT%H:%M:%S', substr(created_at, 1, 19)) = substr(created_at, 1, 19)
            THEN CAST(strftime('%s', substr(created_at, 1, 19)) AS INTEGER) * 1000000 + CAST(substr(created_at, 21, 6) AS INTEGER)
            ELSE created_at END,
            CASE WHEN typeof(updated_at) = 'text' AND length(updated_at) = 27
            AND updated_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9][0-9][0-9][0-9]Z'
            AND strftime('%Y-%m-%dT%H:%M:%S', substr(updated_at, 1, 19)) = substr(updated_at, 1, 19)
            THEN CAST(strftime('%s', substr(updated_at, 1, 19)) AS INTEGER) * 1000000 + CAST(substr(updated_at, 21, 6) AS INTEGER)
            ELSE updated_at END,
            first_seq, last_seq, contradictions, settled_attempt
        FROM operations_v7;
    DROP TABLE operations_v7;
    CREATE INDEX operations_by_recency ON operations (last_seq);
    CREATE INDEX operations_unresolved ON operations (last_seq) WHERE unresolved = 1;
    CREATE INDEX operations_contradicted ON operations (last_seq) WHERE contradictions > 0;
    CREATE INDEX operations_by_host ON operations (host, last_seq);
    CREATE INDEX operations_by_intent ON operations (substr(fingerprint, 1, 16), host, first_seq);
    CREATE TRIGGER shared_intents_on_insert AFTER INSERT ON operations
        WHEN EXISTS (SELECT 1 FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16)
            AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.op_id <> NEW.op_id)
    BEGIN
        INSERT OR IGNORE INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host);
    END;
    CREATE TRIGGER shared_intents_on_update AFTER UPDATE OF fingerprint, host ON operations
        WHEN (OLD.fingerprint IS NOT NEW.fingerprint OR OLD.host IS NOT NEW.host)
            AND EXISTS (SELECT 1 FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16)
                AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.op_id <> NEW.op_id)
    BEGIN
        INSERT OR IGNORE INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host);
    END;
    "#,
    // 9: the suspected duplicate effects kept as the ledger is written (issue 46: `stats`
    // read each candidate intent's operations and their events, 60,000 statements at 1M
    // operations). An operation says whether it ran (`executed`: an attempt reached
    // `started` or an exit came back, folded by the projection), and each intent shared by
    // several op ids counts its executed operations and the strictest family among them.
    // Triggers keep both in the transaction that writes the operation's row, so `stats`
    // reads the counts through one small partial index. `audit verify` recounts them.
    // (No `OR IGNORE` in a trigger: the upsert that fires it would impose its own
    // conflict policy, so a row is inserted only where none is.)
    r#"
    ALTER TABLE operations ADD COLUMN executed INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE shared_intents ADD COLUMN executed INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE shared_intents ADD COLUMN family TEXT;
    DROP TRIGGER shared_intents_on_insert;
    DROP TRIGGER shared_intents_on_update;
    -- A new operation: one more execution of its intent if it arrives executed (a
    -- rebuild), and a row for the intent once a second op id shares it.
    CREATE TRIGGER shared_intents_on_insert AFTER INSERT ON operations
    BEGIN
        UPDATE shared_intents SET executed = executed + 1,
            family = CASE WHEN family IS NULL OR (CASE NEW.family WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2 WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END) > (CASE family WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2 WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END) THEN NEW.family ELSE family END
            WHERE NEW.executed = 1 AND fingerprint = NEW.fingerprint AND host = NEW.host;
        INSERT INTO shared_intents (fingerprint, host)
            SELECT NEW.fingerprint, NEW.host WHERE EXISTS (SELECT 1 FROM operations d
                WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16) AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.op_id <> NEW.op_id)
            AND NOT EXISTS (SELECT 1 FROM shared_intents
                WHERE fingerprint = NEW.fingerprint AND host = NEW.host);
    END;
    -- A row that appears counts what its intent already ran, once.
    CREATE TRIGGER shared_intents_counted AFTER INSERT ON shared_intents
    BEGIN
        UPDATE shared_intents SET
            executed = (SELECT COUNT(*) FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16) AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.executed = 1),
            family = (SELECT d.family FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16) AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.executed = 1
                ORDER BY (CASE d.family WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2 WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END) DESC, d.first_seq LIMIT 1)
            WHERE fingerprint = NEW.fingerprint AND host = NEW.host;
    END;
    -- The common change: an operation starts (counted once: the flag never goes back).
    CREATE TRIGGER shared_intents_on_execution AFTER UPDATE OF executed ON operations
        WHEN OLD.executed = 0 AND NEW.executed = 1 AND OLD.fingerprint = NEW.fingerprint
            AND OLD.host = NEW.host AND OLD.family = NEW.family
    BEGIN
        UPDATE shared_intents SET executed = executed + 1,
            family = CASE WHEN family IS NULL OR (CASE NEW.family WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2 WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END) > (CASE family WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2 WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END) THEN NEW.family ELSE family END
            WHERE fingerprint = NEW.fingerprint AND host = NEW.host;
    END;
    -- Anything else that moves the counts (a new family for an executed operation; an
    -- intent or host rewritten outside opmark): both intents recounted.
    CREATE TRIGGER shared_intents_on_change AFTER UPDATE OF fingerprint, host, family, executed ON operations
        WHEN OLD.fingerprint IS NOT NEW.fingerprint OR OLD.host IS NOT NEW.host
            OR OLD.executed > NEW.executed
            OR ((OLD.executed = 1 OR NEW.executed = 1) AND OLD.family IS NOT NEW.family)
    BEGIN
        INSERT INTO shared_intents (fingerprint, host)
            SELECT NEW.fingerprint, NEW.host WHERE EXISTS (SELECT 1 FROM operations d
                WHERE substr(d.fingerprint, 1, 16) = substr(NEW.fingerprint, 1, 16) AND +d.fingerprint = NEW.fingerprint AND d.host = NEW.host AND d.op_id <> NEW.op_id)
            AND NOT EXISTS (SELECT 1 FROM shared_intents
                WHERE fingerprint = NEW.fingerprint AND host = NEW.host);
        UPDATE shared_intents SET
            executed = (SELECT COUNT(*) FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(shared_intents.fingerprint, 1, 16) AND +d.fingerprint = shared_intents.fingerprint AND d.host = shared_intents.host AND d.executed = 1),
            family = (SELECT d.family FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(shared_intents.fingerprint, 1, 16) AND +d.fingerprint = shared_intents.fingerprint AND d.host = shared_intents.host AND d.executed = 1
                ORDER BY (CASE d.family WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2 WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END) DESC, d.first_seq LIMIT 1)
            WHERE (fingerprint = OLD.fingerprint AND host = OLD.host)
                OR (fingerprint = NEW.fingerprint AND host = NEW.host);
    END;
    -- An operation archived or rebuilt away: one execution fewer (`archive` and the
    -- rebuild recount the families after).
    CREATE TRIGGER shared_intents_on_delete AFTER DELETE ON operations WHEN OLD.executed = 1
    BEGIN
        UPDATE shared_intents SET executed = executed - 1,
            family = CASE WHEN executed = 1 THEN NULL ELSE family END
            WHERE fingerprint = OLD.fingerprint AND host = OLD.host;
    END;
    CREATE INDEX shared_intents_duplicates ON shared_intents (host, family)
        WHERE executed > 1 AND family <> 'read-only';
    "#,
    // 10: `stats` flat in the ledger's size (issue 46: at 1M operations with 15,000
    // duplicates, 5x its 1k figure, the tallies walking every duplicate and the named
    // ones sorted out of them). The tallies by host and family are counters, kept by
    // triggers on `shared_intents` as an intent becomes a duplicate or stops being one,
    // and the duplicates' index is ordered as `stats` names them, so its `LIMIT` stops
    // after the named. `audit verify` recounts the tallies.
    r#"
    CREATE TABLE duplicate_tallies (
        host TEXT NOT NULL,
        family TEXT NOT NULL,
        intents INTEGER NOT NULL,
        PRIMARY KEY (host, family)
    ) WITHOUT ROWID;
    INSERT INTO duplicate_tallies (host, family, intents)
        SELECT host, family, COUNT(*) FROM shared_intents
        WHERE executed > 1 AND family <> 'read-only' GROUP BY host, family;
    CREATE TRIGGER duplicate_tallies_on_insert AFTER INSERT ON shared_intents
        WHEN NEW.executed > 1 AND COALESCE(NEW.family, 'read-only') <> 'read-only'
    BEGIN
        INSERT INTO duplicate_tallies (host, family, intents)
            SELECT NEW.host, NEW.family, 0 WHERE NOT EXISTS (SELECT 1 FROM duplicate_tallies
                WHERE host = NEW.host AND family = NEW.family);
        UPDATE duplicate_tallies SET intents = intents + 1
            WHERE host = NEW.host AND family = NEW.family;
    END;
    CREATE TRIGGER duplicate_tallies_on_update AFTER UPDATE OF executed, family, host ON shared_intents
        WHEN (OLD.executed > 1 AND COALESCE(OLD.family, 'read-only') <> 'read-only')
            <> (NEW.executed > 1 AND COALESCE(NEW.family, 'read-only') <> 'read-only')
            OR (NEW.executed > 1 AND COALESCE(NEW.family, 'read-only') <> 'read-only'
                AND (OLD.family IS NOT NEW.family OR OLD.host IS NOT NEW.host))
    BEGIN
        UPDATE duplicate_tallies SET intents = intents - 1
            WHERE OLD.executed > 1 AND COALESCE(OLD.family, 'read-only') <> 'read-only'
                AND host = OLD.host AND family = OLD.family;
        INSERT INTO duplicate_tallies (host, family, intents)
            SELECT NEW.host, NEW.family, 0
            WHERE NEW.executed > 1 AND COALESCE(NEW.family, 'read-only') <> 'read-only'
                AND NOT EXISTS (SELECT 1 FROM duplicate_tallies
                    WHERE host = NEW.host AND family = NEW.family);
        UPDATE duplicate_tallies SET intents = intents + 1
            WHERE NEW.executed > 1 AND COALESCE(NEW.family, 'read-only') <> 'read-only'
                AND host = NEW.host AND family = NEW.family;
    END;
    CREATE TRIGGER duplicate_tallies_on_delete AFTER DELETE ON shared_intents
        WHEN OLD.executed > 1 AND COALESCE(OLD.family, 'read-only') <> 'read-only'
    BEGIN
        UPDATE duplicate_tallies SET intents = intents - 1
            WHERE host = OLD.host AND family = OLD.family;
    END;
    DROP INDEX shared_intents_duplicates;
    CREATE INDEX shared_intents_duplicates ON shared_intents (host, fingerprint)
        WHERE executed > 1 AND family <> 'read-only';
    "#,
];

/// Steps in Rust after the SQL of the same index (`MIGRATIONS[i]`), then more SQL.
fn after(i: usize, tx: &Transaction<'_>) -> Result<(), LedgerError> {
    if i == 4 {
        super::rows::migrate_to_compact(tx)?;
        tx.execute_batch(
            "DROP TABLE events_v3;
             CREATE INDEX events_by_op ON events (op, seq);",
        )?;
    }
    if i == 8 {
        mark_executed(tx)?;
    }
    Ok(())
}

/// Schema 9's step in Rust: `operations.executed` from the events (their payloads are
/// compact, so SQL cannot read a boundary), then every shared intent recounted.
fn mark_executed(tx: &Transaction<'_>) -> Result<(), LedgerError> {
    use crate::ledger::event::Event;
    let cache = std::cell::RefCell::default();
    let mut ran = std::collections::BTreeSet::new();
    super::rows::read_rows_decoding(
        tx,
        &mut super::atoms::AtomsOf::reading(tx, &cache),
        "ORDER BY e.seq",
        [],
        super::rows::Payloads::Of(&["boundary_reached", "exit_received"]),
        |row| {
            if row.payload.is_empty() {
                return Ok(());
            }
            let executed = match serde_json::from_str::<Event>(&row.payload) {
                Ok(Event::ExitReceived { .. }) => true,
                Ok(Event::BoundaryReached { boundary, .. }) => {
                    boundary == crate::vocab::Boundary::Started
                }
                // An event that does not decode is `audit verify`'s to name.
                _ => false,
            };
            if executed {
                ran.insert((row.op_id, row.host));
            }
            Ok(())
        },
    )?;
    let mut mark =
        tx.prepare("UPDATE operations SET executed = 1 WHERE op_id = ?1 AND host = ?2")?;
    for (op_id, host) in &ran {
        mark.execute(rusqlite::params![op_id, host])?;
    }
    tx.execute(
        &crate::ledger::store::recount_shared_intents(&super::dialect::DIALECT),
        [],
    )?;
    Ok(())
}

/// The schema version this build writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database to [`CURRENT_VERSION`], then calls `then` with the version found
/// before migrating, in the SAME `BEGIN IMMEDIATE` transaction: several processes opening a
/// fresh ledger at once migrate it exactly once, and what `then` does (binding the
/// installation key) commits together with the schema or not at all.
pub fn migrate<T>(
    conn: &mut Connection,
    then: impl FnOnce(&Transaction<'_>, i64) -> Result<T, LedgerError>,
) -> Result<T, LedgerError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > CURRENT_VERSION {
        return Err(LedgerError::Invalid {
            message: format!(
                "the ledger was written by a newer opmark (schema version {version}, this opmark knows up to {CURRENT_VERSION}); upgrade opmark or point --ledger at another file"
            ),
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        after(i, &tx)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)?;
    }
    let result = then(&tx, version)?;
    tx.commit()?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    /// Collapses whitespace, so SQL written over several lines compares as one.
    fn words(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_health_backfill_counts_what_the_window_query_counts() {
        let window =
            crate::ledger::health::event_counts_sql(&crate::ledger::store::sqlite::DIALECT, false);
        let migration = words(super::MIGRATIONS[3]);
        let select = words(&window).replacen("SELECT ", "SELECT 'h/' || ", 1);
        assert!(migration.contains(&select), "{migration}\n---\n{select}");
        let pg = words(include_str!(
            "../../../../migrations/postgres/0004_health.sql"
        ));
        let pg_window = crate::ledger::health::event_counts_sql(
            &crate::ledger::store::postgres::DIALECT,
            false,
        );
        let pg_select = words(&pg_window).replacen("SELECT ", "SELECT 'h/' || ", 1);
        assert!(pg.contains(&pg_select), "{pg}\n---\n{pg_select}");
        for (dialect, text) in [
            (&crate::ledger::store::sqlite::DIALECT, &migration),
            (&crate::ledger::store::postgres::DIALECT, &pg),
        ] {
            let refused = words(&crate::ledger::health::refused_retries_sql(dialect, false))
                .replacen("SELECT ", "SELECT 'h/' || ", 1);
            assert!(text.contains(&refused), "{text}\n---\n{refused}");
        }
    }
}
