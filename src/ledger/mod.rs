//! The ledger: an append-only, hash-chained record of what was intended, what left this
//! machine and what evidence settled it (SPEC sections 7 and 14), in SQLite (the default)
//! or PostgreSQL (a ledger shared by many machines).
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
//! - [`Ledger`] is the one interface; [`sqlite`] and [`postgres`] are its backends, chosen
//!   by the location (`postgres://…`/`postgresql://…` or a file path). [`append`] is the
//!   append algorithm both run under their chain-head lock, so both keep one linear chain
//!   under concurrent writers and make settlements conditional ([`UnlessSettledSince`]).
//!   Reads and `audit verify` go through the same [`Snapshot`] and checks on both.
//! - The SQLite path stays synchronous rusqlite with no runtime; the PostgreSQL backend
//!   runs tokio-postgres on a thread of its own (see [`postgres`]), so the SQLite path
//!   pays nothing for it.

mod append;
pub mod binding;
pub mod chain;
pub mod event;
pub mod fingerprint;
pub mod history;
pub mod postgres;
pub mod projection;
// Redaction is its own top-level module (`op_id` and `policy` use it too); re-exported
// under its old path so the ledger's own `super::redact` imports stay.
pub use crate::redact;
mod schema;
mod sqlite;
pub mod words;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use append::UnlessSettledSince;
pub use binding::key_path_beside;
pub use chain::{ChainBreak, ChainReport, ProjectionMismatch};
pub use event::{Event, Observed, StoredEvent};
pub use history::History;
pub use projection::OperationRecord;
pub use redact::Redactor;
// Path helpers of their own module now (the keeper needs them too, and `ssh` must not
// depend on the ledger); re-exported for the ledger's callers.
pub use crate::paths::{absolute_env, home_dir};
pub use words::{Decision, OpState, ProbeState, Refusal};

use crate::error::{Error, ErrorKind};
use fingerprint::InstallationKey;

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
    /// PostgreSQL failed (the message names the server's complaint, never event content).
    #[error("ledger database error (PostgreSQL): {0}")]
    Postgres(String),
    /// A conditional settlement found the operation settled by someone else first.
    #[error("{0}")]
    AlreadySettled(Box<SettledBy>),
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
            LedgerError::FingerprintConflict { .. } | LedgerError::AlreadySettled(_) => {
                ErrorKind::InvalidInput
            }
            _ => ErrorKind::LocalIo,
        };
        Error::new(kind, e.to_string())
    }
}

/// Who settled an operation first, for [`LedgerError::AlreadySettled`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledBy {
    /// Operation id.
    pub op_id: String,
    /// Host.
    pub host: String,
    /// `operator NAME` or `reconcile`.
    pub by: String,
    /// When (UTC, RFC 3339).
    pub at: String,
    /// What was decided.
    pub decision: Decision,
    /// The settling event.
    pub seq: u64,
}

impl std::fmt::Display for SettledBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "operation `{}` on `{}` was already settled by {} at {} ({}, event #{}); nothing was recorded. `opmark show {} --host {}` shows it",
            self.op_id, self.host, self.by, self.at, self.decision, self.seq, self.op_id, self.host
        )
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

/// How a backend's SQL spells what `stats` reads beyond plain SQL: a JSON field of an
/// event's payload, and a true boolean column.
pub(crate) struct StatsDialect {
    /// The `verdict` field of `payload`, as text.
    pub verdict: &'static str,
    /// The `number` field of `e.payload`, as an integer.
    pub attempt_number: &'static str,
    /// `operations.unresolved` is true.
    pub unresolved: &'static str,
}

