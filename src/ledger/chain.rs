//! The hash chain over all events: how an event's hash is computed and how the chain is
//! checked (`opmark audit verify`).
//!
//! Each event's hash covers its sequence number, its predecessor's hash and its stored
//! content, so editing, deleting or reordering any event breaks the chain at that event.
//! The `chain_head` row (updated in the same transaction as every append) lets a deleted
//! *last* event be noticed too.
//!
//! Keyed chain (docs/ledger.md#the-chain): from the ledger's recorded switch point on (seq 1 for a
//! ledger made by this version), an event's hash is an HMAC under the installation key
//! and the head carries an HMAC of (seq, hash), so someone without the key can neither
//! recompute the chain after an edit nor move the head back over a deleted tail. Events
//! written before the switch (ledgers of the old layout) keep their plain SHA-256; the
//! switch point itself is MACed, so it cannot be moved to pass a recomputed plain chain.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::fingerprint::InstallationKey;

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

    /// HMAC-SHA256 hex under the installation key over the same fields.
    pub fn keyed_hash(&self, key: &InstallationKey) -> String {
        let seq = self.seq.to_string();
        key.mac(
            "opmark-event-v2",
            &[
                seq.as_bytes(),
                self.prev_hash.as_bytes(),
                self.op_id.as_bytes(),
                self.host.as_bytes(),
                self.at.as_bytes(),
                self.kind.as_bytes(),
                self.payload.as_bytes(),
            ],
        )
    }
}

/// [`Link::keyed_hash`] with the key set up once: `audit verify` hashes millions of
/// events, and keying the HMAC and formatting the lengths per event cost as much as the
/// hashing itself. Same bytes in, same hash out.
pub(crate) struct EventMac(hmac::Hmac<Sha256>);

impl EventMac {
    pub(crate) fn new(key: &InstallationKey) -> Self {
        EventMac(key.hmac())
    }

    /// The keyed hash of `link`.
    pub(crate) fn hash(&self, link: &Link<'_>) -> String {
        use hmac::Mac;
        let mut out = Gathered {
            mac: self.0.clone(),
            buf: [0; GATHER],
            len: 0,
        };
        out.put(b"opmark-event-v2\n");
        let mut seq_buf = [0u8; 20];
        let seq = decimal(link.seq, &mut seq_buf);
        for part in [
            seq,
            link.prev_hash.as_bytes(),
            link.op_id.as_bytes(),
            link.host.as_bytes(),
            link.at.as_bytes(),
            link.kind.as_bytes(),
            link.payload.as_bytes(),
        ] {
            out.put_length_of(part);
            out.put(part);
            out.put_byte(b'\n');
        }
        out.flush();
        hex_of(&out.mac.finalize().into_bytes())
    }
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The bytes [`EventMac::hash`] gathers before handing them to the MAC.
const GATHER: usize = 256;

/// The framed parts of an event, handed to the MAC a few hundred bytes at a time: the
/// MAC copies each piece it is given into its block buffer by a call of its own, and
/// the 28 pieces of an event's framing, most a few bytes, were about a tenth of the
/// walk's hashing thread. The same bytes in the same order, so the same hash.
struct Gathered {
    mac: hmac::Hmac<Sha256>,
    buf: [u8; GATHER],
    len: usize,
}

impl Gathered {
    fn put(&mut self, part: &[u8]) {
        use hmac::Mac;
        if self.len + part.len() > GATHER {
            self.flush();
            if part.len() > GATHER / 2 {
                self.mac.update(part);
                return;
            }
        }
        self.buf[self.len..self.len + part.len()].copy_from_slice(part);
        self.len += part.len();
    }

    /// One byte, stored in place: a copy call per separator was as dear as the MAC
    /// update calls the buffer replaced.
    fn put_byte(&mut self, b: u8) {
        if self.len == GATHER {
            self.flush();
        }
        self.buf[self.len] = b;
        self.len += 1;
    }

