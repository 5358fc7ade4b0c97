-- opmark ledger on PostgreSQL, schema version 3: the index of the SQLite ledger's schema version 4
-- (src/ledger/schema.rs). The repetition check looks up the same intent on the same host
-- under other op ids before every new operation: an index, not a scan.
CREATE INDEX operations_by_fingerprint ON operations (fingerprint, host, first_seq);
