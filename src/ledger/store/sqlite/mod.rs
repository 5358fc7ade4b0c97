//! The SQLite backend (the default, zero set-up): one file in WAL mode.
//!
//! Concurrency: every append is one short `BEGIN IMMEDIATE` transaction, which takes the
//! write lock up front, so the head it reads is the head it extends and many opmark
//! processes can write at once. Commits are `synchronous=NORMAL` (survives `kill -9`)
//! unless the caller asks for [`Durability::Full`] (also survives power loss), which `run`
//! uses for the intent and the attempt before dispatch. Synchronous rusqlite calls: a
//! cold `run` pays no connection set-up beyond opening the file.

// Leaves first: how rows and atoms are stored, and the private file, are shared by the
// store below and by the archive and the migrations, so they name none of them; this
// file is the store on top.
mod atoms;
mod dialect;
mod private_file;
mod rows;

pub(crate) mod archive;
mod binding;
pub(crate) mod operations;
pub(crate) mod schema;

pub(crate) use dialect::DIALECT;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::ledger::append::{self, AppendTx, OpAppend};
use crate::ledger::binding::Bound;
use crate::ledger::chain;
use crate::ledger::checkpoint;
use crate::ledger::codec;
use crate::ledger::counters::Counts;
use crate::ledger::durability::Durability;
use crate::ledger::error::{DatabaseFault, LedgerError};
use crate::ledger::event::decode;
use crate::ledger::event::{Event, StoredEvent};
use crate::ledger::filter::{ListFilter, SqlArg};
use crate::ledger::fingerprint::{self, InstallationKey};
use crate::ledger::op_key::OpKey;
use crate::ledger::projection::{self, OperationRecord};
use crate::ledger::snapshot::Snapshot;
use crate::ledger::stats::Stats;
use crate::ledger::store::{RecordedCut, Store, MISSING_SHARED_INTENTS, SAME_INTENT_LIMIT};
use crate::redact::Redactor;

use atoms::{AtomCache, AtomsInOrder, AtomsOf, ATOMS_IN_ORDER};
use private_file::create_private;
use rows::{
    decode_row_into, hash_text, insert_row, op_rows, read_rows, read_rows_decoding, rows_where,
    Payloads, ROW_SELECT,
};

/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

impl From<rusqlite::Error> for LedgerError {
    fn from(e: rusqlite::Error) -> Self {
        let fault = match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => DatabaseFault::DiskFull,
            Some(
                rusqlite::ErrorCode::ReadOnly
                | rusqlite::ErrorCode::CannotOpen
                | rusqlite::ErrorCode::PermissionDenied,
            ) => DatabaseFault::AccessDenied,
            Some(rusqlite::ErrorCode::NotADatabase) => DatabaseFault::NotADatabase,
            _ => DatabaseFault::Other,
        };
        LedgerError::Sqlite {
            message: e.to_string(),
            fault,
        }
    }
}

/// An open SQLite ledger.
#[derive(Debug)]
pub(crate) struct SqliteStore {
    pub(crate) conn: Connection,
    /// The committed atoms read or written so far ([`codec`]).
    pub(crate) atoms: RefCell<AtomCache>,
}

struct Tx<'a, 'c> {
    tx: &'a rusqlite::Transaction<'c>,
    atoms: AtomsOf<'a>,
}

