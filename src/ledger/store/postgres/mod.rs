//! The PostgreSQL backend: one ledger shared by many machines (docs/ledger.md#backends).
//!
//! - Location: `postgres://…` or `postgresql://…` (`--ledger`, `OPMARK_LEDGER`), in
//!   libpq's URL form; a unix socket is `postgresql://USER@%2Fpath%2Fto%2Fdir/DB` or
//!   `?host=/path/to/dir`.
//! - TLS: this build has no TLS connector (it would add a TLS stack to every opmark for
//!   the sake of one backend). `sslmode=disable` and the default `prefer` connect in
//!   plain text; `sslmode=require` (or stricter) is refused with a message saying so.
//!   Reach a remote server over a unix socket, loopback, or an SSH tunnel
//!   (`ssh -L 5432:localhost:5432 db-host`), which keeps the traffic encrypted.
//! - Key: always operator-supplied (`--ledger-key PATH`, `opmark ledger keygen PATH`),
//!   never generated per machine; the database stores its check value like SQLite's.
//! - Schema: `migrations/postgres/*.sql`, applied in order under an advisory lock, the
//!   version recorded in `opmark_schema`, so many machines opening a fresh database
//!   migrate it once.
//! - Appends: one READ COMMITTED transaction that first locks the single `chain_head`
//!   row (`SELECT … FOR UPDATE`), then runs [`crate::ledger::append`]: writers on any machine are
//!   serialised on the head, and the commit is durable (`synchronous_commit` on) before
//!   `run` dispatches.
//! - Threading: tokio-postgres runs on a thread of its own with a current-thread runtime;
//!   [`PgStore`] sends it jobs and waits. The ledger's API stays synchronous, callable
//!   from async code like the SQLite path, without nesting runtimes, and opmark processes
//!   on SQLite never start that thread.

use std::path::Path;
use std::sync::mpsc;

use tokio_postgres::{Client, NoTls, Row};

use crate::ledger::append::{self, AppendTx, OpAppend};
use crate::ledger::archive::{self, ArchiveReport};
use crate::ledger::binding::Bound;
use crate::ledger::chain;
use crate::ledger::checkpoint;
use crate::ledger::counters::Counts;
use crate::ledger::cut;
use crate::ledger::dialect::StatsDialect;
use crate::ledger::durability::Durability;
use crate::ledger::error::LedgerError;
use crate::ledger::event::decode;
use crate::ledger::event::StoredEvent;
use crate::ledger::filter::{ListFilter, SqlArg};
use crate::ledger::fingerprint::InstallationKey;
use crate::ledger::meta;
use crate::ledger::op_key::OpKey;
use crate::ledger::projection::{self, OperationRecord};
use crate::ledger::snapshot::Snapshot;
use crate::ledger::stats::Stats;
use crate::ledger::store::{RecordedCut, Store, MISSING_SHARED_INTENTS, SAME_INTENT_LIMIT};
use crate::redact::Redactor;
use crate::vocab::Verdict;

/// The schema migrations, in order; migration `i` brings version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../../migrations/postgres/0001_ledger.sql"),
    include_str!("../../../../migrations/postgres/0002_counters.sql"),
    include_str!("../../../../migrations/postgres/0003_fingerprint.sql"),
    include_str!("../../../../migrations/postgres/0004_health.sql"),
    include_str!("../../../../migrations/postgres/0005_shared_intents.sql"),
    include_str!("../../../../migrations/postgres/0006_executed.sql"),
    include_str!("../../../../migrations/postgres/0007_duplicate_tallies.sql"),
];

/// How PostgreSQL spells what `stats` reads (payloads are JSON text).
pub(crate) const DIALECT: StatsDialect = StatsDialect {
    verdict: "payload::jsonb ->> 'verdict'",
    attempt_number: "(e.payload::jsonb ->> 'number')::bigint",
    unresolved: "unresolved",
    param: "$1",
    json_text: |column, field| format!("({column}::jsonb ->> '{field}')"),
    same_fingerprint: |a, b| format!("{a} = {b}"),
    // Text (the stamp has no quote: health checks it is digits and `-:.TZ`).
    stamp: |at| format!("'{at}'"),
};

/// Arbitrary constant naming opmark's advisory lock for migrations.
const MIGRATION_LOCK: i64 = 0x6f70_6d61_726b;

impl From<tokio_postgres::Error> for LedgerError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The server's message (constraint names, connection problems), never a row.
        let text = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        };
        LedgerError::Postgres(text)
    }
}

