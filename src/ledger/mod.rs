//! The local ledger: an append-only, hash-chained SQLite record of what was intended, what
//! left this machine and what evidence settled it (SPEC section 7).
//!
//! - [`event`]: the events (source of truth). [`chain`]: their hash chain and its check.
//! - [`projection`]: the `operations` table folded from the events, and the one
//!   "unresolved" rule. [`schema`]: migrations keyed by `user_version`.
//! - [`words`]: the typed words of events and states (decisions, probe states, refusals).
//!   [`history`]: one walk over an operation's events that every reader shares.
//! - [`redact`]: secret masking, applied by the ledger itself to every free-text field.
//! - [`fingerprint`]: canonical intent digests (plain for the host, HMAC for the ledger),
//!   and the installation key. [`binding`]: how a ledger is bound to its key.
//!
//! Concurrency: every append is one short `BEGIN IMMEDIATE` transaction that reads the
//! chain head, inserts the events, updates the projection and the head, and commits, so
//! many opmark processes can write at once and the chain stays linear. WAL mode; commits
//! are `synchronous=NORMAL` (survives `kill -9`) unless the caller asks for
//! [`Durability::Full`] (also survives power loss), which `run` uses for the intent and
//! the attempt before dispatch.

pub mod binding;
pub mod chain;
pub mod event;
pub mod fingerprint;
pub mod history;
pub mod projection;
pub mod redact;
mod schema;
pub mod words;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

pub use binding::key_path_beside;
pub use chain::{ChainBreak, ChainReport, ProjectionMismatch};
pub use event::{Event, Observed, StoredEvent};
pub use history::History;
pub use projection::OperationRecord;
pub use redact::Redactor;
pub use words::{Decision, OpState, ProbeState, Refusal};

use crate::error::{Error, ErrorKind};
use fingerprint::InstallationKey;

/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the ledger. Messages never contain event contents (they may hold secrets the
/// redactor missed), only paths, sequence numbers and ids.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A file or directory operation failed.
    #[error("could not {what}: {source}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite failed.
    #[error("ledger database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The ledger or a related file is unusable; the message says why and what to do.
    #[error("{message}")]
    Invalid {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The op id on this host is already bound to a different intent.
    #[error("operation `{op_id}` on `{host}` is already bound to a different command or stdin (fingerprint differs); resend exactly the recorded command for the same effect, or use a new op id for a different one")]
    FingerprintConflict {
        /// Operation id.
        op_id: String,
        /// Host.
        host: String,
    },
    /// A stored event cannot be decoded.
    #[error("event #{seq} in the ledger cannot be decoded ({why}); run `opmark audit verify`")]
    Corrupt {
        /// Its sequence number.
        seq: u64,
        /// The decoder's complaint (no event content).
        why: String,
    },
}

impl LedgerError {
    /// The write failed for want of space (SQLite's SQLITE_FULL, or ENOSPC/EDQUOT).
    pub fn is_disk_full(&self) -> bool {
        match self {
            LedgerError::Sqlite(e) => e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull),
            LedgerError::Io { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            }
            _ => false,
        }
    }
}

impl From<LedgerError> for Error {
    fn from(e: LedgerError) -> Self {
        let kind = match e {
            LedgerError::FingerprintConflict { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::LocalIo,
        };
        Error::new(kind, e.to_string())
    }
}

/// The ledger key of an operation: op id + host (the same id on two hosts is two
/// operations).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct OpKey {
    /// Operation id.
    pub op_id: String,
    /// Host as the user named it (alias or `[user@]host`).
    pub host: String,
}

impl OpKey {
    /// Builds a key.
    pub fn new(op_id: impl Into<String>, host: impl Into<String>) -> Self {
        OpKey {
            op_id: op_id.into(),
            host: host.into(),
        }
    }

    fn check(&self) -> Result<(), LedgerError> {
        if crate::op_id::OpId::parse(&self.op_id).is_err() {
            return Err(LedgerError::Invalid {
                message: "refusing to record an event under an invalid operation id (1-128 letters, digits, '.', '_', ':' or '-')".into(),
            });
        }
        if self.host.is_empty()
            || self.host.len() > 1024
            || self
                .host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(LedgerError::Invalid {
                message: "refusing to record an event under an empty host or one containing spaces or control characters".into(),
            });
        }
        Ok(())
    }
}

/// How hard a commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is fsynced before commit returns (survives power loss).
    /// For the intent and the attempt, which must be durable before dispatch.
    Full,
    /// `synchronous=NORMAL`: survives any process crash, may lose the newest commits on
    /// power loss.
    Normal,
}

