//! `opmark audit verify`: walk the ledger's keyed hash chain and name the first broken
//! event, then replay the projection and name the first operation row that differs. The
//! same checks and the same output on every ledger backend.

use super::common::redacted_error;
use super::render::printable;
use crate::cli::{AuditAction, AuditArgs, GlobalArgs, VerifyArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{Ledger, VerifyScope};

/// Exit 0 "chain intact: N events"; exit 1 naming the first broken event or row.
pub fn run(global: &GlobalArgs, args: &AuditArgs) -> Result<u8> {
    match &args.action {
        AuditAction::Verify(v) => verify(global, v),
    }
}

fn verify(global: &GlobalArgs, args: &VerifyArgs) -> Result<u8> {
    let (ledger, path) =
        Ledger::open_existing_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())
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
    let (report, scope) = match &args.archive {
        // A wrong or missing FILE is the caller's to fix (exit 245), not the ledger's.
        Some(file) => ledger
            .verify_with_archive(file)
            .map(|r| (r, VerifyScope::Full))
            .map_err(|e| match e {
                crate::ledger::LedgerError::Invalid { message } => {
                    Error::new(ErrorKind::InvalidInput, message)
                }
                e => redacted_error(e.into()),
            })?,
        None => ledger
            .verify(args.incremental && !args.full)
            .map_err(|e| redacted_error(e.into()))?,
    };
    if global.json {
        let doc = serde_json::json!({
            "intact": report.intact(),
            "events": report.events,
            "first_break": report.first_break,
            "first_mismatch": report.first_mismatch,
            "counters_mismatch": report.counters_mismatch,
            "walked": scope,
            // Not `path`: for PostgreSQL that is the URL as given, password and all.
            "ledger": ledger.path(),
            "backend": ledger.backend(),
        });
        super::common::print_json(&doc)?;
    } else {
        match (&report.first_break, &report.first_mismatch) {
            (None, None) if report.counters_mismatch.is_some() => crate::outln!(
                "the `stats` counters differ from a recount of the events ({}); they were changed outside opmark: `opmark stats` is wrong, the events and `list` are not",
                report.counters_mismatch.as_deref().unwrap_or_default()
            ),
            (Some(b), _) => crate::outln!("chain broken at event #{}: {}", b.seq, b.problem),
            (None, Some(m)) => crate::outln!(
                "projection differs from the events at operation `{}` on `{}`: {}; that row was changed outside opmark: trust the timeline of `opmark show` (the events), not its header or `list`",
                printable(&m.op_id),
                printable(&m.host),
                m.problem
            ),
            (None, None) => match scope {
                VerifyScope::Full => match report.archived_through {
                    None => crate::outln!(
                        "chain intact: {} events, projection equals their replay",
                        report.events
                    ),
                    Some(cut) => crate::outln!(
                        "chain intact: {} events after the archive cut at event #{cut}, projection equals their replay; events up to the cut are in the archive (`opmark audit verify --archive FILE` checks it too)",
                        report.events
                    ),
                },
                VerifyScope::SinceCheckpoint {
                    checkpoint,
                    operations,
                } => crate::outln!(
                    "chain intact: {} new events after the checkpoint at event #{checkpoint} (verified earlier), and the {operations} operations they touch equal their replay; only what is new was read: `opmark audit verify` walks the whole chain",
                    report.events
                ),
            },
        }
    }
    Ok(if report.intact() {
        exit_code::OK
    } else {
        exit_code::FINDINGS
    })
}
