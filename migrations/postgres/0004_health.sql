-- opmark ledger on PostgreSQL, schema version 4: the health counters of the SQLite ledger's schema version 4
-- (src/ledger/schema.rs). Health counts (docs/ledger.md#health): the events `stats`
-- counts per family, counted once here from the history and kept by every append since
-- (`health::count`, names `h/<kind>/<word>/<family>`); and the index that finds one
-- intent's operations on a host (suspected duplicate effects) is 0003_fingerprint.sql's.
INSERT INTO counters
    SELECT 'h/' || e.kind || '/' || CASE e.kind
         WHEN 'verdict' THEN (e.payload::jsonb ->> 'verdict') WHEN 'reconciled' THEN (e.payload::jsonb ->> 'decision')
             WHEN 'repetition_held' THEN (e.payload::jsonb ->> 'action') ELSE '' END
         || '/' || COALESCE(o.family, 'unknown'), COUNT(*)
     FROM events e LEFT JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
     WHERE (e.kind IN ('contradiction', 'repetition_held', 'reconciled')
         OR (e.kind = 'verdict' AND (e.payload::jsonb ->> 'verdict') IN ('replayed', 'conflict', 'blocked'))
         OR (e.kind = 'linked' AND (e.payload::jsonb ->> 'relation') = 'repeats'))
     GROUP BY 1;
INSERT INTO counters
        SELECT 'h/' || 'refused_retry//' || COALESCE(o.family, 'unknown'), COUNT(*)
         FROM events b
         JOIN events d ON d.op_id = b.op_id AND d.host = b.host AND d.kind = 'attempt_dispatched'
             AND (d.payload::jsonb ->> 'attempt_id') = (b.payload::jsonb ->> 'attempt_id')
         LEFT JOIN operations o ON o.op_id = b.op_id AND o.host = b.host
         WHERE b.kind = 'boundary_reached' AND (b.payload::jsonb ->> 'boundary') = 'refused'
             AND CAST((d.payload::jsonb ->> 'number') AS BIGINT) > 1
         GROUP BY 1;
