//! Test harness: skip-or-fail rules for external tools, sealed environments for running
//! the real `opmark` binary, and disposable sshd targets (real OpenSSH, no mocks).
//!
//! Rule for external tools (as cargo does): missing locally = the test prints
//! `SKIP: <test>: <tool> not installed` and passes; missing when `CI` is set = panic,
//! so CI can never go green by skipping.

#![allow(dead_code)] // each test module uses a different part of the harness

pub mod disk;
pub mod mcp;
pub mod postgres;
pub mod schema;

#[allow(unused_imports)] // re-exported for test modules
pub use opmark::lab::{Lab, LabSpec, Placement, Target};
use std::path::{Path, PathBuf};
use std::process::Command;

/// True when running in CI (env `CI` set and not empty/"false"/"0").
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// True when `tool` is an executable on PATH (or an absolute path that exists).
pub fn have_tool(tool: &str) -> bool {
    if tool.starts_with('/') {
        return Path::new(tool).is_file();
    }
    if tool == "sshd" {
        return ["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"]
            .iter()
            .any(|p| Path::new(p).is_file());
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

/// Skip-or-fail for a missing precondition: prints `SKIP: <test>: <why>` and returns
/// false locally; panics in CI.
pub fn skip_or_fail(test: &str, why: &str) -> bool {
    if in_ci() {
        panic!("{test}: {why} (CI is set, so this is a failure, not a skip)");
    }
    // Straight to fd 2: libtest captures eprintln! of passing tests, and a skip must show.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP: {test}: {why}");
    false
}

/// True when every tool is installed; otherwise skip (false) locally or panic in CI.
pub fn require_tools(test: &str, tools: &[&str]) -> bool {
    for tool in tools {
        if !have_tool(tool) {
            return skip_or_fail(test, &format!("{tool} not installed"));
        }
    }
    true
}

/// True when running as root; otherwise skip locally or panic in CI.
pub fn require_root(test: &str) -> bool {
    opmark::lab::effective_uid() == 0 || skip_or_fail(test, "needs root (network namespaces)")
}

/// The name of the calling test function, for messages and directory names.
#[macro_export]
macro_rules! test_name {
    () => {{
        fn f() {}
        let name = std::any::type_name_of_val(&f);
        let name = name.strip_suffix("::f").unwrap_or(name);
        name.rsplit("::").next().unwrap_or(name)
    }};
}

/// `require_tool!("dash", "shellcheck")`: returns from the calling test (after printing
/// `SKIP: ...`) when a tool is missing locally; panics in CI.
#[macro_export]
macro_rules! require_tool {
    ($($tool:expr),+ $(,)?) => {
        if !$crate::support::require_tools($crate::test_name!(), &[$($tool),+]) {
            return;
        }
    };
}

/// `let Some(lab) = loopback_lab!(3) else { return };` — a loopback lab named after the
/// calling test, or a skip (locally) when sshd/ssh are missing.
#[macro_export]
macro_rules! loopback_lab {
    ($n:expr) => {
        $crate::support::loopback_lab_named($crate::test_name!(), $n)
    };
}

/// `let Some(lab) = netns_lab!(2) else { return };` — a namespace lab (root only).
#[macro_export]
macro_rules! netns_lab {
    ($n:expr) => {
        $crate::support::netns_lab_named($crate::test_name!(), $n)
    };
}

/// A fresh directory for `name` under CARGO_TARGET_TMPDIR (not /tmp: the host shim
/// refuses marker roots there). Unique per call so parallel and repeated tests never
/// share one; emptied if it exists.
pub fn fresh_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("it")
        .join(format!("{name}-{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

/// The running test's name (libtest names each test's thread after it; with
/// `--test-threads=1` the thread is "main").
pub fn current_test() -> String {
    let name = std::thread::current().name().unwrap_or("test").to_string();
    name.rsplit("::").next().unwrap_or("test").to_string()
}

/// `if !require_tool("dash") { return; }` — function form of [`require_tool!`].
pub fn require_tool(tool: &str) -> bool {
    require_tools(&current_test(), &[tool])
}

/// Function form of [`loopback_lab!`], named after the running test's thread.
pub fn loopback_lab(count: usize) -> Option<Lab> {
    loopback_lab_named(&current_test(), count)
}

/// Function form of [`netns_lab!`], named after the running test's thread.
pub fn netns_lab(count: usize) -> Option<Lab> {
    netns_lab_named(&current_test(), count)
}

/// Starts `count` loopback targets for test `name`; None (after printing SKIP) when
/// sshd or ssh is missing locally. Panics in CI, or when the lab fails to start.
pub fn loopback_lab_named(name: &str, count: usize) -> Option<Lab> {
    if !require_tools(name, &["sshd", "ssh", "ssh-keygen"]) {
        return None;
    }
    let spec = LabSpec {
        count,
        placement: Placement::Loopback,
        dir: fresh_dir(name).join("lab"),
    };
    Some(Lab::start(&spec).unwrap_or_else(|e| panic!("{name}: lab did not start: {e}")))
}

/// Starts `count` network-namespace targets for test `name` (root, ip and nft needed);
/// None (after printing SKIP) when something is missing locally.
pub fn netns_lab_named(name: &str, count: usize) -> Option<Lab> {
    if !require_tools(name, &["sshd", "ssh", "ssh-keygen", "ip", "nft"]) || !require_root(name) {
        return None;
    }
    let spec = LabSpec {
        count,
        placement: Placement::Netns,
        dir: fresh_dir(name).join("lab"),
    };
    Some(Lab::start(&spec).unwrap_or_else(|e| panic!("{name}: lab did not start: {e}")))
}

/// An OpenSSH client command for a lab: `ssh -F <lab cfg> -o BatchMode=yes`, no stdin
/// forwarding unless the caller sets one. Add the alias and the remote command.
pub fn ssh(lab: &Lab) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.arg("-F")
        .arg(lab.ssh_config())
        .args(["-o", "BatchMode=yes"])
        .stdin(std::process::Stdio::null());
    cmd
}

/// One shim call through the OpenSSH client, sent as opmark sends it: the exec stub as
/// the remote command, the call token, the script and the verb's input on stdin (then
/// EOF). Output is piped; the caller waits (or kills the client mid-call).
pub fn spawn_ssh_shim(lab: &Lab, alias: &str, verb: &opmark::shim::Verb) -> std::process::Child {
    use std::io::Write;
    let call = opmark::shim::Invocation::new(verb, None);
    let mut child = ssh(lab)
        .arg(alias)
        .arg(&call.exec)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ssh");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(&call.data)
        .expect("send the shim's data to ssh");
    child
}

/// [`spawn_ssh_shim`], run to its end.
pub fn ssh_shim(lab: &Lab, alias: &str, verb: &opmark::shim::Verb) -> std::process::Output {
    spawn_ssh_shim(lab, alias, verb)
        .wait_with_output()
        .expect("wait for ssh")
}

/// The `opmark` binary the sealed environments run: cargo's, or a copy named by
/// `OPMARK_TEST_BIN` (a long run keeps its binary while the tree is rebuilt).
pub fn opmark_bin() -> PathBuf {
    std::env::var_os("OPMARK_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_opmark")))
}

/// A sealed environment for running the real `opmark` binary: its own HOME,
/// XDG_STATE_HOME, XDG_CONFIG_HOME and ledger, nothing from the developer's setup.
#[derive(Debug)]
pub struct Sealed {
    /// The root directory of this environment.
    pub root: PathBuf,
    /// HOME for opmark.
    pub home: PathBuf,
    /// XDG_STATE_HOME for opmark.
    pub state: PathBuf,
    /// XDG_CONFIG_HOME for opmark.
    pub config: PathBuf,
    /// The ledger database path (`OPMARK_LEDGER`).
    pub ledger: PathBuf,
}

impl Sealed {
    /// A new sealed environment named after the test.
    pub fn new(name: &str) -> Sealed {
        let root = fresh_dir(name).join("env");
        let home = root.join("home");
        let state = root.join("state");
        let config = root.join("config");
        for d in [&home, &state, &config] {
            std::fs::create_dir_all(d).expect("create sealed dir");
        }
        let ledger = state.join("opmark").join("ledger.db");
        Sealed {
            root,
            home,
            state,
            config,
            ledger,
        }
    }

    /// `opmark` with a controlled environment: cleared, then PATH (kept), HOME, USER,
    /// LANG=C, XDG_STATE_HOME, XDG_CONFIG_HOME, XDG_RUNTIME_DIR, OPMARK_LEDGER and
    /// OPMARK_PERSIST=0.
    /// No OPMARK_* from the caller, no SSH_AUTH_SOCK (no agent leaks in).
    pub fn opmark(&self) -> Command {
        let mut cmd = Command::new(opmark_bin());
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env(
                "USER",
                std::env::var_os("USER").unwrap_or_else(|| "opmark-test".into()),
            )
            .env("LANG", "C")
            .env("XDG_STATE_HOME", &self.state)
            .env("XDG_CONFIG_HOME", &self.config)
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("OPMARK_LEDGER", &self.ledger)
            // Connection reuse off unless a test turns it on (`keeper.rs`): each test
            // then proves what it proves about its own connections. A test that turns it
            // on gets a keeper of its own (XDG_RUNTIME_DIR is per environment), stopped
            // when the environment drops.
            .env("OPMARK_PERSIST", "0")
            .stdin(std::process::Stdio::null());
        cmd
    }

    /// The keeper's directory in this environment (`$XDG_RUNTIME_DIR/opmark`).
    pub fn keeper_dir(&self) -> PathBuf {
        self.root.join("run").join("opmark")
    }

    /// The pid of this environment's keeper, if one runs.
    pub fn keeper_pid(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.keeper_dir().join("keeper.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        // Only a keeper of this environment: the pid file could be stale and the pid
        // reused by anything else.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let dir = self.keeper_dir().display().to_string();
        (cmdline.contains("keeper serve") && cmdline.contains(&dir)).then_some(pid)
    }

    /// `opmark -F <lab ssh_config> ...` in this environment.
    pub fn opmark_with_lab(&self, lab: &Lab) -> Command {
        let mut cmd = self.opmark();
        cmd.arg("-F").arg(lab.ssh_config());
        cmd
    }
}

impl Drop for Sealed {
    /// A keeper never outlives its test.
    fn drop(&mut self) {
        if let Some(pid) = self.keeper_pid() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Output of a finished command as text, for assertions and failure messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An ssh config that detects a dead link in about 2 s and includes the lab's.
pub fn fast_loss_config(lab: &Lab, dir: &Path) -> PathBuf {
    let cfg = dir.join("ssh_config");
    std::fs::write(
        &cfg,
        format!(
            "ServerAliveInterval 1\nServerAliveCountMax 1\nConnectTimeout 2\nInclude {}\n",
            lab.ssh_config().display()
        ),
    )
    .unwrap();
    cfg
}

/// The lines a child writes to stderr, read by a thread as they come, so that a test can
/// wait for what the client says (that it noticed a lost link, say) instead of sleeping
/// for a guessed time.
pub struct StderrLines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl StderrLines {
    /// Takes the child's stderr (it must be piped).
    pub fn of(child: &mut std::process::Child) -> StderrLines {
        use std::io::BufRead;
        let stderr = child.stderr.take().expect("stderr must be piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        StderrLines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits until a line containing `needle` arrives and returns it; panics, with every
    /// line seen, when `limit` passes or the stream ends first.
    pub fn wait_for(&mut self, needle: &str, limit: std::time::Duration) -> String {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no stderr line with {needle:?} ({e:?}); lines seen:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The lines that came so far (for a failure message while the child may still run).
    pub fn so_far(&mut self) -> String {
        self.seen.extend(self.rx.try_iter());
        self.seen.join("\n")
    }

    /// Every line, once the child has exited (the rest is read to the end).
    pub fn all(mut self) -> String {
        self.seen.extend(self.rx.iter());
        self.seen.join("\n")
    }
}

/// `opmark --json run ARGS` in `env`, against `lab`.
pub fn run_json(env: &Sealed, lab: &Lab, args: &[&str]) -> Answer {
    answer(
        env.opmark_with_lab(lab)
            .arg("--json")
            .arg("run")
            .args(args)
            .output()
            .unwrap(),
    )
}

/// How many lines a file the commands append to holds (0 before the first).
pub fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// A run's JSON verdict document and the process status, as a test reads them.
pub struct Answer {
    /// The one JSON document on stdout.
    pub json: serde_json::Value,
    /// The process exit status (-1 when killed by a signal).
    pub status: i32,
    /// opmark's and the command's stderr.
    pub stderr: String,
}

impl Answer {
    pub fn verdict(&self) -> &str {
        self.json["verdict"].as_str().unwrap_or("<none>")
    }
    pub fn reason_code(&self) -> &str {
        self.json["reason_code"].as_str().unwrap_or("<none>")
    }
    pub fn exit_code(&self) -> Option<i64> {
        self.json["exit_code"].as_i64()
    }
    pub fn stdout(&self) -> &str {
        self.json["stdout"].as_str().unwrap_or("")
    }
    /// `(reason_code, retryable)`: what an agent branches on besides the verdict.
    pub fn code(&self) -> (&str, bool) {
        (
            self.reason_code(),
            self.json["retryable"]
                .as_bool()
                .unwrap_or_else(|| panic!("no retryable field: {self:?}")),
        )
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {} json {} stderr {}",
            self.status, self.json, self.stderr
        )
    }
}

/// Reads a finished `opmark --json run`: its stdout must be one JSON document.
pub fn answer(out: std::process::Output) -> Answer {
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    Answer {
        json,
        status: out.status.code().unwrap_or(-1),
        stderr: text(&out.stderr),
    }
}

/// The one JSON document a command printed on stdout; panics with both streams otherwise.
pub fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// Polls `ok` every 50 ms until it holds; panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: std::time::Duration, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A copy of the opmark binary that any uid can run. Tests that run opmark as another
/// user (`Command::uid`) cannot exec the one under `target/` when the checkout sits in a
/// 0700 directory (a `mktemp -d` clone): exec needs search permission on every parent.
/// One fixed path, replaced by rename, so repeated runs leave one copy behind, not many.
pub fn opmark_for_any_user() -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join("opmark-it-any-user");
        std::fs::create_dir_all(&dir).expect("create the shared binary directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("open the shared binary directory");
        let tmp = dir.join(format!(".opmark.{}", std::process::id()));
        std::fs::copy(env!("CARGO_BIN_EXE_opmark"), &tmp).expect("copy the opmark binary");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .expect("make the copy executable");
        let bin = dir.join("opmark");
        std::fs::rename(&tmp, &bin).expect("install the copy");
        bin
    })
    .clone()
}

/// `inner` with [`opmark_for_any_user`] as its program: the same arguments, environment
/// and directory.
pub fn runnable_by_any_user(inner: &Command) -> Command {
    let mut cmd = Command::new(opmark_for_any_user());
    cmd.args(inner.get_args()).env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    if let Some(dir) = inner.get_current_dir() {
        cmd.current_dir(dir);
    }
    cmd
}

/// Waits for `child` at most `limit`; on a hang, kills it and fails naming `what`. Its
/// piped stdout and stderr are read meanwhile: a child whose output outgrows a pipe
/// (a document of many files) would otherwise block on its write and look like a hang.
pub fn finish_within(
    mut child: std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::Output {
    fn drain<R: std::io::Read + Send + 'static>(
        pipe: Option<R>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: still waiting after {limit:?}: {}",
                text(&stderr.join().unwrap_or_default())
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Runs the shell command `line` under a pseudo-terminal (`script`) in `env`'s sealed
/// environment, types `keys` at it and keeps the terminal open until the command exits
/// (at most 60 s: a watchdog for a prompt nobody answers, not a speed claim); returns
/// what the terminal showed.
pub fn under_pty(env: &Sealed, line: &str, keys: &[u8]) -> String {
    use std::io::Write;
    let sealed = env.opmark();
    let mut child = Command::new("script")
        .args(["-qefc", line, "/dev/null"])
        .env_clear()
        .envs(sealed.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script runs");
    let mut terminal = child.stdin.take().expect("piped");
    terminal.write_all(keys).expect("typing at the terminal");
    let out = finish_within(
        child,
        std::time::Duration::from_secs(60),
        "a command under a pty",
    );
    drop(terminal);
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// Creates `env`'s ledger with nothing in it (only `run` creates one: here a run refused
/// for a host name that resolves nowhere, after the ledger opened and before anything was
/// recorded).
pub fn empty_ledger(env: &Sealed) {
    let out = env
        .opmark()
        .args(["run", "nohost.invalid", "--", "true"])
        .output()
        .expect("opmark runs");
    assert!(env.ledger.exists(), "no ledger made: {}", text(&out.stderr));
}

/// The repository's root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a built command to its end.
pub fn output(cmd: &mut Command) -> std::process::Output {
    cmd.output().expect("start opmark")
}

/// Starts `cmd ARGS` with stdout and stderr captured (for runs the test interferes with).
pub fn spawn(cmd: &mut Command, args: &[&str]) -> std::process::Child {
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts `cmd --json run ARGS` with stdout and stderr captured.
pub fn spawn_run(cmd: &mut Command, args: &[&str]) -> std::process::Child {
    spawn(cmd.arg("--json").arg("run"), args)
}

/// `show OP` in words.
pub fn show(env: &Sealed, op: &str) -> String {
    let out = env.opmark().args(["show", op]).output().unwrap();
    assert!(out.status.success(), "show {op}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// `show --json OP`.
pub fn show_json(env: &Sealed, op: &str) -> serde_json::Value {
    json(&env.opmark().args(["--json", "show", op]).output().unwrap())
}

/// The operation's row in `opmark list --json`.
pub fn listed(env: &Sealed, op: &str) -> serde_json::Value {
    let doc = json(&env.opmark().args(["--json", "list"]).output().unwrap());
    let rows = doc
        .as_array()
        .or_else(|| doc["operations"].as_array())
        .unwrap_or_else(|| panic!("no operations in {doc}"))
        .clone();
    rows.into_iter()
        .find(|r| r["op_id"] == op)
        .unwrap_or_else(|| panic!("{op} not listed in {doc}"))
}

/// The marker state `opmark probe target1 OP` reports ("" when it reports none).
pub fn probe_state(env: &Sealed, lab: &Lab, op: &str) -> String {
    let out = output(
        env.opmark_with_lab(lab)
            .args(["--json", "probe", "target1", op]),
    );
    json(&out)["marker_state"].as_str().unwrap_or("").to_owned()
}

/// The size of target1's sshd log: it grows with every connection.
pub fn log_len(lab: &Lab) -> u64 {
    std::fs::metadata(&lab.target("target1").unwrap().log).map_or(0, |m| m.len())
}

/// A place on the (local) target where commands leave their effects.
pub fn effects(name: &str) -> PathBuf {
    fresh_dir(name).join("effects")
}

/// Where `tool` is on this machine's PATH.
pub fn tool_path(tool: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap();
    PathBuf::from(text(&out.stdout).trim())
}

/// True when `bytes` hold the tests' secret in any case, or its base64 form.
pub fn contains_canary(bytes: &[u8]) -> bool {
    bytes
        .windows(6)
        .any(|w| w.eq_ignore_ascii_case(b"canary"))
        // "Q2FuYXJ5" is base64 of "Canary": the Basic credential must not leak either.
        || bytes.windows(8).any(|w| w == b"Q2FuYXJ5")
}

/// SHA-256 of `bytes`, in hex.
pub fn sha(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// How many events the ledger holds for `op` (`show --json`).
pub fn event_count(env: &Sealed, op: &str) -> usize {
    let out = env.opmark().args(["--json", "show", op]).output().unwrap();
    json(&out)["events"].as_array().unwrap().len()
}

/// The seeds a seeded test runs: those `var` names when it is set (a replay, several
/// separated by commas), else `known` in CI, then one random seed. A bad value is refused
/// before anything starts.
pub fn seeds(var: &str, known: &[u64]) -> Vec<u64> {
    if let Ok(text) = std::env::var(var) {
        return text
            .split(',')
            .map(|s| {
                s.trim().parse().unwrap_or_else(|_| {
                    panic!("{var}={text:?}: expected seeds as decimal u64 numbers separated by commas, e.g. {var}=42,7")
                })
            })
            .collect();
    }
    let mut seeds = if in_ci() { known.to_vec() } else { Vec::new() };
    seeds.push(rand::random::<u32>().into());
    seeds
}

/// Restores the link of every target whose cut (in a fault schedule, target -> until)
/// is due by `now`, and forgets those cuts.
pub fn restore_due_cuts(
    lab: &Lab,
    cut_until: &mut std::collections::BTreeMap<&str, std::time::Instant>,
    now: std::time::Instant,
) {
    cut_until.retain(|t, until| {
        if *until <= now {
            lab.restore(t).unwrap();
            false
        } else {
            true
        }
    });
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to `pid`, which may be gone already.
pub fn signal_if_alive(pid: i32, signal: &str) {
    // 0, -1 and a negated pid name groups or every process, never one process.
    assert!(pid > 0, "signal_if_alive({pid}): not one process");
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// SIGKILL to every process of process group `pgid`: the system call itself, never `kill
/// -PGID` through a command (without `--` procps reads `-PGID` as an option, and a wrong
/// reading of it signals every process of the user).
pub fn kill_group(pgid: u32) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pgid).expect("a pid fits an i32"))
        .expect("a process group id is positive");
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

/// The shipped policy with every family's `min_retention` at one second, written to
/// `dir/short-retention.toml`: `gc` may then collect markers while operations are
/// unsettled, which is what a rerun must meet.
pub fn short_retention_policy(dir: &Path) -> PathBuf {
    let path = dir.join("short-retention.toml");
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/command-classes.toml"))
            .unwrap();
    let short: Vec<String> = shipped
        .lines()
        .map(|l| {
            if l.starts_with("min_retention = ") {
                "min_retention = \"1s\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&path, short.join("\n")).unwrap();
    path
}

/// The most intervals that overlap at one instant (one that ends when another starts
/// does not overlap it).
pub fn most_at_once(intervals: &[(u64, u64)]) -> usize {
    let mut edges: Vec<(u64, i32)> = intervals
        .iter()
        .flat_map(|&(a, b)| [(a, 1), (b, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// The intervals a file of "START END" lines holds, each read by a command from the
/// host's /proc/uptime (seconds with two decimals), in hundredths of a second.
pub fn uptime_intervals(log: &Path) -> Vec<(u64, u64)> {
    let hundredths = |t: &str| -> u64 {
        let (s, f) = t.split_once('.').unwrap_or((t, "0"));
        s.parse::<u64>().unwrap() * 100 + f.parse::<u64>().unwrap()
    };
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap();
            (hundredths(a), hundredths(b))
        })
        .collect()
}

/// Sets its flag when dropped, a panic's unwinding included: a helper thread of a scope
/// that loops until the flag is set ends whatever ends the scope's body.
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
