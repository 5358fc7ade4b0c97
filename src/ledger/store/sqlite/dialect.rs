//! How SQLite spells what `stats` and the health counts read (its own module: the
//! migrations, the archive and the rebuild recount `shared_intents` with it, and none of
//! them may name the store itself).

use crate::ledger::codec;
use crate::ledger::dialect::StatsDialect;

/// How SQLite spells what `stats` reads.
pub(crate) const DIALECT: StatsDialect = StatsDialect {
    verdict: "json_extract(payload, '$.verdict')",
    attempt_number: "json_extract(e.payload, '$.number')",
    unresolved: "unresolved = 1",
    param: "?1",
    json_text: |column, field| format!("json_extract({column}, '$.{field}')"),
    // `operations_by_intent` indexes the first 16 hex digits (schema 7). The full
    // comparison is `+a = b`: without the `+`, SQLite propagates `a = b` into the prefix
    // term, which then no longer matches the index expression (and a quadratic scan of
    // the host's operations follows).
    same_fingerprint: |a, b| format!("substr({a}, 1, 16) = substr({b}, 1, 16) AND +{a} = {b}"),
    // Micros since the epoch (schema 8).
    stamp: |at| codec::stamp_bound(at).to_string(),
};