impl Stats {
    /// The counts, from one backend's two query shapes (a single count, and counts by a
    /// key): both backends ask the same questions, only the dialect differs.
    pub(crate) fn query(
        count: impl Fn(&str) -> Result<u64, LedgerError>,
        group: impl Fn(&str) -> Result<BTreeMap<String, u64>, LedgerError>,
        dialect: &StatsDialect,
    ) -> Result<Stats, LedgerError> {
        let events_of = |kind: &str| {
            count(&format!(
                "SELECT COUNT(*) FROM events WHERE kind = '{kind}'"
            ))
        };
        let verdicts = group(&format!(
            "SELECT {}, COUNT(*) FROM events WHERE kind = 'verdict' GROUP BY 1",
            dialect.verdict
        ))?;
        Ok(Stats {
            events: count("SELECT COUNT(*) FROM events")?,
            operations: count("SELECT COUNT(*) FROM operations")?,
            by_state: group("SELECT state, COUNT(*) FROM operations GROUP BY state")?,
            by_family: group("SELECT family, COUNT(*) FROM operations GROUP BY family")?,
            unresolved: count(&format!(
                "SELECT COUNT(*) FROM operations WHERE {}",
                dialect.unresolved
            ))?,
            unknown_outcomes: verdicts.get("indeterminate").copied().unwrap_or(0),
            conflicts_on_host: verdicts.get("conflict").copied().unwrap_or(0),
            approvals_asked: verdicts.get("blocked").copied().unwrap_or(0),
            verdicts,
            reconciliations: events_of("reconciled")?,
            operator_decisions: events_of("operator_decision")?,
            contradictions: events_of("contradiction")?,
            contradicted_operations: count(
                "SELECT COUNT(*) FROM operations WHERE contradictions > 0",
            )?,
            attempts: events_of("attempt_dispatched")?,
            retries_by_family: group(&format!(
                "SELECT o.family, COUNT(*) FROM events e
                 JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
                 WHERE e.kind = 'attempt_dispatched' AND {} > 1
                 GROUP BY o.family",
                dialect.attempt_number
            ))?,
        })
    }
}

/// Everything `audit verify` (and `ledger migrate`) reads, in one consistent snapshot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub head: Option<chain::Head>,
    pub keyed_from: u64,
    pub keyed_from_mac: Option<String>,
    pub rows: Vec<chain::Row>,
    pub projected: Vec<OperationRecord>,
}

