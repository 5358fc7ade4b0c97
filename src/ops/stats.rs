//! Stats: counts over the ledger for a dashboard.

use super::{redacted_error, Context};
use crate::error::Result;
use crate::ledger::{Ledger, Stats};

/// The ledger's counts (all zero when there is no ledger yet).
pub fn stats(ctx: &Context) -> Result<Stats> {
    let (ledger, _path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    match &ledger {
        Some(l) => l.stats().map_err(|e| redacted_error(e.into())),
        None => Ok(Stats::default()),
    }
}
