//! The `operations` projection's rows in SQLite: read, written, and rebuilt from the
//! events (the fold itself is [`crate::ledger::projection`]'s).

use rusqlite::{params, OptionalExtension, Transaction};

use crate::ledger::error::LedgerError;
use crate::ledger::event::Event;
use crate::ledger::op_key::OpKey;
use crate::ledger::projection::{self, OperationRecord};
use crate::vocab::Verdict;

use crate::ledger::codec;

/// Rebuilds the whole `operations` table from the events, in the given transaction.
/// Returns false (and changes nothing) when an event cannot be decoded: then the stored
/// rows stay and `audit verify` names the event.
pub(crate) fn rebuild(tx: &Transaction<'_>) -> Result<bool, LedgerError> {
    let mut rows: std::collections::BTreeMap<OpKey, OperationRecord> = Default::default();
    {
        let cache = std::cell::RefCell::default();
        for row in super::rows::rows_where(tx, &cache, "ORDER BY e.seq", [])? {
            let (seq, at) = (row.seq, row.at);
            let key = OpKey::new(row.op_id, row.host);
            let Ok(event) = serde_json::from_str::<Event>(&row.payload) else {
                return Ok(false);
            };
            let mut row = rows.remove(&key);
            // Refused appends were rolled back: the row stays as it was.
            let _ = projection::fold(&mut row, (&key.op_id, &key.host), &event, seq, &at);
            if let Some(rec) = row {
                rows.insert(key, rec);
            }
        }
    }
    tx.execute("DELETE FROM operations", [])?;
    for rec in rows.values() {
        store(tx, rec)?;
    }
    tx.execute(
        &crate::ledger::store::recount_shared_intents(&super::dialect::DIALECT),
        [],
    )?;
    Ok(true)
}

pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<OperationRecord> {
    let family: String = row.get(2)?;
    let verdict: Option<String> = row.get(8)?;
    let state: String = row.get(7)?;
    let bad = |col: usize, msg: String| {
        rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, msg.into())
    };
    Ok(OperationRecord {
        op_id: row.get(0)?,
        host: row.get(1)?,
        family: family.parse().map_err(|e| bad(2, e))?,
        display: row.get(3)?,
        fingerprint: row.get(4)?,
        rule: row.get(5)?,
        session: row.get(6)?,
        state: state.parse().unwrap_or_else(|never| match never {}),
        verdict: verdict
            .map(|v| v.parse::<Verdict>())
            .transpose()
            .map_err(|e| bad(8, e))?,
        exit_code: row.get(9)?,
        attempts: row.get(10)?,
        last_attempt: row.get(11)?,
        unresolved: row.get(12)?,
        created_at: stamp_from_column(row, 13)?,
        updated_at: stamp_from_column(row, 14)?,
        first_seq: row.get(15)?,
        last_seq: row.get(16)?,
        contradictions: row.get(17)?,
        settled_attempt: row.get(18)?,
        executed: row.get(19)?,
    })
}

pub(crate) fn load(
    tx: &Transaction<'_>,
    key: &OpKey,
) -> Result<Option<OperationRecord>, LedgerError> {
    Ok(tx
        .query_row(
            &format!(
                "SELECT {} FROM operations WHERE op_id = ?1 AND host = ?2",
                projection::COLUMNS
            ),
            params![key.op_id, key.host],
            from_row,
        )
        .optional()?)
}

/// Writes one row: an upsert, not `INSERT OR REPLACE`, so a change to an existing
/// operation is an UPDATE and the `shared_intents` triggers see its row before and after
/// (an operation that starts counts once toward its intent's executions).
pub(crate) fn store(tx: &Transaction<'_>, r: &OperationRecord) -> Result<(), LedgerError> {
    let mut stmt = tx.prepare_cached(UPSERT.get_or_init(|| {
        let set = projection::COLUMNS
            .split(", ")
            .filter(|c| !["op_id", "host"].contains(c))
            .map(|c| format!("{c} = excluded.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "INSERT INTO operations ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)
             ON CONFLICT (op_id, host) DO UPDATE SET {set}",
            projection::COLUMNS
        )
    }))?;
    stmt.execute(params![
        r.op_id,
        r.host,
        r.family.as_str(),
        r.display,
        r.fingerprint,
        r.rule,
        r.session,
        r.state.to_string(),
        r.verdict.map(Verdict::as_str),
        r.exit_code,
        r.attempts,
        r.last_attempt,
        r.unresolved,
        stored_stamp(&r.created_at),
        stored_stamp(&r.updated_at),
        r.first_seq,
        r.last_seq,
        r.contradictions,
        r.settled_attempt,
        r.executed,
    ])?;
    Ok(())
}

static UPSERT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// How SQLite stores a stamp opmark formatted: its micros since the epoch (8 bytes
/// instead of 27), or, for a stamp that would not come back byte for byte, its text.
pub(crate) fn stored_stamp(at: &str) -> rusqlite::types::Value {
    match codec::at_to_micros(at) {
        Some(m) => rusqlite::types::Value::Integer(m),
        None => rusqlite::types::Value::Text(at.to_owned()),
    }
}

/// The stamp a column written by [`stored_stamp`] holds.
pub(crate) fn stamp_from_column(row: &rusqlite::Row<'_>, col: usize) -> rusqlite::Result<String> {
    let v = row.get_ref(col)?;
    use rusqlite::types::{FromSqlError, ValueRef};
    match v {
        ValueRef::Integer(m) => codec::micros_to_at(m).ok_or(FromSqlError::OutOfRange(m)),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(str::to_owned)
            .map_err(|e| FromSqlError::Other(Box::new(e))),
        _ => Err(FromSqlError::InvalidType),
    }
    .map_err(|e| rusqlite::Error::FromSqlConversionFailure(col, v.data_type(), Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operations_stamp_is_stored_as_micros_unless_it_would_not_come_back() {
        use rusqlite::types::Value;
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let back = |v: &Value| conn.query_row("SELECT ?1", [v], |r| stamp_from_column(r, 0));
        let at = "2026-12-01T17:25:10.123456Z";
        let stored = stored_stamp(at);
        let Value::Integer(m) = stored else {
            panic!("a canonical stamp is stored as an integer")
        };
        assert_eq!(back(&stored).unwrap(), at);
        let odd = "2026-12-01T17:25:10Z";
        assert_eq!(stored_stamp(odd), Value::Text(odd.to_owned()));
        assert_eq!(back(&stored_stamp(odd)).unwrap(), odd);
        assert!(back(&Value::Null).is_err());
        assert_eq!(codec::stamp_bound(at), m);
        assert_eq!(codec::stamp_bound(""), i64::MIN);
    }
}