/// `url` with any password replaced by `***`, for messages and `Ledger::path`.
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    // A `password=` query parameter is a password too.
    let tail: String = match tail.split_once('?') {
        Some((path, query)) => {
            let q: Vec<String> = query
                .split('&')
                .map(|kv| {
                    if kv.starts_with("password=") {
                        "password=***".to_owned()
                    } else {
                        kv.to_owned()
                    }
                })
                .collect();
            format!("{path}?{}", q.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// The connection, owned by the backend's thread.
struct Conn {
    rt: tokio::runtime::Runtime,
    client: Client,
}

type Job = Box<dyn FnOnce(&mut Conn) + Send>;

/// An open PostgreSQL ledger: a handle on its connection thread.
#[derive(Debug)]
pub(crate) struct PgStore {
    jobs: mpsc::Sender<Job>,
}

impl PgStore {
    /// Connects, migrates and checks the key named by `key` (required).
    pub(crate) fn open(url: &str, key: Option<&Path>) -> Result<(PgStore, Bound), LedgerError> {
        let Some(key_path) = key else {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the PostgreSQL ledger {} needs its installation key named: give --ledger-key PATH (or OPMARK_LEDGER_KEY). For a new shared ledger create one with `opmark ledger keygen PATH` and give the same file to every machine",
                    without_password(url)
                ),
            });
        };
        let key = InstallationKey::load(key_path).map_err(|e| match e {
            LedgerError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                LedgerError::Invalid {
                    message: format!(
                        "no installation key at {} (named by --ledger-key / OPMARK_LEDGER_KEY) for the PostgreSQL ledger {}. Copy the shared ledger's key there, or for a new ledger create one with `opmark ledger keygen {}`",
                        key_path.display(),
                        without_password(url),
                        key_path.display()
                    ),
                }
            }
            e => e,
        })?;
        let store = PgStore::connect(url)?;
        let shown = without_password(url);
        let check_key = key.clone();
        store.call(move |c| c.migrate_and_bind(&check_key, &shown, false))?;
        Ok((store, Bound { key, notice: None }))
    }

    /// Connects to an EMPTY ledger database for `ledger migrate`, binding it to `key`.
    pub(crate) fn open_for_import(
        url: &str,
        key: &InstallationKey,
    ) -> Result<PgStore, LedgerError> {
        let store = PgStore::connect(url)?;
        let shown = without_password(url);
        let key = key.clone();
        store.call(move |c| c.migrate_and_bind(&key, &shown, true))?;
        Ok(store)
    }

    fn connect(url: &str) -> Result<PgStore, LedgerError> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| LedgerError::Invalid {
            message: format!(
                "`{}` is not a PostgreSQL URL opmark can use ({e}); the form is postgresql://USER@HOST[:PORT]/DATABASE",
                without_password(url)
            ),
        })?;
        if !matches!(
            config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable | tokio_postgres::config::SslMode::Prefer
        ) {
            return Err(LedgerError::Invalid {
                message: format!(
                    "`{}` asks for TLS (sslmode=require or stricter), and this opmark has no TLS for PostgreSQL: connect over a unix socket, loopback or an SSH tunnel (ssh -L 5432:localhost:5432 DB-HOST) and drop sslmode, or use sslmode=disable",
                    without_password(url)
                ),
            });
        }
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), LedgerError>>();
        let (jobs, queue) = mpsc::channel::<Job>();
        let shown = without_password(url);
        std::thread::Builder::new()
            .name("opmark-ledger-pg".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(source) => {
                        let _ = ready_tx.send(Err(LedgerError::Io {
                            what: "start the PostgreSQL ledger's runtime".into(),
                            source,
                        }));
                        return;
                    }
                };
                let client = match rt.block_on(config.connect(NoTls)) {
                    Ok((client, connection)) => {
                        // Polled whenever a job blocks on the runtime.
                        rt.spawn(connection);
                        client
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(LedgerError::Postgres(format!(
                            "cannot connect to {shown}: {e}; check that the server runs and the URL (user, host, port, database)"
                        ))));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut conn = Conn { rt, client };
                // Ends when the PgStore (the only sender) is dropped.
                while let Ok(job) = queue.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|source| LedgerError::Io {
                what: "start the PostgreSQL ledger's thread".into(),
                source,
            })?;
        ready_rx
            .recv()
            .map_err(|_| LedgerError::Postgres("the connection thread ended".into()))??;
        Ok(PgStore { jobs })
    }

    /// Runs `f` on the connection thread and waits for its result.
    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<R, LedgerError> + Send + 'static,
    ) -> Result<R, LedgerError> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |c| {
                let _ = tx.send(f(c));
            }))
            .map_err(|_| LedgerError::Postgres("the connection thread ended".into()))?;
        rx.recv()
            .map_err(|_| LedgerError::Postgres("the connection thread ended".into()))?
    }

    pub(crate) fn counters(&self) -> Result<std::collections::BTreeMap<String, i64>, LedgerError> {
        self.call(|c| {
            Ok(
                c.block(c.client.query("SELECT name, n FROM counters", &[]))?
                    .iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
                    .collect(),
            )
        })
    }

    /// Copies `snapshot` (a verified SQLite ledger's) into this empty ledger in one
    /// head-locked transaction: the same rows, head and key facts, and the projection
    /// replayed from the events.
    pub(crate) fn import(
        &mut self,
        key: &InstallationKey,
        snapshot: Snapshot,
    ) -> Result<(), LedgerError> {
        let key = key.clone();
        self.call(move |c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(client.transaction())?;
            rt.block_on(tx.query_one("SELECT seq FROM chain_head WHERE id = 1 FOR UPDATE", &[]))?;
            let n: i64 = rt
                .block_on(tx.query_one("SELECT COUNT(*) FROM events", &[]))?
                .get(0);
            if n > 0 {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the target ledger already holds {n} events; `ledger migrate` copies into an empty database only (create a new one, e.g. `createdb opmark_ledger`). Nothing was copied"
                    ),
                });
            }
            let insert = rt.block_on(tx.prepare(
                "INSERT INTO events (seq, op_id, host, at, kind, payload, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            ))?;
            for r in &snapshot.rows {
                rt.block_on(tx.execute(
                    &insert,
                    &[
                        &(r.seq as i64),
                        &r.op_id,
                        &r.host,
                        &r.at,
                        &r.kind,
                        &r.payload,
                        &r.prev_hash,
                        &r.hash,
                    ],
                ))?;
            }
            if let Some(h) = &snapshot.head {
                rt.block_on(tx.execute(
                    "UPDATE chain_head SET seq = $1, hash = $2, mac = $3 WHERE id = 1",
                    &[&(h.seq as i64), &h.hash, &chain::head_mac(&key, h.seq, &h.hash)],
                ))?;
            }
            for (name, value) in [
                ("chain_keyed_from", snapshot.keyed_from.to_string()),
                (
                    "chain_keyed_from_mac",
                    chain::keyed_from_mac(&key, snapshot.keyed_from),
                ),
            ] {
                rt.block_on(tx.execute(
                    "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    &[&name, &value],
                ))?;
            }
            let (records, mut counts) = crate::ledger::verify::replay_counting(&snapshot.rows).map_err(|m| LedgerError::Invalid {
                message: format!(
                    "the ledger's events cannot be replayed ({}: {}); nothing was copied",
                    m.op_id, m.problem
                ),
            })?;
            // An archived ledger: its cut and what the archived events counted come along
            // (the caller checked their MACs), and the counters count the whole history.
            if let (Some((cut, _)), Some((json, _))) = (&snapshot.cut, &snapshot.archived_counts) {
                let archived: Counts =
                    serde_json::from_str(json).map_err(|_| LedgerError::Invalid {
                        message: "the ledger's archived counts cannot be read; nothing was copied"
                            .to_owned(),
                    })?;
                for (name, n) in &archived {
                    *counts.entry(name.clone()).or_insert(0) += n;
                }
                let sealed = archive::Sealed {
                    cut: cut.clone(),
                    counts_json: json.clone(),
                    report: ArchiveReport { cut: cut.seq, events: 0, operations: 0 },
                };
                for (name, value) in archive::facts(&key, &sealed) {
                    rt.block_on(tx.execute(
                        "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                        &[&name, &value],
                    ))?;
                }
            }
            let mut ptx = PgTx { rt, tx };
            for rec in records.values() {
                ptx.store(rec)?;
            }
            // The migration counted the empty ledger; count what was copied instead.
            ptx.rt.block_on(ptx.tx.execute("DELETE FROM counters", &[]))?;
            ptx.add_counts(&counts)?;
            let PgTx { rt, tx } = ptx;
            rt.block_on(tx.commit())?;
            Ok(())
        })
    }
}

