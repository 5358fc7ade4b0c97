//! How an event row is stored in a SQLite ledger and read back (docs/ledger.md#storage):
//! the text layout of old ledgers and archive files ([`chain_row`]), today's compact
//! layout ([`insert_row`], [`read_rows`]) and schema 4's step between them. Below the
//! store, the archive and the migrations alike, so it names none of them.

use std::cell::RefCell;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use super::atoms::{AtomCache, AtomsOf};
use crate::ledger::chain;
use crate::ledger::codec;
use crate::ledger::error::LedgerError;
use crate::ledger::op_key::OpKey;

/// The columns [`chain_row`] reads, in its order: the text layout of events (ledgers
/// before schema 5, and archive files).
pub(crate) const CHAIN_ROW_SELECT: &str =
    "SELECT seq, prev_hash, hash, op_id, host, at, kind, payload FROM events";

/// One event row as the chain checks it, from a [`CHAIN_ROW_SELECT`] query of the text
/// layout.
pub(crate) fn chain_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<chain::Row> {
    Ok(chain::Row {
        seq: r.get(0)?,
        prev_hash: r.get(1)?,
        hash: r.get(2)?,
        op_id: r.get(3)?,
        host: r.get(4)?,
        at: r.get(5)?,
        kind: r.get(6)?,
        payload: r.get(7)?,
    })
}

/// The `op_keys` id of `key`, made when `create` and missing.
fn op_ref(conn: &Connection, key: &OpKey, create: bool) -> Result<Option<i64>, LedgerError> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT id FROM op_keys WHERE op_id = ?1 AND host = ?2")?
        .query_row(params![key.op_id, key.host], |r| r.get(0))
        .optional()?;
    if found.is_some() || !create {
        return Ok(found);
    }
    conn.prepare_cached("INSERT INTO op_keys (op_id, host) VALUES (?1, ?2)")?
        .execute(params![key.op_id, key.host])?;
    Ok(Some(conn.last_insert_rowid()))
}

/// A hash as stored: 32 bytes when it is a SHA-256 in lowercase hex, else its text.
pub(crate) fn hash_value(hash: &str) -> Value {
    match hex::decode(hash) {
        Ok(b) if b.len() == 32 && hex::encode(&b) == hash => Value::Blob(b),
        _ => Value::Text(hash.to_owned()),
    }
}

/// A stored hash as hex text: bytes (a whole hash or its tag) in hex, text as it is.
pub(crate) fn hash_text(v: Value) -> String {
    hash_text_ref((&v).into())
}

fn hash_text_ref(v: rusqlite::types::ValueRef<'_>) -> String {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Blob(b) => chain::hex_of(b),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        _ => String::new(),
    }
}

/// The `kind` a stored payload text implies: its first key's value when that key is
/// `kind` (as serde writes the tag).
fn implied_kind(payload: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Tag {
        kind: String,
    }
    payload.strip_prefix("{\"kind\":")?;
    serde_json::from_str::<Tag>(payload).ok().map(|t| t.kind)
}

