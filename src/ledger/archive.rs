//! Retention without breaking the chain (issue 30): `opmark ledger archive --before D
//! FILE` moves the oldest settled stretch of the chain into an archive file, and the
//! ledger keeps the cut: the last archived event's seq and hash, MACed under the
//! installation key, and what the archived events had counted. `audit verify` then
//! verifies the ledger from the cut, and with `--archive FILE` the archive up to the cut
//! first, so the two together are checked as the one chain they were.
//!
//! The cut is a prefix of the chain (the chain is one sequence: a hole in it would be
//! indistinguishable from a deletion), ending before the first event of any operation that
//! is unresolved or still had events after the cut: no operation is ever split, and an
//! unresolved one is never archived.
//!
//! Both backends: each finds the cut and removes what was archived in its own transaction
//! (SQLite's `BEGIN IMMEDIATE`, PostgreSQL's lock on the head row, so no append
//! interleaves); what is backend-neutral is here: [`seal`] checks the events to archive
//! and writes the file (a SQLite file on either backend, so one format and one
//! [`verify_file`]), [`facts`] is what the ledger keeps.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::chain::{self, Row};
use super::fingerprint::InstallationKey;
use super::LedgerError;

/// Where a ledger was cut: the last archived event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cut {
    pub seq: u64,
    pub hash: String,
}

/// The MAC of a cut.
pub(crate) fn cut_mac(key: &InstallationKey, cut: &Cut) -> String {
    key.mac(
        "opmark-archive-cut",
        &[cut.seq.to_string().as_bytes(), cut.hash.as_bytes()],
    )
}

/// The MAC of the archived events' counts (as JSON).
pub(crate) fn counts_mac(key: &InstallationKey, json: &str) -> String {
    key.mac("opmark-archive-counts", &[json.as_bytes()])
}

/// What `ledger archive` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArchiveReport {
    /// The last archived event.
    pub cut: u64,
    /// Events moved into the archive.
    pub events: u64,
    /// Operations moved.
    pub operations: u64,
}

fn meta(conn: &Connection, name: &str) -> Result<Option<String>, LedgerError> {
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
    let Some(value) = meta(conn, "archive_cut")? else {
        return Ok(None);
    };
    Ok(Some((parse_cut(&value), meta(conn, "archive_cut_mac")?)))
}

/// A cut as the `archive_cut` meta row stores it (`SEQ HASH`); an unreadable one is seq 0,
/// which no MAC matches.
pub(crate) fn parse_cut(value: &str) -> Cut {
    value
        .split_once(' ')
        .and_then(|(s, h)| {
            Some(Cut {
                seq: s.parse().ok()?,
                hash: h.to_owned(),
            })
        })
        .unwrap_or(Cut {
            seq: 0,
            hash: String::new(),
        })
}

/// The archived events' counts and their MAC, as stored.
pub(crate) fn read_counts(
    conn: &Connection,
) -> Result<Option<(String, Option<String>)>, LedgerError> {
    match meta(conn, "archive_counts")? {
        Some(json) => Ok(Some((json, meta(conn, "archive_counts_mac")?))),
        None => Ok(None),
    }
}