impl Store for PgStore {
    fn name(&self) -> &'static str {
        "postgresql"
    }

    fn append_batch(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        ops: Vec<OpAppend>,
        // Every PostgreSQL commit is durable (`synchronous_commit` on).
        _durability: Durability,
    ) -> Result<(), LedgerError> {
        for op in ops {
            self.append(ikey, redactor, op, Durability::Full)?;
        }
        Ok(())
    }

    fn backup_to(&self, _dest: &Path, shown: &Path) -> Result<(), LedgerError> {
        Err(LedgerError::Invalid {
            message: format!(
                "the ledger {} is a PostgreSQL database: back it up with PostgreSQL's own tools (pg_dump); nothing was written",
                shown.display()
            ),
        })
    }

    fn events_with_hashes(
        &self,
        key: &OpKey,
        _ikey: &InstallationKey,
    ) -> Result<Vec<StoredEvent>, LedgerError> {
        // PostgreSQL stores every hash in full.
        self.events(key)
    }

    /// Appends in one head-locked transaction (see the module doc).
    fn append(
        &mut self,
        ikey: &InstallationKey,
        redactor: &Redactor,
        op: OpAppend,
        // Every PostgreSQL commit is durable (`synchronous_commit` on).
        _durability: Durability,
    ) -> Result<Vec<u64>, LedgerError> {
        let (ikey, redactor) = (ikey.clone(), redactor.clone());
        self.call(move |c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(client.transaction())?;
            let mut ptx = PgTx { rt, tx };
            let seqs = append::append(&mut ptx, &ikey, &redactor, &op)?;
            let PgTx { rt, tx } = ptx;
            rt.block_on(tx.commit())?;
            Ok(seqs)
        })
    }

    fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        let key = key.clone();
        self.call(move |c| {
            let sql = format!(
                "SELECT {} FROM operations WHERE op_id = $1 AND host = $2",
                projection::COLUMNS
            );
            let row = c.block(c.client.query_opt(&sql, &[&key.op_id, &key.host]))?;
            row.as_ref().map(record_from).transpose()
        })
    }

    fn operations_by_id(&self, op_id: &str) -> Result<Vec<OperationRecord>, LedgerError> {
        let op_id = op_id.to_owned();
        self.call(move |c| {
            let sql = format!(
                "SELECT {} FROM operations WHERE op_id = $1 ORDER BY last_seq DESC",
                projection::COLUMNS
            );
            let rows = c.block(c.client.query(&sql, &[&op_id]))?;
            rows.iter().map(record_from).collect()
        })
    }

    /// See `Ledger::same_intent_since`.
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        let (fingerprint, host, op_id, since) = (
            fingerprint.to_owned(),
            host.to_owned(),
            op_id.to_owned(),
            since.to_owned(),
        );
        self.call(move |c| {
            let sql = format!(
                "SELECT {} FROM operations WHERE fingerprint = $1 AND host = $2 AND op_id <> $3 AND created_at >= $4 ORDER BY first_seq LIMIT {SAME_INTENT_LIMIT}",
                projection::COLUMNS
            );
            let rows = c.block(c.client.query(&sql, &[&fingerprint, &host, &op_id, &since]))?;
            rows.iter().map(record_from).collect()
        })
    }

    fn list(&self, filter: &ListFilter) -> Result<Vec<OperationRecord>, LedgerError> {
        let (sql, args) = filter.sql(projection::COLUMNS, "unresolved", |i| format!("${i}"));
        self.call(move |c| {
            let args: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = args
                .into_iter()
                .map(|a| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
                    match a {
                        SqlArg::Text(t) | SqlArg::Stamp(t) => Box::new(t),
                        SqlArg::Int(n) => Box::new(n),
                    }
                })
                .collect();
            let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
                .iter()
                .map(|a| a.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            let rows = c.block(c.client.query(&sql, &refs))?;
            rows.iter().map(record_from).collect()
        })
    }

    fn event_at_or_after(&self, seq: u64) -> Result<Option<(u64, String)>, LedgerError> {
        self.call(move |c| {
            Ok(c.block(c.client.query_opt(
                "SELECT seq, at FROM events WHERE seq >= $1 ORDER BY seq LIMIT 1",
                &[&(seq as i64)],
            ))?
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
        })
    }

    fn head_seq(&self) -> Result<u64, LedgerError> {
        self.call(|c| {
            Ok(c.block(
                c.client
                    .query_opt("SELECT seq FROM chain_head WHERE id = 1", &[]),
            )?
            .map_or(0, |r| r.get::<_, i64>(0) as u64))
        })
    }

    fn stats_since(&self, from_seq: u64) -> Result<Stats, LedgerError> {
        self.call(move |c| {
            let from = from_seq as i64;
            let count = |sql: &str| -> Result<u64, LedgerError> {
                Ok(c.block(c.client.query_one(sql, &[&from]))?.get::<_, i64>(0) as u64)
            };
            let group =
                |sql: &str| -> Result<std::collections::BTreeMap<String, u64>, LedgerError> {
                    Ok(c.block(c.client.query(sql, &[&from]))?
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
                        .collect())
                };
            Stats::query_window(count, group, &DIALECT)
        })
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
        let needs_human_before = needs_human_before.to_owned();
        let retries = stats.retries_by_family.clone();
        self.call(move |c| {
            let from = from_seq.map(|f| f as i64);
            // The window's queries name its first sequence number; the whole ledger's none.
            let query = |sql: &str| {
                let args: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match &from {
                    Some(f) if sql.contains("$1") => vec![f],
                    _ => vec![],
                };
                c.block(c.client.query(sql, &args))
            };
            let group =
                |sql: &str| -> Result<std::collections::BTreeMap<String, u64>, LedgerError> {
                    Ok(query(sql)?
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
                        .collect())
                };
            let rows = |sql: &str| -> Result<Vec<[String; 4]>, LedgerError> {
                Ok(query(sql)?
                    .iter()
                    .map(|r| [r.get(0), r.get(1), r.get(2), r.get(3)])
                    .collect())
            };
            let events = match from {
                None => crate::ledger::health::from_counters(
                    &c.block(c.client.query("SELECT name, n FROM counters", &[]))?
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
                        .collect(),
                ),
                Some(_) => {
                    let mut events =
                        group(&crate::ledger::health::event_counts_sql(&DIALECT, true))?;
                    events.extend(group(&crate::ledger::health::refused_retries_sql(
                        &DIALECT, true,
                    ))?);
                    events
                }
            };
            crate::ledger::health::health(
                &events,
                &retries,
                &crate::ledger::health::Reads {
                    group: &group,
                    rows: &rows,
                },
                &DIALECT,
                from.is_some(),
                &needs_human_before,
                named,
            )
        })
    }

    fn events(&self, key: &OpKey) -> Result<Vec<StoredEvent>, LedgerError> {
        let key = key.clone();
        self.call(move |c| {
            let rows = c.block(c.client.query(
                "SELECT seq, op_id, host, at, payload, prev_hash, hash FROM events
                 WHERE op_id = $1 AND host = $2 ORDER BY seq",
                &[&key.op_id, &key.host],
            ))?;
            rows.iter()
                .map(|r| {
                    let seq = r.get::<_, i64>(0) as u64;
                    Ok(StoredEvent {
                        seq,
                        op_id: r.get(1),
                        host: r.get(2),
                        at: r.get(3),
                        event: decode(seq, r.get(4))?,
                        prev_hash: r.get(5),
                        hash: r.get(6),
                    })
                })
                .collect()
        })
    }

    fn hosts_of(&self, op_id: &str) -> Result<Vec<String>, LedgerError> {
        let op_id = op_id.to_owned();
        self.call(move |c| {
            let rows = c.block(c.client.query(
                "SELECT DISTINCT host FROM events WHERE op_id = $1 ORDER BY host",
                &[&op_id],
            ))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// The whole chain (`ledger migrate`), in one REPEATABLE READ (snapshot) transaction.
    fn snapshot(&self) -> Result<Snapshot, LedgerError> {
        self.call(|c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(snapshot_transaction(client))?;
            let header = read_verify_header(rt, &tx)?;
            let rows = rt
                .block_on(tx.query(&format!("{CHAIN_ROW_SELECT} ORDER BY seq"), &[]))?
                .iter()
                .map(chain_row)
                .collect();
            rt.block_on(tx.commit())?;
            Ok(Snapshot {
                head: header.head,
                keyed_from: header.keyed_from,
                rows,
                cut: header.cut,
                archived_counts: header.archived_counts,
            })
        })
    }

    /// `audit verify --full` in one REPEATABLE READ transaction, streamed: the events and
    /// the rows are read a page at a time through two portals and fed to the same check
    /// as SQLite's ([`crate::ledger::verify::feed`]), so memory holds the operations in flight,
    /// not the chain (read whole, a million operations' chain was gigabytes).
    fn verify_full(&self, key: &InstallationKey) -> Result<chain::ChainReport, LedgerError> {
        let key = key.clone();
        self.call(move |c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(snapshot_transaction(client))?;
            let header = read_verify_header(rt, &tx)?;
            let count = || {
                rt.block_on(tx.query_one("SELECT COUNT(*) FROM events", &[]))
                    .map_or(0, |r| r.get::<_, i64>(0) as u64)
            };
            let mut check = match crate::ledger::verify::FullCheck::start(&key, header, count) {
                Ok(check) => check,
                Err(report) => return Ok(*report),
            };
            let after = check.after() as i64;
            let events = rt.block_on(tx.bind(
                &format!("{CHAIN_ROW_SELECT} WHERE seq > $1 ORDER BY seq"),
                &[&after],
            ))?;
            let stored = rt.block_on(tx.bind(
                &format!(
                    "SELECT {} FROM operations ORDER BY last_seq",
                    projection::COLUMNS
                ),
                &[],
            ))?;
            let page = |portal: &tokio_postgres::Portal,
                        into: &mut std::collections::VecDeque<Row>| {
                if into.is_empty() {
                    into.extend(rt.block_on(tx.query_portal(portal, PAGE_ROWS))?);
                }
                Ok::<_, LedgerError>(into.pop_front())
            };
            let (mut event_page, mut stored_page) = Default::default();
            // This layout keeps no link to an operation's previous event, so whether an
            // event is its operation's first is what the walk has seen (a key per
            // operation, still far less than the chain).
            let mut seen = std::collections::HashSet::<String>::new();
            let mut pair = String::new();
            crate::ledger::verify::feed(
                &mut check,
                |_| {
                    Ok(page(&events, &mut event_page)?.map(|r| {
                        let row = chain_row(&r);
                        crate::ledger::verify::pair_key(&mut pair, &row.op_id, &row.host);
                        let first = !seen.contains(&pair) && seen.insert(pair.clone());
                        (row, Some(first))
                    }))
                },
                || {
                    page(&stored, &mut stored_page)?
                        .map(|r| record_from(&r))
                        .transpose()
                },
            )?;
            rt.block_on(tx.commit())?;
            Ok(check.finish())
        })
    }

    /// What a routine `audit verify` reads (see [`checkpoint::read_after`]), in one
    /// REPEATABLE READ transaction.
    fn snapshot_after_checkpoint(&self) -> Result<Option<checkpoint::Incremental>, LedgerError> {
        self.call(|c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(
                client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start(),
            )?;
            let read = checkpoint::read_after(&mut PgReader { rt, tx: &tx })?;
            rt.block_on(tx.commit())?;
            Ok(read)
        })
    }

    /// Records that the chain verified whole up to `seq` (whose event has `hash`).
    fn record_checkpoint(&self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError> {
        let facts = checkpoint::facts(seq, hash, mac);
        self.call(move |c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(client.transaction())?;
            for (name, value) in &facts {
                rt.block_on(tx.execute(
                    "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    &[name, value],
                ))?;
            }
            rt.block_on(tx.commit())?;
            Ok(())
        })
    }

    /// The recorded archive cut and its MAC, and where the keyed chain starts, for
    /// `audit verify --archive`.
    fn archive_cut(&self) -> Result<(RecordedCut, u64), LedgerError> {
        self.call(|c| {
            let mut read = |name: &str| -> Result<Option<String>, LedgerError> {
                Ok(c.block(
                    c.client
                        .query_opt("SELECT value FROM meta WHERE name = $1", &[&name]),
                )?
                .map(|r| r.get(0)))
            };
            let cut = meta::archive_cut(&mut read)?;
            let keyed_from = meta::keyed_from(&mut read)?;
            Ok((cut, keyed_from))
        })
    }

    /// `ledger archive` (see [`archive`]): in one transaction holding the head row, so no
    /// append interleaves and a second archive waits for the first, the cut is lowered
    /// until no operation straddles it and none below it is unresolved, the events
    /// through it are checked and written to `file` ([`archive::seal`]), then deleted
    /// with their operations' rows, and the cut and the archived counts kept in `meta`.
    /// The counters are left as they are: `stats` still counts the whole history.
    fn archive(
        &mut self,
        key: &InstallationKey,
        first_seq_at_cutoff: u64,
        file: &Path,
    ) -> Result<ArchiveReport, LedgerError> {
        archive::refuse_existing(file)?;
        let (key, file) = (key.clone(), file.to_path_buf());
        self.call(move |c| {
            let Conn { rt, client } = c;
            let tx = rt.block_on(client.transaction())?;
            rt.block_on(tx.query_one("SELECT seq FROM chain_head WHERE id = 1 FOR UPDATE", &[]))?;
            let mut read = |name: &str| -> Result<Option<String>, LedgerError> {
                Ok(rt
                    .block_on(tx.query_opt("SELECT value FROM meta WHERE name = $1", &[&name]))?
                    .map(|r| r.get(0)))
            };
            if let Some(value) = read("archive_cut")? {
                return Err(archive::archived_before(cut::parse_cut(&value).seq));
            }
            let lowest = |sql: &str, cut: i64| -> Result<Option<i64>, LedgerError> {
                Ok(rt.block_on(tx.query_one(sql, &[&cut]))?.get(0))
            };
            let mut cut = first_seq_at_cutoff.saturating_sub(1) as i64;
            loop {
                match lowest(
                    "SELECT MIN(first_seq) FROM operations WHERE first_seq <= $1 AND (last_seq > $1 OR unresolved)",
                    cut,
                )? {
                    Some(first) if first <= cut => cut = first - 1,
                    _ => break,
                }
            }
            // Events of keys without a projection row (e.g. a fence of an op id never
            // intended here) must not straddle either.
            loop {
                match lowest(
                    "SELECT MIN(e.seq) FROM events e WHERE e.seq <= $1 AND EXISTS (SELECT 1 FROM events f WHERE f.op_id = e.op_id AND f.host = e.host AND f.seq > $1)",
                    cut,
                )? {
                    Some(first) if first <= cut => cut = first - 1,
                    _ => break,
                }
            }
            if cut <= 0 {
                return Err(archive::nothing_to_archive());
            }
            let rows: Vec<chain::Row> = rt
                .block_on(tx.query(
                    &format!("{CHAIN_ROW_SELECT} WHERE seq <= $1 ORDER BY seq"),
                    &[&cut],
                ))?
                .iter()
                .map(chain_row)
                .collect();
            let keyed_from = meta::keyed_from(&mut read)?;
            let keyed_from_mac = meta::keyed_from_mac(&mut read)?;
            let sealed = archive::seal(&rows, &key, keyed_from, keyed_from_mac.as_deref())?;
            super::sqlite::archive::write_file(&file, &key, &sealed.cut, &rows)?;
            let through = sealed.cut.seq as i64;
            rt.block_on(tx.execute("DELETE FROM events WHERE seq <= $1", &[&through]))?;
            rt.block_on(tx.execute("DELETE FROM operations WHERE last_seq <= $1", &[&through]))?;
            // The delete trigger took their executions off; the strictest family is
            // recounted.
            rt.block_on(tx.execute(
                &crate::ledger::store::recount_shared_intents(&DIALECT),
                &[],
            ))?;
            for (name, value) in archive::facts(&key, &sealed) {
                rt.block_on(tx.execute(
                    "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    &[&name, &value],
                ))?;
            }
            rt.block_on(tx.commit())?;
            Ok(sealed.report)
        })
    }

    /// See [`MISSING_SHARED_INTENTS`].
    fn missing_shared_intents(&self) -> Result<u64, LedgerError> {
        self.call(|c| {
            Ok(c.block(c.client.query_one(MISSING_SHARED_INTENTS, &[]))?
                .get::<_, i64>(0) as u64)
        })
    }

    /// See [`crate::ledger::store::miscounted_shared_intents`].
    fn miscounted_shared_intents(&self) -> Result<u64, LedgerError> {
        self.call(|c| {
            let sql = crate::ledger::store::miscounted_shared_intents(&DIALECT);
            Ok(c.block(c.client.query_one(&sql, &[]))?.get::<_, i64>(0) as u64)
        })
    }

    /// See [`crate::ledger::store::miscounted_duplicate_tallies`].
    fn miscounted_duplicate_tallies(&self) -> Result<u64, LedgerError> {
        self.call(|c| {
            Ok(c.block(
                c.client
                    .query_one(&crate::ledger::store::miscounted_duplicate_tallies(), &[]),
            )?
            .get::<_, i64>(0) as u64)
        })
    }

    fn stats(&self) -> Result<Stats, LedgerError> {
        Ok(Stats::from_counters(&self.counters()?))
    }
}

