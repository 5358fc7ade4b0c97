//! The hash chain over all events: how an event's hash is computed and how the chain is
//! checked (`opmark audit verify`).
//!
//! Each event's hash covers its sequence number, its predecessor's hash and its stored
//! content, so editing, deleting or reordering any event breaks the chain at that event.
//! The `chain_head` row (updated in the same transaction as every append) lets a deleted
//! *last* event be noticed too.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// `prev_hash` of the first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The stored fields an event's hash covers.
#[derive(Debug, Clone, Copy)]
pub struct Link<'a> {
    /// Global sequence number.
    pub seq: u64,
    /// Predecessor's hash (hex).
    pub prev_hash: &'a str,
    /// Operation id.
    pub op_id: &'a str,
    /// Host.
    pub host: &'a str,
    /// Record time.
    pub at: &'a str,
    /// Event kind column.
    pub kind: &'a str,
    /// The JSON payload exactly as stored.
    pub payload: &'a str,
}

impl Link<'_> {
    /// SHA-256 hex over the length-prefixed fields, so no two field lists share bytes.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"opmark-event-v1\n");
        h.update(self.seq.to_string().as_bytes());
        h.update(b"\n");
        for field in [
            self.prev_hash,
            self.op_id,
            self.host,
            self.at,
            self.kind,
            self.payload,
        ] {
            h.update(field.len().to_string().as_bytes());
            h.update(b":");
            h.update(field.as_bytes());
            h.update(b"\n");
        }
        hex::encode(h.finalize())
    }
}

/// The result of walking the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainReport {
    /// How many events were walked.
    pub events: u64,
    /// The first problem, if any.
    pub first_break: Option<ChainBreak>,
}

impl ChainReport {
    /// True when the chain is whole.
    pub fn intact(&self) -> bool {
        self.first_break.is_none()
    }
}

/// The first broken event and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    /// Sequence number of the event that was edited, deleted or moved.
    pub seq: u64,
    /// What is wrong, for people.
    pub problem: String,
}

/// One stored row as the verifier sees it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub seq: u64,
    pub prev_hash: String,
    pub hash: String,
    pub op_id: String,
    pub host: String,
    pub at: String,
    pub kind: String,
    pub payload: String,
}

/// Walks `rows` (in stored sequence order) and the recorded head; names the first break.
pub(crate) fn verify(rows: impl Iterator<Item = Row>, head: Option<(u64, String)>) -> ChainReport {
    let mut expected_seq = 1u64;
    let mut prev_hash = GENESIS.to_owned();
    let mut count = 0u64;
    let broken = |seq, problem: String| ChainBreak { seq, problem };
    for row in rows {
        count += 1;
        if row.seq != expected_seq {
            let problem = if row.seq > expected_seq {
                format!(
                    "event #{expected_seq} is missing (deleted): the event after #{} is #{}",
                    expected_seq - 1,
                    row.seq
                )
            } else {
                format!("event #{} appears out of order", row.seq)
            };
            return report(count, Some(broken(expected_seq, problem)));
        }
        let computed = Link {
            seq: row.seq,
            prev_hash: &row.prev_hash,
            op_id: &row.op_id,
            host: &row.host,
            at: &row.at,
            kind: &row.kind,
            payload: &row.payload,
        }
        .hash();
        if computed != row.hash {
            return report(
                count,
                Some(broken(
                    row.seq,
                    format!(
                        "event #{} was edited or moved: its content does not match its hash",
                        row.seq
                    ),
                )),
            );
        }
        if row.prev_hash != prev_hash {
            // The row itself is self-consistent, so its predecessor was rewritten (content
            // and hash together) or replaced.
            let prev = row.seq - 1;
            return report(
                count,
                Some(broken(
                    prev,
                    format!(
                        "event #{prev} was edited, replaced or reordered: event #{} records a different predecessor hash",
                        row.seq
                    ),
                )),
            );
        }
        prev_hash = row.hash;
        expected_seq += 1;
    }
    let last = expected_seq - 1;
    match head {
        Some((head_seq, _)) if head_seq > last => report(
            count,
            Some(broken(
                last + 1,
                format!(
                    "event #{} is missing (deleted): the chain head records {head_seq} events, the last stored one is #{last}",
                    last + 1
                ),
            )),
        ),
        Some((head_seq, head_hash)) if head_seq == last && head_hash != prev_hash && last > 0 => {
            report(
                count,
                Some(broken(
                    last,
                    format!("event #{last} was edited or replaced: it does not match the chain head"),
                )),
            )
        }
        Some((head_seq, _)) if head_seq < last => report(
            count,
            Some(broken(
                head_seq + 1,
                format!(
                    "event #{} was added outside opmark: the chain head records only {head_seq} events",
                    head_seq + 1
                ),
            )),
        ),
        None if last > 0 => report(
            count,
            Some(broken(
                last,
                "the chain head record is missing (deleted outside opmark)".to_owned(),
            )),
        ),
        _ => report(count, None),
    }
}

fn report(events: u64, first_break: Option<ChainBreak>) -> ChainReport {
    ChainReport {
        events,
        first_break,
    }
}