impl AppendTx for Tx<'_, '_> {
    fn head(&mut self) -> Result<(u64, String), LedgerError> {
        Ok(self
            .tx
            .query_row("SELECT seq, hash FROM chain_head WHERE id = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((0, chain::GENESIS.to_owned())))
    }

    fn load(&mut self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        operations::load(self.tx, key)
    }

    fn insert(&mut self, r: &chain::Row) -> Result<(), LedgerError> {
        // opmark appends keyed events only (docs/ledger.md#the-installation-key).
        insert_row(self.tx, &mut self.atoms, r, true)
    }

    fn store(&mut self, rec: &OperationRecord) -> Result<(), LedgerError> {
        operations::store(self.tx, rec)
    }

    fn set_head(&mut self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError> {
        self.tx.execute(
            "INSERT INTO chain_head (id, seq, hash, mac) VALUES (1, ?1, ?2, ?3) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, mac = excluded.mac",
            params![seq, hash, mac],
        )?;
        Ok(())
    }

    fn add_counts(&mut self, deltas: &Counts) -> Result<(), LedgerError> {
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO counters (name, n) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET n = n + excluded.n",
        )?;
        for (name, n) in deltas.iter().filter(|(_, n)| **n != 0) {
            stmt.execute(params![name, n])?;
        }
        Ok(())
    }

    fn events_after(
        &mut self,
        key: &OpKey,
        after: u64,
    ) -> Result<Vec<(u64, String, String)>, LedgerError> {
        Ok(op_rows(self.tx, &mut self.atoms, key, after)?
            .into_iter()
            .map(|r| (r.seq, r.at, r.payload))
            .collect())
    }
}

impl SqliteStore {
    /// Opens (creating when missing: file 0600, missing directories 0700), migrates, and
    /// checks the installation key: `key` when named, else [`crate::ledger::key_path_beside`] the
    /// ledger (made with a fresh ledger only; see [`binding`]).
    pub(crate) fn open(
        path: &Path,
        key: Option<&Path>,
    ) -> Result<(SqliteStore, Bound), LedgerError> {
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
        create_private(path)?;
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        set_wal(&conn, path)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // The write-ahead log outlives the process: a process closing its connection
        // last would otherwise fold the log into the file (an fsync of each) and delete
        // it, and the next run would begin a new one (an fsync of its header): three of
        // a run's five fsyncs (docs/performance.md). The log is folded in when it grows
        // (SQLite's auto-checkpoint), so it stays small; a copy of the ledger is `opmark
        // ledger backup`, as the file alone may lack the newest commits.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        let bound = schema::migrate(&mut conn, |tx, found_version| {
            binding::bind(tx, path, key, found_version)
        })?;
        Ok((
            SqliteStore {
                conn,
                atoms: RefCell::default(),
            },
            bound,
        ))
    }

