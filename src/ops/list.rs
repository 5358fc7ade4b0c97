//! List: the ledger's operations, most recently active first, filtered.

use std::time::Duration;

use serde::Serialize;

use super::{redacted_error, Context};
use crate::error::{Error, ErrorKind, Result};
use crate::ledger::{Ledger, ListFilter, OperationRecord};
use crate::text::parse_at;

/// Which operations.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Only those whose outcome is not settled.
    pub unresolved: bool,
    /// Only those on this host.
    pub host: Option<String>,
    /// Only those active within this long.
    pub since: Option<Duration>,
    /// At most this many (at least 1).
    pub limit: Option<usize>,
}

/// The operations found.
#[derive(Debug, Clone, Serialize)]
pub struct ListReport {
    /// Most recently active first.
    pub operations: Vec<OperationRecord>,
}

/// Reads the operations from the ledger (none when there is no ledger yet).
pub fn list(ctx: &Context, req: &ListRequest) -> Result<ListReport> {
    if req.limit == Some(0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--limit 0 would list nothing; give at least 1, or leave --limit out for all",
        ));
    }
    let cutoff = req
        .since
        .map(|since| {
            time::Duration::try_from(since)
                .ok()
                .and_then(|d| time::OffsetDateTime::now_utc().checked_sub(d))
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        "--since reaches back before any possible date; use a shorter duration such as 30d",
                    )
                })
        })
        .transpose()?;
    let (ledger, _path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    // Without --since the ledger can stop at the limit; with it the cut-off is applied
    // here (on the projection's timestamps), then the limit.
    let filter = ListFilter {
        unresolved: req.unresolved,
        host: req.host.clone(),
        limit: if cutoff.is_none() { req.limit } else { None },
    };
    let mut ops = match &ledger {
        Some(l) => l.list(&filter).map_err(|e| redacted_error(e.into()))?,
        None => Vec::new(),
    };
    if let Some(cutoff) = cutoff {
        // A timestamp that does not parse is kept: hiding an operation is worse.
        ops.retain(|o| parse_at(&o.updated_at).is_none_or(|at| at >= cutoff));
        if let Some(limit) = req.limit {
            ops.truncate(limit);
        }
    }
    Ok(ListReport { operations: ops })
}
