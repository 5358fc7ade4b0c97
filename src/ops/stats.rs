//! Stats: counts over the ledger for a dashboard, and the health counts
//! (docs/ledger.md#health); the `needs_human` rule that `list` and `reconcile` share.

use std::time::Duration;

use super::{load_policy, redacted_error, Context};
use crate::error::{Error, ErrorKind, Result};
use crate::ledger::{Ledger, OperationRecord, Stats};

/// When an unresolved operation needs a human: created before this time (UTC RFC 3339,
/// as the ledger stamps), that is unresolved longer than the policy's `escalate_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    /// The policy's `escalate_after`.
    pub after: Duration,
    /// Now minus `after`.
    pub before: String,
}

impl Escalation {
    /// From the policy in effect (`escalate_after`, shipped 1h).
    pub fn from_policy(ctx: &Context) -> Result<Escalation> {
        let after = load_policy(ctx)?.escalate_after();
        let before = crate::ledger::stamp_before(after).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                "escalate_after reaches back before any possible date; use a shorter duration such as 1h",
            )
        })?;
        Ok(Escalation { after, before })
    }

    /// Does `rec` need a human: unresolved, and intended longer than `escalate_after` ago?
    pub fn needs_human(&self, rec: &OperationRecord) -> bool {
        rec.unresolved && rec.created_at.as_str() < self.before.as_str()
    }
}

/// How many suspected duplicates `stats` names unless asked for another number.
pub const NAMED_DUPLICATES: usize = 20;

/// The ledger's counts with the health counts (all zero when there is no ledger yet):
/// whole-ledger counts from the counters every append keeps; with `since`, over the
/// events of that window and the operations active in it. At most `named` suspected
/// duplicates are named (`None`: all); their tally always counts every one.
pub fn stats(ctx: &Context, since: Option<Duration>, named: Option<usize>) -> Result<Stats> {
    let cutoff = super::since_cutoff(since)?;
    let escalation = Escalation::from_policy(ctx)?;
    let (ledger, path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let Some(ledger) = ledger else {
        return Err(redacted_error(super::no_ledger_at(ctx, &path)));
    };
    let mut stats = ledger
        .stats_with_health(cutoff.as_deref(), &escalation.before, named)
        .map_err(|e| redacted_error(e.into()))?;
    stats.health.escalate_after = crate::duration::format_duration(escalation.after);
    Ok(stats)
}