    /// `part`'s length in decimal and `:`, the framing before it, written in place.
    fn put_length_of(&mut self, part: &[u8]) {
        let mut n = part.len();
        let mut digits = 1;
        while n >= 10 {
            n /= 10;
            digits += 1;
        }
        if self.len + digits + 1 > GATHER {
            self.flush();
        }
        let mut n = part.len();
        for i in (self.len..self.len + digits).rev() {
            self.buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        self.buf[self.len + digits] = b':';
        self.len += digits + 1;
    }

    fn flush(&mut self) {
        use hmac::Mac;
        self.mac.update(&self.buf[..self.len]);
        self.len = 0;
    }
}

/// Lowercase hex of `bytes`, as `hex::encode` writes it, through a table: the walk
/// writes two hashes' hex per event.
pub(crate) fn hex_of(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(bytes, &mut out);
    out
}

/// [`hex_of`] appended to `out`.
pub(crate) fn push_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
}

/// The MAC the head row carries for (`seq`, `hash`).
pub fn head_mac(key: &InstallationKey, seq: u64, hash: &str) -> String {
    key.mac(
        "opmark-chain-head",
        &[seq.to_string().as_bytes(), hash.as_bytes()],
    )
}

/// The MAC of the recorded switch point from plain to keyed hashes.
pub fn keyed_from_mac(key: &InstallationKey, keyed_from: u64) -> String {
    key.mac(
        "opmark-chain-keyed-from",
        &[keyed_from.to_string().as_bytes()],
    )
}

/// The recorded head as the verifier sees it.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub seq: u64,
    pub hash: String,
    pub mac: Option<String>,
}

/// The result of walking the chain and replaying the projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainReport {
    /// How many events were walked.
    pub events: u64,
    /// The first problem of the chain, if any.
    pub first_break: Option<ChainBreak>,
    /// The first projected row that differs from the replay of its events, if any
    /// (checked only when the chain itself is whole).
    pub first_mismatch: Option<ProjectionMismatch>,
    /// The `stats` counters that differ from a recount of the events, by name (checked
    /// when the chain and the rows are whole; a `None` from a partial walk says nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters_mismatch: Option<String>,
    /// The last event `ledger archive` moved out, when the walk started after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived_through: Option<u64>,
    /// The last event of a whole chain: `(seq, hash)`, where a later verify can start.
    #[serde(skip)]
    pub verified_head: Option<(u64, String)>,
}

impl ChainReport {
    /// True when the chain is whole and the projection (rows and counters) equals its
    /// replay.
    pub fn intact(&self) -> bool {
        self.first_break.is_none()
            && self.first_mismatch.is_none()
            && self.counters_mismatch.is_none()
    }
}

/// An `operations` row that is not what its events say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProjectionMismatch {
    /// Operation id of the row.
    pub op_id: String,
    /// Host of the row.
    pub host: String,
    /// What differs, for people (column names and both values, no free text).
    pub problem: String,
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
///
/// The SQLite layout (schema 7, docs/ledger.md#storage) stores neither every predecessor
/// hash nor every full hash: `prev_hash` is empty when it is implied (the hash of event
/// `seq - 1` as the walk recomputes it), and `hash` may be a *tag*, the first
/// [`KEYED_TAG`] (keyed events) or [`PLAIN_TAG`] (plain SHA-256 ones) hex digits of the
/// event's hash. A walk recomputes the full hashes ([`verify_after`], [`complete`]).
#[derive(Debug, Clone, Default)]
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

/// Hex digits of a keyed event's stored tag (8 bytes of its HMAC). Forging an edit that
/// keeps a tag needs the installation key; without it a guess passes one event with odds
/// of 2^-64, and the next event's recomputed hash (which covers the full hash) and the
/// MACed head still differ. So the tag only names *which* event broke; the full hashes
/// the head, the checkpoints and the archive cut keep are what no edit gets past.
pub(crate) const KEYED_TAG: usize = 16;