impl Conn {
    fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Applies missing migrations and checks (or, for an empty ledger, records) the key,
    /// all in one transaction under the migration lock. `import`: the caller copies a
    /// ledger in, so the database must hold no events (checked again under the head lock).
    fn migrate_and_bind(
        &mut self,
        key: &InstallationKey,
        shown: &str,
        import: bool,
    ) -> Result<(), LedgerError> {
        let Conn { rt, client } = self;
        let tx = rt.block_on(client.transaction())?;
        rt.block_on(tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]))?;
        rt.block_on(
            tx.batch_execute("CREATE TABLE IF NOT EXISTS opmark_schema (version INTEGER NOT NULL)"),
        )?;
        let version: i32 = rt
            .block_on(tx.query_opt("SELECT version FROM opmark_schema", &[]))?
            .map_or(0, |r| r.get(0));
        if version as usize > MIGRATIONS.len() {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger {shown} was written by a newer opmark (schema version {version}, this opmark knows up to {}); upgrade opmark",
                    MIGRATIONS.len()
                ),
            });
        }
        for sql in MIGRATIONS.iter().skip(version as usize) {
            rt.block_on(tx.batch_execute(sql))?;
        }
        let now = MIGRATIONS.len() as i32;
        if version == 0 {
            rt.block_on(tx.execute("INSERT INTO opmark_schema (version) VALUES ($1)", &[&now]))?;
        } else if version < now {
            rt.block_on(tx.execute("UPDATE opmark_schema SET version = $1", &[&now]))?;
        }
        let check: Option<String> = rt
            .block_on(tx.query_opt("SELECT value FROM meta WHERE name = 'key_check'", &[]))?
            .map(|r| r.get(0));
        let events: i64 = rt
            .block_on(tx.query_one("SELECT COUNT(*) FROM events", &[]))?
            .get(0);
        match check {
            Some(check) if check != key.check_value() => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the installation key {} is not the key of the ledger {shown} (the ledger's check value differs). Name the shared ledger's own key with --ledger-key PATH (OPMARK_LEDGER_KEY); nothing was done",
                        key.path().display()
                    ),
                })
            }
            Some(_) if import && events > 0 => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the target ledger {shown} already holds {events} events; `ledger migrate` copies into an empty database only. Nothing was copied"
                    ),
                })
            }
            Some(_) => {}
            None if events > 0 => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the ledger {shown} holds events but its key check record is gone: it was edited outside opmark. Restore it from a backup, or keep it as evidence and use another database"
                    ),
                })
            }
            None => {
                for (name, value) in [
                    ("key_check", key.check_value()),
                    ("chain_keyed_from", "1".to_owned()),
                    ("chain_keyed_from_mac", chain::keyed_from_mac(key, 1)),
                ] {
                    rt.block_on(tx.execute(
                        "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                        &[&name, &value],
                    ))?;
                }
            }
        }
        rt.block_on(tx.commit())?;
        Ok(())
    }
}