    /// Opens an existing ledger for reading only: what `list`, `show`, `stats` and `audit
    /// verify` need from a ledger this user may read but not write (another user's, a
    /// read-only mount, a copy from a backup). Nothing is created, migrated or bound: a
    /// ledger that needs either says so and names the fix.
    pub(crate) fn open_read_only(
        path: &Path,
        key: Option<&Path>,
    ) -> Result<(SqliteStore, Bound), LedgerError> {
        use rusqlite::OpenFlags;
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match Connection::open_with_flags(path, flags).and_then(|c| {
            c.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
                .map(|_| c)
        }) {
            Ok(conn) => conn,
            // A WAL ledger in a directory this user cannot write, closed cleanly (no -shm
            // left): SQLite can read it only as immutable, a snapshot of the file.
            Err(_) => Connection::open_with_flags(immutable_uri(path), flags)?,
        };
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mut conn = conn;
        let tx = conn.transaction()?;
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version != schema::CURRENT_VERSION {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger {} has schema version {version} and this opmark reads version {}; it can only be {} by someone who can write it (`opmark ledger migrate`, or any `opmark run`){}",
                    path.display(),
                    schema::CURRENT_VERSION,
                    if version > schema::CURRENT_VERSION { "read by a newer opmark, or migrated" } else { "migrated" },
                    if version > schema::CURRENT_VERSION { "; upgrade opmark" } else { "" },
                ),
            });
        }
        let Some(bound) = binding::check(&tx, path, key)? else {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger {} has no installation key bound yet, and binding one writes to it; open it once with write access (any `opmark run`, or `opmark ledger migrate`)",
                    path.display()
                ),
            });
        };
        drop(tx);
        Ok((
            SqliteStore {
                conn,
                atoms: RefCell::default(),
            },
            bound,
        ))
    }

    /// The counters `stats` reads.
    pub(crate) fn counters(&self) -> Result<BTreeMap<String, i64>, LedgerError> {
        let mut stmt = self.conn.prepare("SELECT name, n FROM counters")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The health events of the window from `from_seq`, named as the counters name them
    /// (`health::key`), from one pass over the window's events.
    fn health_window_events(&self, from_seq: u64) -> Result<BTreeMap<String, u64>, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let mut decoded: Vec<(OpKey, Event)> = Vec::new();
        const COUNTED: &[&str] = &[
            "verdict",
            "reconciled",
            "contradiction",
            "repetition_held",
            "linked",
            "attempt_dispatched",
            "boundary_reached",
        ];
        read_rows_decoding(
            &tx,
            &mut AtomsOf::reading(&tx, &self.atoms),
            "WHERE e.seq >= ?1 ORDER BY e.seq",
            params![from_seq as i64],
            Payloads::Of(COUNTED),
            |r| {
                if COUNTED.contains(&r.kind.as_str()) {
                    if let Ok(event) = decode(r.seq, &r.payload) {
                        decoded.push((OpKey::new(r.op_id, r.host), event));
                    }
                }
                Ok(())
            },
        )?;
        let mut families: std::collections::HashMap<OpKey, String> = Default::default();
        // Attempt numbers seen in the window: a refused boundary of an attempt dispatched
        // before the window is not counted as a refused retry (it began earlier).
        let mut numbers: std::collections::HashMap<String, u32> = Default::default();
        let mut out = BTreeMap::new();
        for (key, event) in decoded {
            if !families.contains_key(&key) {
                let family: Option<String> = tx
                    .prepare_cached(FAMILY_OF)?
                    .query_row(params![key.op_id, key.host], |r| r.get(0))
                    .optional()?;
                families.insert(
                    key.clone(),
                    family.unwrap_or_else(|| crate::ledger::health::NO_FAMILY.to_owned()),
                );
            }
            let family = &families[&key];
            match &event {
                Event::AttemptDispatched {
                    attempt_id, number, ..
                } => {
                    numbers.insert(attempt_id.clone(), *number);
                }
                Event::BoundaryReached {
                    attempt_id,
                    boundary: crate::vocab::Boundary::Refused,
                    ..
                } => {
                    if numbers.get(attempt_id).is_some_and(|n| *n > 1) {
                        *out.entry(format!(
                            "{}//{family}",
                            crate::ledger::health::REFUSED_RETRY
                        ))
                        .or_insert(0) += 1;
                    }
                }
                other => {
                    if let Some(name) = crate::ledger::health::key(other, family) {
                        *out.entry(name).or_insert(0) += 1;
                    }
                }
            }
        }
        tx.finish()?;
        Ok(out)
    }

    fn verify_full_walk(&self, key: &InstallationKey) -> Result<chain::ChainReport, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let (keyed_from, keyed_from_mac) = binding::keyed_from(&tx)?;
        let header = crate::ledger::verify::Header {
            head: chain_head(&tx)?,
            keyed_from,
            keyed_from_mac,
            counters: {
                let mut stmt = tx.prepare("SELECT name, n FROM counters")?;
                let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<Result<_, _>>()?
            },
            cut: archive::read_cut(&tx)?,
            archived_counts: archive::read_counts(&tx)?,
        };
        let count = || {
            tx.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
                .unwrap_or(0)
        };
        let mut check = match crate::ledger::verify::FullCheck::start(key, header, count) {
            Ok(check) => check,
            Err(report) => return Ok(*report),
        };
        {
            let mut atoms_stmt = tx.prepare(ATOMS_IN_ORDER)?;
            let mut atoms = AtomsInOrder::new(&mut atoms_stmt)?;
            let mut events =
                tx.prepare(&format!("{ROW_SELECT} WHERE e.seq > ?1 ORDER BY e.seq"))?;
            let mut events = events.query(params![check.after() as i64])?;
            let mut stored = tx.prepare(&format!(
                "SELECT {} FROM operations ORDER BY last_seq",
                projection::COLUMNS
            ))?;
            let mut stored = stored.query([])?;
            crate::ledger::verify::feed(
                &mut check,
                |spare| match events.next()? {
                    Some(r) => {
                        let mut row = spare.unwrap_or_default();
                        let back = decode_row_into(r, &mut atoms, &mut row, Payloads::All)?;
                        Ok(Some((row, Some(back.is_none()))))
                    }
                    None => Ok(None),
                },
                || -> Result<_, LedgerError> {
                    Ok(match stored.next()? {
                        Some(r) => Some(operations::from_row(r)?),
                        None => None,
                    })
                },
            )?;
        }
        tx.finish()?;
        Ok(check.finish())
    }

    /// Appends `ops` in one `BEGIN IMMEDIATE` transaction, committed as hard as
    /// `durability` asks (`Full` switches the connection to `synchronous=FULL` for it and
    /// back after); returns their events' sequence numbers, in order. One way for
    /// [`Store::append`] and [`Store::append_batch`], which differ only in how many.
    fn append_ops(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        ops: &[OpAppend],
        durability: Durability,
    ) -> Result<Vec<u64>, LedgerError> {
        let full = durability == Durability::Full;
        if full {
            self.conn.pragma_update(None, "synchronous", "FULL")?;
        }
        let result = self.append_ops_now(ikey, redactor, ops);
        if full {
            // Best effort: a failure here only makes later commits stricter.
            let _ = self.conn.pragma_update(None, "synchronous", "NORMAL");
        }
        result
    }

    /// [`SqliteStore::append_ops`] at the connection's current durability.
    fn append_ops_now(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        ops: &[OpAppend],
    ) -> Result<Vec<u64>, LedgerError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut t = Tx {
            tx: &tx,
            atoms: AtomsOf::writing(&tx, &self.atoms),
        };
        let mut seqs = Vec::new();
        for op in ops {
            seqs.extend(append::append(&mut t, ikey, redactor, op)?);
        }
        let pending = t.atoms.into_pending();
        tx.commit()?;
        self.atoms.borrow_mut().committed(pending);
        Ok(seqs)
    }
}

impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn fold_wal(&self) -> Result<(), LedgerError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// See `Ledger::expand_rows_for_tests`.
    fn expand_rows_for_tests(&self, key: &InstallationKey) -> Result<(), LedgerError> {
        expand_rows(&self.conn, &self.atoms, key)
    }

    fn archive_cut(&self) -> Result<(RecordedCut, u64), LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        Ok((archive::read_cut(&tx)?, binding::keyed_from(&tx)?.0))
    }

    #[cfg(test)]
    fn sqlite_conn(&self) -> Option<&Connection> {
        Some(&self.conn)
    }

    /// See `Ledger::backup_to`. `VACUUM INTO` reads in one transaction, so the copy is a
    /// snapshot even while other processes append; it also works on a read-only ledger.
    fn backup_to(&self, dest: &Path, _shown: &Path) -> Result<(), LedgerError> {
        let Some(dest_text) = dest.to_str() else {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the backup path {} is not valid UTF-8, which SQLite cannot name; choose another path",
                    dest.display()
                ),
            });
        };
        // Made here, empty and 0600 (the ledger's own mode), so that SQLite writes into
        // it instead of creating it with the umask's mode; never an existing file.
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dest)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "{} already exists; a backup never overwrites a file. Name a new file; nothing was written",
                        dest.display()
                    ),
                })
            }
            Err(source) => {
                return Err(LedgerError::Io {
                    what: format!("create the backup {}", dest.display()),
                    source,
                })
            }
        }
        let written = self
            .conn
            .execute("VACUUM INTO ?1", [dest_text])
            .map_err(LedgerError::from)
            .and_then(|_| {
                let sync = |p: &Path| std::fs::File::open(p).and_then(|f| f.sync_all());
                let dir = dest.parent().filter(|d| !d.as_os_str().is_empty());
                sync(dest)
                    .and_then(|()| dir.map_or(Ok(()), sync))
                    .map_err(|source| LedgerError::Io {
                        what: format!("sync the backup {}", dest.display()),
                        source,
                    })
            });
        if written.is_err() {
            // Half a backup is worse than none: it would be taken for one.
            let _ = std::fs::remove_file(dest);
        }
        written
    }

    /// Appends in one `BEGIN IMMEDIATE` transaction.
    fn append(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        op: OpAppend,
        durability: Durability,
    ) -> Result<Vec<u64>, LedgerError> {
        self.append_ops(ikey, redactor, std::slice::from_ref(&op), durability)
    }

    /// Appends many operations' events in one `BEGIN IMMEDIATE` transaction.
    fn append_batch(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        ops: Vec<OpAppend>,
        durability: Durability,
    ) -> Result<(), LedgerError> {
        self.append_ops(ikey, redactor, &ops, durability).map(drop)
    }

    /// The projection row of one operation.
    fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT {} FROM operations WHERE op_id = ?1 AND host = ?2",
                    projection::COLUMNS
                ),
                params![key.op_id, key.host],
                operations::from_row,
            )
            .optional()?)
    }

    /// Every operation with this id (one per host), most recently active first.
    fn operations_by_id(&self, op_id: &str) -> Result<Vec<OperationRecord>, LedgerError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {} FROM operations WHERE op_id = ?1 ORDER BY last_seq DESC",
            projection::COLUMNS
        ))?;
        let rows = stmt.query_map(params![op_id], operations::from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// See `Ledger::same_intent_since`: walks `operations_by_intent`.
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {} FROM operations WHERE substr(fingerprint, 1, 16) = substr(?1, 1, 16) AND +fingerprint = ?1 AND host = ?2 AND op_id <> ?3 AND created_at >= ?4 ORDER BY first_seq LIMIT {}",
            projection::COLUMNS,
            SAME_INTENT_LIMIT
        ))?;
        let rows = stmt.query_map(
            params![fingerprint, host, op_id, codec::stamp_bound(since)],
            operations::from_row,
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Operations, most recently active first, filtered. Each filter is spelled so that
    /// SQLite walks the index made for it (a partial one for unresolved and contradicted
    /// rows) from the newest end and stops at the limit.
    fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError> {
        let (sql, args) = filter.sql(projection::COLUMNS, "unresolved = 1", |i| format!("?{i}"));
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(
            rusqlite::params_from_iter(args.iter().map(|a| match a {
                SqlArg::Text(t) => rusqlite::types::Value::Text(t.clone()),
                SqlArg::Int(n) => rusqlite::types::Value::Integer(*n),
                SqlArg::Stamp(at) => rusqlite::types::Value::Integer(codec::stamp_bound(at)),
            })),
            operations::from_row,
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The first stored event at or after `seq`: `(seq, at)`.
    fn event_at_or_after(&self, seq: u64) -> Result<Option<(u64, String)>, LedgerError> {
        Ok(self
            .conn
            .query_row(
                "SELECT e.seq, e.at, k.base FROM events e JOIN op_keys k ON k.id = e.op WHERE e.seq >= ?1 ORDER BY e.seq LIMIT 1",
                params![seq],
                |r| {
                    let at = match r.get::<_, Value>(1)? {
                        Value::Integer(m) => {
                            codec::micros_to_at(m.saturating_add(r.get::<_, Option<i64>>(2)?.unwrap_or(0)))
                                .unwrap_or_default()
                        }
                        Value::Text(t) => t,
                        _ => String::new(),
                    };
                    Ok((r.get(0)?, at))
                },
            )
            .optional()?)
    }

    /// The head's sequence number (0 before the first event).
    fn head_seq(&self) -> Result<u64, LedgerError> {
        Ok(self
            .conn
            .query_row("SELECT seq FROM chain_head WHERE id = 1", [], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    /// `stats` over the events from `from_seq` on and the operations active since:
    /// O(window), through the primary key and the recency index. The events' payloads are
    /// compact (schema 5), so they are counted here rather than by SQL.
    fn stats_since(&self, from_seq: u64) -> Result<Stats, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let count = |sql: &str| -> Result<u64, LedgerError> {
            Ok(tx.query_row(sql, params![from_seq as i64], |r| r.get(0))?)
        };
        let group = |sql: &str| -> Result<BTreeMap<String, u64>, LedgerError> {
            let mut stmt = tx.prepare(sql)?;
            let rows = stmt.query_map(params![from_seq as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        let ops = |cond: &str| {
            count(&format!(
                "SELECT COUNT(*) FROM operations WHERE last_seq >= ?1{cond}"
            ))
        };
        let mut stats = Stats {
            operations: ops("")?,
            by_state: group(
                "SELECT state, COUNT(*) FROM operations WHERE last_seq >= ?1 GROUP BY state",
            )?,
            by_family: group(
                "SELECT family, COUNT(*) FROM operations WHERE last_seq >= ?1 GROUP BY family",
            )?,
            unresolved: ops(" AND unresolved = 1")?,
            contradicted_operations: ops(" AND contradictions > 0")?,
            ..Stats::default()
        };
        let mut retries: Vec<OpKey> = Vec::new();
        read_rows_decoding(
            &tx,
            &mut AtomsOf::reading(&tx, &self.atoms),
            "WHERE e.seq >= ?1 ORDER BY e.seq",
            params![from_seq as i64],
            Payloads::Of(&["attempt_dispatched", "verdict"]),
            |r| {
                stats.events += 1;
                match r.kind.as_str() {
                    "reconciled" => stats.reconciliations += 1,
                    "operator_decision" => stats.operator_decisions += 1,
                    "contradiction" => stats.contradictions += 1,
                    "attempt_dispatched" => {
                        stats.attempts += 1;
                        if let Ok(Event::AttemptDispatched { number, .. }) =
                            decode(r.seq, &r.payload)
                        {
                            if number > 1 {
                                retries.push(OpKey::new(r.op_id, r.host));
                            }
                        }
                    }
                    "verdict" => {
                        if let Ok(Event::Verdict { verdict, .. }) = decode(r.seq, &r.payload) {
                            *stats
                                .verdicts
                                .entry(verdict.as_str().to_owned())
                                .or_insert(0) += 1;
                        }
                    }
                    _ => {}
                }
                Ok(())
            },
        )?;
        for key in retries {
            let family: Option<String> = tx
                .prepare_cached(FAMILY_OF)?
                .query_row(params![key.op_id, key.host], |r| r.get(0))
                .optional()?;
            if let Some(family) = family {
                *stats.retries_by_family.entry(family).or_insert(0) += 1;
            }
        }
        let verdict = |v: &str| stats.verdicts.get(v).copied().unwrap_or(0);
        let (unknown, conflicts, blocked) = (
            verdict("indeterminate"),
            verdict("conflict"),
            verdict("blocked"),
        );
        stats.unknown_outcomes = unknown;
        stats.conflicts_on_host = conflicts;
        stats.approvals_asked = blocked;
        tx.finish()?;
        Ok(stats)
    }

    /// The health counts (docs/ledger.md#health) of the whole ledger (`from_seq` None,
    /// its events from the counters) or of the window from `from_seq`.
    fn health(
        &self,
        from_seq: Option<u64>,
        needs_human_before: &str,
        stats: &Stats,
        named: Option<usize>,
    ) -> Result<crate::ledger::health::Health, LedgerError> {
        let c = &self.conn;
        // The window's queries name its first sequence number; the whole ledger's none.
        let bind = |stmt: &rusqlite::Statement<'_>| -> Vec<u64> {
            from_seq
                .filter(|_| stmt.parameter_count() == 1)
                .into_iter()
                .collect()
        };
        let group = |sql: &str| -> Result<BTreeMap<String, u64>, LedgerError> {
            let mut stmt = c.prepare(sql)?;
            let args = bind(&stmt);
            let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        let rows = |sql: &str| -> Result<Vec<[String; 4]>, LedgerError> {
            let mut stmt = c.prepare(sql)?;
            let args = bind(&stmt);
            let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
                Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?])
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        let events = match from_seq {
            None => crate::ledger::health::from_counters(&self.counters()?),
            // The payloads are compact (schema 5): the window is counted here, not by SQL.
            Some(from) => self.health_window_events(from)?,
        };
        crate::ledger::health::health(
            &events,
            &stats.retries_by_family,
            &crate::ledger::health::Reads {
                group: &group,
                rows: &rows,
            },
            &DIALECT,
            from_seq.is_some(),
            needs_human_before,
            named,
        )
    }

    /// One operation's events in order.
    fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
        let rows = op_rows(
            &self.conn,
            &mut AtomsOf::reading(&self.conn, &self.atoms),
            key,
            0,
        )?;
        rows.into_iter()
            .map(|r| {
                Ok(StoredEvent {
                    event: decode(r.seq, &r.payload)?,
                    seq: r.seq,
                    op_id: r.op_id,
                    host: r.host,
                    at: r.at,
                    prev_hash: r.prev_hash,
                    hash: r.hash,
                })
            })
            .collect()
    }

    /// [`SqliteStore::events`] with every hash in full, as `show --json` prints them:
    /// each recomputed by a walk from the nearest event before it that keeps its full
    /// hash (an anchor, [`chain::ANCHOR`] events apart at most, or the archive cut), so
    /// this reads a few hundred events, not the chain. Not a verification: an event whose
    /// content no longer matches its tag shows the tag; `audit verify` names it.
    fn events_with_hashes(
        &self,
        key: &OpKey,
        ikey: &InstallationKey,
    ) -> Result<Vec<StoredEvent>, LedgerError> {
        let mut events = self.events(key)?;
        let tx = self.conn.unchecked_transaction()?;
        let (keyed_from, _) = binding::keyed_from(&tx)?;
        let cut = archive::read_cut(&tx)?.map(|(c, _)| c);
        let mut atoms = AtomsOf::reading(&tx, &self.atoms);
        // The last event walked and its full hash.
        let mut walked: Option<(u64, String)> = None;
        for ev in &mut events {
            let need = ev.seq - 1;
            let floor = (need - need % chain::ANCHOR).max(cut.as_ref().map_or(0, |c| c.seq));
            let (from, running) = match walked.take() {
                Some((s, h)) if s <= need && s >= floor => (s, h),
                _ => {
                    let start = if floor == 0 {
                        Some(chain::GENESIS.to_owned())
                    } else if cut.as_ref().is_some_and(|c| c.seq == floor) {
                        cut.as_ref().map(|c| c.hash.clone())
                    } else {
                        tx.prepare_cached("SELECT hash FROM events WHERE seq = ?1")?
                            .query_row(params![floor as i64], |r| r.get::<_, Value>(0))
                            .optional()?
                            .map(hash_text)
                            .filter(|h| h.len() == 64)
                    };
                    let Some(start) = start else {
                        // The anchor is gone (an edit outside opmark): show what is stored.
                        continue;
                    };
                    (floor, start)
                }
            };
            let mut rows = Vec::new();
            read_rows(
                &tx,
                &mut atoms,
                "WHERE e.seq > ?1 AND e.seq <= ?2 ORDER BY e.seq",
                params![from as i64, ev.seq as i64],
                |r| {
                    rows.push(r);
                    Ok(())
                },
            )?;
            chain::complete(&mut rows, ikey, keyed_from, &running);
            if let Some(last) = rows.last().filter(|r| r.seq == ev.seq) {
                ev.prev_hash.clone_from(&last.prev_hash);
                ev.hash.clone_from(&last.hash);
                walked = Some((ev.seq, last.hash.clone()));
            }
        }
        tx.finish()?;
        Ok(events)
    }

    /// Hosts on which `op_id` has events (also those without an intent).
    fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError> {
        let mut stmt = self.conn.prepare(
            "SELECT host FROM op_keys WHERE op_id = ?1 AND last_seq IS NOT NULL ORDER BY host",
        )?;
        let rows = stmt.query_map(params![op_id], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Counts for `opmark stats`, from the counters.
    fn stats(&self) -> Result<Stats, LedgerError> {
        Ok(Stats::from_counters(&self.counters()?))
    }

    /// See [`MISSING_SHARED_INTENTS`].
    fn missing_shared_intents(&self) -> Result<u64, LedgerError> {
        let n: i64 = self
            .conn
            .query_row(MISSING_SHARED_INTENTS, [], |r| r.get(0))?;
        Ok(n as u64)
    }

    /// See [`crate::ledger::store::miscounted_shared_intents`].
    fn miscounted_shared_intents(&self) -> Result<u64, LedgerError> {
        let n: i64 = self.conn.query_row(
            &crate::ledger::store::miscounted_shared_intents(&DIALECT),
            [],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// See [`crate::ledger::store::miscounted_duplicate_tallies`].
    fn miscounted_duplicate_tallies(&self) -> Result<u64, LedgerError> {
        let n: i64 = self.conn.query_row(
            &crate::ledger::store::miscounted_duplicate_tallies(),
            [],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// What a routine `audit verify` reads (see [`checkpoint::read_after`]), in one
    /// consistent snapshot.
    fn snapshot_after_checkpoint(&self) -> Result<Option<checkpoint::Incremental>, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let read = checkpoint::read_after(&mut SqliteReader {
            tx: &tx,
            atoms: &self.atoms,
        })?;
        tx.finish()?;
        Ok(read)
    }

    /// See [`crate::ledger::archive::archive`].
    fn archive(
        &mut self,
        key: &InstallationKey,
        first_seq_at_cutoff: u64,
        file: &Path,
    ) -> Result<crate::ledger::archive::ArchiveReport, LedgerError> {
        archive::archive(&mut self.conn, &self.atoms, key, first_seq_at_cutoff, file)
    }

    /// Records that the chain verified whole up to `seq` (whose event has `hash`).
    fn record_checkpoint(&self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        for (name, value) in checkpoint::facts(seq, hash, mac) {
            tx.execute(
                "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                params![name, value],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// `audit verify`'s full walk ([`crate::ledger::verify`]) in one consistent snapshot: the
    /// events by primary key and the `operations` rows by the recency index, side by
    /// side, so nothing is collected.
    fn verify_full(&self, key: &InstallationKey) -> Result<chain::ChainReport, LedgerError> {
        // Read through a map of the file: the walk reads every page once, and reading
        // them by pread through a small page cache took a third of its time. The map is
        // the page cache's memory, counted in RSS but not the process's own. Given back
        // when the walk ends; an error setting it only loses the speed.
        let _ = self.conn.pragma_update(None, "mmap_size", WALK_MMAP_BYTES);
        let report = self.verify_full_walk(key);
        let _ = self.conn.pragma_update(None, "mmap_size", 0);
        report
    }

    /// The whole chain (`ledger migrate`), read in one consistent snapshot.
    fn snapshot(&self) -> Result<Snapshot, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let head = chain_head(&tx)?;
        let (keyed_from, _) = binding::keyed_from(&tx)?;
        let rows = rows_where(&tx, &self.atoms, "ORDER BY e.seq", [])?;
        let cut = archive::read_cut(&tx)?;
        let archived_counts = archive::read_counts(&tx)?;
        tx.finish()?;
        Ok(Snapshot {
            head,
            keyed_from,
            rows,
            cut,
            archived_counts,
        })
    }
}

/// `file:PATH?immutable=1`, the path percent-encoded where a URI needs it.
fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
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

/// A [`checkpoint::SnapshotReader`] over one SQLite read transaction.
struct SqliteReader<'a> {
    tx: &'a Transaction<'a>,
    atoms: &'a RefCell<AtomCache>,
}

impl checkpoint::SnapshotReader for SqliteReader<'_> {
    fn meta(&mut self, name: &str) -> Result<Option<String>, LedgerError> {
        Ok(self
            .tx
            .query_row(
                "SELECT value FROM meta WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()?)
    }

    fn event_hash(&mut self, seq: u64) -> Result<Option<String>, LedgerError> {
        Ok(self
            .tx
            .query_row(
                "SELECT hash FROM events WHERE seq = ?1",
                params![seq],
                |r| r.get::<_, Value>(0),
            )
            .optional()?
            .map(hash_text))
    }

    fn head(&mut self) -> Result<Option<chain::Head>, LedgerError> {
        Ok(chain_head(self.tx)?)
    }

    fn rows_after(&mut self, seq: u64) -> Result<Vec<chain::Row>, LedgerError> {
        rows_where(
            self.tx,
            self.atoms,
            "WHERE e.seq > ?1 ORDER BY e.seq",
            params![seq],
        )
    }

    fn operations(
        &mut self,
        keys: &std::collections::BTreeSet<OpKey>,
    ) -> Result<(Vec<chain::Row>, Vec<OperationRecord>), LedgerError> {
        let mut history = Vec::new();
        let mut projected = Vec::new();
        let mut row = self.tx.prepare(&format!(
            "SELECT {} FROM operations WHERE op_id = ?1 AND host = ?2",
            projection::COLUMNS
        ))?;
        for key in keys {
            history.extend(op_rows(
                self.tx,
                &mut AtomsOf::reading(self.tx, self.atoms),
                key,
                0,
            )?);
            if let Some(rec) = row
                .query_row(params![key.op_id, key.host], operations::from_row)
                .optional()?
            {
                projected.push(rec);
            }
        }
        Ok((history, projected))
    }
}

/// The chain head row, if any event was ever appended.
fn chain_head(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Option<chain::Head>> {
    tx.query_row(
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
    .optional()
}

/// An operation's family (prepared once per connection: a window looks up one per
/// operation in it).
const FAMILY_OF: &str = "SELECT family FROM operations WHERE op_id = ?1 AND host = ?2";

/// The most of the ledger file `audit verify --full` maps (SQLite maps up to the file's
/// size): past a terabyte it reads the rest as it always did.
const WALK_MMAP_BYTES: i64 = 1 << 40;

/// Rewrites every event row with each column explicit and as text (the stamp, the JSON
/// payload, the hashes in hex, the kind): the same logical rows, readable and editable
/// with plain SQL (`UPDATE events SET payload = replace(payload, …)`), as tests that play an
/// attacker need. Never used by opmark itself.
pub(crate) fn expand_rows(
    conn: &Connection,
    cache: &RefCell<AtomCache>,
    key: &InstallationKey,
) -> Result<(), LedgerError> {
    let mut rows = rows_where(conn, cache, "ORDER BY e.seq", [])?;
    let tx = conn.unchecked_transaction()?;
    let (keyed_from, _) = binding::keyed_from(&tx)?;
    let start = archive::read_cut(&tx)?.map_or(chain::GENESIS.to_owned(), |(c, _)| c.hash);
    chain::complete(&mut rows, key, keyed_from, &start);
    for r in rows {
        tx.execute(
            "UPDATE events SET at = ?1, payload = ?2, hash = ?3, prev_hash = ?4, kind = ?5 WHERE seq = ?6",
            params![r.at, r.payload, r.hash, r.prev_hash, r.kind, r.seq as i64],
        )?;
    }
    tx.commit()?;
    Ok(())
}