/// Rows of an archive file (the text layout of events).
pub(crate) fn rows(conn: &Connection, sql: &str, arg: u64) -> Result<Vec<Row>, LedgerError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map(params![arg], super::sqlite::chain_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

const SELECT: &str = super::sqlite::CHAIN_ROW_SELECT;

/// Moves the settled prefix of the chain recorded before `cutoff` into the new file
/// `file`; see the module doc.
pub(crate) fn archive(
    conn: &mut Connection,
    atoms: &RefCell<super::sqlite::AtomCache>,
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
    let mut archived = super::sqlite::rows_where(
        &tx,
        atoms,
        "WHERE e.seq <= ?1 ORDER BY e.seq",
        params![cut as i64],
    )?;
    let (keyed_from, keyed_from_mac) = super::binding::keyed_from(&tx)?;
    // The archive stands alone: every hash in full (the ledger keeps tags).
    chain::complete(&mut archived, key, keyed_from, chain::GENESIS);
    let sealed = seal(&archived, key, keyed_from, keyed_from_mac.as_deref(), file)?;
    let cut = &sealed.cut;
    tx.execute("DELETE FROM events WHERE seq <= ?1", params![cut.seq])?;
    // The first event left implied its predecessor's hash from the row just deleted.
    tx.execute(
        "UPDATE events SET prev_hash = ?1 WHERE seq = ?2 AND prev_hash IS NULL",
        params![super::sqlite::hash_value(&cut.hash), cut.seq as i64 + 1],
    )?;
    tx.execute(
        "DELETE FROM operations WHERE last_seq <= ?1",
        params![cut.seq],
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

/// The refusal to overwrite: an archive is written to a new file only.
pub(crate) fn refuse_existing(file: &Path) -> Result<(), LedgerError> {
    if file.exists() {
        return Err(LedgerError::Invalid {
            message: format!(
                "{} already exists; an archive is written to a new file only (choose another path); nothing was archived",
                file.display()
            ),
        });
    }
    Ok(())
}

/// The refusal to archive a ledger a second time.
pub(crate) fn archived_before(cut: u64) -> LedgerError {
    LedgerError::Invalid {
        message: format!(
            "this ledger was archived before (through event #{cut}); archiving it again is not supported yet: keep that archive, nothing was archived"
        ),
    }
}

/// The refusal when the cut falls before the first event.
pub(crate) fn nothing_to_archive() -> LedgerError {
    LedgerError::Invalid {
        message: "nothing to archive: no settled operation was finished before that time (unresolved operations and those still active are never archived)".to_owned(),
    }
}

/// Events checked and written to an archive, and what the ledger must keep of them.
#[derive(Debug)]
pub(crate) struct Sealed {
    /// The last archived event.
    pub cut: Cut,
    /// What the archived events counted (`append::count`), as JSON.
    pub counts_json: String,
    /// What `ledger archive` reports.
    pub report: ArchiveReport,
}

/// Checks `archived` (the chain from its first event through the cut, read in the
/// backend's archiving transaction) as `audit verify` would, replays it for its counts,
/// and writes it to the new file `file`. Nothing is written when a check fails.
pub(crate) fn seal(
    archived: &[Row],
    key: &InstallationKey,
    keyed_from: u64,
    keyed_from_mac: Option<&str>,
    file: &Path,
) -> Result<Sealed, LedgerError> {
    if keyed_from_mac != Some(chain::keyed_from_mac(key, keyed_from).as_str()) {
        return Err(LedgerError::Invalid {
            message: "the record of where the keyed chain starts was edited outside opmark (its MAC does not match); nothing was archived: keep the ledger as evidence".to_owned(),
        });
    }
    let cut = archived.last().map_or(0, |r| r.seq);
    let last = archived.last().map(|r| r.hash.clone()).unwrap_or_default();
    let head = chain::Head {
        seq: cut,
        hash: last.clone(),
        mac: Some(chain::head_mac(key, cut, &last)),
    };
    let report = chain::verify(archived, Some(head), key, keyed_from);
    if let Some(b) = report.first_break {
        return Err(LedgerError::Invalid {
            message: format!(
                "the events to archive do not verify (event #{}: {}); nothing was archived: keep the ledger as evidence",
                b.seq, b.problem
            ),
        });
    }
    let (replayed, counts) =
        super::verify::replay_counting(archived).map_err(|m| LedgerError::Invalid {
            message: format!(
                "the events to archive cannot be replayed ({}: {}); nothing was archived",
                m.op_id, m.problem
            ),
        })?;
    let cut = Cut {
        seq: cut,
        hash: last,
    };
    write_file(file, key, &cut, archived)?;
    Ok(Sealed {
        report: ArchiveReport {
            cut: cut.seq,
            events: archived.len() as u64,
            operations: replayed.len() as u64,
        },
        cut,
        counts_json: serde_json::to_string(&counts).expect("counts serialize"),
    })
}

/// The meta rows the ledger keeps of an archive: the cut and the archived counts, each
/// with its MAC.
pub(crate) fn facts(key: &InstallationKey, sealed: &Sealed) -> [(&'static str, String); 4] {
    let cut = &sealed.cut;
    [
        ("archive_cut", format!("{} {}", cut.seq, cut.hash)),
        ("archive_cut_mac", cut_mac(key, cut)),
        ("archive_counts_mac", counts_mac(key, &sealed.counts_json)),
        ("archive_counts", sealed.counts_json.clone()),
    ]
}

/// Writes the archive: the events as the ledger stored them, and the cut.
fn write_file(
    file: &Path,
    key: &InstallationKey,
    cut: &Cut,
    archived: &[Row],
) -> Result<(), LedgerError> {
    super::sqlite::create_private(file)?;
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

/// Verifies the archive `file` against the ledger's recorded `cut`: same key, same cut,
/// and its events a whole chain from the first event to the cut.
pub(crate) fn verify_file(
    file: &Path,
    key: &InstallationKey,
    cut: &Cut,
    keyed_from: u64,
) -> Result<chain::ChainReport, LedgerError> {
    if !file.is_file() {
        return Err(LedgerError::Invalid {
            message: format!(
                "no archive at {}; give the file `opmark ledger archive` wrote",
                file.display()
            ),
        });
    }
    let conn = Connection::open_with_flags(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    if meta(&conn, "key_check")?.as_deref() != Some(key.check_value().as_str()) {
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
    let recorded = read_cut(&conn)?;
    let head = chain::Head {
        seq: cut.seq,
        hash: cut.hash.clone(),
        mac: Some(chain::head_mac(key, cut.seq, &cut.hash)),
    };
    let mut report = chain::verify(&rows, Some(head), key, keyed_from);
    if report.first_break.is_none() && recorded.as_ref().map(|(c, _)| c) != Some(cut) {
        report.first_break = Some(chain::ChainBreak {
            seq: cut.seq,
            problem: "the archive's record of its cut differs from the ledger's: it is not the archive of this cut".to_owned(),
        });
    }
    Ok(report)
}

/// The archived counts, when their MAC holds.
pub(crate) fn archived_counts(
    key: &InstallationKey,
    stored: Option<(String, Option<String>)>,
) -> Option<BTreeMap<String, i64>> {
    let (json, mac) = stored?;
    (mac.as_deref() == Some(counts_mac(key, &json).as_str()))
        .then(|| serde_json::from_str(&json).ok())
        .flatten()
}
