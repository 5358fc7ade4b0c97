//! The ledger: an append-only, hash-chained record of what was intended, what left this
//! machine and what evidence settled it (docs/ledger.md#backends), in SQLite (the default)
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

// The leaves every file of the ledger may name: each holds one shared concept and names
// none of the files below, so the ledger's files import each other without a circle.
// This file sits on top: it holds `Ledger` and re-exports (`pub use`), so the paths the
// rest of the crate names (`crate::ledger::LedgerError`, `crate::ledger::OpKey`, …) stay.
mod counters;
mod cut;
mod dialect;
mod durability;
mod error;
mod filter;
mod meta;
mod op_key;
mod snapshot;
mod stats;

mod append;
pub mod archive;
pub mod binding;
pub mod chain;
mod checkpoint;
mod codec;
pub mod event;
pub mod fingerprint;
pub mod health;
pub mod history;
pub mod projection;
// Redaction is its own top-level module (`op_id` and `policy` use it too); re-exported
// under its old path for the ledger's callers (the ledger's own files name
// `crate::redact`).
pub use crate::redact;
mod store;
mod verify;

// The one PostgreSQL item the commands need (a URL without its password, for messages).
pub(crate) use store::postgres;
pub mod words;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use append::UnlessSettledSince;
pub use binding::key_path_beside;
pub use chain::{ChainBreak, ChainReport, ProjectionMismatch};
pub use durability::Durability;
pub use error::{DatabaseFault, LedgerError, SettledBy};
pub use event::{Event, LinkRelation, Observed, StoredEvent};
pub use filter::ListFilter;
pub use history::History;
pub use op_key::OpKey;
pub use projection::OperationRecord;
pub use redact::Redactor;
pub use stats::Stats;
pub use store::SAME_INTENT_LIMIT;
// Path helpers of their own module now (the keeper needs them too, and `ssh` must not
// depend on the ledger); re-exported for the ledger's callers.
pub use crate::paths::{absolute_env, home_dir};
pub use words::{CancelResult, Decision, ObservationKind, OpState, ProbeState, RefusalWord};

use append::OpAppend;
use error::explain_open_failure;
use fingerprint::InstallationKey;
use snapshot::Snapshot;
use store::{sqlite, Store};

/// How much of the chain a verify walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum VerifyScope {
    /// Every event, every operation, the counters.
    Full,
    /// Only the events after a checkpoint verified earlier, and the operations they touch.
    SinceCheckpoint {
        /// The checkpoint's sequence number.
        checkpoint: u64,
        /// Operations replayed.
        operations: u64,
    },
}

