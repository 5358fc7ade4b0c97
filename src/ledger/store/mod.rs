//! What a ledger backend does: the one [`Store`] trait the [`crate::ledger::Ledger`]
//! calls, and its two implementations, [`sqlite`] (a file, the default) and [`postgres`]
//! (a database shared by many machines). The backends hold the SQL and the database
//! crates; the append algorithm, the chain, the checks and the archive cut they run are
//! the ledger's own, written once.

pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::path::Path;

use crate::ledger::append::OpAppend;
use crate::ledger::archive::ArchiveReport;
use crate::ledger::chain::ChainReport;
use crate::ledger::checkpoint::Incremental;
use crate::ledger::cut::Cut;
use crate::ledger::dialect::StatsDialect;
use crate::ledger::durability::Durability;
use crate::ledger::error::LedgerError;
use crate::ledger::event::StoredEvent;
use crate::ledger::filter::ListFilter;
use crate::ledger::fingerprint::InstallationKey;
use crate::ledger::health::Health;
use crate::ledger::op_key::OpKey;
use crate::ledger::projection::OperationRecord;
use crate::ledger::snapshot::Snapshot;
use crate::ledger::stats::Stats;
use crate::redact::Redactor;

/// At most this many earlier operations of one intent are read by the repetition check
/// (each backend's [`Store::same_intent_since`] limits its query to it).
pub const SAME_INTENT_LIMIT: usize = 32;

/// How many (fingerprint, host) pairs `operations` holds more than once and
/// `shared_intents` lacks (docs/ledger.md#health): a row deleted outside opmark would hide
/// a suspected duplicate effect from `stats`. Rows it has beyond those are fine: it only
/// grows (an archived operation's intent stays a candidate). One statement, so one
/// snapshot of both tables on either backend; the same SQL on both.
pub(crate) const MISSING_SHARED_INTENTS: &str = "SELECT COUNT(*) FROM (
    SELECT fingerprint, host FROM operations GROUP BY fingerprint, host HAVING COUNT(*) > 1
    EXCEPT SELECT fingerprint, host FROM shared_intents) AS missing";

/// A family's rank in SQL, least dangerous first as [`Family::ALL`](crate::family::Family)
/// orders them; a word no family has ranks below them all.
fn family_rank(column: &str) -> String {
    let arms: String = crate::family::Family::ALL
        .iter()
        .enumerate()
        .map(|(rank, f)| format!(" WHEN '{}' THEN {rank}", f.as_str()))
        .collect();
    format!("(CASE {column}{arms} ELSE -1 END)")
}

/// What `shared_intents` keeps of one intent, recomputed from `operations`: how many of
/// its operations executed, and the strictest family among those (the first such op id's
/// when two have it). `s` names the `shared_intents` row.
fn shared_intent_counts(dialect: &StatsDialect, s: &str) -> (String, String) {
    let members = format!(
        "FROM operations d WHERE {} AND d.host = {s}.host AND d.executed = 1",
        (dialect.same_fingerprint)("d.fingerprint", &format!("{s}.fingerprint"))
    );
    (
        format!("(SELECT COUNT(*) {members})"),
        format!(
            "(SELECT d.family {members} ORDER BY {} DESC, d.first_seq LIMIT 1)",
            family_rank("d.family")
        ),
    )
}

/// Recounts every row of `shared_intents` from `operations` (a migration, and after an
/// archive or a rebuild deleted operations: the delete trigger keeps the count, not the
/// strictest family).
pub(crate) fn recount_shared_intents(dialect: &StatsDialect) -> String {
    let (executed, family) = shared_intent_counts(dialect, "shared_intents");
    format!("UPDATE shared_intents SET executed = {executed}, family = {family}")
}

/// How many rows of `shared_intents` count other executions or another family than
/// `operations` holds: `stats` would report duplicate effects that are not there, or miss
/// one (`audit verify`).
pub(crate) fn miscounted_shared_intents(dialect: &StatsDialect) -> String {
    let (executed, family) = shared_intent_counts(dialect, "s");
    format!(
        "SELECT COUNT(*) FROM shared_intents s WHERE s.executed <> {executed}
         OR COALESCE(s.family, '') <> COALESCE({family}, '')"
    )
}

/// How many (host, family) tallies of `duplicate_tallies` differ from the duplicates
/// `shared_intents` holds, either way (`audit verify`): `stats` reads the tallies, so an
/// edited one would hide a duplicate effect or report one that is not there. The same
/// SQL on both backends.
pub(crate) fn miscounted_duplicate_tallies() -> String {
    let held = "SELECT host, family, COUNT(*) FROM shared_intents
        WHERE executed > 1 AND family <> 'read-only' GROUP BY host, family";
    let tallied = "SELECT host, family, intents FROM duplicate_tallies WHERE intents <> 0";
    format!(
        "SELECT (SELECT COUNT(*) FROM ({held} EXCEPT {tallied}) AS untallied)
             + (SELECT COUNT(*) FROM ({tallied} EXCEPT {held}) AS overtallied)"
    )
}