/// The backend an open ledger runs on.
#[derive(Debug)]
enum Store {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

/// Which backend: dispatches a call to whichever is open.
macro_rules! with_store {
    ($self:expr, $s:ident => $call:expr) => {
        match &$self.store {
            Store::Sqlite($s) => $call,
            Store::Postgres($s) => $call,
        }
    };
}

/// An open ledger (a SQLite file or a PostgreSQL database) and its installation key.
pub struct Ledger {
    store: Store,
    path: PathBuf,
    redactor: Redactor,
    key: InstallationKey,
}

/// Is `location` a PostgreSQL URL (`postgres://…` or `postgresql://…`)?
pub fn is_postgres_url(location: &Path) -> bool {
    location
        .to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

fn decode(seq: u64, payload: &str) -> Result<Event, LedgerError> {
    serde_json::from_str(payload).map_err(|e| LedgerError::Corrupt {
        seq,
        why: format!("{:?} at column {}", e.classify(), e.column()),
    })
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The refusal when no default path can be made: no home anywhere.
fn no_home_error() -> LedgerError {
    LedgerError::Invalid {
        message: format!(
            "no place for the ledger: HOME and XDG_STATE_HOME are unset (or not absolute) and the passwd entry of uid {} names no home directory; set HOME, or name the ledger with --ledger PATH (OPMARK_LEDGER) and its key with --ledger-key PATH; nothing was done",
            rustix::process::geteuid().as_raw()
        ),
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

impl Ledger {
    /// `${XDG_STATE_HOME:-~/.local/state}/opmark/ledger.db`, the home from [`home_dir`];
    /// an error naming the fix when there is no home at all (never the current directory).
    pub fn default_path() -> Result<PathBuf, LedgerError> {
        let state = match absolute_env("XDG_STATE_HOME") {
            Some(state) => state,
            None => home_dir()
                .ok_or_else(no_home_error)?
                .join(".local")
                .join("state"),
        };
        Ok(state.join("opmark").join("ledger.db"))
    }

    /// Opens `path` if given (`--ledger` / `OPMARK_LEDGER`), else the default path, with
    /// the key named by `key` (`--ledger-key` / `OPMARK_LEDGER_KEY`), else the one beside it.
    pub fn open_default_or(path: Option<&Path>, key: Option<&Path>) -> Result<Ledger, LedgerError> {
        match path {
            Some(p) => Ledger::open_with_key(p, key),
            None => Ledger::open_with_key(&Ledger::default_path()?, key),
        }
    }

    /// Opens with the key beside the ledger (see [`Ledger::open_with_key`]).
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        Ledger::open_with_key(path, None)
    }

    /// Opens `location`: a PostgreSQL URL (see [`postgres`]: the key must be named), else a
    /// SQLite file (created when missing: file 0600, missing directories 0700), migrates,
    /// and checks the installation key: `key` when named, else [`key_path_beside`] the
    /// SQLite ledger (made with a fresh ledger only; see [`binding`]).
    pub fn open_with_key(location: &Path, key: Option<&Path>) -> Result<Ledger, LedgerError> {
        let (store, bound, path) = if is_postgres_url(location) {
            let url = location.to_str().unwrap_or_default();
            let (store, bound) = postgres::PgStore::open(url, key)?;
            let shown = PathBuf::from(postgres::without_password(url));
            (Store::Postgres(store), bound, shown)
        } else {
            let (store, bound) = sqlite::SqliteStore::open(location, key)?;
            (Store::Sqlite(store), bound, location.to_path_buf())
        };
        if let Some(notice) = &bound.notice {
            crate::logging::say(format_args!("{notice}"));
        }
        Ok(Ledger {
            store,
            path,
            redactor: Redactor::default(),
            key: bound.key,
        })
    }

    /// Opens `path` only if it exists (read-only commands do not create a ledger).
    pub fn open_existing(path: &Path, key: Option<&Path>) -> Result<Option<Ledger>, LedgerError> {
        // A database server is always "there": opening it is how to find out.
        if is_postgres_url(path) || path.exists() {
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
        let path = match path {
            Some(p) => p.to_path_buf(),
            None => Ledger::default_path()?,
        };
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

    /// The database file, or for PostgreSQL the URL without its password (for messages).
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
        self.append_if(key, events, durability, None)
    }

    /// Like [`Ledger::append_many`], but only if `condition` holds under the chain-head
    /// lock: a settlement (an operator decision, a reconcile) refused with
    /// [`LedgerError::AlreadySettled`] when another writer settled the operation after
    /// the caller read it.
    pub fn append_if(
        &mut self,
        key: &OpKey,
        events: &[Event],
        durability: Durability,
        condition: Option<UnlessSettledSince>,
    ) -> Result<Vec<u64>, LedgerError> {
        key.check()?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let redacted: Vec<(Event, String)> = events
            .iter()
            .map(|e| {
                let e = e.redacted(&self.redactor);
                let payload = serde_json::to_string(&e).expect("events serialize");
                (e, payload)
            })
            .collect();
        let at = now();
        let (ikey, redactor) = (&self.key, &self.redactor);
        match &mut self.store {
            Store::Sqlite(s) => {
                s.append(ikey, redactor, key, &redacted, &at, durability, condition)
            }
            Store::Postgres(p) => p.append(ikey, redactor, key, redacted, at, condition),
        }
    }

    /// The projection row of one operation.
    pub fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        with_store!(self, s => s.operation(key))
    }

    /// Every operation with this id (one per host), most recently active first.
    pub fn operations_by_id(&self, op_id: &str) -> Result<Vec<OperationRecord>, LedgerError> {
        with_store!(self, s => s.operations_by_id(op_id))
    }

    /// Operations, most recently active first, filtered.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError> {
        with_store!(self, s => s.list(filter))
    }

    /// One operation's events in order.
    pub fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
        with_store!(self, s => s.events(key))
    }

    /// Hosts on which `op_id` has events (also those without an intent).
    pub fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError> {
        with_store!(self, s => s.hosts_of(op_id))
    }

    /// Which backend: `sqlite` or `postgresql`.
    pub fn backend(&self) -> &'static str {
        match self.store {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgresql",
        }
    }

    pub(crate) fn snapshot(&self) -> Result<Snapshot, LedgerError> {
        with_store!(self, s => s.snapshot())
    }

    /// Walks the whole chain in one consistent snapshot and names the first broken event;
    /// when the chain is whole, replays every operation's events and names the first
    /// projected row that differs from its replay (SPEC section 7). The same checks on
    /// every backend.
    pub fn verify_chain(&self) -> Result<ChainReport, LedgerError> {
        let Snapshot {
            head,
            keyed_from,
            keyed_from_mac,
            rows,
            projected,
        } = self.snapshot()?;
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

    /// Copies this ledger, event for event (same seq, time, hash), into the empty
    /// PostgreSQL ledger `target`, binding it to this ledger's key, then re-verifies the
    /// chain on the target. Returns the target's report.
    pub fn migrate_to(&self, target: &str) -> Result<ChainReport, LedgerError> {
        let snapshot = self.snapshot()?;
        let report = chain::verify(
            snapshot.rows.iter().cloned(),
            snapshot.head.clone(),
            &self.key,
            snapshot.keyed_from,
        );
        if let Some(b) = report.first_break {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger {} does not verify (event #{}: {}); fix or keep it as evidence, nothing was copied",
                    self.path.display(),
                    b.seq,
                    b.problem
                ),
            });
        }
        if !is_postgres_url(Path::new(target)) {
            return Err(LedgerError::Invalid {
                message: format!(
                    "--to must be a PostgreSQL URL (postgres://USER@HOST/DB or postgresql://…), not `{}`; nothing was copied",
                    postgres::without_password(target)
                ),
            });
        }
        let mut store = postgres::PgStore::open_for_import(target, &self.key)?;
        store.import(&self.key, snapshot)?;
        let copied = Ledger {
            store: Store::Postgres(store),
            path: PathBuf::from(postgres::without_password(target)),
            redactor: self.redactor.clone(),
            key: self.key.clone(),
        };
        copied.verify_chain()
    }

