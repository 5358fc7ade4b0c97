//! The checkpoint of `audit verify`: where the chain was last verified whole, recorded in
//! the `meta` table with its MAC, and what a routine verify reads after it. Written once
//! over both stores: each gives a [`SnapshotReader`] over one consistent read
//! transaction, and [`read_after`] does the rest.

use std::collections::BTreeSet;

use super::chain;
use super::error::LedgerError;
use super::meta;
use super::op_key::OpKey;
use super::projection::OperationRecord;

/// The `meta` name of the checkpoint (`SEQ HASH`).
const AT: &str = "verified_through";
/// The `meta` name of its MAC.
const MAC: &str = "verified_through_mac";

/// What a routine `audit verify` reads, in one consistent snapshot.
#[derive(Debug, Clone)]
pub(crate) struct Incremental {
    /// The recorded checkpoint: seq, hash, MAC.
    pub checkpoint: (u64, String, String),
    /// The hash the event at the checkpoint's seq carries now.
    pub stored_hash: Option<String>,
    pub head: Option<chain::Head>,
    pub keyed_from: u64,
    pub keyed_from_mac: Option<String>,
    /// The events after the checkpoint.
    pub rows: Vec<chain::Row>,
    /// Every event of the operations those touch, in chain order.
    pub history: Vec<chain::Row>,
    /// Those operations' projected rows.
    pub projected: Vec<OperationRecord>,
}

/// One store's reads inside one read transaction (a snapshot: every read sees the same
/// ledger).
pub(crate) trait SnapshotReader {
    /// The `meta` value `name`, if set.
    fn meta(&mut self, name: &str) -> Result<Option<String>, LedgerError>;
    /// The hash event `seq` carries, if it exists.
    fn event_hash(&mut self, seq: u64) -> Result<Option<String>, LedgerError>;
    /// The chain's head, if any event was appended.
    fn head(&mut self) -> Result<Option<chain::Head>, LedgerError>;
    /// The events after `seq`, in chain order.
    fn rows_after(&mut self, seq: u64) -> Result<Vec<chain::Row>, LedgerError>;
    /// Every event of the operations `keys` (in any order) and their projected rows.
    fn operations(
        &mut self,
        keys: &BTreeSet<OpKey>,
    ) -> Result<(Vec<chain::Row>, Vec<OperationRecord>), LedgerError>;
}

/// What a routine `audit verify` reads: the events after the recorded checkpoint, and the
/// whole history and row of each operation they touch. `None` when no checkpoint was
/// recorded (or it does not read as one): the verify then walks everything.
pub(crate) fn read_after(r: &mut impl SnapshotReader) -> Result<Option<Incremental>, LedgerError> {
    let (Some(at), Some(mac)) = (r.meta(AT)?, r.meta(MAC)?) else {
        return Ok(None);
    };
    let Some((seq, hash)) = at
        .split_once(' ')
        .and_then(|(s, h)| Some((s.parse::<u64>().ok()?, h.to_owned())))
    else {
        return Ok(None);
    };
    let stored_hash = r.event_hash(seq)?;
    let head = r.head()?;
    let keyed_from = meta::keyed_from(&mut |name| r.meta(name))?;
    let keyed_from_mac = meta::keyed_from_mac(&mut |name| r.meta(name))?;
    let rows = r.rows_after(seq)?;
    let touched: BTreeSet<OpKey> = rows
        .iter()
        .map(|r| OpKey::new(r.op_id.clone(), r.host.clone()))
        .collect();
    let (mut history, projected) = r.operations(&touched)?;
    history.sort_by_key(|r| r.seq);
    Ok(Some(Incremental {
        checkpoint: (seq, hash, mac),
        stored_hash,
        head,
        keyed_from,
        keyed_from_mac,
        rows,
        history,
        projected,
    }))
}

/// The `meta` rows that record a checkpoint at `seq` (whose event has `hash`).
pub(crate) fn facts(seq: u64, hash: &str, mac: &str) -> [(&'static str, String); 2] {
    [(AT, format!("{seq} {hash}")), (MAC, mac.to_owned())]
}