/// A head-locked transaction, seen by [`append::append`].
struct PgTx<'a> {
    rt: &'a tokio::runtime::Runtime,
    tx: tokio_postgres::Transaction<'a>,
}

impl AppendTx for PgTx<'_> {
    fn add_counts(&mut self, deltas: &Counts) -> Result<(), LedgerError> {
        for (name, n) in deltas.iter().filter(|(_, n)| **n != 0) {
            self.rt.block_on(self.tx.execute(
                "INSERT INTO counters (name, n) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET n = counters.n + excluded.n",
                &[name, n],
            ))?;
        }
        Ok(())
    }

    fn head(&mut self) -> Result<(u64, String), LedgerError> {
        let row = self.rt.block_on(self.tx.query_one(
            "SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE",
            &[],
        ))?;
        Ok((row.get::<_, i64>(0) as u64, row.get(1)))
    }

    fn load(&mut self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        let sql = format!(
            "SELECT {} FROM operations WHERE op_id = $1 AND host = $2",
            projection::COLUMNS
        );
        let row = self
            .rt
            .block_on(self.tx.query_opt(&sql, &[&key.op_id, &key.host]))?;
        row.as_ref().map(record_from).transpose()
    }

    fn insert(&mut self, r: &chain::Row) -> Result<(), LedgerError> {
        self.rt.block_on(self.tx.execute(
            "INSERT INTO events (seq, op_id, host, at, kind, payload, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &(r.seq as i64),
                &r.op_id,
                &r.host,
                &r.at,
                &r.kind,
                &r.payload,
                &r.prev_hash,
                &r.hash,
            ],
        ))?;
        Ok(())
    }

    fn store(&mut self, r: &OperationRecord) -> Result<(), LedgerError> {
        let sql = format!(
            "INSERT INTO operations ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
             ON CONFLICT (op_id, host) DO UPDATE SET
               family = excluded.family, display = excluded.display,
               fingerprint = excluded.fingerprint, rule = excluded.rule,
               session = excluded.session, state = excluded.state, verdict = excluded.verdict,
               exit_code = excluded.exit_code, attempts = excluded.attempts,
               last_attempt = excluded.last_attempt, unresolved = excluded.unresolved,
               created_at = excluded.created_at, updated_at = excluded.updated_at,
               first_seq = excluded.first_seq, last_seq = excluded.last_seq,
               contradictions = excluded.contradictions,
               settled_attempt = excluded.settled_attempt, executed = excluded.executed",
            projection::COLUMNS
        );
        self.rt.block_on(self.tx.execute(
            &sql,
            &[
                &r.op_id,
                &r.host,
                &r.family.as_str(),
                &r.display,
                &r.fingerprint,
                &r.rule,
                &r.session,
                &r.state.to_string(),
                &r.verdict.map(Verdict::as_str),
                &r.exit_code,
                &i64::from(r.attempts),
                &r.last_attempt,
                &r.unresolved,
                &r.created_at,
                &r.updated_at,
                &(r.first_seq as i64),
                &(r.last_seq as i64),
                &i64::from(r.contradictions),
                &r.settled_attempt,
                &i32::from(r.executed),
            ],
        ))?;
        Ok(())
    }

    fn set_head(&mut self, seq: u64, hash: &str, mac: &str) -> Result<(), LedgerError> {
        self.rt.block_on(self.tx.execute(
            "UPDATE chain_head SET seq = $1, hash = $2, mac = $3 WHERE id = 1",
            &[&(seq as i64), &hash, &mac],
        ))?;
        Ok(())
    }

    fn events_after(
        &mut self,
        key: &OpKey,
        after: u64,
    ) -> Result<Vec<(u64, String, String)>, LedgerError> {
        let rows = self.rt.block_on(self.tx.query(
            "SELECT seq, at, payload FROM events WHERE op_id = $1 AND host = $2 AND seq > $3 ORDER BY seq",
            &[&key.op_id, &key.host, &(after as i64)],
        ))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1), r.get(2)))
            .collect())
    }
}