/// Stores one event row in the layout of schemas 5 and 6 (the op by reference, the time
/// as micros, the payload transcoded, the hash as 32 bytes, the predecessor hash and kind
/// only when they are not the stored predecessor's hash and the payload's tag). Frozen:
/// only migration 5's step writes it (from the text layout), before migration 7 turns
/// those rows into today's layout; [`insert_row`] writes today's.
fn insert_row_v5(
    conn: &Connection,
    atoms: &mut AtomsOf<'_>,
    r: &chain::Row,
) -> Result<(), LedgerError> {
    let op = op_ref(conn, &OpKey::new(r.op_id.clone(), r.host.clone()), true)?.expect("created");
    let at = match codec::at_to_micros(&r.at) {
        Some(m) => Value::Integer(m),
        None => Value::Text(r.at.clone()),
    };
    let (body, kind) = stored_payload(atoms, r)?;
    let before: Option<Value> = conn
        .prepare_cached("SELECT hash FROM events WHERE seq = ?1")?
        .query_row(params![r.seq.wrapping_sub(1) as i64], |row| row.get(0))
        .optional()?;
    let implied = match before {
        Some(h) => Some(hash_text(h)),
        None if r.seq == 1 => Some(chain::GENESIS.to_owned()),
        None => None,
    };
    let prev = if implied.as_deref() == Some(r.prev_hash.as_str()) {
        Value::Null
    } else {
        hash_value(&r.prev_hash)
    };
    conn.prepare_cached(
        "INSERT INTO events (seq, op, at, payload, hash, prev_hash, kind) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![r.seq as i64, op, at, body, hash_value(&r.hash), prev, kind])?;
    Ok(())
}

/// Stores one event row in today's layout (schema 7, docs/ledger.md#storage), losslessly
/// for what the chain covers:
/// - the op by reference (`op_keys`), and a back link to the op's previous event
///   (`back`, the difference of their seqs), so one operation's events are found without
///   an index over all events;
/// - the time as micros after the op's first event's (`op_keys.base`), or as text when
///   it is not a stamp opmark writes;
/// - the payload transcoded ([`codec`]), the kind only when the payload's tag is not it;
/// - the hash as its tag ([`chain::KEYED_TAG`] or [`chain::PLAIN_TAG`] hex digits as
///   bytes) and the predecessor hash only when it is not implied (the hash of event
///   `seq - 1`, which the tag stored for that event starts).
pub(crate) fn insert_row(
    conn: &Connection,
    atoms: &mut AtomsOf<'_>,
    r: &chain::Row,
    keyed: bool,
) -> Result<(), LedgerError> {
    let (op, base, last) = op_slot(conn, &OpKey::new(r.op_id.clone(), r.host.clone()))?;
    let at = match (codec::at_to_micros(&r.at), base) {
        (Some(m), Some(b)) => Value::Integer(m - b),
        (Some(m), None) => {
            conn.prepare_cached("UPDATE op_keys SET base = ?1 WHERE id = ?2")?
                .execute(params![m, op])?;
            Value::Integer(0)
        }
        (None, _) => Value::Text(r.at.clone()),
    };
    let (body, kind) = stored_payload(atoms, r)?;
    let implied = if r.seq == 1 {
        r.prev_hash == chain::GENESIS
    } else {
        let before: Option<Value> = conn
            .prepare_cached("SELECT hash FROM events WHERE seq = ?1")?
            .query_row(params![r.seq as i64 - 1], |row| row.get(0))
            .optional()?;
        before.map(hash_text).is_some_and(|tag| {
            tag == r.prev_hash
                || (matches!(tag.len(), chain::KEYED_TAG | chain::PLAIN_TAG)
                    && r.prev_hash.starts_with(&tag))
        })
    };
    let prev = if implied {
        Value::Null
    } else {
        hash_value(&r.prev_hash)
    };
    let back = last.map(|l| r.seq as i64 - l);
    conn.prepare_cached(
        "INSERT INTO events (seq, op, back, at, payload, hash, prev_hash, kind) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        r.seq as i64,
        op,
        back,
        at,
        body,
        stored_hash(&r.hash, r.seq, keyed),
        prev,
        kind
    ])?;
    conn.prepare_cached("UPDATE op_keys SET last_seq = ?1 WHERE id = ?2")?
        .execute(params![r.seq as i64, op])?;
    Ok(())
}

/// What is stored of `r`'s payload (compact when it round-trips, else its text) and of
/// its kind (only when the payload's tag is not it); the same in every layout since 5.
fn stored_payload(
    atoms: &mut AtomsOf<'_>,
    r: &chain::Row,
) -> Result<(Value, Option<String>), LedgerError> {
    let (body, kind) = match codec::encode(&r.payload, atoms)? {
        Some(b) => {
            let implied = codec::decode(&b, atoms)?.ok().and_then(|(_, k)| k);
            (Value::Blob(b), implied)
        }
        None => (Value::Text(r.payload.clone()), implied_kind(&r.payload)),
    };
    Ok((
        body,
        (kind.as_deref() != Some(r.kind.as_str())).then(|| r.kind.clone()),
    ))
}

/// What is stored of event `seq`'s `hash` when it is a SHA-256 in lowercase hex: all 32
/// bytes on an anchor ([`chain::ANCHOR`]), else its tag ([`chain::KEYED_TAG`] or
/// [`chain::PLAIN_TAG`] hex digits as bytes); any other hash as its text.
fn stored_hash(hash: &str, seq: u64, keyed: bool) -> Value {
    let digits = match (seq.is_multiple_of(chain::ANCHOR), keyed) {
        (true, _) => 64,
        (false, true) => chain::KEYED_TAG,
        (false, false) => chain::PLAIN_TAG,
    };
    match hash_value(hash) {
        Value::Blob(b) => Value::Blob(b[..digits / 2].to_vec()),
        other => other,
    }
}