/// Which operations `list` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only unresolved operations.
    pub unresolved: bool,
    /// Only this host.
    pub host: Option<String>,
    /// At most this many.
    pub limit: Option<usize>,
}

/// Counts for a dashboard (`opmark stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Events in the ledger.
    pub events: u64,
    /// Operations in the ledger.
    pub operations: u64,
    /// Operations by current state.
    pub by_state: BTreeMap<String, u64>,
    /// Operations by family.
    pub by_family: BTreeMap<String, u64>,
    /// Operations whose outcome is not settled.
    pub unresolved: u64,
    /// Verdict events by verdict.
    pub verdicts: BTreeMap<String, u64>,
    /// `indeterminate` verdicts given (unknown outcomes).
    pub unknown_outcomes: u64,
    /// Reconcile decisions recorded.
    pub reconciliations: u64,
    /// `conflict` verdicts recorded: op ids the host's marker binds to another intent.
    /// A conflict with this ledger's own record is answered before anything is written
    /// (the operation's history belongs to its first intent), so it is not counted here.
    pub conflicts_on_host: u64,
    /// `blocked` verdicts given (approval asked).
    pub approvals_asked: u64,
    /// Operator decisions recorded.
    pub operator_decisions: u64,
    /// Contradictions between evidence recorded (SPEC section 3).
    pub contradictions: u64,
    /// Operations with at least one contradiction.
    pub contradicted_operations: u64,
    /// Attempts dispatched.
    pub attempts: u64,
    /// Attempts after the first, by the operation's family.
    pub retries_by_family: BTreeMap<String, u64>,
}

/// An open ledger (one SQLite connection) and its installation key.
pub struct Ledger {
    conn: Connection,
    path: PathBuf,
    redactor: Redactor,
    key: InstallationKey,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn now() -> String {
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    time::OffsetDateTime::now_utc()
        .format(&fmt)
        .expect("UTC time formats")
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

impl Ledger {
    /// `${XDG_STATE_HOME:-~/.local/state}/opmark/ledger.db`.
    pub fn default_path() -> PathBuf {
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| fingerprint::home_dir().join(".local").join("state"));
        state.join("opmark").join("ledger.db")
    }

    /// Opens `path` if given (`--ledger` / `OPMARK_LEDGER`), else the default path, with
    /// the key named by `key` (`--ledger-key` / `OPMARK_LEDGER_KEY`), else the one beside it.
    pub fn open_default_or(path: Option<&Path>, key: Option<&Path>) -> Result<Ledger, LedgerError> {
        match path {
            Some(p) => Ledger::open_with_key(p, key),
            None => Ledger::open_with_key(&Ledger::default_path(), key),
        }
    }

    /// Opens with the key beside the ledger (see [`Ledger::open_with_key`]).
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        Ledger::open_with_key(path, None)
    }