/// The columns of a [`chain::Row`], in [`chain_row`]'s order.
const CHAIN_ROW_SELECT: &str =
    "SELECT seq, prev_hash, hash, op_id, host, at, kind, payload FROM events";

/// A chain row read by [`CHAIN_ROW_SELECT`].
fn chain_row(r: &Row) -> chain::Row {
    chain::Row {
        seq: r.get::<_, i64>(0) as u64,
        prev_hash: r.get(1),
        hash: r.get(2),
        op_id: r.get(3),
        host: r.get(4),
        at: r.get(5),
        kind: r.get(6),
        payload: r.get(7),
    }
}

/// Rows fetched per page by the streamed walk ([`PgStore::verify_full`]).
const PAGE_ROWS: i32 = 4096;

/// A read-only REPEATABLE READ transaction: everything a verify reads is one snapshot.
async fn snapshot_transaction(
    client: &mut Client,
) -> Result<tokio_postgres::Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

/// What a verify reads before the events: the head, where the keyed chain starts, the
/// archive cut and counts (each with its MAC) and the counters.
fn read_verify_header(
    rt: &tokio::runtime::Runtime,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<crate::ledger::verify::Header, LedgerError> {
    let mut read = |name: &str| -> Result<Option<String>, LedgerError> {
        Ok(rt
            .block_on(tx.query_opt("SELECT value FROM meta WHERE name = $1", &[&name]))?
            .map(|r| r.get(0)))
    };
    let keyed_from = meta::keyed_from(&mut read)?;
    let cut = meta::archive_cut(&mut read)?;
    let archived_counts = meta::archive_counts(&mut read)?;
    Ok(crate::ledger::verify::Header {
        head: read_head(rt, tx)?,
        keyed_from,
        keyed_from_mac: meta::keyed_from_mac(&mut read)?,
        counters: rt
            .block_on(tx.query("SELECT name, n FROM counters", &[]))?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
            .collect(),
        cut,
        archived_counts,
    })
}

/// A [`checkpoint::SnapshotReader`] over one PostgreSQL REPEATABLE READ transaction.
struct PgReader<'a> {
    rt: &'a tokio::runtime::Runtime,
    tx: &'a tokio_postgres::Transaction<'a>,
}

