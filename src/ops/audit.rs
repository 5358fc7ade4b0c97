//! Audit: walk the ledger's keyed hash chain and name the first broken event, then
//! replay the projection and name the first operation row that differs. The same checks
//! on every ledger backend.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{redacted_error, Context};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{ChainBreak, Ledger, LedgerError, ProjectionMismatch, VerifyScope};

/// What the walk found.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// No break and no mismatch.
    pub intact: bool,
    /// Events walked (JSON `event_count`: `events` is a list in `show`).
    #[serde(rename = "event_count")]
    pub events: u64,
    /// The first event whose link does not verify.
    pub first_break: Option<ChainBreak>,
    /// The first operation row that differs from the replay of its events.
    pub first_mismatch: Option<ProjectionMismatch>,
    /// The `stats` counters that differ from a recount of the events, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters_mismatch: Option<String>,
    /// How much was walked: the whole chain, or only what followed a checkpoint.
    pub walked: VerifyScope,
    /// The last event `ledger archive` moved out, when the walk started after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived_through: Option<u64>,
    /// The ledger, as it names itself (never a URL's password).
    pub ledger: PathBuf,
    /// `sqlite` or `postgresql`.
    pub backend: &'static str,
}

impl AuditReport {
    /// 0 when intact, else 1.
    pub fn exit_status(&self) -> u8 {
        if self.intact {
            exit_code::OK
        } else {
            exit_code::FINDINGS
        }
    }
}

/// What to walk.
#[derive(Debug, Clone, Default)]
pub struct VerifyRequest {
    /// Only the events after the last verified checkpoint (SQLite).
    pub incremental: bool,
    /// Also the archive `ledger archive` wrote, as one chain with the ledger.
    pub archive: Option<PathBuf>,
}

/// Verifies the chain and the projection of an existing ledger.
pub fn verify(ctx: &Context, req: &VerifyRequest) -> Result<AuditReport> {
    let (ledger, path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let Some(ledger) = ledger else {
        return Err(super::no_ledger_at(ctx, &path));
    };
    let (report, walked) = match &req.archive {
        Some(file) => with_archive(&ledger, file)?,
        None => ledger
            .verify(req.incremental)
            .map_err(|e| redacted_error(e.into()))?,
    };
    Ok(AuditReport {
        intact: report.intact(),
        events: report.events,
        first_break: report.first_break,
        first_mismatch: report.first_mismatch,
        counters_mismatch: report.counters_mismatch,
        walked,
        archived_through: report.archived_through,
        // Not `path`: for PostgreSQL that is the URL as given, password and all.
        ledger: ledger.path().to_path_buf(),
        backend: ledger.backend(),
    })
}

fn with_archive(ledger: &Ledger, file: &Path) -> Result<(crate::ledger::ChainReport, VerifyScope)> {
    ledger
        .verify_with_archive(file)
        .map(|r| (r, VerifyScope::Full))
        .map_err(|e| match e {
            // A wrong or missing FILE is the caller's to fix (exit 245), not the ledger's.
            LedgerError::Invalid { message } => Error::new(ErrorKind::InvalidInput, message),
            e => redacted_error(e.into()),
        })
}