/// An open ledger (a SQLite file or a PostgreSQL database) and its installation key.
pub struct Ledger {
    /// A trait object, not a type parameter: the backend is chosen at run time from the
    /// location, and a generic `Ledger<S>` would make every caller generic or match on
    /// the backend again; one virtual call is nothing beside a database round trip.
    store: Box<dyn Store>,
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

/// The time `back` before now, as events are stamped (UTC RFC 3339, microseconds).
/// `None` when that is before any representable date.
pub fn stamp_before(back: std::time::Duration) -> Option<String> {
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    let d = time::Duration::try_from(back).ok()?;
    time::OffsetDateTime::now_utc()
        .checked_sub(d)?
        .format(&fmt)
        .ok()
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
            (Box::new(store) as Box<dyn Store>, bound, shown)
        } else {
            let (store, bound) = sqlite::SqliteStore::open(location, key)
                .map_err(|e| explain_open_failure(location, e, "open"))?;
            (
                Box::new(store) as Box<dyn Store>,
                bound,
                location.to_path_buf(),
            )
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

    /// Opens `path` only if it exists (read-only commands do not create a ledger). A
    /// SQLite ledger this user may read but not write is opened read-only: reading
    /// commands work on it, and a write through it fails naming the ledger.
    pub fn open_existing(path: &Path, key: Option<&Path>) -> Result<Option<Ledger>, LedgerError> {
        // A database server is always "there": opening it is how to find out.
        if is_postgres_url(path) {
            return Ledger::open_with_key(path, key).map(Some);
        }
        if !path.exists() {
            return Ok(None);
        }
        match Ledger::open_with_key(path, key) {
            Ok(ledger) => Ok(Some(ledger)),
            Err(e) if e.is_access_denied() => {
                let (store, bound) = sqlite::SqliteStore::open_read_only(path, key)
                    .map_err(|e| explain_open_failure(path, e, "read"))?;
                Ok(Some(Ledger {
                    store: Box::new(store),
                    path: path.to_path_buf(),
                    redactor: Redactor::default(),
                    key: bound.key,
                }))
            }
            Err(e) => Err(e),
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
        append_barrier();
        let op = OpAppend {
            key: key.clone(),
            events: self.redacted(events),
            at: now(),
            condition,
        };
        self.store.append(&self.key, &self.redactor, op, durability)
    }

    /// `events` redacted by this ledger's redactor, each with its JSON payload: what is
    /// stored of them.
    fn redacted(&self, events: &[Event]) -> Vec<(Event, String)> {
        events
            .iter()
            .map(|e| {
                let e = e.redacted(&self.redactor);
                let payload = serde_json::to_string(&e).expect("events serialize");
                (e, payload)
            })
            .collect()
    }

    /// Appends many operations' events in ONE transaction, each operation's through the
    /// same append algorithm as [`Ledger::append_many`] (redaction, keyed chain,
    /// projection, contradictions): for imports and for building big ledgers in benches.
    /// All or nothing; `Normal` durability.
    pub fn append_batch(&mut self, ops: &[(OpKey, Vec<Event>)]) -> Result<(), LedgerError> {
        let at = now();
        let stamped: Vec<(OpKey, Vec<Event>, String)> = ops
            .iter()
            .map(|(k, e)| (k.clone(), e.clone(), at.clone()))
            .collect();
        self.append_batch_stamped_durable(&stamped, Durability::Normal)
    }

    /// [`Ledger::append_batch`] with `durability`: a fleet's hosts' writes before their
    /// dispatch in one commit, `Full` so that each is on disk before any of those hosts
    /// is dispatched (src/operation/fleet.rs). PostgreSQL commits each operation on its
    /// own, every commit durable.
    pub fn append_batch_durable(
        &mut self,
        ops: &[(OpKey, Vec<Event>)],
        durability: Durability,
    ) -> Result<(), LedgerError> {
        let at = now();
        let stamped: Vec<(OpKey, Vec<Event>, String)> = ops
            .iter()
            .map(|(k, e)| (k.clone(), e.clone(), at.clone()))
            .collect();
        self.append_batch_stamped_durable(&stamped, durability)
    }

    /// [`Ledger::append_batch`] with each operation's own record time (UTC RFC 3339 with
    /// microseconds, not before the last event's): a bench builds a year of history this
    /// way. Never used by opmark's commands, which stamp the time of the append.
    #[doc(hidden)]
    pub fn append_batch_stamped(
        &mut self,
        ops: &[(OpKey, Vec<Event>, String)],
    ) -> Result<(), LedgerError> {
        self.append_batch_stamped_durable(ops, Durability::Normal)
    }

    fn append_batch_stamped_durable(
        &mut self,
        ops: &[(OpKey, Vec<Event>, String)],
        durability: Durability,
    ) -> Result<(), LedgerError> {
        let mut prepared = Vec::with_capacity(ops.len());
        for (key, events, at) in ops {
            key.check()?;
            prepared.push(OpAppend {
                key: key.clone(),
                events: self.redacted(events),
                at: at.clone(),
                condition: None,
            });
        }
        self.store
            .append_batch(&self.key, &self.redactor, prepared, durability)
    }

    /// Folds SQLite's write-ahead log into the database file (so its size is the
    /// ledger's); nothing to do on PostgreSQL.
    pub fn checkpoint(&self) -> Result<(), LedgerError> {
        self.store.fold_wal()
    }

    /// `ledger backup`: one consistent snapshot of a SQLite ledger (its file and its
    /// write-ahead log, which holds the newest commits) written to the new file `dest`,
    /// mode 0600, synced. A PostgreSQL ledger is refused: its server has its own tools.
    pub fn backup_to(&self, dest: &Path) -> Result<(), LedgerError> {
        self.store.backup_to(dest, &self.path)
    }

    /// Test support, never used by opmark: rewrites a SQLite ledger's event rows with
    /// every column explicit and as text (see `sqlite::expand_rows`), so a test can edit
    /// them with plain SQL as an attacker would. The rows mean the same; nothing changes
    /// for `audit verify`.
    #[doc(hidden)]
    pub fn expand_rows_for_tests(&self) -> Result<(), LedgerError> {
        self.store.expand_rows_for_tests(&self.key)
    }

    /// The projection row of one operation.
    pub fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        self.store.operation(key)
    }

    /// Every operation with this id (one per host), most recently active first.
    pub fn operations_by_id(&self, op_id: &str) -> Result<Vec<OperationRecord>, LedgerError> {
        self.store.operations_by_id(op_id)
    }

    /// Operations of the same intent (ledger fingerprint) on the same host under other op
    /// ids, intended at or after `since` (a stamp as events carry), oldest first, at most
    /// [`SAME_INTENT_LIMIT`]: the ledger half of the repetition check
    /// (docs/guarantees.md#repetitions), an indexed lookup whatever the history's size.
    pub fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        self.store
            .same_intent_since(fingerprint, host, op_id, since)
    }

