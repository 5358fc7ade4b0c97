//! The SQLite backend (the default, zero set-up): one file in WAL mode.
//!
//! Concurrency: every append is one short `BEGIN IMMEDIATE` transaction, which takes the
//! write lock up front, so the head it reads is the head it extends and many opmark
//! processes can write at once. Commits are `synchronous=NORMAL` (survives `kill -9`)
//! unless the caller asks for [`Durability::Full`] (also survives power loss), which `run`
//! uses for the intent and the attempt before dispatch. Synchronous rusqlite calls: a
//! cold `run` pays no connection set-up beyond opening the file.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::append::{self, AppendTx, UnlessSettledSince};
use super::binding::{self, Bound};
use super::chain;
use super::event::{Event, StoredEvent};
use super::fingerprint::{self, InstallationKey};
use super::projection::{self, OperationRecord};
use super::redact::Redactor;
use super::{decode, schema, Durability, LedgerError, ListFilter, OpKey, Snapshot, Stats};

/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// How SQLite spells what `stats` reads.
pub(crate) const DIALECT: super::StatsDialect = super::StatsDialect {
    verdict: "json_extract(payload, '$.verdict')",
    attempt_number: "json_extract(e.payload, '$.number')",
    unresolved: "unresolved = 1",
    param: "?1",
    json_text: |column, field| format!("json_extract({column}, '$.{field}')"),
};

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// An open SQLite ledger.
#[derive(Debug)]
pub(crate) struct SqliteStore {
    pub(crate) conn: Connection,
}

struct Tx<'a, 'c>(&'a rusqlite::Transaction<'c>);