/// Every `ANCHOR`-th event (seq a multiple of it) keeps its full hash, so the full hash
/// of any event is a walk of at most this many events away (`show --json` prints full
/// hashes without walking the chain from its start).
pub(crate) const ANCHOR: u64 = 256;

/// Hex digits of a plain (pre-key) event's stored tag: anyone can compute a plain
/// SHA-256, so its tag must resist a search (16 bytes).
pub(crate) const PLAIN_TAG: usize = 32;

/// Does the recomputed `full` hash match what is `stored` for an event: the full hash,
/// or exactly the tag its kind of hash keeps (a shorter one is not accepted).
pub(crate) fn matches_stored(full: &str, stored: &str, keyed: bool) -> bool {
    let tag = if keyed { KEYED_TAG } else { PLAIN_TAG };
    stored == full || (stored.len() == tag && full.starts_with(stored))
}

/// The hash of `row` under the chain's rules: keyed from `keyed_from` on, its stored
/// predecessor or, when that is implied, `running` (the walk's recomputed one).
fn recompute(row: &Row, running: &str, mac: &EventMac, keyed_from: u64) -> String {
    let link = Link {
        seq: row.seq,
        prev_hash: if row.prev_hash.is_empty() {
            running
        } else {
            &row.prev_hash
        },
        op_id: &row.op_id,
        host: &row.host,
        at: &row.at,
        kind: &row.kind,
        payload: &row.payload,
    };
    if row.seq >= keyed_from {
        mac.hash(&link)
    } else {
        link.hash()
    }
}

/// Fills in what `rows` (consecutive, from `after + 1`, whose predecessor's hash is
/// `after_hash`) leave implied: each predecessor hash, and the full hash of each event
/// whose stored tag matches it (one that does not keep its tag, so a later verify of the
/// copy still names it). For copies that must stand alone: an archive file, a
/// PostgreSQL ledger, a test's plain-SQL view.
pub(crate) fn complete(rows: &mut [Row], key: &InstallationKey, keyed_from: u64, after_hash: &str) {
    let mac = EventMac::new(key);
    let mut running = after_hash.to_owned();
    for row in rows {
        let full = recompute(row, &running, &mac, keyed_from);
        if row.prev_hash.is_empty() {
            row.prev_hash.clone_from(&running);
        }
        if matches_stored(&full, &row.hash, row.seq >= keyed_from) {
            row.hash.clone_from(&full);
        }
        running = full;
    }
}

/// Walks `rows` (in stored sequence order) and the recorded head; names the first break.
/// Events from `keyed_from` on must carry their HMAC under `key`, and the head its MAC.
pub(crate) fn verify(
    rows: &[Row],
    head: Option<Head>,
    key: &InstallationKey,
    keyed_from: u64,
) -> ChainReport {
    verify_after(rows, head, key, keyed_from, 0, GENESIS)
}

/// The MAC of a verified checkpoint: `audit verify` found the chain whole up to `seq`,
/// whose event carries `hash`.
pub fn checkpoint_mac(key: &InstallationKey, seq: u64, hash: &str) -> String {
    key.mac(
        "opmark-verified-through",
        &[seq.to_string().as_bytes(), hash.as_bytes()],
    )
}

/// [`verify`] of the events after `after` (whose hash is `after_hash`, from a checkpoint
/// already verified): `rows` start at `after + 1`.
pub(crate) fn verify_after(
    rows: &[Row],
    head: Option<Head>,
    key: &InstallationKey,
    keyed_from: u64,
    after: u64,
    after_hash: &str,
) -> ChainReport {
    let mut walk = Walk::new(key, keyed_from, after, after_hash);
    for row in rows {
        if let Some(b) = walk.step(row) {
            return report(walk.count, Some(b));
        }
    }
    walk.finish(head)
}

