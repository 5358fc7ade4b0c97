//! The SQLite side of `ledger archive` (see [`crate::ledger::archive`]): the archiving
//! transaction of a SQLite ledger, its recorded cut, and the archive file itself, a
//! SQLite file whichever backend wrote it.

use std::cell::RefCell;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::ledger::archive::{
    archived_before, facts, nothing_to_archive, refuse_existing, seal, ArchiveReport,
};
use crate::ledger::chain::{self, Row};
use crate::ledger::cut::{cut_mac, Cut};
use crate::ledger::error::LedgerError;
use crate::ledger::fingerprint::InstallationKey;
use crate::ledger::meta;

use super::atoms::AtomCache;
use super::private_file::create_private;
use super::rows;

fn read_meta(conn: &Connection, name: &str) -> Result<Option<String>, LedgerError> {
    Ok(conn
        .query_row(
            "SELECT value FROM meta WHERE name = ?1",
            params![name],
            |r| r.get(0),
        )
        .optional()?)
}

/// The recorded cut and its MAC, as stored (`None` when the ledger was never archived).
pub(crate) fn read_cut(conn: &Connection) -> Result<Option<(Cut, Option<String>)>, LedgerError> {
    meta::archive_cut(&mut |name| read_meta(conn, name))
}

/// The archived events' counts and their MAC, as stored.
pub(crate) fn read_counts(
    conn: &Connection,
) -> Result<Option<(String, Option<String>)>, LedgerError> {
    meta::archive_counts(&mut |name| read_meta(conn, name))
}

/// Rows of an archive file (the text layout of events).
pub(crate) fn rows(conn: &Connection, sql: &str, arg: u64) -> Result<Vec<Row>, LedgerError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map(params![arg], rows::chain_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

const SELECT: &str = rows::CHAIN_ROW_SELECT;

/// Moves the settled prefix of the chain recorded before `cutoff` into the new file
/// `file`; see the module doc.
pub(crate) fn archive(
    conn: &mut Connection,
    atoms: &RefCell<AtomCache>,
    key: &InstallationKey,
    first_seq_at_cutoff: u64,
    file: &Path,
) -> Result<ArchiveReport, LedgerError> {
    refuse_existing(file)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some((cut, _)) = read_cut(&tx)? {
        return Err(archived_before(cut.seq));
    }
    // Lower the cut until no operation straddles it and none below it is unresolved.
    let mut cut = first_seq_at_cutoff.saturating_sub(1);
    loop {
        let lower: Option<u64> = tx.query_row(
            "SELECT MIN(first_seq) FROM operations WHERE first_seq <= ?1 AND (last_seq > ?1 OR unresolved = 1)",
            params![cut],
            |r| r.get(0),
        )?;
        match lower {
            Some(first) if first <= cut => cut = first - 1,
            _ => break,
        }
    }
    // Events of keys without a projection row (e.g. a fence of an op id never intended
    // here) must not straddle either.
    loop {
        let lower: Option<u64> = tx.query_row(
            "SELECT MIN(e.seq) FROM events e JOIN op_keys k ON k.id = e.op WHERE e.seq <= ?1 AND k.last_seq > ?1",
            params![cut],
            |r| r.get(0),
        )?;
        match lower {
            Some(first) if first <= cut => cut = first - 1,
            _ => break,
        }
    }
    if cut == 0 {
        return Err(nothing_to_archive());
    }
    let mut archived = rows::rows_where(
        &tx,
        atoms,
        "WHERE e.seq <= ?1 ORDER BY e.seq",
        params![cut as i64],
    )?;
    let (keyed_from, keyed_from_mac) = super::binding::keyed_from(&tx)?;
    // The archive stands alone: every hash in full (the ledger keeps tags).
    chain::complete(&mut archived, key, keyed_from, chain::GENESIS);
    let sealed = seal(&archived, key, keyed_from, keyed_from_mac.as_deref())?;
    write_file(file, key, &sealed.cut, &archived)?;
    let cut = &sealed.cut;
    tx.execute("DELETE FROM events WHERE seq <= ?1", params![cut.seq])?;
    // The first event left implied its predecessor's hash from the row just deleted.
    tx.execute(
        "UPDATE events SET prev_hash = ?1 WHERE seq = ?2 AND prev_hash IS NULL",
        params![rows::hash_value(&cut.hash), cut.seq as i64 + 1],
    )?;
    tx.execute(
        "DELETE FROM operations WHERE last_seq <= ?1",
        params![cut.seq],
    )?;
    // The delete trigger took their executions off; the strictest family is recounted.
    tx.execute(
        &crate::ledger::store::recount_shared_intents(&super::dialect::DIALECT),
        [],
    )?;
    // Their keys stay (events refer to keys by number), without events here.
    tx.execute(
        "UPDATE op_keys SET last_seq = NULL WHERE last_seq <= ?1",
        params![cut.seq],
    )?;
    for (name, value) in facts(key, &sealed) {
        tx.execute(
            "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            params![name, value],
        )?;
    }
    tx.commit()?;
    // Retention is about space: give the moved events' pages back to the filesystem.
    conn.execute_batch("VACUUM")?;
    Ok(sealed.report)
}

/// Writes the archive: the events as the ledger stored them, and the cut.
pub(crate) fn write_file(
    file: &Path,
    key: &InstallationKey,
    cut: &Cut,
    archived: &[Row],
) -> Result<(), LedgerError> {
    create_private(file)?;
    let mut conn = Connection::open(file)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let tx = conn.transaction()?;
    tx.execute_batch(
        "CREATE TABLE events (
            seq INTEGER PRIMARY KEY, op_id TEXT NOT NULL, host TEXT NOT NULL, at TEXT NOT NULL,
            kind TEXT NOT NULL, payload TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
         CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;",
    )?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO events (seq, op_id, host, at, kind, payload, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for r in archived {
            insert.execute(params![
                r.seq,
                r.op_id,
                r.host,
                r.at,
                r.kind,
                r.payload,
                r.prev_hash,
                r.hash
            ])?;
        }
    }
    for (name, value) in [
        ("archive_cut", format!("{} {}", cut.seq, cut.hash)),
        ("archive_cut_mac", cut_mac(key, cut)),
        ("key_check", key.check_value()),
    ] {
        tx.execute(
            "INSERT INTO meta (name, value) VALUES (?1, ?2)",
            params![name, value],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Reads the archive `file`: its events and the cut it recorded, refusing a file that is
/// missing or not an archive of the ledger keyed by `key`.
pub(crate) fn read_file(
    file: &Path,
    key: &InstallationKey,
) -> Result<(Vec<Row>, Option<Cut>), LedgerError> {
    if !file.is_file() {
        return Err(LedgerError::Invalid {
            message: format!(
                "no archive at {}; give the file `opmark ledger archive` wrote",
                file.display()
            ),
        });
    }
    let conn = Connection::open_with_flags(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    if read_meta(&conn, "key_check")?.as_deref() != Some(key.check_value().as_str()) {
        return Err(LedgerError::Invalid {
            message: format!(
                "{} is not an archive of this ledger (its key check differs, or it has none)",
                file.display()
            ),
        });
    }
    let rows = rows(
        &conn,
        &format!("{SELECT} WHERE seq <= ?1 ORDER BY seq"),
        u64::MAX >> 1,
    )?;
    let recorded = read_cut(&conn)?.map(|(c, _)| c);
    Ok((rows, recorded))
}