/// Where `ledger archive` cut the chain and the cut's MAC, if it ever did.
pub(crate) type RecordedCut = Option<(Cut, Option<String>)>;

/// An open ledger database. Reads see one consistent snapshot per call; appends run
/// [`crate::ledger::append`] in one transaction under the backend's chain-head lock.
pub(crate) trait Store {
    /// Which backend: `sqlite` or `postgresql`.
    fn name(&self) -> &'static str;

    /// Appends one operation's redacted events (with their payloads) in one transaction.
    fn append(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        op: OpAppend,
        durability: Durability,
    ) -> Result<Vec<u64>, LedgerError>;

    /// Appends many operations' events, all or nothing where the backend can.
    fn append_batch(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        ops: Vec<OpAppend>,
        durability: Durability,
    ) -> Result<(), LedgerError>;

    /// Folds a write-ahead log into the database, where there is one.
    fn fold_wal(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    /// `ledger backup` to the new file `dest`; `shown` names the ledger in messages.
    fn backup_to(&self, dest: &Path, shown: &Path) -> Result<(), LedgerError>;

    /// Test support: see `Ledger::expand_rows_for_tests`.
    fn expand_rows_for_tests(&self, _key: &InstallationKey) -> Result<(), LedgerError> {
        Ok(())
    }

    /// The projection row of one operation.
    fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError>;

    /// Every operation with this id, most recently active first.
    fn operations_by_id(&self, op_id: &str) -> Result<Vec<OperationRecord>, LedgerError>;

    /// See `Ledger::same_intent_since`.
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError>;

    /// Operations, most recently active first, filtered.
    fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError>;

    /// One operation's events in order.
    fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError>;

    /// [`Store::events`] with every hash in full.
    fn events_with_hashes(
        &self,
        key: &OpKey,
        ikey: &InstallationKey,
    ) -> Result<Vec<StoredEvent>, LedgerError>;

    /// Hosts on which `op_id` has events.
    fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError>;

    /// The whole chain in one consistent snapshot.
    fn snapshot(&self) -> Result<Snapshot, LedgerError>;

    /// `audit verify`'s full walk in one consistent snapshot.
    fn verify_full(&self, key: &InstallationKey) -> Result<ChainReport, LedgerError>;

    /// See [`MISSING_SHARED_INTENTS`].
    fn missing_shared_intents(&self) -> Result<u64, LedgerError>;

    /// See [`miscounted_shared_intents`].
    fn miscounted_shared_intents(&self) -> Result<u64, LedgerError>;

    /// See [`miscounted_duplicate_tallies`].
    fn miscounted_duplicate_tallies(&self) -> Result<u64, LedgerError>;

    /// `ledger archive` from the first event at or after the cutoff (see
    /// [`crate::ledger::archive`]).
    fn archive(
        &mut self,
        key: &InstallationKey,
        first_seq_at_cutoff: u64,
        file: &Path,
    ) -> Result<ArchiveReport, LedgerError>;

    /// The recorded archive cut and its MAC, and where the keyed chain starts, for
    /// `audit verify --archive`.
    fn archive_cut(&self) -> Result<(RecordedCut, u64), LedgerError>;

    /// What a routine `audit verify` reads, in one consistent snapshot.
    fn snapshot_after_checkpoint(&self) -> Result<Option<Incremental>, LedgerError>;

    /// Records that the chain verified whole up to `seq` (whose event has `hash`).
    fn record_checkpoint(&self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError>;

    /// Counts from the counters every append keeps.
    fn stats(&self) -> Result<Stats, LedgerError>;

    /// Counts over the events from `from_seq` on.
    fn stats_since(&self, from_seq: u64) -> Result<Stats, LedgerError>;

    /// The health counts of the whole ledger (`from_seq` None) or of the window, naming
    /// at most `named` suspected duplicates (`None`: all).
    fn health(
        &self,
        from_seq: Option<u64>,
        needs_human_before: &str,
        stats: &Stats,
        named: Option<usize>,
    ) -> Result<Health, LedgerError>;

    /// The newest sequence number (0 when empty).
    fn head_seq(&self) -> Result<u64, LedgerError>;

    /// The first event at or after `seq`: its seq and record time.
    fn event_at_or_after(&self, seq: u64) -> Result<Option<(u64, String)>, LedgerError>;

    /// The SQLite connection, for tests that edit the file behind opmark's back.
    #[cfg(test)]
    fn sqlite_conn(&self) -> Option<&rusqlite::Connection> {
        None
    }
}
