-- opmark ledger on PostgreSQL, schema version 5: the SQLite ledger's schema version 6
-- (src/ledger/schema.rs). The intents recorded under more than one op id on a host, so
-- `stats`'s suspected duplicate effects read this table, not a GROUP BY over every
-- operation. Kept by a trigger in the transaction that writes the operation's row; it
-- only grows (a stale row changes no count: `health::duplicates` counts an intent only
-- when it finds two executed operations).
CREATE TABLE shared_intents (
    fingerprint TEXT NOT NULL,
    host        TEXT NOT NULL,
    PRIMARY KEY (fingerprint, host)
);
INSERT INTO shared_intents
    SELECT fingerprint, host FROM operations GROUP BY fingerprint, host HAVING COUNT(*) > 1;
CREATE FUNCTION opmark_note_shared_intent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM operations d WHERE d.fingerprint = NEW.fingerprint
               AND d.host = NEW.host AND d.op_id <> NEW.op_id) THEN
        INSERT INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER shared_intents_on_insert AFTER INSERT ON operations
    FOR EACH ROW EXECUTE FUNCTION opmark_note_shared_intent();
CREATE TRIGGER shared_intents_on_update AFTER UPDATE OF fingerprint, host ON operations
    FOR EACH ROW WHEN (OLD.fingerprint IS DISTINCT FROM NEW.fingerprint OR OLD.host IS DISTINCT FROM NEW.host)
    EXECUTE FUNCTION opmark_note_shared_intent();
