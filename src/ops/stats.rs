//! Stats: counts over the ledger for a dashboard.

use std::time::Duration;

use super::{redacted_error, Context};
use crate::error::Result;
use crate::ledger::{Ledger, Stats};

/// The ledger's counts (all zero when there is no ledger yet), from the counters every
/// append keeps; with `since`, over the events of that window and the operations active
/// in it.
pub fn stats(ctx: &Context, since: Option<Duration>) -> Result<Stats> {
    let cutoff = super::since_cutoff(since)?;
    let (ledger, _path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    match &ledger {
        Some(l) => match &cutoff {
            None => l.stats(),
            Some(cutoff) => l.stats_since(cutoff),
        }
        .map_err(|e| redacted_error(e.into())),
        None => Ok(Stats::default()),
    }
}