/// A walk of the chain one event at a time, in stored order, holding nothing but the
/// last recomputed hash: memory does not grow with the chain.
pub(crate) struct Walk {
    key: InstallationKey,
    mac: EventMac,
    keyed_from: u64,
    expected_seq: u64,
    running: String,
    /// Events walked so far.
    pub count: u64,
}

impl Walk {
    /// A walk of the events after `after`, whose hash is `after_hash`.
    pub(crate) fn new(
        key: &InstallationKey,
        keyed_from: u64,
        after: u64,
        after_hash: &str,
    ) -> Walk {
        Walk {
            key: key.clone(),
            mac: EventMac::new(key),
            keyed_from,
            expected_seq: after + 1,
            running: after_hash.to_owned(),
            count: 0,
        }
    }

    /// Checks the next stored row; the first break, if it is one.
    pub(crate) fn step(&mut self, row: &Row) -> Option<ChainBreak> {
        let broken = |seq, problem: String| Some(ChainBreak { seq, problem });
        self.count += 1;
        let expected_seq = self.expected_seq;
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
            return broken(expected_seq, problem);
        }
        let keyed = row.seq >= self.keyed_from;
        let full = recompute(row, &self.running, &self.mac, self.keyed_from);
        if !matches_stored(&full, &row.hash, keyed) {
            let problem = if keyed {
                format!(
                    "event #{} was edited or moved: its content does not match its keyed hash (a hash recomputed without the installation key does not either)",
                    row.seq
                )
            } else {
                format!(
                    "event #{} was edited or moved: its content does not match its hash",
                    row.seq
                )
            };
            return broken(row.seq, problem);
        }
        if !row.prev_hash.is_empty() && row.prev_hash != self.running {
            // The row itself is self-consistent, so its predecessor was rewritten (content
            // and hash together) or replaced.
            let prev = row.seq - 1;
            return broken(
                prev,
                format!(
                    "event #{prev} was edited, replaced or reordered: event #{} records a different predecessor hash",
                    row.seq
                ),
            );
        }
        self.running = full;
        self.expected_seq += 1;
        None
    }

    /// The end of the walk: checks the recorded head against the last event walked.
    pub(crate) fn finish(self, head: Option<Head>) -> ChainReport {
        let (key, count, last, prev_hash) =
            (&self.key, self.count, self.expected_seq - 1, self.running);
        let broken = |seq, problem: String| ChainBreak { seq, problem };
        let head = match head {
            Some(h) => h,
            None if last > 0 => {
                return report(
                    count,
                    Some(broken(
                        last,
                        "the chain head record is missing (deleted outside opmark)".to_owned(),
                    )),
                )
            }
            None => return report(count, None),
        };
        if head.mac.as_deref() != Some(head_mac(key, head.seq, &head.hash).as_str()) {
            // Whatever the rows say, the head was not written by a holder of the key: a
            // deleted tail "fixed" by copying the last remaining event into the head looks
            // exactly like this.
            return report(
            count,
            Some(broken(
                head.seq.min(last) + 1,
                format!(
                    "the chain head (event #{}) was rewritten outside opmark (its MAC does not match): events after #{} may have been deleted",
                    head.seq,
                    head.seq.min(last)
                ),
            )),
        );
        }
        let head_seq = head.seq;
        if head_seq > last {
            return report(
            count,
            Some(broken(
                last + 1,
                format!(
                    "event #{} is missing (deleted): the chain head records {head_seq} events, the last stored one is #{last}",
                    last + 1
                ),
            )),
        );
        }
        if head_seq == last && head.hash != prev_hash && last > 0 {
            return report(
                count,
                Some(broken(
                    last,
                    format!(
                        "event #{last} was edited or replaced: it does not match the chain head"
                    ),
                )),
            );
        }
        if head_seq < last {
            return report(
            count,
            Some(broken(
                head_seq + 1,
                format!(
                    "event #{} was added outside opmark: the chain head records only {head_seq} events",
                    head_seq + 1
                ),
            )),
        );
        }
        let mut whole = report(count, None);
        whole.verified_head = (last > 0).then_some((last, prev_hash));
        whole
    }
}