/// The `op_keys` row of `key` (made when missing): its id, the base of its times and its
/// last event's seq.
fn op_slot(conn: &Connection, key: &OpKey) -> Result<(i64, Option<i64>, Option<i64>), LedgerError> {
    let found = conn
        .prepare_cached("SELECT id, base, last_seq FROM op_keys WHERE op_id = ?1 AND host = ?2")?
        .query_row(params![key.op_id, key.host], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    if let Some(slot) = found {
        return Ok(slot);
    }
    conn.prepare_cached("INSERT INTO op_keys (op_id, host) VALUES (?1, ?2)")?
        .execute(params![key.op_id, key.host])?;
    Ok((conn.last_insert_rowid(), None, None))
}

/// The columns [`read_rows`] reads, in its order; `e` is `events`, `k` is `op_keys`.
pub(crate) const ROW_SELECT: &str =
    "SELECT e.seq, k.op_id, k.host, e.at, k.base, e.payload, e.hash, e.prev_hash, e.kind, e.back FROM events e JOIN op_keys k ON k.id = e.op";

/// Decodes the rows of a [`ROW_SELECT`] query with `tail` (`WHERE …`, `ORDER BY e.seq`)
/// into what the chain covers, calling `each` on each in order. What the layout leaves
/// implied stays so ([`chain::Row`]: an empty `prev_hash`, a tag for `hash`).
pub(crate) fn read_rows(
    conn: &Connection,
    atoms: &mut AtomsOf<'_>,
    tail: &str,
    args: impl rusqlite::Params,
    each: impl FnMut(chain::Row) -> Result<(), LedgerError>,
) -> Result<(), LedgerError> {
    read_rows_decoding(conn, atoms, tail, args, Payloads::All, each)
}

/// Which rows' payloads a read decodes. A window's counts (`stats --since`) need every
/// event's kind and few events' payloads, and decoding them all was most of its time.
#[derive(Clone, Copy)]
pub(crate) enum Payloads<'k> {
    All,
    /// Only the payloads of these kinds; other rows come with an empty payload.
    Of(&'k [&'k str]),
}

/// [`read_rows`], decoding only the payloads `payloads` names.
pub(crate) fn read_rows_decoding(
    conn: &Connection,
    atoms: &mut AtomsOf<'_>,
    tail: &str,
    args: impl rusqlite::Params,
    payloads: Payloads<'_>,
    mut each: impl FnMut(chain::Row) -> Result<(), LedgerError>,
) -> Result<(), LedgerError> {
    let mut stmt = conn.prepare_cached(&format!("{ROW_SELECT} {tail}"))?;
    let mut rows = stmt.query(args)?;
    while let Some(r) = rows.next()? {
        let mut row = chain::Row::default();
        decode_row_into(r, atoms, &mut row, payloads)?;
        each(row)?;
    }
    Ok(())
}

/// One row of a [`ROW_SELECT`] query, and its back link (`back`).
fn decode_row(
    r: &rusqlite::Row<'_>,
    atoms: &mut AtomsOf<'_>,
) -> Result<(chain::Row, Option<i64>), LedgerError> {
    let mut row = chain::Row::default();
    let back = decode_row_into(r, atoms, &mut row, Payloads::All)?;
    Ok((row, back))
}