impl AppendTx for Tx<'_, '_> {
    fn head(&mut self) -> Result<(u64, String), LedgerError> {
        Ok(self
            .0
            .query_row("SELECT seq, hash FROM chain_head WHERE id = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((0, chain::GENESIS.to_owned())))
    }

    fn load(&mut self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        projection::load(self.0, key)
    }

    fn insert(&mut self, r: &chain::Row) -> Result<(), LedgerError> {
        self.0.execute(
            "INSERT INTO events (seq, op_id, host, at, kind, payload, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![r.seq, r.op_id, r.host, r.at, r.kind, r.payload, r.prev_hash, r.hash],
        )?;
        Ok(())
    }

    fn store(&mut self, rec: &OperationRecord) -> Result<(), LedgerError> {
        projection::store(self.0, rec)
    }

    fn set_head(&mut self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError> {
        self.0.execute(
            "INSERT INTO chain_head (id, seq, hash, mac) VALUES (1, ?1, ?2, ?3) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, mac = excluded.mac",
            params![seq, hash, mac],
        )?;
        Ok(())
    }

    fn add_counts(&mut self, deltas: &append::Counts) -> Result<(), LedgerError> {
        let mut stmt = self.0.prepare_cached(
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
        let mut stmt = self.0.prepare(
            "SELECT seq, at, payload FROM events WHERE op_id = ?1 AND host = ?2 AND seq > ?3 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![key.op_id, key.host, after], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl SqliteStore {
    /// Opens (creating when missing: file 0600, missing directories 0700), migrates, and
    /// checks the installation key: `key` when named, else [`super::key_path_beside`] the
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
        let bound = schema::migrate(&mut conn, |tx, found_version| {
            binding::bind(tx, path, key, found_version)
        })?;
        Ok((SqliteStore { conn }, bound))
    }

    /// Appends in one `BEGIN IMMEDIATE` transaction.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        key: &OpKey,
        events: &[(Event, String)],
        at: &str,
        durability: Durability,
        condition: Option<UnlessSettledSince>,
    ) -> Result<Vec<u64>, LedgerError> {
        let full = durability == Durability::Full;
        if full {
            self.conn.pragma_update(None, "synchronous", "FULL")?;
        }
        let result = (|| {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let seqs = append::append(&mut Tx(&tx), ikey, redactor, key, events, at, condition)?;
            tx.commit()?;
            Ok(seqs)
        })();
        if full {
            // Best effort: a failure here only makes later commits stricter.
            let _ = self.conn.pragma_update(None, "synchronous", "NORMAL");
        }
        result
    }

    /// Appends many operations' events in one `BEGIN IMMEDIATE` transaction.
    pub(crate) fn append_batch(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        ops: &[(&OpKey, Vec<(Event, String)>)],
        at: &str,
    ) -> Result<(), LedgerError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        for (key, events) in ops {
            append::append(&mut Tx(&tx), ikey, redactor, key, events, at, None)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The projection row of one operation.
    pub(crate) fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
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
    pub(crate) fn operations_by_id(
        &self,
        op_id: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {} FROM operations WHERE op_id = ?1 ORDER BY last_seq DESC",
            projection::COLUMNS
        ))?;
        let rows = stmt.query_map(params![op_id], projection::from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Operations, most recently active first, filtered. Each filter is spelled so that
    /// SQLite walks the index made for it (a partial one for unresolved and contradicted
    /// rows) from the newest end and stops at the limit.
    pub(crate) fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError> {
        let (sql, args) = filter.sql(projection::COLUMNS, "unresolved = 1", |i| format!("?{i}"));
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(
            rusqlite::params_from_iter(args.iter().map(|a| match a {
                super::SqlArg::Text(t) => rusqlite::types::Value::Text(t.clone()),
                super::SqlArg::Int(n) => rusqlite::types::Value::Integer(*n),
            })),
            projection::from_row,
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The counters `stats` reads.
    pub(crate) fn counters(&self) -> Result<BTreeMap<String, i64>, LedgerError> {
        let mut stmt = self.conn.prepare("SELECT name, n FROM counters")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The first stored event at or after `seq`: `(seq, at)`.
    pub(crate) fn event_at_or_after(&self, seq: u64) -> Result<Option<(u64, String)>, LedgerError> {
        Ok(self
            .conn
            .query_row(
                "SELECT seq, at FROM events WHERE seq >= ?1 ORDER BY seq LIMIT 1",
                params![seq],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// The head's sequence number (0 before the first event).
    pub(crate) fn head_seq(&self) -> Result<u64, LedgerError> {
        Ok(self
            .conn
            .query_row("SELECT seq FROM chain_head WHERE id = 1", [], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    /// `stats` over the events from `from_seq` on and the operations active since.
    pub(crate) fn stats_since(&self, from_seq: u64) -> Result<Stats, LedgerError> {
        let c = &self.conn;
        let count = |sql: &str| -> Result<u64, LedgerError> {
            Ok(c.query_row(sql, params![from_seq], |r| r.get(0))?)
        };
        let group = |sql: &str| -> Result<BTreeMap<String, u64>, LedgerError> {
            let mut stmt = c.prepare(sql)?;
            let rows = stmt.query_map(params![from_seq], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        Stats::query_window(count, group, &DIALECT)
    }

    /// The health counts (docs/ledger.md#health) of the whole ledger (`from_seq` None,
    /// its events from the counters) or of the window from `from_seq`.
    pub(crate) fn health(
        &self,
        from_seq: Option<u64>,
        needs_human_before: &str,
        stats: &Stats,
    ) -> Result<super::health::Health, LedgerError> {
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
            None => super::health::from_counters(&self.counters()?),
            Some(_) => {
                let mut events = group(&super::health::event_counts_sql(&DIALECT, true))?;
                events.extend(group(&super::health::refused_retries_sql(&DIALECT, true))?);
                events
            }
        };
        super::health::health(
            &events,
            &stats.retries_by_family,
            &super::health::Reads {
                group: &group,
                rows: &rows,
            },
            &DIALECT,
            from_seq.is_some(),
            needs_human_before,
        )
    }

    /// One operation's events in order.
    pub(crate) fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
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
            let event = decode(seq, &payload)?;
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
    pub(crate) fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare("SELECT DISTINCT host FROM events WHERE op_id = ?1 ORDER BY host")?;
        let rows = stmt.query_map(params![op_id], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Counts for `opmark stats`, from the counters.
    pub(crate) fn stats(&self) -> Result<Stats, LedgerError> {
        Ok(Stats::from_counters(&self.counters()?))
    }

    /// What a routine `audit verify` reads, in one consistent snapshot: the events after
    /// the last verified checkpoint, and the whole history and row of each operation they
    /// touch. `None` when no checkpoint was recorded.
    pub(crate) fn snapshot_after_checkpoint(
        &self,
    ) -> Result<Option<super::Incremental>, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let get_meta = |name: &str| -> Result<Option<String>, LedgerError> {
            Ok(tx
                .query_row(
                    "SELECT value FROM meta WHERE name = ?1",
                    params![name],
                    |r| r.get(0),
                )
                .optional()?)
        };
        let (Some(at), Some(mac)) = (
            get_meta("verified_through")?,
            get_meta("verified_through_mac")?,
        ) else {
            return Ok(None);
        };
        let Some((seq, hash)) = at
            .split_once(' ')
            .and_then(|(s, h)| Some((s.parse::<u64>().ok()?, h.to_owned())))
        else {
            return Ok(None);
        };
        let stored_hash: Option<String> = tx
            .query_row(
                "SELECT hash FROM events WHERE seq = ?1",
                params![seq],
                |r| r.get(0),
            )
            .optional()?;
        let head = chain_head(&tx)?;
        let (keyed_from, keyed_from_mac) = binding::keyed_from(&tx)?;
        let select = CHAIN_ROW_SELECT;
        let to_row = chain_row;
        let rows: Vec<chain::Row> = {
            let mut stmt = tx.prepare(&format!("{select} WHERE seq > ?1 ORDER BY seq"))?;
            let rows = stmt.query_map(params![seq], to_row)?;
            rows.collect::<Result<_, _>>()?
        };
        let touched: std::collections::BTreeSet<OpKey> = rows
            .iter()
            .map(|r| OpKey::new(r.op_id.clone(), r.host.clone()))
            .collect();
        let mut history = Vec::new();
        let mut projected = Vec::new();
        {
            let mut events = tx.prepare(&format!(
                "{select} WHERE op_id = ?1 AND host = ?2 ORDER BY seq"
            ))?;
            let mut row = tx.prepare(&format!(
                "SELECT {} FROM operations WHERE op_id = ?1 AND host = ?2",
                projection::COLUMNS
            ))?;
            for key in &touched {
                let evs = events.query_map(params![key.op_id, key.host], to_row)?;
                for e in evs {
                    history.push(e?);
                }
                if let Some(rec) = row
                    .query_row(params![key.op_id, key.host], projection::from_row)
                    .optional()?
                {
                    projected.push(rec);
                }
            }
        }
        history.sort_by_key(|r| r.seq);
        tx.finish()?;
        Ok(Some(super::Incremental {
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

    /// See [`super::archive::archive`].
    pub(crate) fn archive(
        &mut self,
        key: &InstallationKey,
        first_seq_at_cutoff: u64,
        file: &Path,
    ) -> Result<super::archive::ArchiveReport, LedgerError> {
        super::archive::archive(&mut self.conn, key, first_seq_at_cutoff, file)
    }

    /// Records that the chain verified whole up to `seq` (whose event has `hash`).
    pub(crate) fn record_checkpoint(
        &self,
        seq: u64,
        hash: &str,
        mac: &str,
    ) -> Result<(), LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        for (name, value) in [
            ("verified_through", format!("{seq} {hash}")),
            ("verified_through_mac", mac.to_owned()),
        ] {
            tx.execute(
                "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                params![name, value],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Everything `audit verify` checks, read in one consistent snapshot.
    pub(crate) fn snapshot(&self) -> Result<Snapshot, LedgerError> {
        let tx = self.conn.unchecked_transaction()?;
        let head = chain_head(&tx)?;
        let (keyed_from, keyed_from_mac) = binding::keyed_from(&tx)?;
        let rows: Vec<chain::Row> = {
            let mut stmt = tx.prepare(&format!("{CHAIN_ROW_SELECT} ORDER BY seq"))?;
            let rows = stmt.query_map([], chain_row)?;
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
        let counters: BTreeMap<String, i64> = {
            let mut stmt = tx.prepare("SELECT name, n FROM counters")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let cut = super::archive::read_cut(&tx)?;
        let archived_counts = super::archive::read_counts(&tx)?;
        tx.finish()?;
        Ok(Snapshot {
            head,
            keyed_from,
            keyed_from_mac,
            rows,
            projected,
            counters,
            cut,
            archived_counts,
        })
    }
}

/// Creates the database file 0600 when it does not exist yet (SQLite gives its -wal and
/// -shm files the database file's mode), and never opens an existing one.
///
/// Closing ANY descriptor of a file drops every POSIX advisory lock this process holds on
/// it, and SQLite's locks are such locks. A fleet opens one connection per host task
/// while its other tasks' connections are open: had this opened (and closed) the
/// existing file, each open would have silently released the locks those connections
/// hold, SQLite (which counts its locks per process) would not retake them, and another
/// process closing its last connection would then believe itself alone, checkpoint and
/// remove the WAL under them: commits lost, or `disk I/O error` (issue 24 row 10). A file
/// that did not exist a moment ago has no connection of this process on it, so closing
/// the descriptor that created it releases nothing.
pub(crate) fn create_private(path: &Path) -> Result<(), LedgerError> {
    // O_CREAT|O_EXCL: an existing file is refused by the kernel without being opened.
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        // Another process (or host task) created it first.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(LedgerError::Io {
            what: format!("create the ledger {}", path.display()),
            source,
        }),
    }
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

/// The columns [`chain_row`] reads, in its order.
pub(crate) const CHAIN_ROW_SELECT: &str =
    "SELECT seq, prev_hash, hash, op_id, host, at, kind, payload FROM events";

/// One event row as the chain checks it, from a [`CHAIN_ROW_SELECT`] query (the ledger's
/// and an archive's events table alike).
pub(crate) fn chain_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<chain::Row> {
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
