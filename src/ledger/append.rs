//! THE append algorithm, written once for every backend (docs/ledger.md#backends).
//!
//! A backend opens a transaction that holds the chain head exclusively (SQLite:
//! `BEGIN IMMEDIATE`; PostgreSQL: `SELECT … FOR UPDATE` on the head row) and hands it
//! here as an [`AppendTx`]. Under that lock this module reads the head, checks the
//! settlement condition, inserts each event with its keyed hash, folds the projection,
//! records contradictions, and moves the head. So concurrent writers from any number of
//! processes or machines extend one linear chain, and a conditional settlement sees every
//! decision committed before it.

use super::chain;
use super::counters::{Counters, Counts};
use super::error::{LedgerError, SettledBy};
use super::event::Event;
use super::fingerprint::InstallationKey;
use super::op_key::OpKey;
use super::projection::{self, OperationRecord};
use super::words::Decision;
use crate::redact::Redactor;

/// What a backend's head-locked transaction offers the append algorithm.
pub(crate) trait AppendTx {
    /// The chain head `(seq, hash)`; `(0, GENESIS)` before the first event.
    fn head(&mut self) -> Result<(u64, String), LedgerError>;
    /// The projection row of one operation.
    fn load(&mut self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError>;
    /// Inserts one event row.
    fn insert(&mut self, row: &chain::Row) -> Result<(), LedgerError>;
    /// Inserts or replaces one projection row.
    fn store(&mut self, rec: &OperationRecord) -> Result<(), LedgerError>;
    /// Moves the head.
    fn set_head(&mut self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError>;
    /// Adds `deltas` to the named counters `stats` reads (creating missing ones).
    fn add_counts(&mut self, deltas: &Counts) -> Result<(), LedgerError>;
    /// `(seq, at, payload)` of the operation's events after `after`, in order.
    fn events_after(
        &mut self,
        key: &OpKey,
        after: u64,
    ) -> Result<Vec<(u64, String, String)>, LedgerError>;
}

/// The part of an operation's row that [`count`] (and `health::count`) read of the row
/// before an event: its state, family, flags and attempts, with the texts left empty.
/// `audit verify --full` counts every event against the row before it, and a copy of the
/// whole row (its texts) per event was a tenth of its replay. Kept beside [`count`]: a
/// field it starts reading must be copied here.
pub(crate) fn counted_part(rec: &OperationRecord) -> OperationRecord {
    OperationRecord {
        op_id: String::new(),
        host: String::new(),
        family: rec.family,
        display: String::new(),
        fingerprint: String::new(),
        rule: String::new(),
        session: String::new(),
        state: rec.state.clone(),
        verdict: rec.verdict,
        exit_code: rec.exit_code,
        attempts: rec.attempts,
        last_attempt: rec.last_attempt.clone(),
        unresolved: rec.unresolved,
        created_at: String::new(),
        updated_at: String::new(),
        first_seq: rec.first_seq,
        last_seq: rec.last_seq,
        contradictions: rec.contradictions,
        settled_attempt: None,
        executed: rec.executed,
    }
}

/// What one stored event changes in the counters `stats` reads: the event itself (by
/// kind, verdicts, retries by family) and the move of its operation's projected row from
/// `before` to `after` (by state, family, unresolved, contradicted). Kept in the same
/// transaction as the event, so `stats` costs the number of counters, not the history;
/// `audit verify --full` recounts them from the events.
pub(crate) fn count(
    counts: &mut dyn Counters,
    event: &Event,
    before: Option<&OperationRecord>,
    after: Option<&OperationRecord>,
) {
    use std::fmt::Write as _;
    // One name buffer for the event: `audit verify --full` recounts every event, and a
    // name allocated per counter was a tenth of its time.
    // Adding 0 changes no counter (a missing counter reads as 0), so it is skipped.
    fn add(name: &mut String, counts: &mut dyn Counters, parts: std::fmt::Arguments<'_>, n: i64) {
        if n == 0 {
            return;
        }
        name.clear();
        let _ = name.write_fmt(parts);
        counts.add(name, n);
    }
    fn side(name: &mut String, counts: &mut dyn Counters, rec: &OperationRecord, n: i64) {
        add(name, counts, format_args!("state/{}", rec.state), n);
        let unresolved = n * i64::from(rec.unresolved);
        add(name, counts, format_args!("unresolved"), unresolved);
        let contradicted = n * i64::from(rec.contradictions > 0);
        add(name, counts, format_args!("contradicted"), contradicted);
    }
    let name = &mut String::with_capacity(48);
    add(name, counts, format_args!("events"), 1);
    add(name, counts, format_args!("kind/{}", event.kind()), 1);
    if let Event::Verdict { verdict, .. } = event {
        add(
            name,
            counts,
            format_args!("verdict/{}", verdict.as_str()),
            1,
        );
    }
    super::health::count(counts, event, before, after);
    if let (Event::AttemptDispatched { number, .. }, Some(rec)) = (event, after.or(before)) {
        if *number > 1 {
            add(
                name,
                counts,
                format_args!("retries/{}", rec.family.as_str()),
                1,
            );
        }
    }
    let Some(after) = after else { return };
    match before {
        Some(b) => side(name, counts, b, -1),
        None => {
            add(name, counts, format_args!("operations"), 1);
            add(
                name,
                counts,
                format_args!("family/{}", after.family.as_str()),
                1,
            );
        }
    }
    side(name, counts, after, 1);
}

/// A conditional settlement: store the events only if no decision settled the operation
/// after the caller read it (its `last_seq` then). Two operators, or an operator and a
/// reconcile on another machine, settling one operation at once get one decision; the
/// later writer gets [`LedgerError::AlreadySettled`] naming the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnlessSettledSince(pub u64);

/// Who settled an operation, for [`LedgerError::AlreadySettled`].
fn settled_by(event: &Event) -> Option<(String, Decision)> {
    match event {
        Event::OperatorDecision { by, decision, .. } if decision.settles() => {
            Some((format!("operator {by}"), decision.clone()))
        }
        Event::Reconciled { decision, .. } if decision.settles() => {
            Some(("reconcile".to_owned(), decision.clone()))
        }
        _ => None,
    }
}

/// One operation's append, as the [`Ledger`](super::Ledger) prepares it and the stores
/// pass it to [`append`] unchanged: what was four of their arguments (seven in all), and
/// a batch is a list of them.
#[derive(Debug, Clone)]
pub(crate) struct OpAppend {
    /// The operation.
    pub key: OpKey,
    /// Its events, already redacted, each with its JSON payload.
    pub events: Vec<(Event, String)>,
    /// The record time (UTC RFC 3339 with microseconds).
    pub at: String,
    /// A settlement's condition, checked under the chain-head lock.
    pub condition: Option<UnlessSettledSince>,
}

/// Appends `op`'s events (already redacted, with their JSON payloads) in the open
/// transaction; returns their sequence numbers. The caller commits (or drops the
/// transaction on error, which stores nothing).
pub(crate) fn append(
    tx: &mut dyn AppendTx,
    ikey: &InstallationKey,
    redactor: &Redactor,
    op: &OpAppend,
) -> Result<Vec<u64>, LedgerError> {
    let (key, events, at) = (&op.key, op.events.as_slice(), op.at.as_str());
    let (mut seq, mut prev) = tx.head()?;
    if let Some(UnlessSettledSince(seen)) = op.condition {
        for (eseq, eat, payload) in tx.events_after(key, seen)? {
            let event: Event =
                serde_json::from_str(&payload).map_err(|e| LedgerError::Corrupt {
                    seq: eseq,
                    why: format!("{:?} at column {}", e.classify(), e.column()),
                })?;
            if let Some((by, decision)) = settled_by(&event) {
                return Err(LedgerError::AlreadySettled(Box::new(SettledBy {
                    op_id: key.op_id.clone(),
                    host: key.host.clone(),
                    by,
                    at: eat,
                    decision,
                    seq: eseq,
                })));
            }
        }
    }
    let mut seqs = Vec::with_capacity(events.len());
    let mut counts = Counts::new();
    for (event, payload) in events {
        let before = tx.load(key)?;
        let contradiction = before
            .as_ref()
            .and_then(|rec| projection::contradiction(rec, event));
        seq += 1;
        prev = insert(tx, ikey, key, seq, &prev, at, event, payload)?;
        let counted = before.as_ref().map(counted_part);
        let mut row = before;
        match projection::fold(&mut row, (&key.op_id, &key.host), event, seq, at) {
            Ok(()) => {
                count(&mut counts, event, counted.as_ref(), row.as_ref());
                if let Some(rec) = &row {
                    tx.store(rec)?
                }
            }
            // The caller drops the transaction: nothing of this append is stored.
            Err(projection::AppendRefused::FingerprintConflict) => {
                return Err(LedgerError::FingerprintConflict {
                    op_id: key.op_id.clone(),
                    host: key.host.clone(),
                })
            }
        }
        seqs.push(seq);
        if let Some((expected, seen)) = contradiction {
            // Recorded by the ledger itself, right after the evidence, so no caller can
            // forget it and no later evidence silently rewrites the settled truth.
            let noted = Event::Contradiction {
                source: event.kind().to_owned(),
                evidence_seq: seq,
                expected,
                seen,
            }
            .redacted(redactor);
            let noted_payload = serde_json::to_string(&noted).expect("events serialize");
            let before = tx.load(key)?;
            seq += 1;
            prev = insert(tx, ikey, key, seq, &prev, at, &noted, &noted_payload)?;
            let counted = before.as_ref().map(counted_part);
            let mut row = before;
            // A contradiction is never refused (only an intent can be).
            let _ = projection::fold(&mut row, (&key.op_id, &key.host), &noted, seq, at);
            count(&mut counts, &noted, counted.as_ref(), row.as_ref());
            if let Some(rec) = &row {
                tx.store(rec)?;
            }
        }
    }
    tx.add_counts(&counts)?;
    tx.set_head(seq, &prev, &chain::head_mac(ikey, seq, &prev))?;
    Ok(seqs)
}

/// Inserts one event with its keyed hash; returns the hash.
#[allow(clippy::too_many_arguments)]
fn insert(
    tx: &mut dyn AppendTx,
    ikey: &InstallationKey,
    key: &OpKey,
    seq: u64,
    prev: &str,
    at: &str,
    event: &Event,
    payload: &str,
) -> Result<String, LedgerError> {
    let hash = chain::Link {
        seq,
        prev_hash: prev,
        op_id: &key.op_id,
        host: &key.host,
        at,
        kind: event.kind(),
        payload,
    }
    .keyed_hash(ikey);
    tx.insert(&chain::Row {
        seq,
        prev_hash: prev.to_owned(),
        hash: hash.clone(),
        op_id: key.op_id.clone(),
        host: key.host.clone(),
        at: at.to_owned(),
        kind: event.kind().to_owned(),
        payload: payload.to_owned(),
    })?;
    Ok(hash)
}
