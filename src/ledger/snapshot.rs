//! The whole chain read in one consistent snapshot, as `ledger migrate` copies it.

use super::chain;
use super::cut::Cut;

/// The whole chain as `ledger migrate` copies it, in one consistent snapshot (`audit
/// verify --full` streams it instead).
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub head: Option<chain::Head>,
    pub keyed_from: u64,
    pub rows: Vec<chain::Row>,
    /// Where `ledger archive` cut the chain, and the cut's MAC.
    pub cut: Option<(Cut, Option<String>)>,
    /// What the archived events counted, and its MAC.
    pub archived_counts: Option<(String, Option<String>)>,
}