/// [`decode_row`] into a row whose texts are reused (their buffers kept, their contents
/// replaced): `audit verify --full` decodes every event, and seven fresh texts per event
/// made the allocator a fifth of its time.
pub(crate) fn decode_row_into(
    r: &rusqlite::Row<'_>,
    atoms: &mut dyn codec::Atoms,
    row: &mut chain::Row,
    payloads: Payloads<'_>,
) -> Result<Option<i64>, LedgerError> {
    use rusqlite::types::ValueRef;
    fn put_text(v: ValueRef<'_>, out: &mut String) {
        out.clear();
        if let ValueRef::Text(t) = v {
            out.push_str(&String::from_utf8_lossy(t));
        }
    }
    fn put_hash(v: ValueRef<'_>, out: &mut String) {
        out.clear();
        match v {
            ValueRef::Blob(b) => chain::push_hex(b, out),
            ValueRef::Text(t) => out.push_str(&String::from_utf8_lossy(t)),
            _ => {}
        }
    }
    // A column that must hold text: copied when it does, else the typed read's error.
    fn put_required(r: &rusqlite::Row<'_>, i: usize, out: &mut String) -> Result<(), LedgerError> {
        out.clear();
        match r.get_ref(i)? {
            ValueRef::Text(t) if std::str::from_utf8(t).is_ok() => {
                out.push_str(std::str::from_utf8(t).expect("checked"))
            }
            _ => out.push_str(&r.get::<_, String>(i)?),
        }
        Ok(())
    }
    row.seq = r.get::<_, i64>(0)? as u64;
    put_required(r, 1, &mut row.op_id)?;
    put_required(r, 2, &mut row.host)?;
    row.at.clear();
    match (r.get_ref(3)?, r.get::<_, Option<i64>>(4)?) {
        (ValueRef::Integer(m), Some(base)) => {
            codec::push_at(base.saturating_add(m), &mut row.at);
        }
        (v @ ValueRef::Text(_), _) => put_text(v, &mut row.at),
        _ => {}
    }
    put_hash(r.get_ref(6)?, &mut row.hash);
    put_hash(r.get_ref(7)?, &mut row.prev_hash);
    let back = r.get::<_, Option<i64>>(9)?;
    if let Payloads::Of(kinds) = payloads {
        // The kind first (stored, or the body's first key), the payload only if wanted.
        let kind = match r.get_ref(8)? {
            ValueRef::Null => match r.get_ref(5)? {
                ValueRef::Blob(b) => codec::first_kind(b, atoms)?,
                ValueRef::Text(t) => implied_kind(&String::from_utf8_lossy(t)),
                _ => None,
            },
            _ => Some(r.get::<_, String>(8)?),
        };
        if !kind.as_deref().is_some_and(|k| kinds.contains(&k)) {
            row.kind.clear();
            row.kind.push_str(kind.as_deref().unwrap_or_default());
            row.payload.clear();
            return Ok(back);
        }
    }
    // Decoded where SQLite holds the blob, not copied out first.
    let implied = match r.get_ref(5)? {
        ValueRef::Blob(b) => match codec::decode_into(b, atoms, &mut row.payload, &mut row.kind)? {
            Ok(found) => found,
            Err(why) => {
                // Not what opmark wrote: the hash check names the event.
                row.payload.clear();
                row.payload.push_str("\u{0}undecodable body: ");
                row.payload.push_str(why);
                false
            }
        },
        v @ ValueRef::Text(_) => {
            put_text(v, &mut row.payload);
            row.kind.clear();
            match implied_kind(&row.payload) {
                Some(k) => {
                    row.kind.push_str(&k);
                    true
                }
                None => false,
            }
        }
        _ => {
            row.payload.clear();
            row.payload.push_str("\u{0}undecodable body");
            false
        }
    };
    match r.get_ref(8)? {
        ValueRef::Null => {
            if !implied {
                row.kind.clear();
            }
        }
        _ => put_required(r, 8, &mut row.kind)?,
    }
    Ok(back)
}

/// The events of one operation after `after`, in order, found by following the back
/// links from its last event (O(its events), no index over all events).
pub(crate) fn op_rows(
    conn: &Connection,
    atoms: &mut AtomsOf<'_>,
    key: &OpKey,
    after: u64,
) -> Result<Vec<chain::Row>, LedgerError> {
    let last: Option<Option<i64>> = conn
        .prepare_cached("SELECT last_seq FROM op_keys WHERE op_id = ?1 AND host = ?2")?
        .query_row(params![key.op_id, key.host], |r| r.get(0))
        .optional()?;
    let mut out = Vec::new();
    let mut next = last.flatten();
    let mut stmt = conn.prepare_cached(&format!("{ROW_SELECT} WHERE e.seq = ?1"))?;
    while let Some(seq) = next.filter(|s| *s > after as i64) {
        let mut rows = stmt.query(params![seq])?;
        let Some(r) = rows.next()? else {
            // A link to a deleted event: what is left of the history (audit verify names
            // the deletion).
            break;
        };
        let (row, back) = decode_row(r, atoms)?;
        if row.op_id != key.op_id || row.host != key.host {
            // Not this operation's (an edit outside opmark): stop rather than mix two.
            break;
        }
        next = back.filter(|b| *b > 0).map(|b| seq - b);
        out.push(row);
    }
    out.reverse();
    Ok(out)
}

/// [`read_rows`] collected.
pub(crate) fn rows_where(
    conn: &Connection,
    cache: &RefCell<AtomCache>,
    tail: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<chain::Row>, LedgerError> {
    let mut out = Vec::new();
    read_rows(
        conn,
        &mut AtomsOf::reading(conn, cache),
        tail,
        args,
        |row| {
            out.push(row);
            Ok(())
        },
    )?;
    Ok(out)
}

/// Schema 4's step in Rust: every event of the old text layout (`events_v3`) into the
/// compact one, unchanged in what the chain covers. Rows are read in chain order, so an
/// event whose stored predecessor hash is its predecessor's stored hash keeps it implied;
/// any other (an edit, a deletion) keeps it stored, so `audit verify` still finds it.
pub(crate) fn migrate_to_compact(tx: &Transaction<'_>) -> Result<(), LedgerError> {
    let cache = RefCell::new(AtomCache::default());
    let mut atoms = AtomsOf::reading(tx, &cache);
    let mut stmt = tx.prepare(
        "SELECT seq, prev_hash, hash, op_id, host, at, kind, payload FROM events_v3 ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        insert_row_v5(tx, &mut atoms, &chain_row(r)?)?;
    }
    Ok(())
}