    /// Counts for `opmark stats`.
    pub fn stats(&self) -> Result<Stats, LedgerError> {
        with_store!(self, s => s.stats())
    }
}

/// Folds every operation's events (as `audit verify` and `ledger migrate` do); names the
/// first event that cannot be decoded.
pub(crate) fn replay(
    rows: &[chain::Row],
) -> Result<BTreeMap<OpKey, OperationRecord>, ProjectionMismatch> {
    let mut replayed: BTreeMap<OpKey, OperationRecord> = BTreeMap::new();
    for row in rows {
        let key = OpKey::new(row.op_id.clone(), row.host.clone());
        let event: Event = match serde_json::from_str(&row.payload) {
            Ok(e) => e,
            Err(e) => {
                return Err(ProjectionMismatch {
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
            Err(projection::AppendRefused::FingerprintConflict) => {
                if let Some(rec) = had {
                    replayed.insert(key, rec);
                }
            }
        }
    }
    Ok(replayed)
}

/// Folds every operation's events again and compares with the stored projection; names
/// the first row (by op id, host) that differs, is missing, or has no events.
fn replay_mismatch(
    rows: &[chain::Row],
    projected: &[OperationRecord],
) -> Option<ProjectionMismatch> {
    let replayed = match replay(rows) {
        Ok(r) => r,
        Err(m) => return Some(m),
    };
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

#[cfg(test)]
impl Ledger {
    /// The SQLite connection, for tests that edit the file behind opmark's back.
    fn conn(&self) -> &rusqlite::Connection {
        match &self.store {
            Store::Sqlite(s) => &s.conn,
            Store::Postgres(_) => panic!("not a SQLite ledger"),
        }
    }
}

#[cfg(test)]
mod tests;
