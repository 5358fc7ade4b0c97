//! Audit: walk the ledger's keyed hash chain and name the first broken event, then
//! replay the projection and name the first operation row that differs. The same checks
//! on every ledger backend.

use std::path::PathBuf;

use serde::Serialize;

use super::{redacted_error, Context};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{ChainBreak, Ledger, ProjectionMismatch};

/// What the walk found.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// No break and no mismatch.
    pub intact: bool,
    /// Events walked.
    pub events: u64,
    /// The first event whose link does not verify.
    pub first_break: Option<ChainBreak>,
    /// The first operation row that differs from the replay of its events.
    pub first_mismatch: Option<ProjectionMismatch>,
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

/// Verifies the chain and the projection of an existing ledger.
pub fn verify(ctx: &Context) -> Result<AuditReport> {
    let (ledger, path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let Some(ledger) = ledger else {
        return Err(Error::new(
            ErrorKind::LocalIo,
            format!(
                "no ledger at {}: nothing to verify (give the right file with --ledger or OPMARK_LEDGER)",
                path.display()
            ),
        ));
    };
    let report = ledger
        .verify_chain()
        .map_err(|e| redacted_error(e.into()))?;
    Ok(AuditReport {
        intact: report.intact(),
        events: report.events,
        first_break: report.first_break,
        first_mismatch: report.first_mismatch,
        // Not `path`: for PostgreSQL that is the URL as given, password and all.
        ledger: ledger.path().to_path_buf(),
        backend: ledger.backend(),
    })
}