impl checkpoint::SnapshotReader for PgReader<'_> {
    fn meta(&mut self, name: &str) -> Result<Option<String>, LedgerError> {
        Ok(self
            .rt
            .block_on(
                self.tx
                    .query_opt("SELECT value FROM meta WHERE name = $1", &[&name]),
            )?
            .map(|r| r.get(0)))
    }

    fn event_hash(&mut self, seq: u64) -> Result<Option<String>, LedgerError> {
        Ok(self
            .rt
            .block_on(
                self.tx
                    .query_opt("SELECT hash FROM events WHERE seq = $1", &[&(seq as i64)]),
            )?
            .map(|r| r.get(0)))
    }

    fn head(&mut self) -> Result<Option<chain::Head>, LedgerError> {
        read_head(self.rt, self.tx)
    }

    fn rows_after(&mut self, seq: u64) -> Result<Vec<chain::Row>, LedgerError> {
        Ok(self
            .rt
            .block_on(self.tx.query(
                &format!("{CHAIN_ROW_SELECT} WHERE seq > $1 ORDER BY seq"),
                &[&(seq as i64)],
            ))?
            .iter()
            .map(chain_row)
            .collect())
    }

    fn operations(
        &mut self,
        keys: &std::collections::BTreeSet<OpKey>,
    ) -> Result<(Vec<chain::Row>, Vec<OperationRecord>), LedgerError> {
        let (ids, hosts): (Vec<&str>, Vec<&str>) = keys
            .iter()
            .map(|k| (k.op_id.as_str(), k.host.as_str()))
            .unzip();
        // One indexed read per touched operation, as one statement.
        let history = self
            .rt
            .block_on(self.tx.query(
                &format!(
                    "{CHAIN_ROW_SELECT} WHERE (op_id, host) IN (SELECT * FROM unnest($1::text[], $2::text[])) ORDER BY seq"
                ),
                &[&ids, &hosts],
            ))?
            .iter()
            .map(chain_row)
            .collect();
        let projected = self
            .rt
            .block_on(self.tx.query(
                &format!(
                    "SELECT {} FROM operations WHERE (op_id, host) IN (SELECT * FROM unnest($1::text[], $2::text[])) ORDER BY op_id, host",
                    projection::COLUMNS
                ),
                &[&ids, &hosts],
            ))?
            .iter()
            .map(record_from)
            .collect::<Result<_, _>>()?;
        Ok((history, projected))
    }
}