fn report(events: u64, first_break: Option<ChainBreak>) -> ChainReport {
    ChainReport {
        events,
        first_break,
        first_mismatch: None,
        counters_mismatch: None,
        archived_through: None,
        verified_head: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of its own in a fresh directory.
    fn test_key(name: &str) -> InstallationKey {
        let dir = std::env::temp_dir().join(format!("opmark-chain-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = InstallationKey::generate(&dir.join("k")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        key
    }

    /// Events 1..=n as a writer stores them: keyed from `keyed_from` on, each with its
    /// predecessor's hash and its own full hash.
    fn chain_of(n: u64, key: &InstallationKey, keyed_from: u64) -> Vec<Row> {
        let mut prev = GENESIS.to_owned();
        (1..=n)
            .map(|seq| {
                let mut row = Row {
                    seq,
                    prev_hash: prev.clone(),
                    op_id: format!("op-{seq}"),
                    host: "web1".to_owned(),
                    at: format!("2026-12-06T08:00:0{seq}Z"),
                    kind: "verdict".to_owned(),
                    payload: format!("{{\"n\":{seq}}}"),
                    ..Row::default()
                };
                row.hash = hash_of(&row, key, keyed_from);
                prev.clone_from(&row.hash);
                row
            })
            .collect()
    }

    /// The full hash of `row` with its stored predecessor.
    fn hash_of(row: &Row, key: &InstallationKey, keyed_from: u64) -> String {
        recompute(row, &row.prev_hash, &EventMac::new(key), keyed_from)
    }

    fn head_of(rows: &[Row], key: &InstallationKey) -> Option<Head> {
        let last = rows.last()?;
        Some(Head {
            seq: last.seq,
            hash: last.hash.clone(),
            mac: Some(head_mac(key, last.seq, &last.hash)),
        })
    }

    fn first_break(report: &ChainReport) -> (u64, String) {
        let b = report.first_break.as_ref().expect("a break");
        (b.seq, b.problem.clone())
    }

    #[test]
    fn a_whole_chain_verifies_and_its_last_event_is_where_the_next_verify_starts() {
        let key = test_key("whole");
        let rows = chain_of(5, &key, 1);
        let report = verify(&rows, head_of(&rows, &key), &key, 1);
        assert!(report.intact(), "{report:?}");
        assert_eq!(report.events, 5);
        assert_eq!(report.verified_head, Some((5, rows[4].hash.clone())));
        let empty = verify(&[], None, &key, 1);
        assert!(empty.intact());
        assert_eq!((empty.events, empty.verified_head), (0, None));
    }

    #[test]
    fn an_edited_event_is_named_and_its_kind_of_hash_said() {
        let key = test_key("edited");
        for (keyed_from, keyed) in [(1, true), (10, false)] {
            let mut rows = chain_of(5, &key, keyed_from);
            rows[2].payload = "{\"n\":30}".to_owned();
            let report = verify(&rows, head_of(&rows, &key), &key, keyed_from);
            let (seq, problem) = first_break(&report);
            assert_eq!(seq, 3, "{problem}");
            assert!(
                problem.starts_with("event #3 was edited or moved"),
                "{problem}"
            );
            assert_eq!(problem.contains("keyed hash"), keyed, "{problem}");
            assert!(!report.intact());
            assert_eq!(report.events, 3, "the walk stops at the break");
        }
    }

    #[test]
    fn a_deleted_or_moved_event_is_named_by_the_sequence_it_breaks() {
        let key = test_key("moved");
        let mut rows = chain_of(5, &key, 1);
        rows.remove(2);
        let (seq, problem) = first_break(&verify(&rows, head_of(&rows, &key), &key, 1));
        assert_eq!(seq, 3);
        assert_eq!(
            problem,
            "event #3 is missing (deleted): the event after #2 is #4"
        );
        // Moved: a later event where an earlier one should be reads as the earlier one
        // missing; an earlier one where a later one should be, as out of order.
        let mut rows = chain_of(5, &key, 1);
        rows.swap(1, 2);
        let (seq, problem) = first_break(&verify(&rows, head_of(&rows, &key), &key, 1));
        assert_eq!(
            (seq, problem.as_str()),
            (2, "event #2 is missing (deleted): the event after #1 is #3")
        );
        let mut rows = chain_of(5, &key, 1);
        rows.insert(2, rows[0].clone());
        let (seq, problem) = first_break(&verify(&rows, head_of(&rows, &key), &key, 1));
        assert_eq!(
            (seq, problem.as_str()),
            (3, "event #1 appears out of order")
        );
    }

    #[test]
    fn a_predecessor_rewritten_with_a_hash_of_its_own_is_named_by_the_event_after_it() {
        let key = test_key("rewritten");
        let mut rows = chain_of(5, &key, 1);
        rows[1].payload = "{\"n\":20}".to_owned();
        rows[1].hash = hash_of(&rows[1], &key, 1);
        let (seq, problem) = first_break(&verify(&rows, head_of(&rows, &key), &key, 1));
        assert_eq!(seq, 2, "{problem}");
        assert_eq!(
            problem,
            "event #2 was edited, replaced or reordered: event #3 records a different predecessor hash"
        );
    }

    #[test]
    fn the_head_names_a_deleted_tail_an_added_event_and_a_rewrite_by_someone_without_the_key() {
        let key = test_key("head");
        let other = test_key("head-other");
        let rows = chain_of(5, &key, 1);
        let head = |seq: u64, hash: &str, by: &InstallationKey| {
            Some(Head {
                seq,
                hash: hash.to_owned(),
                mac: Some(head_mac(by, seq, hash)),
            })
        };
        let check = |head: Option<Head>, want_seq: u64, want: &str| {
            let report = verify(&rows, head, &key, 1);
            let (seq, problem) = first_break(&report);
            assert_eq!(seq, want_seq, "{problem}");
            assert!(problem.starts_with(want), "{problem}");
            assert_eq!(report.events, 5);
            assert_eq!(report.verified_head, None);
        };
        check(None, 5, "the chain head record is missing");
        // A tail deleted and the head "fixed" by someone without the key: its MAC is wrong.
        check(
            head(3, &rows[2].hash, &other),
            4,
            "the chain head (event #3) was rewritten outside opmark (its MAC does not match): events after #3",
        );
        let mut unmacked = head(5, &rows[4].hash, &key);
        unmacked.as_mut().unwrap().mac = None;
        check(
            unmacked,
            6,
            "the chain head (event #5) was rewritten outside opmark",
        );
        check(
            head(7, "ff", &key),
            6,
            "event #6 is missing (deleted): the chain head records 7 events, the last stored one is #5",
        );
        check(
            head(5, &rows[3].hash, &key),
            5,
            "event #5 was edited or replaced: it does not match the chain head",
        );
        check(
            head(4, &rows[3].hash, &key),
            5,
            "event #5 was added outside opmark: the chain head records only 4 events",
        );
        // A head of an empty chain that says nothing was written is whole.
        assert!(verify(&[], head(0, GENESIS, &key), &key, 1).intact());
    }

    #[test]
    fn a_stored_tag_counts_only_at_the_length_its_kind_of_hash_keeps() {
        let key = test_key("tags");
        let full = chain_of(3, &key, 1);
        for (len, whole) in [
            (KEYED_TAG, true),
            (KEYED_TAG - 1, false),
            (PLAIN_TAG, false),
        ] {
            let mut rows = full.clone();
            rows[1].hash.truncate(len);
            let report = verify(&rows, head_of(&full, &key), &key, 1);
            assert_eq!(report.intact(), whole, "keyed tag of {len}: {report:?}");
        }
        let plain = chain_of(3, &key, 10);
        for (len, whole) in [
            (PLAIN_TAG, true),
            (KEYED_TAG, false),
            (PLAIN_TAG + 1, false),
        ] {
            let mut rows = plain.clone();
            rows[1].hash.truncate(len);
            let report = verify(&rows, head_of(&plain, &key), &key, 10);
            assert_eq!(report.intact(), whole, "plain tag of {len}: {report:?}");
        }
        assert!(matches_stored("abcd", "abcd", true));
        assert!(!matches_stored("abcd", "", false));
    }

    #[test]
    fn implied_predecessors_and_tags_are_filled_in_for_a_copy_that_must_stand_alone() {
        let key = test_key("complete");
        let full = chain_of(4, &key, 3);
        let mut stored = full.clone();
        for row in &mut stored {
            row.prev_hash.clear();
            let tag = if row.seq >= 3 { KEYED_TAG } else { PLAIN_TAG };
            row.hash.truncate(tag);
        }
        // A walk recomputes the implied predecessors itself.
        assert!(verify(&stored, head_of(&full, &key), &key, 3).intact());
        // An edited copy keeps the tag it no longer matches, so its verify names it.
        stored[3].payload = "{\"n\":40}".to_owned();
        complete(&mut stored, &key, 3, GENESIS);
        for (got, want) in stored.iter().zip(&full).take(3) {
            assert_eq!((&got.prev_hash, &got.hash), (&want.prev_hash, &want.hash));
        }
        assert_eq!(stored[3].prev_hash, full[3].prev_hash);
        assert_eq!(stored[3].hash.len(), KEYED_TAG);
        let (seq, _) = first_break(&verify(&stored, head_of(&full, &key), &key, 3));
        assert_eq!(seq, 4);
    }

    #[test]
    fn a_walk_from_a_checkpoint_starts_at_its_hash_and_a_moved_switch_point_breaks() {
        let key = test_key("after");
        let rows = chain_of(5, &key, 3);
        let report = verify_after(&rows[3..], head_of(&rows, &key), &key, 3, 3, &rows[2].hash);
        assert!(report.intact(), "{report:?}");
        assert_eq!(report.events, 2);
        let mut implied = rows[3..].to_vec();
        implied[0].prev_hash.clear();
        let report = verify_after(&implied, head_of(&rows, &key), &key, 3, 3, &rows[1].hash);
        assert_eq!(
            first_break(&report).0,
            4,
            "a checkpoint hash that is not event 3's"
        );
        // The plain events before the switch pass only as plain ones.
        assert!(verify(&rows, head_of(&rows, &key), &key, 3).intact());
        assert_eq!(
            first_break(&verify(&rows, head_of(&rows, &key), &key, 2)).0,
            2
        );
        assert_eq!(
            first_break(&verify(&rows, head_of(&rows, &key), &key, 4)).0,
            3
        );
    }

    #[test]
    fn the_keyed_once_event_mac_is_the_keyed_hash() {
        let key = test_key("eventmac");
        for seq in [0, 1, 9, 10, 12345678901234] {
            let link = Link {
                seq,
                prev_hash: GENESIS,
                op_id: "op-1",
                host: "web1",
                at: "2026-12-01T17:25:10.123456Z",
                kind: "verdict",
                payload: "{\"kind\":\"verdict\"}",
            };
            assert_eq!(EventMac::new(&key).hash(&link), link.keyed_hash(&key));
        }
        // Every length from empty to past two gather buffers, so each piece and each
        // length (one to four digits) lands on and across the buffer's end somewhere.
        let long = "x".repeat(2 * GATHER + 70);
        for n in 0..long.len() {
            let link = Link {
                seq: 7,
                prev_hash: GENESIS,
                op_id: &long[..n % 40],
                host: "web1",
                at: "2026-12-01T17:25:10.123456Z",
                kind: &long[..n % 7],
                payload: &long[..n],
            };
            assert_eq!(
                EventMac::new(&key).hash(&link),
                link.keyed_hash(&key),
                "payload of {n} bytes"
            );
        }
    }
}
