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
//! (the file they go to is a SQLite file on either backend, so one format, written and
//! read by `store::sqlite::archive`), [`verify_rows`] checks them back, [`facts`] is what
//! the ledger keeps.

use std::path::Path;

use super::chain::{self, Row};
use super::cut::{counts_mac, cut_mac, Cut};
use super::error::LedgerError;
use super::fingerprint::InstallationKey;

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
/// backend's archiving transaction) as `audit verify` would and replays it for its
/// counts; the backend then writes it to the new file (a SQLite file on either backend,
/// so one format: `store::sqlite::archive::write_file`), nothing when a check fails.
pub(crate) fn seal(
    archived: &[Row],
    key: &InstallationKey,
    keyed_from: u64,
    keyed_from_mac: Option<&str>,
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

/// Checks the rows of an archive (read by `store::sqlite::archive::read_file`, with the
/// cut it recorded) against the ledger's recorded `cut`: its events a whole chain from
/// the first event to the cut, and the same cut.
pub(crate) fn verify_rows(
    rows: &[Row],
    recorded: Option<Cut>,
    key: &InstallationKey,
    cut: &Cut,
    keyed_from: u64,
) -> chain::ChainReport {
    let head = chain::Head {
        seq: cut.seq,
        hash: cut.hash.clone(),
        mac: Some(chain::head_mac(key, cut.seq, &cut.hash)),
    };
    let mut report = chain::verify(rows, Some(head), key, keyed_from);
    if report.first_break.is_none() && recorded.as_ref() != Some(cut) {
        report.first_break = Some(chain::ChainBreak {
            seq: cut.seq,
            problem: "the archive's record of its cut differs from the ledger's: it is not the archive of this cut".to_owned(),
        });
    }
    report
}
