-- opmark ledger on PostgreSQL, schema version 6: the SQLite ledger's schema version 9
-- (src/ledger/store/sqlite/schema.rs). The suspected duplicate effects kept as the
-- ledger is written, so `stats` reads counts, not each candidate's operations and events:
-- an operation says whether it ran (`executed`: an attempt reached `started` or an exit
-- came back, folded by the projection), and each intent shared by several op ids counts
-- its executed operations and the strictest family among them. Kept by triggers in the
-- transaction that writes the operation's row; `audit verify` recounts them.
ALTER TABLE operations ADD COLUMN executed INTEGER NOT NULL DEFAULT 0;
UPDATE operations o SET executed = 1 WHERE EXISTS (
    SELECT 1 FROM events x WHERE x.op_id = o.op_id AND x.host = o.host
        AND (x.kind = 'exit_received'
            OR (x.kind = 'boundary_reached' AND (x.payload::jsonb ->> 'boundary') = 'started')));
ALTER TABLE shared_intents ADD COLUMN executed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE shared_intents ADD COLUMN family TEXT;

-- Least dangerous first, as `Family::ALL`; a word no family has ranks below them all.
CREATE FUNCTION opmark_family_rank(TEXT) RETURNS INTEGER LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE $1 WHEN 'destructive' THEN 3 WHEN 'append-only' THEN 2
        WHEN 'convergent' THEN 1 WHEN 'read-only' THEN 0 ELSE -1 END
$$;

-- One intent's row recounted from its operations.
CREATE FUNCTION opmark_recount_shared_intent(TEXT, TEXT) RETURNS void LANGUAGE sql AS $$
    UPDATE shared_intents s SET
        executed = (SELECT COUNT(*) FROM operations d
            WHERE d.fingerprint = $1 AND d.host = $2 AND d.executed = 1),
        family = (SELECT d.family FROM operations d
            WHERE d.fingerprint = $1 AND d.host = $2 AND d.executed = 1
            ORDER BY opmark_family_rank(d.family) DESC, d.first_seq LIMIT 1)
    WHERE s.fingerprint = $1 AND s.host = $2
$$;

-- A row that appears counts what its intent already ran, once.
CREATE FUNCTION opmark_count_shared_intent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM opmark_recount_shared_intent(NEW.fingerprint, NEW.host);
    RETURN NULL;
END
$$;
CREATE TRIGGER shared_intents_counted AFTER INSERT ON shared_intents
    FOR EACH ROW EXECUTE FUNCTION opmark_count_shared_intent();

-- An operation written or deleted: its intent's row made once a second op id shares it,
-- one execution more when it starts (the flag never goes back), one fewer when it is
-- archived (the archive recounts the families after), both intents recounted for any
-- other change that moves the counts.
CREATE OR REPLACE FUNCTION opmark_note_shared_intent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.executed = 1 THEN
            UPDATE shared_intents SET executed = executed - 1,
                family = CASE WHEN executed = 1 THEN NULL ELSE family END
                WHERE fingerprint = OLD.fingerprint AND host = OLD.host;
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND (OLD.fingerprint IS DISTINCT FROM NEW.fingerprint
            OR OLD.host IS DISTINCT FROM NEW.host OR OLD.executed > NEW.executed
            OR ((OLD.executed = 1 OR NEW.executed = 1) AND OLD.family IS DISTINCT FROM NEW.family)) THEN
        IF EXISTS (SELECT 1 FROM operations d WHERE d.fingerprint = NEW.fingerprint
                   AND d.host = NEW.host AND d.op_id <> NEW.op_id) THEN
            INSERT INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host)
                ON CONFLICT DO NOTHING;
        END IF;
        PERFORM opmark_recount_shared_intent(OLD.fingerprint, OLD.host);
        PERFORM opmark_recount_shared_intent(NEW.fingerprint, NEW.host);
        RETURN NULL;
    END IF;
    IF NEW.executed = 1 AND (TG_OP = 'INSERT' OR OLD.executed = 0) THEN
        UPDATE shared_intents SET executed = executed + 1,
            family = CASE WHEN family IS NULL
                OR opmark_family_rank(NEW.family) > opmark_family_rank(family)
                THEN NEW.family ELSE family END
            WHERE fingerprint = NEW.fingerprint AND host = NEW.host;
    END IF;
    IF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM operations d WHERE d.fingerprint = NEW.fingerprint
            AND d.host = NEW.host AND d.op_id <> NEW.op_id) THEN
        INSERT INTO shared_intents (fingerprint, host) VALUES (NEW.fingerprint, NEW.host)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER shared_intents_on_insert ON operations;
DROP TRIGGER shared_intents_on_update ON operations;
CREATE TRIGGER shared_intents_on_insert AFTER INSERT OR DELETE ON operations
    FOR EACH ROW EXECUTE FUNCTION opmark_note_shared_intent();
CREATE TRIGGER shared_intents_on_update AFTER UPDATE OF fingerprint, host, family, executed ON operations
    FOR EACH ROW WHEN (OLD.fingerprint IS DISTINCT FROM NEW.fingerprint OR OLD.host IS DISTINCT FROM NEW.host
        OR OLD.family IS DISTINCT FROM NEW.family OR OLD.executed IS DISTINCT FROM NEW.executed)
    EXECUTE FUNCTION opmark_note_shared_intent();

UPDATE shared_intents s SET
    executed = (SELECT COUNT(*) FROM operations d
        WHERE d.fingerprint = s.fingerprint AND d.host = s.host AND d.executed = 1),
    family = (SELECT d.family FROM operations d
        WHERE d.fingerprint = s.fingerprint AND d.host = s.host AND d.executed = 1
        ORDER BY opmark_family_rank(d.family) DESC, d.first_seq LIMIT 1);
CREATE INDEX shared_intents_duplicates ON shared_intents (host, family)
    WHERE executed > 1 AND family <> 'read-only';
