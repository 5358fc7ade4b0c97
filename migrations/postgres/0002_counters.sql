-- opmark ledger on PostgreSQL, schema version 2: the SQLite ledger's schema version 3
-- (src/ledger/schema.rs). Everyday commands cost what their answer costs (issue 30):
-- counters kept by every append for `stats`, counted once here from the events already
-- stored; the indexes `list --unresolved`, `reconcile`, `gc` and `list --host` walk.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    n     BIGINT NOT NULL
);
INSERT INTO counters SELECT 'events', COUNT(*) FROM events;
INSERT INTO counters SELECT 'operations', COUNT(*) FROM operations;
INSERT INTO counters SELECT 'unresolved', COUNT(*) FROM operations WHERE unresolved;
INSERT INTO counters SELECT 'contradicted', COUNT(*) FROM operations WHERE contradictions > 0;
INSERT INTO counters SELECT 'state/' || state, COUNT(*) FROM operations GROUP BY state;
INSERT INTO counters SELECT 'family/' || family, COUNT(*) FROM operations GROUP BY family;
INSERT INTO counters SELECT 'kind/' || kind, COUNT(*) FROM events GROUP BY kind;
INSERT INTO counters
    SELECT 'verdict/' || (payload::jsonb ->> 'verdict'), COUNT(*) FROM events
    WHERE kind = 'verdict' GROUP BY 1;
INSERT INTO counters
    SELECT 'retries/' || o.family, COUNT(*) FROM events e
    JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
    WHERE e.kind = 'attempt_dispatched' AND (e.payload::jsonb ->> 'number')::bigint > 1
    GROUP BY o.family;
DROP INDEX events_by_kind;
DROP INDEX operations_unresolved;
CREATE INDEX operations_unresolved ON operations (last_seq) WHERE unresolved;
CREATE INDEX operations_contradicted ON operations (last_seq) WHERE contradictions > 0;
CREATE INDEX operations_by_host ON operations (host, last_seq);
