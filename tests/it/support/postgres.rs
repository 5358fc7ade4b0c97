//! A throwaway PostgreSQL cluster for the ledger's conformance tests: Debian's binaries
//! (`/usr/lib/postgresql/*/bin`), `initdb` in a temporary directory, listening on a unix
//! socket only (no TCP port to collide on), trust authentication for its one user. One
//! cluster per test binary, started on first use; each test gets its own database.
//!
//! As root, `initdb` and `postgres` refuse to run, so they run as `nobody` (`runuser`).
//! A watchdog shell stops the cluster and removes its directory when the test binary
//! exits, so no server outlives the tests.
//!
//! Missing PostgreSQL: skipped locally, a failure with `CI=true` (see the module doc of
//! `support`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Env a child test process reads to reach the parent's cluster (instead of starting one).
const SOCKET_ENV: &str = "OPMARK_TEST_PG_SOCKET";
const USER: &str = "opmark";

/// A running cluster: its socket directory.
#[derive(Debug)]
pub struct Cluster {
    socket_dir: PathBuf,
    bin: PathBuf,
    /// The data directory and server options, for [`Cluster::restart`]; `None` for the
    /// parent's cluster a child process reaches.
    server: Option<(PathBuf, String, PathBuf)>,
}

/// One database of the cluster, named after its test.
#[derive(Debug, Clone)]
pub struct Database {
    /// `postgresql://opmark@%2F…/NAME`.
    pub url: String,
}

fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").is_file() && b.join("pg_ctl").is_file())
        .collect();
    found.sort();
    found.pop()
}

fn encode(path: &Path) -> String {
    path.to_string_lossy().replace('/', "%2F")
}

/// Runs `cmd` (a PostgreSQL binary) as `nobody` when we are root.
fn as_server_user(bin: &Path, args: &[&str]) -> Command {
    if opmark::lab::effective_uid() == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(bin).args(args);
        c
    } else {
        let mut c = Command::new(bin);
        c.args(args);
        c
    }
}

fn start() -> Result<Cluster, String> {
    if let Some(dir) = std::env::var_os(SOCKET_ENV) {
        let bin = pg_bin().ok_or("PostgreSQL binaries not found")?;
        return Ok(Cluster {
            socket_dir: PathBuf::from(dir),
            bin,
            server: None,
        });
    }
    start_new()
}

/// A cluster of its own for a test that restarts its server (the shared one serves
/// every other test of the binary at the same time).
pub fn own_cluster() -> Result<Cluster, String> {
    start_new()
}

fn start_new() -> Result<Cluster, String> {
    let bin = pg_bin().ok_or(
        "PostgreSQL not installed (no /usr/lib/postgresql/*/bin/initdb; scripts/install-deps.sh installs it)",
    )?;
    // Not under CARGO_TARGET_TMPDIR: a unix socket path must stay under ~100 bytes.
    let root = std::env::temp_dir().join(format!(
        "opmark-pg-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let data = root.join("data");
    let sock = root.join("sock");
    std::fs::create_dir_all(&sock).map_err(|e| e.to_string())?;
    if opmark::lab::effective_uid() == 0 {
        let ok = Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(&root)
            .status()
            .map_err(|e| e.to_string())?
            .success();
        if !ok {
            return Err(format!("chown nobody {} failed", root.display()));
        }
    }
    let out = as_server_user(
        &bin.join("initdb"),
        &[
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            USER,
            "--no-sync",
            "-E",
            "UTF8",
        ],
    )
    .output()
    .map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let opts = format!(
        "-c listen_addresses='' -k {} -c fsync=on -c max_connections=200",
        sock.display()
    );
    let log = root.join("server.log");
    let out = as_server_user(
        &bin.join("pg_ctl"),
        &[
            "-D",
            data.to_str().unwrap(),
            "-o",
            &opts,
            "-l",
            log.to_str().unwrap(),
            "-w",
            "start",
        ],
    )
    .stdout(Stdio::null())
    .output()
    .map_err(|e| format!("pg_ctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        ));
    }
    // The watchdog: when this test binary exits, stop the server and remove its files.
    let pg_ctl = bin.join("pg_ctl");
    let stop = if opmark::lab::effective_uid() == 0 {
        format!(
            "runuser -u nobody -- {} -D {} -m immediate stop",
            pg_ctl.display(),
            data.display()
        )
    } else {
        format!(
            "{} -D {} -m immediate stop",
            pg_ctl.display(),
            data.display()
        )
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf {root}",
        pid = std::process::id(),
        root = root.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("watchdog: {e}"))?;
    Ok(Cluster {
        socket_dir: sock,
        bin,
        server: Some((data, opts, log)),
    })
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// The cluster, or why there is none.
pub fn cluster() -> Result<&'static Cluster, String> {
    CLUSTER.get_or_init(start).as_ref().map_err(Clone::clone)
}

impl Cluster {
    /// Env for a child process (a re-executed test binary) to use this cluster.
    pub fn child_env(&self) -> (&'static str, &Path) {
        (SOCKET_ENV, &self.socket_dir)
    }

    /// Restarts the server (`pg_ctl restart -m immediate`: connections cut as a crash
    /// would cut them), waiting until it accepts connections again.
    pub fn restart(&self) -> Result<(), String> {
        let (data, opts, log) = self
            .server
            .as_ref()
            .ok_or("this process did not start the cluster")?;
        let out = as_server_user(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                opts,
                "-l",
                log.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "restart",
            ],
        )
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl restart failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `psql` against database `db`, running `sql`.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket_dir)
            .args(["-U", USER, "-d", db, "-c", sql])
            .output()
            .map_err(|e| format!("psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// A new empty database for `name` (unique per call).
    pub fn database(&self, name: &str) -> Database {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let db = format!(
            "t_{}_{}_{}",
            name.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(30)
                .collect::<String>(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
        .to_lowercase();
        // CREATE DATABASE copies template1: concurrent creates can collide on it.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.psql("postgres", &format!("CREATE DATABASE {db}")) {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline && e.contains("being accessed") => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("CREATE DATABASE {db}: {e}"),
            }
        }
        Database {
            url: format!("postgresql://{USER}@{}/{db}", encode(&self.socket_dir)),
        }
    }
}

impl Database {
    /// The database's name.
    pub fn name(&self) -> &str {
        self.url.rsplit('/').next().unwrap_or_default()
    }
}

/// The cluster, or a skip (locally) / panic (CI) naming why there is none.
pub fn require(test: &str) -> Option<&'static Cluster> {
    match cluster() {
        Ok(c) => Some(c),
        Err(why) => {
            super::skip_or_fail(test, &why);
            None
        }
    }
}
