-- opmark ledger on PostgreSQL, schema version 7: the SQLite ledger's schema version 10
-- (src/ledger/store/sqlite/schema.rs). `stats` flat in the ledger's size: the suspected
-- duplicates tallied by host and family as counters, kept by a trigger on
-- `shared_intents` as an intent becomes a duplicate or stops being one, and the
-- duplicates' index ordered as `stats` names them, so its LIMIT stops after the named.
-- `audit verify` recounts the tallies.
CREATE TABLE duplicate_tallies (
    host TEXT NOT NULL,
    family TEXT NOT NULL,
    intents BIGINT NOT NULL,
    PRIMARY KEY (host, family)
);
INSERT INTO duplicate_tallies (host, family, intents)
    SELECT host, family, COUNT(*) FROM shared_intents
    WHERE executed > 1 AND family <> 'read-only' GROUP BY host, family;

-- Whether a row of shared_intents is a suspected duplicate effect (as stats reads them).
CREATE FUNCTION opmark_is_duplicate(BIGINT, TEXT) RETURNS BOOLEAN LANGUAGE sql IMMUTABLE AS $$
    SELECT $1 > 1 AND COALESCE($2, 'read-only') <> 'read-only'
$$;

CREATE FUNCTION opmark_tally_duplicate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND opmark_is_duplicate(OLD.executed, OLD.family) THEN
        UPDATE duplicate_tallies SET intents = intents - 1
            WHERE host = OLD.host AND family = OLD.family;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND opmark_is_duplicate(NEW.executed, NEW.family) THEN
        INSERT INTO duplicate_tallies (host, family, intents) VALUES (NEW.host, NEW.family, 1)
            ON CONFLICT (host, family) DO UPDATE SET intents = duplicate_tallies.intents + 1;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER duplicate_tallies_on_insert AFTER INSERT OR DELETE ON shared_intents
    FOR EACH ROW EXECUTE FUNCTION opmark_tally_duplicate();
CREATE TRIGGER duplicate_tallies_on_update AFTER UPDATE OF executed, family, host ON shared_intents
    FOR EACH ROW WHEN (opmark_is_duplicate(OLD.executed, OLD.family) IS DISTINCT FROM opmark_is_duplicate(NEW.executed, NEW.family)
        OR (opmark_is_duplicate(NEW.executed, NEW.family)
            AND (OLD.family IS DISTINCT FROM NEW.family OR OLD.host IS DISTINCT FROM NEW.host)))
    EXECUTE FUNCTION opmark_tally_duplicate();

DROP INDEX shared_intents_duplicates;
CREATE INDEX shared_intents_duplicates ON shared_intents (host, fingerprint)
    WHERE executed > 1 AND family <> 'read-only';