    /// Opens (creating when missing: file 0600, missing directories 0700), migrates, and
    /// checks the installation key: `key` when named, else [`key_path_beside`] the ledger
    /// (made with a fresh ledger only; see [`binding`]).
    pub fn open_with_key(path: &Path, key: Option<&Path>) -> Result<Ledger, LedgerError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fingerprint::create_private_dir(dir)?;
        }
        if path.is_dir() {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger path {} is a directory; give a file path such as {}/ledger.db",
                    path.display(),
                    path.display()
                ),
            });
        }
        // Create the file ourselves so it is 0600 from the start; SQLite gives its -wal
        // and -shm files the database file's mode.
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|source| LedgerError::Io {
                what: format!("open the ledger {}", path.display()),
                source,
            })?;
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        set_wal(&conn, path)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let bound = schema::migrate(&mut conn, |tx, found_version| {
            binding::bind(tx, path, key, found_version)
        })?;
        if let Some(notice) = &bound.notice {
            crate::logging::say(format_args!("{notice}"));
        }
        Ok(Ledger {
            conn,
            path: path.to_path_buf(),
            redactor: Redactor::default(),
            key: bound.key,
        })
    }

    /// Opens `path` only if it exists (read-only commands do not create a ledger).
    pub fn open_existing(path: &Path, key: Option<&Path>) -> Result<Option<Ledger>, LedgerError> {
        if path.exists() {
            Ledger::open_with_key(path, key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Like [`Ledger::open_existing`] at `path` or the default path; also returns the path
    /// that was looked at, for messages.
    pub fn open_existing_default_or(
        path: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<(Option<Ledger>, PathBuf), LedgerError> {
        let path = path.map_or_else(Ledger::default_path, Path::to_path_buf);
        Ok((Ledger::open_existing(&path, key)?, path))
    }

    /// The installation key this ledger was opened with (checked against the ledger).
    pub fn key(&self) -> &InstallationKey {
        &self.key
    }

    /// Uses `redactor` (e.g. with the policy's extra patterns) for every later append.
    pub fn set_redactor(&mut self, redactor: Redactor) {
        self.redactor = redactor;
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event; returns its global sequence number.
    pub fn append(
        &mut self,
        key: &OpKey,
        event: &Event,
        durability: Durability,
    ) -> Result<u64, LedgerError> {
        Ok(self.append_many(key, std::slice::from_ref(event), durability)?[0])
    }

    /// Appends several events of one operation in ONE transaction: all or none are
    /// stored (e.g. the intent and its first attempt). Free-text fields are redacted
    /// first. An `Intended` whose fingerprint differs from the operation's recorded one
    /// is refused with [`LedgerError::FingerprintConflict`] and nothing is stored.
    pub fn append_many(
        &mut self,
        key: &OpKey,
        events: &[Event],
        durability: Durability,
    ) -> Result<Vec<u64>, LedgerError> {
        key.check()?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let full = durability == Durability::Full;
        if full {
            self.conn.pragma_update(None, "synchronous", "FULL")?;
        }
        let result = self.append_tx(key, events);
        if full {
            // Best effort: a failure here only makes later commits stricter.
            let _ = self.conn.pragma_update(None, "synchronous", "NORMAL");
        }
        result
    }

    fn append_tx(&mut self, key: &OpKey, events: &[Event]) -> Result<Vec<u64>, LedgerError> {
        let redacted: Vec<(Event, String)> = events
            .iter()
            .map(|e| {
                let e = e.redacted(&self.redactor);
                let payload = serde_json::to_string(&e).expect("events serialize");
                (e, payload)
            })
            .collect();
        let (ikey, redactor) = (&self.key, &self.redactor);
        // IMMEDIATE takes the write lock up front, so the head we read is the head we extend.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (mut seq, mut prev): (u64, String) = tx
            .query_row("SELECT seq, hash FROM chain_head WHERE id = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((0, chain::GENESIS.to_owned()));
        let at = now();
        let mut seqs = Vec::with_capacity(events.len());
        for (event, payload) in &redacted {
            let before = projection::load(&tx, key)?;
            let contradiction = before
                .as_ref()
                .and_then(|rec| projection::contradiction(rec, event));
            seq += 1;
            prev = insert_event(&tx, ikey, key, seq, &prev, &at, event, payload)?;
            match projection::fold(before, key, event, seq, &at) {
                Ok(Some(rec)) => projection::store(&tx, &rec)?,
                Ok(None) => {}
                // Dropping `tx` rolls back everything of this append.
                Err(projection::Refusal::FingerprintConflict) => {
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
                let before = projection::load(&tx, key)?;
                seq += 1;
                prev = insert_event(&tx, ikey, key, seq, &prev, &at, &noted, &noted_payload)?;
                if let Ok(Some(rec)) = projection::fold(before, key, &noted, seq, &at) {
                    projection::store(&tx, &rec)?;
                }
            }
        }
        tx.execute(
            "INSERT INTO chain_head (id, seq, hash, mac) VALUES (1, ?1, ?2, ?3) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, mac = excluded.mac",
            params![seq, prev, chain::head_mac(ikey, seq, &prev)],
        )?;
        tx.commit()?;
        Ok(seqs)
    }

    /// The projection row of one operation.
    pub fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT {} FROM operations WHERE op_id = ?1 AND host = ?2",
                    projection::COLUMNS
                ),
                params![key.op_id, key.host],
                projection::from_row,
            )
            .optional()?)
    }

    /// Every operation with this id (one per host), most recently active first.
    pub fn operations_by_id(&self, op_id: &str) -> Result<Vec<OperationRecord>, LedgerError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {} FROM operations WHERE op_id = ?1 ORDER BY last_seq DESC",
            projection::COLUMNS
        ))?;
        let rows = stmt.query_map(params![op_id], projection::from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Operations, most recently active first, filtered.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError> {
        let limit = filter.limit.map_or(-1, |l| l as i64);
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {} FROM operations
             WHERE (?1 = 0 OR unresolved = 1) AND (?2 IS NULL OR host = ?2)
             ORDER BY last_seq DESC LIMIT ?3",
            projection::COLUMNS
        ))?;
        let rows = stmt.query_map(
            params![filter.unresolved, filter.host, limit],
            projection::from_row,
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One operation's events in order.
    pub fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, op_id, host, at, payload, prev_hash, hash FROM events
             WHERE op_id = ?1 AND host = ?2 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![key.op_id, key.host], |r| {
            Ok((
                r.get::<_, u64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, op_id, host, at, payload, prev_hash, hash) = row?;
            let event = serde_json::from_str(&payload).map_err(|e| LedgerError::Corrupt {
                seq,
                why: format!("{:?} at column {}", e.classify(), e.column()),
            })?;
            out.push(StoredEvent {
                seq,
                op_id,
                host,
                at,
                event,
                prev_hash,
                hash,
            });
        }
        Ok(out)
    }

    /// Hosts on which `op_id` has events (also those without an intent).
    pub fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT DISTINCT host FROM events WHERE op_id = ?1 ORDER BY host")?;
        let rows = stmt.query_map(params![op_id], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Walks the whole chain in one consistent snapshot and names the first broken event;
    /// when the chain is whole, replays every operation's events and names the first
    /// projected row that differs from its replay (SPEC section 7).
    pub fn verify_chain(&self) -> Result<ChainReport, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let head: Option<chain::Head> = tx
            .query_row(
                "SELECT seq, hash, mac FROM chain_head WHERE id = 1",
                [],
                |r| {
                    Ok(chain::Head {
                        seq: r.get(0)?,
                        hash: r.get(1)?,
                        mac: r.get(2)?,
                    })
                },
            )
            .optional()?;
        let (keyed_from, keyed_from_mac) = binding::keyed_from(&tx)?;
        let rows: Vec<chain::Row> = {
            let mut stmt = tx.prepare(
                "SELECT seq, prev_hash, hash, op_id, host, at, kind, payload FROM events ORDER BY seq",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(chain::Row {
                    seq: r.get(0)?,
                    prev_hash: r.get(1)?,
                    hash: r.get(2)?,
                    op_id: r.get(3)?,
                    host: r.get(4)?,
                    at: r.get(5)?,
                    kind: r.get(6)?,
                    payload: r.get(7)?,
                })
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let projected: Vec<OperationRecord> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {} FROM operations ORDER BY op_id, host",
                projection::COLUMNS
            ))?;
            let rows = stmt.query_map([], projection::from_row)?;
            rows.collect::<Result<_, _>>()?
        };
        tx.finish()?;
        if keyed_from_mac.as_deref() != Some(chain::keyed_from_mac(&self.key, keyed_from).as_str())
        {
            return Ok(ChainReport {
                events: rows.len() as u64,
                first_break: Some(ChainBreak {
                    seq: 1,
                    problem: "the record of where the keyed chain starts was edited outside opmark (its MAC does not match): no event can be trusted".to_owned(),
                }),
                first_mismatch: None,
            });
        }
        let mut report = chain::verify(rows.iter().cloned(), head, &self.key, keyed_from);
        if report.first_break.is_none() {
            report.first_mismatch = replay_mismatch(&rows, &projected);
        }
        Ok(report)
    }

    /// Counts for `opmark stats`.
    pub fn stats(&self) -> Result<Stats, LedgerError> {
        let c = &self.conn;
        let count =
            |sql: &str| -> Result<u64, LedgerError> { Ok(c.query_row(sql, [], |r| r.get(0))?) };
        let group = |sql: &str| -> Result<BTreeMap<String, u64>, LedgerError> {
            let mut stmt = c.prepare(sql)?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        let verdicts = group(
            "SELECT json_extract(payload, '$.verdict'), COUNT(*) FROM events WHERE kind = 'verdict' GROUP BY 1",
        )?;
        Ok(Stats {
            events: count("SELECT COUNT(*) FROM events")?,
            operations: count("SELECT COUNT(*) FROM operations")?,
            by_state: group("SELECT state, COUNT(*) FROM operations GROUP BY state")?,
            by_family: group("SELECT family, COUNT(*) FROM operations GROUP BY family")?,
            unresolved: count("SELECT COUNT(*) FROM operations WHERE unresolved = 1")?,
            unknown_outcomes: verdicts.get("indeterminate").copied().unwrap_or(0),
            conflicts_on_host: verdicts.get("conflict").copied().unwrap_or(0),
            approvals_asked: verdicts.get("blocked").copied().unwrap_or(0),
            verdicts,
            reconciliations: count("SELECT COUNT(*) FROM events WHERE kind = 'reconciled'")?,
            operator_decisions: count(
                "SELECT COUNT(*) FROM events WHERE kind = 'operator_decision'",
            )?,
            contradictions: count("SELECT COUNT(*) FROM events WHERE kind = 'contradiction'")?,
            contradicted_operations: count(
                "SELECT COUNT(*) FROM operations WHERE contradictions > 0",
            )?,
            attempts: count("SELECT COUNT(*) FROM events WHERE kind = 'attempt_dispatched'")?,
            retries_by_family: group(
                "SELECT o.family, COUNT(*) FROM events e
                 JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
                 WHERE e.kind = 'attempt_dispatched' AND json_extract(e.payload, '$.number') > 1
                 GROUP BY o.family",
            )?,
        })
    }
}

/// Inserts one event with its keyed hash; returns the hash.
#[allow(clippy::too_many_arguments)]
fn insert_event(
    tx: &rusqlite::Transaction<'_>,
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
    tx.execute(
        "INSERT INTO events (seq, op_id, host, at, kind, payload, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![seq, key.op_id, key.host, at, event.kind(), payload, prev, hash],
    )?;
    Ok(hash)
}

/// Folds every operation's events again and compares with the stored projection; names
/// the first row (by op id, host) that differs, is missing, or has no events.
fn replay_mismatch(
    rows: &[chain::Row],
    projected: &[OperationRecord],
) -> Option<ProjectionMismatch> {
    let mut replayed: BTreeMap<OpKey, OperationRecord> = BTreeMap::new();
    for row in rows {
        let key = OpKey::new(row.op_id.clone(), row.host.clone());
        let event: Event = match serde_json::from_str(&row.payload) {
            Ok(e) => e,
            Err(e) => {
                return Some(ProjectionMismatch {
                    op_id: row.op_id.clone(),
                    host: row.host.clone(),
                    problem: format!(
                        "event #{} cannot be decoded ({:?} at column {}), so its operation cannot be replayed",
                        row.seq,
                        e.classify(),
                        e.column()
                    ),
                })
            }
        };
        let before = replayed.remove(&key);
        let had = before.clone();
        match projection::fold(before, &key, &event, row.seq, &row.at) {
            Ok(Some(rec)) => {
                replayed.insert(key, rec);
            }
            Ok(None) => {}
            // Refused appends were rolled back; a stored one is not what opmark wrote.
            Err(projection::Refusal::FingerprintConflict) => {
                if let Some(rec) = had {
                    replayed.insert(key, rec);
                }
            }
        }
    }
    let mut stored: BTreeMap<OpKey, &OperationRecord> = projected
        .iter()
        .map(|r| (OpKey::new(r.op_id.clone(), r.host.clone()), r))
        .collect();
    for (key, want) in &replayed {
        let mismatch = |problem: String| ProjectionMismatch {
            op_id: key.op_id.clone(),
            host: key.host.clone(),
            problem,
        };
        match stored.remove(key) {
            None => {
                return Some(mismatch(
                    "its row in `operations` is missing (deleted outside opmark)".to_owned(),
                ))
            }
            Some(got) if got != want => {
                return Some(mismatch(format!(
                    "its row in `operations` differs from the replay of its events in {}",
                    differing_columns(got, want).join(", ")
                )))
            }
            Some(_) => {}
        }
    }
    stored.into_keys().next().map(|key| ProjectionMismatch {
        op_id: key.op_id,
        host: key.host,
        problem: "its row in `operations` has no events behind it (added outside opmark)"
            .to_owned(),
    })
}

/// Names of the columns where `got` differs from `want` (names only: values may hold text
/// the redactor missed, and the stored one is not trusted anyway).
fn differing_columns(got: &OperationRecord, want: &OperationRecord) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |name: &'static str, same: bool| {
        if !same {
            out.push(name);
        }
    };
    check("family", got.family == want.family);
    check("display", got.display == want.display);
    check("fingerprint", got.fingerprint == want.fingerprint);
    check("rule", got.rule == want.rule);
    check("session", got.session == want.session);
    check("state", got.state == want.state);
    check("verdict", got.verdict == want.verdict);
    check("exit_code", got.exit_code == want.exit_code);
    check("attempts", got.attempts == want.attempts);
    check("last_attempt", got.last_attempt == want.last_attempt);
    check("unresolved", got.unresolved == want.unresolved);
    check("created_at", got.created_at == want.created_at);
    check("updated_at", got.updated_at == want.updated_at);
    check("first_seq", got.first_seq == want.first_seq);
    check("last_seq", got.last_seq == want.last_seq);
    check("contradictions", got.contradictions == want.contradictions);
    check(
        "settled_attempt",
        got.settled_attempt == want.settled_attempt,
    );
    out
}

/// Switches to WAL. Done once per database (the mode is persistent); when several
/// processes create the ledger at once the switch can report busy, so retry briefly.
fn set_wal(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the ledger {} cannot use WAL journaling (SQLite kept `{mode}`); put it on a local filesystem",
                        path.display()
                    ),
                })
            }
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests;