/// The chain head, `None` while the ledger holds no event.
fn read_head(
    rt: &tokio::runtime::Runtime,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<Option<chain::Head>, LedgerError> {
    Ok(rt
        .block_on(tx.query_opt("SELECT seq, hash, mac FROM chain_head WHERE id = 1", &[]))?
        .filter(|r| r.get::<_, i64>(0) > 0)
        .map(|r| chain::Head {
            seq: r.get::<_, i64>(0) as u64,
            hash: r.get(1),
            mac: r.get(2),
        }))
}

/// A projection row from PostgreSQL (column order: [`projection::COLUMNS`]).
fn record_from(row: &Row) -> Result<OperationRecord, LedgerError> {
    let bad = |what: &str, e: String| LedgerError::Invalid {
        message: format!(
            "an operations row has an unreadable {what} ({e}); run `opmark audit verify`"
        ),
    };
    let family: String = row.get(2);
    let verdict: Option<String> = row.get(8);
    let state: String = row.get(7);
    Ok(OperationRecord {
        op_id: row.get(0),
        host: row.get(1),
        family: family.parse().map_err(|e| bad("family", e))?,
        display: row.get(3),
        fingerprint: row.get(4),
        rule: row.get(5),
        session: row.get(6),
        state: state.parse().unwrap_or_else(|never| match never {}),
        verdict: verdict
            .map(|v| v.parse::<Verdict>())
            .transpose()
            .map_err(|e| bad("verdict", e))?,
        exit_code: row.get(9),
        attempts: u32::try_from(row.get::<_, i64>(10))
            .map_err(|e| bad("attempts", e.to_string()))?,
        last_attempt: row.get(11),
        unresolved: row.get(12),
        created_at: row.get(13),
        updated_at: row.get(14),
        first_seq: row.get::<_, i64>(15) as u64,
        last_seq: row.get::<_, i64>(16) as u64,
        contradictions: u32::try_from(row.get::<_, i64>(17))
            .map_err(|e| bad("contradictions", e.to_string()))?,
        settled_attempt: row.get(18),
        executed: row.get::<_, i32>(19) != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            without_password("postgresql://alice:s3cret@db:5432/ledger"),
            "postgresql://alice:***@db:5432/ledger"
        );
        assert_eq!(
            without_password("postgres://alice@db/ledger?password=s3cret&sslmode=disable"),
            "postgres://alice@db/ledger?password=***&sslmode=disable"
        );
        assert_eq!(
            without_password("postgresql://%2Ftmp%2Fpg/ledger"),
            "postgresql://%2Ftmp%2Fpg/ledger"
        );
    }
}