    /// Operations, most recently active first, filtered.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError> {
        self.store.list(filter)
    }

    /// One operation's events in order.
    pub fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
        self.store.events(key)
    }

    /// [`Ledger::events`] with every event's hash and predecessor hash in full, as `show
    /// --json` prints them (SQLite keeps tags of most, docs/ledger.md#storage).
    pub fn events_with_hashes(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
        self.store.events_with_hashes(key, &self.key)
    }

    /// Hosts on which `op_id` has events (also those without an intent).
    pub fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError> {
        self.store.hosts_of(op_id)
    }

    /// Which backend: `sqlite` or `postgresql`.
    pub fn backend(&self) -> &'static str {
        self.store.name()
    }

    pub(crate) fn snapshot(&self) -> Result<Snapshot, LedgerError> {
        self.store.snapshot()
    }

    /// Walks the whole chain in one consistent snapshot and names the first broken event;
    /// when the chain is whole, replays every operation's events and names the first
    /// projected row that differs from its replay (docs/ledger.md#the-chain). The same checks on
    /// every backend.
    pub fn verify_chain(&self) -> Result<ChainReport, LedgerError> {
        let mut report = self.store.verify_full(&self.key)?;
        if report.first_break.is_none() && report.first_mismatch.is_none() {
            // The tables the projection keeps that the replay does not rebuild, recounted
            // from the rows just checked (`shared_intents` may hold more than they share),
            // and the tallies from `shared_intents`.
            let missing = self.store.missing_shared_intents()?;
            let miscounted = self.store.miscounted_shared_intents()?;
            let mistallied = self.store.miscounted_duplicate_tallies()?;
            let notes = [
                (missing > 0).then(|| format!(
                    "shared_intents: {missing} (fingerprint, host) pair(s) of more than one operation missing, so `stats` does not look at them for duplicate effects"
                )),
                (miscounted > 0).then(|| format!(
                    "shared_intents: {miscounted} intent(s) whose executions or strictest family differ from their operations', so `stats` miscounts duplicate effects"
                )),
                (mistallied > 0).then(|| format!(
                    "duplicate_tallies: {mistallied} (host, family) tally(ies) differ from the duplicates shared_intents holds, so `stats` miscounts duplicate effects"
                )),
            ];
            for note in notes.into_iter().flatten() {
                report.counters_mismatch = Some(match report.counters_mismatch.take() {
                    Some(names) => format!("{names}, {note}"),
                    None => note,
                });
            }
        }
        Ok(report)
    }

    /// `opmark ledger archive --before D FILE`: moves the settled operations finished
    /// before `cutoff` (the oldest stretch of the chain, up to the first event of an
    /// operation that is unresolved or still active) into the new archive `file`, keeping
    /// the cut (see [`archive`]). Both backends.
    pub fn archive_before(
        &mut self,
        cutoff: &str,
        file: &Path,
    ) -> Result<archive::ArchiveReport, LedgerError> {
        let first = self.seq_since(cutoff)?;
        self.store.archive(&self.key, first, file)
    }

    /// `audit verify --archive FILE`: the archive up to the ledger's cut, then the ledger
    /// from it, as the one chain they were. The report counts the events of both.
    pub fn verify_with_archive(&self, file: &Path) -> Result<ChainReport, LedgerError> {
        let (snapshot_cut, keyed_from) = self.store.archive_cut()?;
        let Some((cut, mac)) = snapshot_cut else {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger {} was never archived: verify it without --archive",
                    self.path.display()
                ),
            });
        };
        if mac.as_deref() != Some(cut::cut_mac(&self.key, &cut).as_str()) {
            return self.verify_chain();
        }
        let (rows, recorded) = sqlite::archive::read_file(file, &self.key)?;
        let archived = archive::verify_rows(&rows, recorded, &self.key, &cut, keyed_from);
        if archived.first_break.is_some() {
            return Ok(archived);
        }
        let mut report = self.verify_chain()?;
        report.events += archived.events;
        report.archived_through = None;
        Ok(report)
    }

    /// `audit verify`: without `incremental` or without a usable checkpoint,
    /// [`Ledger::verify_chain`]; else only the events after the last verified checkpoint
    /// (its MAC and its event's hash checked), and the replay of the operations they touch.
    /// An intact result records a new checkpoint at the head (both backends), so the next
    /// routine verify reads only what was appended since. What was verified before the
    /// checkpoint is trusted: an edit there is found by the full walk only.
    pub fn verify(&self, incremental: bool) -> Result<(ChainReport, VerifyScope), LedgerError> {
        let incremental = match incremental {
            true => self.store.snapshot_after_checkpoint()?,
            false => None,
        };
        let usable = incremental.filter(|inc| {
            let (seq, hash, mac) = &inc.checkpoint;
            *mac == chain::checkpoint_mac(&self.key, *seq, hash)
                && inc
                    .stored_hash
                    .as_deref()
                    .is_some_and(|t| chain::matches_stored(hash, t, *seq >= inc.keyed_from))
                && inc.keyed_from_mac.as_deref()
                    == Some(chain::keyed_from_mac(&self.key, inc.keyed_from).as_str())
        });
        let (report, scope) = match usable {
            None => (self.verify_chain()?, VerifyScope::Full),
            Some(inc) => {
                let (seq, hash, _) = &inc.checkpoint;
                let mut report = chain::verify_after(
                    &inc.rows,
                    inc.head.clone(),
                    &self.key,
                    inc.keyed_from,
                    *seq,
                    hash,
                );
                if report.first_break.is_none() {
                    report.first_mismatch =
                        verify::replay_mismatch(&inc.history, &inc.projected).err();
                }
                let operations = inc
                    .rows
                    .iter()
                    .map(|r| (&r.op_id, &r.host))
                    .collect::<std::collections::BTreeSet<_>>()
                    .len() as u64;
                (
                    report,
                    VerifyScope::SinceCheckpoint {
                        checkpoint: *seq,
                        operations,
                    },
                )
            }
        };
        if let (true, Some((seq, hash))) = (report.intact(), &report.verified_head) {
            // Best effort: a ledger this user may read but not write (an auditor's copy,
            // a read-only database role) still verifies; its next verify walks from the
            // older checkpoint.
            let mac = chain::checkpoint_mac(&self.key, *seq, hash);
            let _ = self.store.record_checkpoint(*seq, hash, &mac);
        }
        Ok((report, scope))
    }

    /// Copies this ledger, event for event (same seq, time, hash), into the empty
    /// PostgreSQL ledger `target`, binding it to this ledger's key, then re-verifies the
    /// chain on the target. Returns the target's report. An archived ledger keeps its
    /// cut and archived counts there, so its archive still verifies with the copy.
    pub fn migrate_to(&self, target: &str) -> Result<ChainReport, LedgerError> {
        let mut snapshot = self.snapshot()?;
        let start = match &snapshot.cut {
            None => cut::Cut {
                seq: 0,
                hash: chain::GENESIS.to_owned(),
            },
            Some((cut, mac))
                if mac.as_deref() == Some(cut::cut_mac(&self.key, cut).as_str())
                    && cut::archived_counts(&self.key, snapshot.archived_counts.clone())
                        .is_some() =>
            {
                cut.clone()
            }
            Some(_) => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the ledger {}'s record of its archive cut or archived counts was edited outside opmark (its MAC does not match); keep it as evidence, nothing was copied",
                        self.path.display()
                    ),
                })
            }
        };
        // PostgreSQL stores every hash in full.
        chain::complete(
            &mut snapshot.rows,
            &self.key,
            snapshot.keyed_from,
            &start.hash,
        );
        let report = chain::verify_after(
            &snapshot.rows,
            snapshot.head.clone(),
            &self.key,
            snapshot.keyed_from,
            start.seq,
            &start.hash,
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
            store: Box::new(store),
            path: PathBuf::from(postgres::without_password(target)),
            redactor: self.redactor.clone(),
            key: self.key.clone(),
        };
        copied.verify_chain()
    }

    /// Counts for `opmark stats`, from the counters every append keeps: O(counters).
    pub fn stats(&self) -> Result<Stats, LedgerError> {
        self.store.stats()
    }

    /// Counts for `opmark stats --since D`: the events recorded at or after `cutoff`
    /// (UTC RFC 3339, as events are stamped) and the operations active since.
    pub fn stats_since(&self, cutoff: &str) -> Result<Stats, LedgerError> {
        let from = self.seq_since(cutoff)?;
        self.store.stats_since(from)
    }

    /// [`Ledger::stats`] (whole ledger, `cutoff` None) or [`Ledger::stats_since`], with the
    /// health counts (docs/ledger.md#health); an unresolved operation created before
    /// `needs_human_before` (UTC RFC 3339) counts as needing a human.
    pub fn stats_with_health(
        &self,
        cutoff: Option<&str>,
        needs_human_before: &str,
        named: Option<usize>,
    ) -> Result<Stats, LedgerError> {
        let from = cutoff.map(|c| self.seq_since(c)).transpose()?;
        let mut stats = match from {
            None => self.stats()?,
            Some(from) => self.store.stats_since(from)?,
        };
        stats.health = self.store.health(from, needs_human_before, &stats, named)?;
        Ok(stats)
    }

    /// The first sequence number whose event was recorded at or after `cutoff`, found by
    /// bisection on the chain (a few dozen primary-key reads, whatever the history). Events
    /// are stamped just before their transaction takes the head, so the stamps of
    /// concurrent writers can be out of order by that much: the window's edge is exact to
    /// within the time between stamping and committing.
    pub fn seq_since(&self, cutoff: &str) -> Result<u64, LedgerError> {
        let (mut lo, mut hi) = (1u64, self.store.head_seq()? + 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.store.event_at_or_after(mid)? {
                Some((_, at)) if at.as_str() >= cutoff => hi = mid,
                Some((seq, _)) => lo = seq + 1,
                None => hi = mid,
            }
        }
        Ok(lo)
    }

    /// How many operations `filter` matches, ignoring its limit, when the counters know
    /// (all, or the unresolved ones); `None` for other filters.
    pub fn count_hint(&self, filter: &ListFilter) -> Result<Option<u64>, LedgerError> {
        if filter.host.is_some()
            || filter.contradicted
            || filter.since_seq.is_some()
            || filter.since_at.is_some()
            || filter.before_seq.is_some()
        {
            return Ok(None);
        }
        let stats = self.stats()?;
        Ok(Some(if filter.unresolved {
            stats.unresolved
        } else {
            stats.operations
        }))
    }
}

/// Test builds only: with `OPMARK_TEST_APPEND_BARRIER=DIR` and
/// `OPMARK_TEST_APPEND_BARRIER_N=N`, the process's first append marks itself in DIR and
/// waits (up to 30 s) until N processes have, so the concurrency tests know that N
/// writers reached their append at once (e.g. both operators had read the operation
/// before either decided) instead of hoping a sleep lined them up.
#[cfg(feature = "test-hooks")]
fn append_barrier() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    let (Some(dir), Some(n)) = (
        std::env::var_os("OPMARK_TEST_APPEND_BARRIER"),
        std::env::var("OPMARK_TEST_APPEND_BARRIER_N")
            .ok()
            .and_then(|n| n.parse::<usize>().ok()),
    ) else {
        return;
    };
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let dir = PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(std::process::id().to_string()), b"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_dir(&dir).map_or(0, |d| d.count()) < n
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Nothing: the append barrier exists only with the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn append_barrier() {}

#[cfg(test)]
mod tests;
