//! The host shim, run for real from Rust under dash, bash and busybox ash (no SSH here;
//! `transport`/`run` tests drive it through real sshd targets).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::op_id::OpId;
use opmark::shim::{self, Frame, MarkerState, Reply, ReplyParser, RunCall, StdinSpec, Verb};
use sha2::{Digest, Sha256};

use crate::support::{fresh_dir, lines, text};

mod functions;
mod locks;

/// The script under test: the shipped one, or the mutant of it that
/// `OPMARK_SHIM_UNDER_TEST` names (scripts/mutate-shim.sh runs these tests once per guard
/// it removes or negates: a guard whose mutant still passes is not proven by them).
fn script() -> &'static str {
    static SCRIPT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| match std::env::var_os("OPMARK_SHIM_UNDER_TEST") {
        Some(path) => std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("OPMARK_SHIM_UNDER_TEST={path:?}: {e}")),
        None => shim::SCRIPT.to_owned(),
    })
}

/// The three shells the shim must run under. A missing one skips locally, fails in CI.
fn shells() -> Vec<(&'static str, PathBuf)> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shells");
    std::fs::create_dir_all(&dir).unwrap();
    let mut found = Vec::new();
    for (name, path) in [("dash", "/usr/bin/dash"), ("bash", "/usr/bin/bash")] {
        let p = [path, &path.replace("/usr", "")]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
        match p {
            Some(p) => found.push((name, p)),
            None => missing(name),
        }
    }
    match ["/usr/bin/busybox", "/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    {
        Some(busybox) => {
            // busybox runs the applet named by argv[0]: a link named `ash` is busybox ash.
            let ash = dir.join("ash");
            if !ash.exists() {
                let _ = std::os::unix::fs::symlink(busybox, &ash);
            }
            found.push(("busybox-ash", ash));
        }
        None => missing("busybox"),
    }
    found
}

fn missing(tool: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{tool} is required in CI (install it in .ci/run)");
    }
    eprintln!("SKIP (partly): {tool} not installed");
}

/// A marker root of its own (never under /tmp: the shim refuses volatile roots).
struct Host {
    state_home: PathBuf,
    shell: PathBuf,
    /// A directory put ahead of PATH for every call: stand-ins that watch a tool the
    /// shim calls (see `tool_on_path`).
    path_first: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    frames: Vec<Frame>,
    status: Option<i32>,
}

impl Outcome {
    fn exit(&self) -> Option<&shim::ExitFrame> {
        self.frames.iter().find_map(|f| match f {
            Frame::Exit(x) => Some(x),
            _ => None,
        })
    }
    fn refusal(&self) -> Option<&shim::Refusal> {
        self.frames.iter().find_map(|f| match f {
            Frame::Refused(r) => Some(r),
            _ => None,
        })
    }
    fn started(&self) -> bool {
        self.frames
            .iter()
            .any(|f| matches!(f, Frame::Started { .. }))
    }
    fn marker(&self) -> &shim::MarkerInfo {
        self.frames
            .iter()
            .find_map(|f| match f {
                Frame::Probe(m) | Frame::Interrupted(m) | Frame::Attached(m) => Some(m),
                Frame::Fence { marker, .. } => Some(marker),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no marker report in {:?}", self.frames))
    }
}

fn parse(stdout: &[u8], stderr: &[u8]) -> Outcome {
    let mut p = ReplyParser::new();
    let mut replies = Vec::new();
    p.push_stderr(stderr, &mut replies)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(stderr)));
    p.push_stdout(stdout, &mut replies).unwrap();
    let mut o = Outcome::default();
    for r in replies {
        match r {
            Reply::Stdout(b) => o.stdout.extend(b),
            Reply::Stderr(b) => o.stderr.extend(b),
            Reply::Frame(f) => o.frames.push(f),
        }
    }
    o
}

fn fp(command: &str) -> String {
    hex::encode(Sha256::digest(command.as_bytes()))
}

impl Host {
    fn new(test: &str, shell: &Path) -> Host {
        let name = format!("{test}-{}", shell.file_name().unwrap().to_string_lossy());
        let state_home = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("shim-hosts")
            .join(name);
        let _ = std::fs::remove_dir_all(&state_home);
        std::fs::create_dir_all(&state_home).unwrap();
        Host {
            state_home,
            shell: shell.to_owned(),
            path_first: None,
        }
    }

    fn root(&self) -> PathBuf {
        self.state_home.join("opmark")
    }

    fn marker(&self, op: &str) -> PathBuf {
        self.root().join("ops").join(op)
    }

    fn command_with_args(&self, args: Vec<String>) -> Command {
        let mut cmd = Command::new(&self.shell);
        cmd.arg("-c")
            .arg(script())
            .arg("opmark-shim")
            .arg(script())
            .args(args)
            .env("OPMARK_SH", &self.shell)
            // The command runs by the login shell ($SHELL, as sshd sets it): the shell
            // under test plays that too, whatever shell runs the tests.
            .env("SHELL", &self.shell)
            .env("XDG_STATE_HOME", &self.state_home)
            .env_remove("OPMARK_ROOT")
            // A test host is disposable, and its root is under /tmp in a clone there.
            .env("OPMARK_ALLOW_VOLATILE_ROOT", "1")
            .current_dir(&self.state_home);
        if let Some(first) = &self.path_first {
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", first.display()));
        }
        cmd
    }

    /// The shim for `verb` with its stdin already holding the verb's input (the
    /// command), as the channel's data would after the script. Its output must go to
    /// pipes: the shim does nothing when its replies cannot reach a client.
    fn command(&self, verb: &Verb) -> Command {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shim-data");
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join(format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&data, shim::local_data(verb, b"")).unwrap();
        let mut cmd = self.command_with_args(verb.args());
        cmd.stdin(std::fs::File::open(&data).unwrap());
        cmd
    }

    /// The shim for `verb`, fed the verb's input and then `stdin`, run to its end.
    fn call(&self, verb: &Verb, stdin: &[u8]) -> Outcome {
        self.call_args(verb.args(), &shim::local_data(verb, stdin))
    }

    fn call_args(&self, args: Vec<String>, stdin: &[u8]) -> Outcome {
        let mut child = self
            .command_with_args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A refusal before the data is read ends the call: the rest meets a closed pipe.
        if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        }
        let out = child.wait_with_output().unwrap();
        let mut o = parse(&out.stdout, &out.stderr);
        o.status = out.status.code();
        o
    }

    fn run(&self, op: &str, attempt: &str, command: &str) -> Outcome {
        self.run_with(op, attempt, command, |_| {})
    }

    fn run_with(
        &self,
        op: &str,
        attempt: &str,
        command: &str,
        tweak: impl FnOnce(&mut RunCall),
    ) -> Outcome {
        let op = OpId::parse(op).unwrap();
        let fingerprint = fp(command);
        let mut req = run_request(&op, &fingerprint, command, opmark::secret::Secrets::none());
        req.attempt_id = attempt;
        tweak(&mut req);
        self.call(&Verb::Run(req), b"")
    }

    fn run_with_secrets(
        &self,
        op: &str,
        attempt: &str,
        command: &str,
        secrets: &opmark::secret::Secrets,
    ) -> Outcome {
        let op = OpId::parse(op).unwrap();
        let fingerprint = fp(command);
        let mut req = run_request(&op, &fingerprint, command, secrets);
        req.attempt_id = attempt;
        self.call(&Verb::Run(req), b"")
    }

    fn probe(&self, op: &str) -> shim::MarkerInfo {
        let op = OpId::parse(op).unwrap();
        self.call(&Verb::Probe(&op), b"").marker().clone()
    }

    fn wait_for_state(&self, op: &str, want: MarkerState) -> shim::MarkerInfo {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let m = self.probe(op);
            if m.state == want {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "{op} never became {want:?}: {m:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_file(&self, path: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !path.exists() {
            assert!(
                Instant::now() < deadline,
                "{} never appeared",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn record(&self, op: &str, file: &str, key: &str) -> String {
        let text = std::fs::read_to_string(self.marker(op).join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} missing in {text}"))
            .to_owned()
    }
}

/// The shim's parts (`remote-scripts/shim/*.sh`) in the order build.rs assembles them
/// (name order), each with its text.
fn shim_parts() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("remote-scripts/shim");
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sh"))
        .collect();
    parts.sort();
    parts
        .into_iter()
        .map(|path| {
            let name = format!(
                "remote-scripts/shim/{}",
                path.file_name().unwrap().to_string_lossy()
            );
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect()
}

/// `PART:LINE` of line `line` (1-based) of the assembled script.
fn part_line(parts: &[(String, String)], line: usize) -> String {
    let mut first = 1;
    for (name, text) in parts {
        let count = text.lines().count();
        if line < first + count {
            return format!("{name}:{}", line - first + 1);
        }
        first += count;
    }
    format!("(assembled script):{line}")
}

#[test]
fn the_embedded_shim_is_its_parts_joined_and_the_supervisor_calls_nothing_below_its_entry() {
    // What the host runs and hashes is what the parts say, nothing added or left out: the
    // header whole, then every other part without its comment lines (`#` and a blank or
    // the end, after blanks). A stale build or a change to build.rs's rule shows here.
    let parts = shim_parts();
    let comment = regex::Regex::new(r"^[ \t]*#([ \t].*)?$").unwrap();
    let mut shipped = parts[0].1.clone();
    for (_, text) in &parts[1..] {
        for line in text.split_inclusive('\n') {
            if !comment.is_match(line.trim_end_matches('\n')) {
                shipped.push_str(line);
            }
        }
    }
    assert!(
        shipped == shim::SCRIPT,
        "SCRIPT differs from the parts joined without their comment lines"
    );
    // Delivered, the script is one argument of `sh -c` (and of the detached supervisor's
    // start): Linux refuses one of 128 KiB or more (E2BIG, "Argument list too long"),
    // and the host would never start the shim.
    assert!(
        shim::SCRIPT.len() < 128 * 1024,
        "the shipped shim is {} bytes; one argument holds less than 128 KiB",
        shim::SCRIPT.len()
    );
    // The detached supervisor reads the script only down to its own entry (the end of
    // 38-standby.sh) and exits there: a function defined below it does not exist for the
    // supervisor, so no code line above the entry may call one.
    let stop = "if [ \"${1:-}\" = supervise ]; then";
    let (name, _) = parts
        .iter()
        .find(|(_, text)| text.contains(stop))
        .expect("no part holds the supervisor's entry");
    assert_eq!(name, "remote-scripts/shim/38-standby.sh");
    let (above, below) = shim::SCRIPT.split_at(shim::SCRIPT.find(stop).unwrap());
    let code: Vec<&str> = above
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| line.split(" # ").next().unwrap())
        .collect();
    let call = |name: &str| {
        regex::Regex::new(&format!(r"(^|[^A-Za-z0-9_$/.-]){name}($|[^A-Za-z0-9_])")).unwrap()
    };
    // The check can see a call: the supervisor's own functions are called above.
    for used in ["supervise", "rget", "durable_write"] {
        assert!(code.iter().any(|line| call(used).is_match(line)), "{used}");
    }
    let defined = regex::Regex::new(r"(?m)^([a-z_]+)\(\) \{").unwrap();
    let later: Vec<&str> = defined
        .captures_iter(below)
        .map(|c| c.get(1).unwrap().as_str())
        .collect();
    assert!(later.contains(&"verb_run"), "{later:?}");
    for name in later {
        let uses: Vec<&&str> = code
            .iter()
            .filter(|line| call(name).is_match(line))
            .collect();
        assert!(
            uses.is_empty(),
            "{name} is defined below the supervisor's entry but called above it: {uses:?}"
        );
    }
}

#[test]
fn shim_is_shellcheck_clean() {
    if which("shellcheck").is_none() {
        return missing("shellcheck");
    }
    // The parts joined (what is shipped, with the comments that hold shellcheck's
    // directives): a part alone would read as using variables that another part sets.
    // Each finding is named by its part and the line in it.
    let parts = shim_parts();
    let joined: String = parts.iter().map(|(_, text)| text.as_str()).collect();
    let file = fresh_dir("shim-shellcheck").join("shim.sh");
    std::fs::write(&file, joined).unwrap();
    let out = Command::new("shellcheck")
        .args(["-s", "sh", "-f", "gcc"])
        .arg(&file)
        .output()
        .unwrap();
    let findings: Vec<String> = text(&out.stdout)
        .lines()
        .map(|finding| {
            // gcc format: FILE:LINE:COLUMN: LEVEL: MESSAGE [SCnnnn]
            let mut fields = finding.splitn(3, ':');
            let (_, line, rest) = (fields.next(), fields.next(), fields.next());
            match (line.and_then(|l| l.parse().ok()), rest) {
                (Some(line), Some(rest)) => format!("{}:{rest}", part_line(&parts, line)),
                _ => finding.to_owned(),
            }
        })
        .collect();
    assert!(
        out.status.success(),
        "shellcheck: {}\n{}",
        findings.join("\n"),
        text(&out.stderr)
    );
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.exists())
    })
}

#[test]
fn every_verb_works_under_dash_bash_and_busybox_ash() {
    for (name, shell) in shells() {
        let host = Host::new("verbs", &shell);
        let cmd = "echo out; echo err >&2; exit 3";

        let first = host.run("op-1", "a1", cmd);
        assert!(first.started(), "{name}: {first:?}");
        assert_eq!(first.stdout, b"out\n", "{name}");
        assert_eq!(first.stderr, b"err\n", "{name}");
        assert_eq!(first.exit().unwrap().code, 3, "{name}");
        assert_eq!(
            first.status,
            Some(0),
            "{name}: the shim's own status is not the command's"
        );

        // Same op id again: nothing runs, the recorded result is replayed.
        let again = host.run("op-1", "a2", cmd);
        assert!(!again.started(), "{name}");
        assert_eq!(again.refusal().unwrap().reason, "completed", "{name}");
        assert_eq!(again.stdout, b"out\n", "{name}");
        assert_eq!(again.exit().unwrap().code, 3, "{name}");
        assert_eq!(again.exit().unwrap().attempt, "a1", "{name}");

        let probe = host.probe("op-1");
        assert_eq!(probe.state, MarkerState::Completed, "{name}");
        assert_eq!(probe.exit_code, Some(3), "{name}");
        assert_eq!(
            probe.fingerprint.as_deref(),
            Some(fp(cmd).as_str()),
            "{name}"
        );

        let op = OpId::parse("op-1").unwrap();
        let attach = host.call(
            &Verb::Attach {
                op: &op,
                out_offset: 2,
                err_offset: 0,
            },
            b"",
        );
        assert_eq!(
            attach.stdout, b"t\n",
            "{name}: attach resumes at the offset"
        );
        assert_eq!(attach.stderr, b"err\n", "{name}");
        assert_eq!(attach.exit().unwrap().code, 3, "{name}");

        // A different command under the same op id is a conflict, not a replay.
        let conflict = host.run("op-1", "a3", "echo other");
        assert_eq!(conflict.refusal().unwrap().reason, "conflict", "{name}");
        assert!(conflict.exit().is_none(), "{name}");

        assert_eq!(host.probe("never").state, MarkerState::Absent, "{name}");
        let never = OpId::parse("never").unwrap();
        let fence = host.call(
            &Verb::Fence {
                op: &never,
                force: false,
            },
            b"",
        );
        assert_eq!(fence.marker().state, MarkerState::Fenced, "{name}");
        let late = host.run("never", "late", "touch late-effect");
        assert_eq!(late.refusal().unwrap().reason, "fenced", "{name}");
        assert!(!host.state_home.join("late-effect").exists(), "{name}");

        let gc_dry = host.call(
            &Verb::Gc {
                older_than: Duration::ZERO,
                dry_run: true,
                tombstones_older_than: None,
            },
            b"",
        );
        let removals = gc_dry
            .frames
            .iter()
            .filter(|f| matches!(f, Frame::GcRemoved(_)))
            .count();
        assert_eq!(removals, 2, "{name}: {:?}", gc_dry.frames);
        assert!(
            host.marker("op-1").exists(),
            "{name}: dry run removes nothing"
        );
        host.call(
            &Verb::Gc {
                older_than: Duration::ZERO,
                dry_run: false,
                tombstones_older_than: None,
            },
            b"",
        );
        // Collected down to tombstones: no output, still read as completed / fenced.
        assert!(!host.marker("op-1").join("out").exists(), "{name}");
        let tomb = host.probe("op-1");
        assert_eq!(tomb.state, MarkerState::Completed, "{name}");
        assert_eq!(tomb.exit_code, Some(3), "{name}");
        assert!(tomb.output_collected(), "{name}: {tomb:?}");
        assert_eq!(host.probe("never").state, MarkerState::Fenced, "{name}");
        host.call(
            &Verb::Gc {
                older_than: Duration::ZERO,
                dry_run: false,
                tombstones_older_than: Some(Duration::ZERO),
            },
            b"",
        );
        assert!(!host.marker("op-1").exists(), "{name}");
        assert!(!host.marker("never").exists(), "{name}");

        let doctor = host.call(&Verb::Doctor, b"");
        assert!(
            doctor.frames.iter().any(
                |f| matches!(f, Frame::Doctor(k) if k.get("writable").map(String::as_str) == Some("yes"))
            ),
            "{name}: {:?}",
            doctor.frames
        );
    }
}

#[test]
fn fifty_concurrent_claimers_run_the_command_exactly_once_twenty_times() {
    let shells = shells();
    for round in 0..20 {
        let (name, shell) = &shells[round % shells.len()];
        let host = Host::new(&format!("race{round}"), shell);
        let effects = host.state_home.join("effects");
        let cmd = format!("echo ran >> {}", effects.display());
        let fingerprint = fp(&cmd);
        let children: Vec<_> = (0..50)
            .map(|i| {
                let op = OpId::parse("contended").unwrap();
                let attempt = format!("a{i}");
                let verb = Verb::Run(RunCall {
                    op: &op,
                    attempt_id: &attempt,
                    host_fingerprint: &fingerprint,
                    family: Family::AppendOnly,
                    timeout: None,
                    output_cap: 1024,
                    stdin: None,
                    supersede_interrupted: false,
                    repeat: opmark::shim::RepeatCheck::OFF,
                    command: &cmd,
                    secrets: opmark::secret::Secrets::none(),
                    become_user: None,
                    locks: &[],
                    lock_wait: std::time::Duration::ZERO,
                    kind: opmark::shim::RunKind::Command,
                    put_from: 0,
                });
                host.command(&verb)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut started = 0;
        for child in children {
            let out = child.wait_with_output().unwrap();
            let o = parse(&out.stdout, &out.stderr);
            if o.started() {
                started += 1;
                assert_eq!(o.exit().unwrap().code, 0);
            } else {
                // Every loser is told the truth: the winner is running, or it finished.
                let r = o.refusal().expect("a loser gets a refusal");
                assert!(
                    r.reason == "running" || r.reason == "completed",
                    "{name}: {r:?}"
                );
                if r.reason == "completed" {
                    assert_eq!(o.exit().unwrap().code, 0);
                }
            }
        }
        assert_eq!(started, 1, "{name} round {round}");
        assert_eq!(lines(&effects), 1, "{name} round {round}");
    }
}

#[test]
fn killing_the_foreground_does_not_stop_the_command() {
    for (name, shell) in shells() {
        let host = Host::new("fgkill", &shell);
        let gate = host.state_home.join("gate");
        let cmd = format!(
            "echo before; while [ ! -e {} ]; do sleep 0.02; done; echo after; exit 7",
            gate.display()
        );
        let op = OpId::parse("survivor").unwrap();
        let fingerprint = fp(&cmd);
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fingerprint,
            family: Family::Convergent,
            timeout: None,
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: &cmd,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        });
        let mut child = {
            use std::os::unix::process::CommandExt;
            host.command(&verb)
                .process_group(0)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        host.wait_for_file(&host.marker("survivor").join("proc"));
        kill(-(child.id() as i32), "KILL");
        child.wait().unwrap();
        let during = host.probe("survivor");
        assert_eq!(during.state, MarkerState::Running, "{name}: {during:?}");
        std::fs::write(&gate, "").unwrap();
        let done = host.wait_for_state("survivor", MarkerState::Completed);
        assert_eq!(done.exit_code, Some(7), "{name}");
        let replay = host.call(
            &Verb::Attach {
                op: &op,
                out_offset: 0,
                err_offset: 0,
            },
            b"",
        );
        assert_eq!(replay.stdout, b"before\nafter\n", "{name}");
        assert_eq!(replay.exit().unwrap().code, 7, "{name}");
    }
}

fn kill(pid: i32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn killing_the_detached_process_group_leaves_an_interrupted_marker() {
    for (name, shell) in shells() {
        let host = Host::new("pgkill", &shell);
        let op = "doomed";
        let mut child = host
            .command(&Verb::Run(RunCall {
                op: &OpId::parse(op).unwrap(),
                attempt_id: "a1",
                host_fingerprint: &fp("sleep 60"),
                family: Family::AppendOnly,
                timeout: None,
                output_cap: 1024,
                stdin: None,
                supersede_interrupted: false,
                repeat: opmark::shim::RepeatCheck::OFF,
                command: "sleep 60",
                secrets: opmark::secret::Secrets::none(),
                become_user: None,
                locks: &[],
                lock_wait: std::time::Duration::ZERO,
                kind: opmark::shim::RunKind::Command,
                put_from: 0,
            }))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        host.wait_for_file(&host.marker(op).join("started"));
        assert_eq!(host.probe(op).state, MarkerState::Running, "{name}");
        let pid: i32 = host.record(op, "proc", "pid").parse().unwrap();
        kill(-pid, "KILL");
        let m = host.wait_for_state(op, MarkerState::Interrupted);
        assert_eq!(m.why.as_deref(), Some("process_gone"), "{name}");
        // The foreground notices too and ends with an interrupted frame, not an exit.
        let out = child.wait().unwrap();
        assert!(out.success());

        // An interrupted claim blocks a plain retry ...
        let retry = host.run(op, "a2", "sleep 60");
        assert_eq!(retry.refusal().unwrap().reason, "interrupted", "{name}");
        // ... and an explicit supersede lets exactly one new claim win, keeping the record.
        let sup = host.call(
            &Verb::Supersede {
                op: &OpId::parse(op).unwrap(),
                by_attempt: "a3",
            },
            b"",
        );
        assert!(
            sup.frames
                .iter()
                .any(|f| matches!(f, Frame::Superseded { by } if by == "a3")),
            "{name}: {:?}",
            sup.frames
        );
        let kept: Vec<_> = std::fs::read_dir(host.root().join("superseded"))
            .unwrap()
            .collect();
        assert_eq!(
            kept.len(),
            1,
            "{name}: the superseded claim is kept for audit"
        );
        let rerun = host.run(op, "a3", "exit 1");
        assert!(
            rerun.started(),
            "{name}: the op id is free again: {rerun:?}"
        );
        assert_eq!(rerun.exit().unwrap().code, 1, "{name}");
    }
}

#[test]
fn run_can_supersede_an_interrupted_claim_in_one_call_when_allowed() {
    let (_, shell) = &shells()[0];
    let host = Host::new("supersede-run", shell);
    let effects = host.state_home.join("effects");
    let cmd = format!("echo ran >> {}; sleep 60", effects.display());
    let mut child = host
        .command(&Verb::Run(RunCall {
            op: &OpId::parse("op").unwrap(),
            attempt_id: "a1",
            host_fingerprint: &fp(&cmd),
            family: Family::Convergent,
            timeout: None,
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: &cmd,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        }))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    host.wait_for_file(&host.marker("op").join("started"));
    // Kill only once the command has had its effect, or the count below means nothing.
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&effects) < 1 {
        assert!(Instant::now() < deadline, "the command never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid: i32 = host.record("op", "proc", "pid").parse().unwrap();
    kill(-pid, "KILL");
    child.wait().unwrap();
    host.wait_for_state("op", MarkerState::Interrupted);
    let cmd2 = cmd.replace("; sleep 60", "");
    // Same intent needed: use the original command but let it finish quickly this time
    // by superseding with the same fingerprint.
    let rerun = host.run_with("op", "a2", &cmd, |r| {
        r.supersede_interrupted = true;
        r.timeout = Some(Duration::from_secs(1));
    });
    assert!(rerun.started(), "{rerun:?}");
    assert!(rerun
        .frames
        .iter()
        .any(|f| matches!(f, Frame::Superseded { .. })));
    assert_eq!(lines(&effects), 2);
    let _ = cmd2;
}

#[test]
fn a_changed_boot_id_means_interrupted() {
    let (_, shell) = &shells()[0];
    if which("unshare").is_none() || !is_root() {
        return missing("unshare as root");
    }
    let host = Host::new("reboot", shell);
    let mut child = host
        .command(&Verb::Run(RunCall {
            op: &OpId::parse("op").unwrap(),
            attempt_id: "a1",
            host_fingerprint: &fp("sleep 30"),
            family: Family::AppendOnly,
            timeout: Some(Duration::from_secs(30)),
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: "sleep 30",
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        }))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    host.wait_for_file(&host.marker("op").join("started"));
    assert_eq!(host.probe("op").state, MarkerState::Running);
    let fake = host.state_home.join("fake_boot_id");
    std::fs::write(&fake, "00000000-0000-0000-0000-000000000000\n").unwrap();
    // Probe inside a mount namespace where boot_id reads differently: as after a reboot.
    let probe = host.command(&Verb::Probe(&OpId::parse("op").unwrap()));
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["-m", "sh", "-c"])
        .arg(format!(
            "mount --bind {} /proc/sys/kernel/random/boot_id && exec \"$0\" \"$@\"",
            fake.display()
        ))
        .arg(probe.get_program())
        .args(probe.get_args())
        .envs(probe.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))));
    let out = wrapped.output().unwrap();
    let o = parse(&out.stdout, &out.stderr);
    assert_eq!(o.marker().state, MarkerState::Interrupted, "{o:?}");
    assert_eq!(o.marker().why.as_deref(), Some("reboot"));
    let pid: i32 = host.record("op", "proc", "pid").parse().unwrap();
    kill(-pid, "KILL");
    child.wait().unwrap();
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
}

#[test]
fn a_reused_pid_with_another_start_time_is_not_running() {
    let (_, shell) = &shells()[0];
    let host = Host::new("pidreuse", shell);
    let done = host.run("op", "a1", "true");
    assert_eq!(done.exit().unwrap().code, 0);
    wait_supervisor_gone(&host, "op");
    // Forge the aftermath of a crash whose pid now belongs to another live process:
    // the test process itself, with a start time that cannot match.
    let m = host.marker("op");
    std::fs::remove_file(m.join("exit")).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    std::fs::write(
        m.join("proc"),
        format!(
            "pid={}\nstart=1\nboot={}\n",
            std::process::id(),
            boot.trim()
        ),
    )
    .unwrap();
    let p = host.probe("op");
    assert_eq!(p.state, MarkerState::Interrupted, "{p:?}");
}

#[test]
fn output_that_imitates_the_framing_cannot_change_the_verdict() {
    for (name, shell) in shells() {
        let host = Host::new("spoof", &shell);
        let cmd = "for n in 00000000000000000000000000000000 ffffffffffffffffffffffffffffffff; do \
                   printf 'OPMARK/1 %s X code=0 out=0 err=0 attempt=x\\n' $n; \
                   printf 'OPMARK/1 %s X code=0 out=0 err=0 attempt=x\\n' $n >&2; \
                   printf 'OPMARK/1 %s H v=1\\n' $n >&2; done; exit 201";
        let o = host.run("spoof", "a1", cmd);
        assert_eq!(o.exit().unwrap().code, 201, "{name}");
        let exits = o
            .frames
            .iter()
            .filter(|f| matches!(f, Frame::Exit(_)))
            .count();
        assert_eq!(exits, 1, "{name}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("X code=0"),
            "{name}"
        );
    }
}

/// Everything a process of the same user can read about a running call, printed by the
/// command itself: the marker's names and records, its own descriptors and environment,
/// and every process's arguments and environment.
const LOOK_AROUND: &str = r#"m=$XDG_STATE_HOME/opmark/ops/leak
ls -la "$m"
cat "$m/claim" "$m/proc"
for f in /proc/self/fd/*; do echo "fd $f -> $(readlink "$f")"; done
for p in /proc/[0-9]*; do
	tr '\0' ' ' <"$p/cmdline"
	echo
	tr '\0' ' ' <"$p/environ"
	echo
done 2>/dev/null
exit 0"#;

#[test]
fn the_nonce_is_in_no_name_record_argument_environment_or_inherited_descriptor() {
    for (name, shell) in shells() {
        let host = Host::new("leak", &shell);
        let op = OpId::parse("leak").unwrap();
        let fingerprint = fp(LOOK_AROUND);
        let child = host
            .command(&Verb::Run(RunCall {
                op: &op,
                attempt_id: "a1",
                host_fingerprint: &fingerprint,
                family: Family::ReadOnly,
                timeout: None,
                output_cap: shim::DEFAULT_OUTPUT_CAP,
                stdin: None,
                supersede_interrupted: false,
                repeat: opmark::shim::RepeatCheck::OFF,
                command: LOOK_AROUND,
                secrets: opmark::secret::Secrets::none(),
                become_user: None,
                locks: &[],
                lock_wait: std::time::Duration::ZERO,
                kind: opmark::shim::RunKind::Command,
                put_from: 0,
            }))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The frame channel the foreground writes to (its fd 2 here; fd 3 in the shim),
        // named by our end of the same pipe: the shim's own fd 2 points elsewhere as
        // soon as it has moved the channel to fd 3.
        let channel = {
            use std::os::fd::AsRawFd;
            let ours = child.stderr.as_ref().unwrap().as_raw_fd();
            std::fs::read_link(format!("/proc/self/fd/{ours}")).unwrap()
        };
        assert!(
            channel.to_string_lossy().starts_with("pipe:["),
            "{name}: {channel:?}"
        );
        let out = child.wait_with_output().unwrap();
        let header = String::from_utf8_lossy(&out.stderr);
        let nonce = header
            .split_whitespace()
            .nth(1)
            .filter(|n| n.len() == 32)
            .unwrap_or_else(|| panic!("{name}: no header: {header}"));
        let o = parse(&out.stdout, &out.stderr);
        assert_eq!(o.exit().map(|x| x.code), Some(0), "{name}: {o:?}");
        let seen = String::from_utf8_lossy(&o.stdout);
        assert!(
            seen.contains("fingerprint="),
            "{name}: the command saw too little: {seen}"
        );
        assert!(
            !seen.contains(nonce),
            "{name}: the command found the nonce:\n{seen}"
        );
        let channel = channel.to_string_lossy();
        assert!(
            !seen.contains(channel.as_ref()),
            "{name}: the command inherited the frame channel {channel}:\n{seen}"
        );
    }
}

#[test]
fn the_shim_itself_refuses_bad_op_ids_and_creates_nothing_outside_its_root() {
    for (name, shell) in shells() {
        let host = Host::new("badids", &shell);
        let long = "a".repeat(200);
        for bad in [
            "../escape",
            "a/b",
            "..",
            ".hidden",
            "has space",
            "new\nline",
            long.as_str(),
            "",
        ] {
            let mut args = Verb::Probe(&OpId::parse("placeholder").unwrap()).args();
            args[1] = bad.to_owned();
            let probe = host.call_args(args, b"");
            assert_eq!(
                probe.refusal().unwrap().reason,
                "invalid_op_id",
                "{name} {bad:?}"
            );

            let mut args = Verb::Run(RunCall {
                op: &OpId::parse("placeholder").unwrap(),
                attempt_id: "a1",
                host_fingerprint: &fp("touch x"),
                family: Family::AppendOnly,
                timeout: None,
                output_cap: 1024,
                stdin: None,
                supersede_interrupted: false,
                repeat: opmark::shim::RepeatCheck::OFF,
                command: "touch x",
                secrets: opmark::secret::Secrets::none(),
                become_user: None,
                locks: &[],
                lock_wait: std::time::Duration::ZERO,
                kind: opmark::shim::RunKind::Command,
                put_from: 0,
            })
            .args();
            args[1] = bad.to_owned();
            let run = host.call_args(args, b"");
            assert_eq!(
                run.refusal().unwrap().reason,
                "invalid_op_id",
                "{name} {bad:?}"
            );
        }
        let entries: Vec<_> = std::fs::read_dir(&host.state_home)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(entries.is_empty(), "{name}: created {entries:?}");
    }
}

#[test]
fn timeout_kills_the_process_group_and_is_recorded() {
    let (_, shell) = &shells()[0];
    let host = Host::new("timeout", shell);
    let started = Instant::now();
    let o = host.run_with("slow", "a1", "sleep 30 & sleep 30; echo never", |r| {
        r.timeout = Some(Duration::from_secs(1));
    });
    let x = o.exit().unwrap_or_else(|| {
        let log = std::fs::read_to_string(host.root().join("shim.log")).unwrap_or_default();
        panic!("no exit frame: {o:?}\nshim.log: {log}")
    });
    assert!(x.timed_out, "{o:?}");
    assert_ne!(x.code, 0);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(host.probe("slow").timed_out);
}

#[test]
fn output_beyond_the_cap_streams_live_and_only_the_capped_copy_is_kept_for_replay() {
    for (name, shell) in shells() {
        let host = Host::new("cap", &shell);
        // Three spill segments and a short one: more than the spill window never waits
        // for long, since this foreground streams and removes them.
        let total = 3 * 1_048_576 + 4321;
        let cmd = format!("head -c {total} /dev/zero | tr '\\0' a; echo done >&2");
        let o = host.run_with("big", "a1", &cmd, |r| r.output_cap = 65_536);
        let x = o.exit().unwrap_or_else(|| panic!("{name}: {:?}", o.frames));
        assert_eq!(x.code, 0, "{name}: the command was never cut off");
        assert_eq!(o.stdout.len(), total, "{name}: the live stream is whole");
        assert!(o.stdout.iter().all(|&b| b == b'a'), "{name}");
        assert_eq!(o.stderr, b"done\n", "{name}");
        assert_eq!(x.kept_out, Some(65_536), "{name}");
        assert_eq!(x.dropped_out, (total - 65_536) as u64, "{name}");
        let out = std::fs::metadata(host.marker("big").join("out")).unwrap();
        assert_eq!(out.len(), 65_536, "{name}: the kept copy is capped");
        let left: Vec<_> = std::fs::read_dir(host.marker("big"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".s."))
            .collect();
        assert!(left.is_empty(), "{name}: spill segments left: {left:?}");

        let replay = host.run_with("big", "a2", &cmd, |r| r.output_cap = 65_536);
        let rx = replay.exit().unwrap();
        assert_eq!(
            replay.stdout.len(),
            65_536,
            "{name}: a replay has the kept copy"
        );
        assert_eq!((rx.kept_out, rx.dropped_out), (Some(65_536), x.dropped_out));
    }
}

#[test]
fn output_beyond_the_cap_is_counted_and_dropped_when_nobody_follows() {
    let (_, shell) = &shells()[0];
    let host = Host::new("cap-gone", shell);
    let gate = host.state_home.join("gate");
    let cmd = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; head -c 5000000 /dev/zero",
        gate.display()
    );
    let mut child = host
        .command(&Verb::Run(RunCall {
            op: &OpId::parse("unfollowed").unwrap(),
            attempt_id: "a1",
            host_fingerprint: &fp(&cmd),
            family: Family::AppendOnly,
            timeout: None,
            output_cap: 1000,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: &cmd,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        }))
        // Pipes: the shim acts only when its replies can reach a client.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    host.wait_for_file(&host.marker("unfollowed").join("started"));
    // The client went away before the output came: the command must neither block nor
    // die, and nothing beyond the cap piles up on the host.
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::write(&gate, "").unwrap();
    let m = host.wait_for_state("unfollowed", MarkerState::Completed);
    assert_eq!(m.exit_code, Some(0), "{m:?}");
    let marker = host.marker("unfollowed");
    let dropped = std::fs::read_to_string(marker.join("out.dropped")).unwrap();
    assert_eq!(dropped.trim(), "4999000");
    assert_eq!(std::fs::metadata(marker.join("out")).unwrap().len(), 1000);
    let spilled = std::fs::read_dir(&marker)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".s."))
        .count();
    assert_eq!(spilled, 0, "nothing beyond the cap stays on the host");
}

#[test]
fn stdin_is_verified_before_the_claim() {
    let (_, shell) = &shells()[0];
    let host = Host::new("stdin", shell);
    let input = b"line one\nline two\n";
    let spec = StdinSpec {
        len: input.len() as u64,
        sha256_hex: hex::encode(Sha256::digest(input)),
    };
    let op = OpId::parse("with-input").unwrap();
    let fingerprint = fp("wc -l");
    let mut req = RunCall {
        op: &op,
        attempt_id: "a1",
        host_fingerprint: &fingerprint,
        family: Family::ReadOnly,
        timeout: None,
        output_cap: 1024,
        stdin: Some(spec.clone()),
        supersede_interrupted: false,
        repeat: opmark::shim::RepeatCheck::OFF,
        command: "wc -l",
        secrets: opmark::secret::Secrets::none(),
        become_user: None,
        locks: &[],
        lock_wait: std::time::Duration::ZERO,
        kind: opmark::shim::RunKind::Command,
        put_from: 0,
    };
    // Half the input arrives (the connection died): refused, nothing claimed.
    let short = host.call(&Verb::Run(req.clone()), &input[..5]);
    assert_eq!(short.refusal().unwrap().reason, "bad_stdin");
    assert_eq!(host.probe("with-input").state, MarkerState::Absent);
    // As many bytes as announced, but not the ones digested: refused the same way, so a
    // command never reads an input its intent does not name.
    let mut altered = input.to_vec();
    altered[0] ^= 0x20;
    req.attempt_id = "a2";
    let other = host.call(&Verb::Run(req.clone()), &altered);
    let refusal = other.refusal().unwrap();
    assert_eq!(refusal.reason, "bad_stdin", "{other:?}");
    assert_eq!(refusal.fields["reason"], "digest_mismatch", "{other:?}");
    assert_eq!(host.probe("with-input").state, MarkerState::Absent);
    req.attempt_id = "a3";
    let full = host.call(&Verb::Run(req), input);
    assert_eq!(full.stdout, b"2\n");
}

#[test]
fn a_volatile_or_unwritable_marker_root_is_refused() {
    let (_, shell) = &shells()[0];
    let host = Host::new("roots", shell);
    let volatile = format!("/tmp/opmark-volatile-root-{}", std::process::id());
    let probe = |allow: Option<&str>| {
        let mut cmd = host.command(&Verb::Probe(&OpId::parse("x").unwrap()));
        cmd.env("OPMARK_ROOT", &volatile);
        match allow {
            Some(v) => cmd.env("OPMARK_ALLOW_VOLATILE_ROOT", v),
            None => cmd.env_remove("OPMARK_ALLOW_VOLATILE_ROOT"),
        };
        let out = cmd.output().unwrap();
        parse(&out.stdout, &out.stderr)
    };
    // A real host: refused, and nothing created. Only an explicit `1` opts out.
    for allow in [None, Some(""), Some("0"), Some("yes")] {
        let o = probe(allow);
        assert_eq!(o.refusal().unwrap().reason, "root_unusable", "{allow:?}");
        assert_eq!(o.refusal().unwrap().fields["reason"], "volatile_path");
        assert!(!Path::new(&volatile).exists(), "{allow:?}");
    }
    // A disposable target (a lab, a test container) opts out explicitly.
    let o = probe(Some("1"));
    assert_eq!(o.marker().state, MarkerState::Absent, "{o:?}");
    let _ = std::fs::remove_dir_all(&volatile);
}

/// The shim through a real sshd, driven by the OpenSSH client: killing the client
/// mid-command leaves the command running; probe, attach and replay over new connections.
#[test]
fn through_real_sshd_a_killed_client_leaves_the_command_running_and_replayable() {
    let Some(lab) = crate::support::loopback_lab(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let gate = crate::support::fresh_dir("sshd-shim").join("gate");
    let cmd = format!(
        "echo start; while [ ! -e {} ]; do sleep 0.02; done; echo end; exit 9",
        gate.display()
    );
    let op = OpId::parse("over-ssh").unwrap();
    let fingerprint = fp(&cmd);
    let run = Verb::Run(RunCall {
        op: &op,
        attempt_id: "a1",
        host_fingerprint: &fingerprint,
        family: Family::AppendOnly,
        timeout: None,
        output_cap: 1 << 20,
        stdin: None,
        supersede_interrupted: false,
        repeat: opmark::shim::RepeatCheck::OFF,
        command: &cmd,
        secrets: opmark::secret::Secrets::none(),
        become_user: None,
        locks: &[],
        lock_wait: std::time::Duration::ZERO,
        kind: opmark::shim::RunKind::Command,
        put_from: 0,
    });
    let ssh_call = |verb: &Verb| {
        let out = crate::support::ssh_shim(&lab, "target1", verb);
        parse(&out.stdout, &out.stderr)
    };
    let mut client = crate::support::spawn_ssh_shim(&lab, "target1", &run);
    let out_file = target.marker_root().join("ops/over-ssh/out");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read(&out_file).map_or(true, |o| o != b"start\n") {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    client.kill().unwrap();
    client.wait().unwrap();

    let probe = ssh_call(&Verb::Probe(&op));
    assert_eq!(probe.marker().state, MarkerState::Running, "{probe:?}");
    std::fs::write(&gate, "").unwrap();
    // Re-attach from the byte the client had seen: only the rest arrives.
    let attach = ssh_call(&Verb::Attach {
        op: &op,
        out_offset: 6,
        err_offset: 0,
    });
    assert_eq!(attach.stdout, b"end\n", "{attach:?}");
    assert_eq!(attach.exit().unwrap().code, 9);
    // A retry of the run replays instead of running again.
    let replay = ssh_call(&Verb::Run(RunCall {
        attempt_id: "a2",
        ..match &run {
            Verb::Run(r) => r.clone(),
            _ => unreachable!(),
        }
    }));
    assert_eq!(replay.refusal().unwrap().reason, "completed");
    assert_eq!(replay.stdout, b"start\nend\n");
    assert_eq!(replay.exit().unwrap().code, 9);
    assert_eq!(replay.exit().unwrap().attempt, "a1");
}

/// Starts `command` as op `op` in the background (the run call keeps following it) and
/// waits until the command itself is up: it must touch `ready` first.
fn start_in_background(host: &Host, op: &str, command: &str, ready: &Path) -> std::process::Child {
    let op = OpId::parse(op).unwrap();
    let fingerprint = fp(command);
    let child = host
        .command(&Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fingerprint,
            family: Family::AppendOnly,
            timeout: None,
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        }))
        // Pipes: the shim acts only when its replies can reach a client.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    host.wait_for_file(ready);
    child
}

fn cancel_answer(
    host: &Host,
    op: &str,
    grace: Duration,
) -> (shim::CancelOutcome, shim::MarkerInfo) {
    let op = OpId::parse(op).unwrap();
    let o = host.call(&Verb::Cancel { op: &op, grace }, b"");
    o.frames
        .iter()
        .find_map(|f| match f {
            Frame::Cancel { outcome, marker } => Some((outcome.clone(), marker.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no cancel frame: {o:?}"))
}

#[test]
fn cancel_verb_stops_fences_and_reports_under_every_shell() {
    use shim::CancelOutcome;
    for (name, shell) in shells() {
        let host = Host::new("cancel", &shell);

        // Running: TERM to its session; the supervisor records the exit, marked cancelled.
        let ready = host.state_home.join("ready");
        let cmd = format!("touch {}; sleep 60", ready.display());
        let mut follower = start_in_background(&host, "busy", &cmd, &ready);
        let (outcome, m) = cancel_answer(&host, "busy", Duration::from_secs(5));
        assert_eq!(outcome, CancelOutcome::Cancelled, "{name}: {m:?}");
        assert_eq!(m.state, MarkerState::Completed, "{name}");
        assert_eq!(m.exit_code, Some(143), "{name}: died of TERM");
        assert!(m.cancelled(), "{name}");
        assert_eq!(host.record("busy", "exit", "cancelled"), "1", "{name}");
        assert_eq!(host.record("busy", "exit", "timed_out"), "0", "{name}");
        follower.wait().unwrap();
        let replay = host.run("busy", "a2", &cmd);
        assert_eq!(
            replay.exit().unwrap().code,
            143,
            "{name}: replayed, not re-run"
        );

        // A command that ignores TERM is killed after the grace.
        let stubborn_ready = host.state_home.join("stubborn-ready");
        let stubborn = format!("trap '' TERM; touch {}; sleep 60", stubborn_ready.display());
        let mut follower = start_in_background(&host, "stubborn", &stubborn, &stubborn_ready);
        let (outcome, m) = cancel_answer(&host, "stubborn", Duration::from_millis(500));
        assert_eq!(outcome, CancelOutcome::Cancelled, "{name}: {m:?}");
        assert_eq!(m.exit_code, Some(137), "{name}: KILL after the grace");
        follower.wait().unwrap();

        // Absent: fenced, so a delayed run can never claim it.
        let (outcome, m) = cancel_answer(&host, "ghost", Duration::from_secs(1));
        assert_eq!(
            outcome,
            CancelOutcome::Fenced {
                was: "absent".into()
            },
            "{name}"
        );
        assert_eq!(m.state, MarkerState::Fenced, "{name}");
        let late = host.run("ghost", "late", "touch late-effect");
        assert_eq!(late.refusal().unwrap().reason, "fenced", "{name}");
        assert!(!host.state_home.join("late-effect").exists(), "{name}");
        let (outcome, _) = cancel_answer(&host, "ghost", Duration::from_secs(1));
        assert_eq!(outcome, CancelOutcome::AlreadyFenced, "{name}");

        // Completed: nothing is signalled, the record stays as it was.
        host.run("done", "a1", "exit 3");
        let before = std::fs::read_to_string(host.marker("done").join("exit")).unwrap();
        let (outcome, m) = cancel_answer(&host, "done", Duration::from_secs(1));
        assert_eq!(outcome, CancelOutcome::AlreadyCompleted, "{name}");
        assert_eq!(m.exit_code, Some(3), "{name}");
        assert!(!m.cancelled(), "{name}");
        let after = std::fs::read_to_string(host.marker("done").join("exit")).unwrap();
        assert_eq!(before, after, "{name}");
    }
}

#[test]
fn cancel_of_an_interrupted_claim_fences_it_so_no_rerun_can_supersede_it() {
    let (name, shell) = &shells()[0];
    let host = Host::new("cancel-interrupted", shell);
    // A claim whose process is gone without an exit record, as a crash leaves it.
    let m = host.marker("crashed");
    std::fs::create_dir_all(m.join("started")).unwrap();
    std::fs::write(
        m.join("claim"),
        format!(
            "attempt=a1\nfingerprint={}\nfamily=read-only\nshim=1\nclaimed_at=1\nfg_pid=1\nfg_start=1\nboot=x\n",
            fp("true")
        ),
    )
    .unwrap();
    std::fs::write(m.join("proc"), "pid=999999\nstart=1\nboot=x\n").unwrap();
    assert_eq!(host.probe("crashed").state, MarkerState::Interrupted);
    let (outcome, marker) = cancel_answer(&host, "crashed", Duration::from_secs(1));
    assert_eq!(
        outcome,
        shim::CancelOutcome::Fenced {
            was: "interrupted".into()
        },
        "{name}"
    );
    assert_eq!(marker.state, MarkerState::Fenced);
    let rerun = host.run_with("crashed", "a2", "true", |r| r.supersede_interrupted = true);
    assert_eq!(rerun.refusal().unwrap().reason, "fenced", "{rerun:?}");
}

#[test]
fn cancel_of_a_claim_whose_command_has_not_started_takes_the_start_gate() {
    let (name, shell) = &shells()[0];
    let host = Host::new("cancel-unstarted", shell);
    // A claimer that is alive but has not started its supervisor yet.
    let mut claimer = Command::new("sleep").arg("30").spawn().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", claimer.id())).unwrap();
    let start = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split(' ')
        .nth(19)
        .unwrap()
        .to_owned();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let m = host.marker("slowstart");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(
        m.join("claim"),
        format!(
            "attempt=a1\nfingerprint={}\nfamily=read-only\nshim=1\nclaimed_at=1\nfg_pid={}\nfg_start={start}\nboot={}\n",
            fp("true"),
            claimer.id(),
            boot.trim()
        ),
    )
    .unwrap();
    let before = host.probe("slowstart");
    assert_eq!(before.state, MarkerState::Running, "{name}: {before:?}");
    let (outcome, marker) = cancel_answer(&host, "slowstart", Duration::from_secs(1));
    assert_eq!(
        outcome,
        shim::CancelOutcome::Fenced {
            was: "not_started".into()
        },
        "{name}"
    );
    assert_eq!(marker.state, MarkerState::Fenced);
    assert!(
        m.join("started").exists(),
        "the gate is taken: a late supervisor cannot start the command"
    );
    claimer.kill().unwrap();
    claimer.wait().unwrap();
}

#[test]
fn a_supervisor_that_never_comes_up_is_answered_as_not_started_instead_of_waited_for() {
    for (name, shell) in shells() {
        let host = Host::new("supervisor-lost", &shell);
        let op = OpId::parse("lost-1").unwrap();
        let fingerprint = fp("echo ran");
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fingerprint,
            family: Family::Destructive,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: "echo ran",
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        });
        // The supervisor's shell does not exist: `setsid -f` forks and reports success,
        // and the supervisor's exec then fails with nobody told.
        let mut child = host
            .command_with_args(verb.args())
            .env("OPMARK_SH", host.state_home.join("no-such-shell"))
            .env("OPMARK_START_LIMIT", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&shim::local_data(&verb, b""))
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let lost = parse(&out.stdout, &out.stderr);
        assert!(lost.started(), "{name}: the claim was made: {lost:?}");
        let refusal = lost.refusal().unwrap_or_else(|| panic!("{name}: {lost:?}"));
        assert_eq!(refusal.reason, "cannot_start", "{name}: {refusal:?}");
        assert_eq!(
            refusal.fields.get("reason").map(String::as_str),
            Some("supervisor_lost"),
            "{name}"
        );
        // The claim went aside with its start gate taken: nothing can run under it, and
        // the op id is free for a run whose supervisor does come up.
        assert_eq!(host.probe("lost-1").state, MarkerState::Absent, "{name}");
        let aside: Vec<_> = std::fs::read_dir(host.root().join("superseded"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(aside.len(), 1, "{name}: {aside:?}");
        assert!(aside[0].join("started").exists(), "{name}: gate taken");
        let rerun = host.run("lost-1", "a2", "echo ran");
        assert_eq!(rerun.exit().map(|x| x.code), Some(0), "{name}: {rerun:?}");
        assert_eq!(rerun.stdout, b"ran\n", "{name}");
    }
}

/// The shim call `args` with `stdin`, run in a mount namespace of its own where /proc is
/// an empty tmpfs: a host (a container) without /proc, as far as the shim can tell.
fn call_without_proc(host: &Host, args: Vec<String>, stdin: &[u8]) -> Outcome {
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg("mount -t tmpfs none /proc && exec \"$@\"")
        .arg("no-proc")
        .arg(&host.shell)
        .arg("-c")
        .arg(script())
        .arg("opmark-shim")
        .arg(script())
        .args(args)
        .env("OPMARK_SH", &host.shell)
        .env("XDG_STATE_HOME", &host.state_home)
        .env_remove("OPMARK_ROOT")
        .env("OPMARK_ALLOW_VOLATILE_ROOT", "1")
        .current_dir(&host.state_home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let mut o = parse(&out.stdout, &out.stderr);
    o.status = out.status.code();
    o
}

/// Waits until the supervisor of `op` has exited: it syncs (and on a failed sync writes
/// again) the exit record after the run's foreground already answered, so a test that
/// edits the marker before then races it.
fn wait_supervisor_gone(host: &Host, op: &str) {
    let pid = host.record(op, "proc", "pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
    {
        assert!(
            Instant::now() < deadline,
            "supervisor {pid} of {op} never exited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Forges what a crash mid-command leaves of a finished op: no exit record, and a
/// supervisor record naming a process that is gone (this boot).
fn forge_crash(host: &Host, op: &str) {
    wait_supervisor_gone(host, op);
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let m = host.marker(op);
    std::fs::remove_file(m.join("exit")).unwrap();
    std::fs::write(
        m.join("proc"),
        format!("pid={}\nstart=1\nboot={}\n", gone.id(), boot.trim()),
    )
    .unwrap();
}

/// The start time (clock ticks since boot, /proc/PID/stat's 22nd field) of `pid`.
fn start_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(19).unwrap().parse().unwrap()
}

#[test]
fn a_live_member_of_the_recorded_session_keeps_it_running_unless_it_is_older_than_the_supervisor() {
    // A session whose leader is gone and whose one member, a sleep, lives on: what a
    // killed supervisor leaves when its command outlives it.
    let out = Command::new("setsid")
        .args(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $$ $!"])
        .output()
        .unwrap();
    let said = text(&out.stdout);
    let (sid, member) = said.trim().split_once(' ').unwrap();
    let member_start = start_ticks(member);
    for (name, shell) in shells() {
        let host = Host::new("session-member", &shell);
        let first = host.run("outlived", "a1", "true");
        assert_eq!(first.exit().unwrap().code, 0, "{name}: {first:?}");
        wait_supervisor_gone(&host, "outlived");
        let m = host.marker("outlived");
        std::fs::remove_file(m.join("exit")).unwrap();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let forge = |supervisor_start: u64| {
            std::fs::write(
                m.join("proc"),
                format!(
                    "pid={sid}\nstart={supervisor_start}\nboot={}\n",
                    boot.trim()
                ),
            )
            .unwrap();
        };
        // The supervisor started with its session: the member may be its command.
        forge(member_start);
        assert_eq!(
            host.probe("outlived").state,
            MarkerState::Running,
            "{name}: a member of the session lives"
        );
        // A supervisor started after the member: the member predates the session the
        // record names (the session id was the kernel's to hand out again), not its command.
        forge(member_start + 100);
        assert_eq!(
            host.probe("outlived").state,
            MarkerState::Interrupted,
            "{name}: a member older than the supervisor is another session's"
        );
    }
    kill(member.parse().unwrap(), "KILL");
}

/// Whether this machine lets a test hide /proc in a mount namespace (root, unshare).
fn can_hide_proc(test: &str) -> bool {
    if !is_root() || which("unshare").is_none() {
        missing(&format!("root and unshare (for {test})"));
        return false;
    }
    true
}

#[test]
fn without_proc_the_shim_refuses_to_claim_and_reads_an_old_claim_as_running_never_interrupted() {
    if !can_hide_proc("no-proc") {
        return;
    }
    for (name, shell) in shells() {
        let host = Host::new("no-proc", &shell);
        let effect = host.state_home.join("ran");
        let cmd = format!("touch {}", effect.display());
        let op = OpId::parse("noproc-1").unwrap();
        let fingerprint = fp(&cmd);
        let req = RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fingerprint,
            family: Family::ReadOnly,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: true,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: &cmd,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        };
        let verb = Verb::Run(req.clone());
        let refused = call_without_proc(&host, verb.args(), &shim::local_data(&verb, b""));
        assert!(!refused.started(), "{name}: {refused:?}");
        let r = refused
            .refusal()
            .unwrap_or_else(|| panic!("{name}: {refused:?}"));
        assert_eq!(r.reason, "cannot_start", "{name}: {r:?}");
        assert_eq!(
            r.fields.get("reason").map(String::as_str),
            Some("no_process_identity"),
            "{name}"
        );
        assert_eq!(host.probe("noproc-1").state, MarkerState::Absent, "{name}");
        assert!(!effect.exists(), "{name}: nothing ran");

        // A claim made while /proc was there, its exit not (yet) recorded: without /proc
        // nobody can tell whether it runs, so it reads running ("liveness unknown"), and
        // a rerun allowed to supersede an interrupted claim neither supersedes nor runs.
        let done = host.run("old-1", "a1", "true");
        assert_eq!(done.exit().map(|x| x.code), Some(0), "{name}");
        forge_crash(&host, "old-1");
        assert_eq!(
            host.probe("old-1").state,
            MarkerState::Interrupted,
            "{name}: with /proc the forged crash reads interrupted"
        );
        let old = OpId::parse("old-1").unwrap();
        let probe = call_without_proc(
            &host,
            Verb::Probe(&old).args(),
            &shim::local_data(&Verb::Probe(&old), b""),
        );
        let m = probe.marker();
        assert_eq!(m.state, MarkerState::Running, "{name}: {m:?}");
        assert!(m.liveness_unknown(), "{name}: {m:?}");
        assert!(m.summary().contains("liveness_unknown"), "{name}");
        let true_fp = fp("true");
        let rerun = Verb::Run(RunCall {
            op: &old,
            attempt_id: "a2",
            host_fingerprint: &true_fp,
            command: "true",
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            ..req.clone()
        });
        let answer = call_without_proc(&host, rerun.args(), &shim::local_data(&rerun, b""));
        assert!(!answer.started(), "{name}: {answer:?}");
        assert_eq!(
            answer.refusal().map(|r| r.reason.as_str()),
            Some("cannot_start"),
            "{name}: {answer:?}"
        );
        assert_eq!(
            host.record("old-1", "claim", "attempt"),
            "a1",
            "{name}: the old claim stays where it was"
        );
        let aside = std::fs::read_dir(host.root().join("superseded"))
            .unwrap()
            .count();
        assert_eq!(aside, 0, "{name}: nothing was superseded");
    }
}

#[test]
fn a_crashed_ops_pid_reused_by_another_ops_supervisor_reads_interrupted_and_cancel_signals_nothing()
{
    for (name, shell) in shells() {
        let host = Host::new("pid-reuse-cancel", &shell);
        // The other operation, running: its supervisor leads a session of its own.
        let ready = host.state_home.join("live-ready");
        let finished = host.state_home.join("live-finished");
        let live_cmd = format!(
            "touch {}; sleep 2; touch {}",
            ready.display(),
            finished.display()
        );
        let follower = start_in_background(&host, "live", &live_cmd, &ready);
        let live_pid = host.record("live", "proc", "pid");
        // The crashed operation: its recorded supervisor pid is now the live op's
        // supervisor (with its own, later start time), as a pid namespace restarted
        // after a crash hands it out. A test may forge exactly that state.
        let done = host.run("dead", "a1", "true");
        assert_eq!(done.exit().map(|x| x.code), Some(0), "{name}");
        wait_supervisor_gone(&host, "dead");
        let m = host.marker("dead");
        std::fs::remove_file(m.join("exit")).unwrap();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        std::fs::write(
            m.join("proc"),
            format!("pid={live_pid}\nstart=1\nboot={}\n", boot.trim()),
        )
        .unwrap();
        let p = host.probe("dead");
        assert_eq!(p.state, MarkerState::Interrupted, "{name}: {p:?}");
        assert_eq!(p.why.as_deref(), Some("process_gone"), "{name}");

        let (outcome, marker) = cancel_answer(&host, "dead", Duration::from_millis(500));
        assert_eq!(
            outcome,
            shim::CancelOutcome::Fenced {
                was: "interrupted".into()
            },
            "{name}: {marker:?}"
        );
        // The other operation was not touched: it finishes its work with its own exit.
        let out = follower.wait_with_output().unwrap();
        let live = parse(&out.stdout, &out.stderr);
        assert_eq!(live.exit().map(|x| x.code), Some(0), "{name}: {live:?}");
        assert!(
            finished.exists(),
            "{name}: the live op's command ran to its end"
        );
        assert_eq!(host.record("live", "exit", "cancelled"), "0", "{name}");
    }
}

/// A shell for the supervisor that comes up `delay` late: `setsid -f` has returned long
/// before, and the foreground's start limit passes meanwhile.
fn late_shell(host: &Host, delay: &str) -> PathBuf {
    let path = host.state_home.join("late-sh");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nsleep {delay}\nexec {} \"$@\"\n",
            host.shell.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_supervisor_that_comes_up_after_the_start_limit_leaves_the_reruns_claim_alone() {
    for (name, shell) in shells() {
        let host = Host::new("late-supervisor", &shell);
        let count = host.state_home.join("count");
        let cmd = format!("sleep 4; echo ran >> {}", count.display());
        let op = OpId::parse("late-1").unwrap();
        let fingerprint = fp(&cmd);
        let req = RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fingerprint,
            family: Family::Destructive,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: &cmd,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        };
        let first = Verb::Run(req.clone());
        let began = Instant::now();
        let mut child = host
            .command_with_args(first.args())
            .env("OPMARK_SH", late_shell(&host, "3"))
            .env("OPMARK_START_LIMIT", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&shim::local_data(&first, b""))
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let lost = parse(&out.stdout, &out.stderr);
        assert_eq!(
            lost.refusal().map(|r| r.reason.as_str()),
            Some("cannot_start"),
            "{name}: {lost:?}"
        );
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "{name}: answered before the late supervisor came up"
        );
        // Rerun at once: its own supervisor starts the command; the late one comes up
        // while it runs and must leave this claim alone.
        let rerun = host.run_with("late-1", "a2", &cmd, |r| r.family = Family::Destructive);
        assert!(rerun.started(), "{name}: {rerun:?}");
        assert_eq!(
            rerun.exit().map(|x| x.code),
            Some(0),
            "{name}: the rerun ran and says so: {rerun:?}"
        );
        assert!(
            began.elapsed() > Duration::from_secs(3),
            "{name}: overlapped"
        );
        assert_eq!(lines(&count), 1, "{name}: ran once");
        assert_eq!(host.record("late-1", "claim", "attempt"), "a2", "{name}");
        let aside: Vec<_> = std::fs::read_dir(host.root().join("superseded"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(aside.len(), 1, "{name}: {aside:?}");
        assert!(
            !aside[0].join("proc").exists(),
            "{name}: the late supervisor touched nothing, not even its own set-aside claim"
        );
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(lines(&count), 1, "{name}: still once");
    }
}

#[test]
fn a_cancel_racing_natural_completion_never_says_stopped_for_a_command_that_did_its_work() {
    use shim::CancelOutcome;
    let (name, shell) = &shells()[0];
    let host = Host::new("cancel-race", shell);
    let (mut stopped, mut ended_itself, mut before) = (0, 0, 0);
    for i in 0..24u64 {
        let op = format!("race-{i}");
        let ready = host.state_home.join(format!("ready-{i}"));
        let end = host.state_home.join(format!("end-{i}"));
        let cmd = format!(
            "touch {}; sleep 0.6; touch {}",
            ready.display(),
            end.display()
        );
        let mut follower = start_in_background(&host, &op, &cmd, &ready);
        // From well inside the command's run to around its own end (a cancel call takes
        // tens of milliseconds to reach its signal): 100 ms to 675 ms after it is up.
        std::thread::sleep(Duration::from_millis(100 + 25 * i));
        let (outcome, m) = cancel_answer(&host, &op, Duration::from_millis(500));
        follower.wait().unwrap();
        let did_its_work = end.exists();
        match outcome {
            CancelOutcome::Cancelled => {
                stopped += 1;
                assert!(
                    matches!(m.exit_code, Some(143 | 137)),
                    "{name} delay {i}: stopped means died of the cancel's signal: {m:?}"
                );
            }
            CancelOutcome::AlreadyCompleted => {
                assert!(!m.cancelled(), "{name} delay {i}: {m:?}");
                if m.cancel_pending() {
                    ended_itself += 1;
                } else {
                    before += 1;
                }
            }
            other => panic!("{name} delay {i}: {other:?} {m:?}"),
        }
        if did_its_work && m.exit_code == Some(0) {
            assert_ne!(
                outcome,
                CancelOutcome::Cancelled,
                "{name} delay {i}: a command that finished its work was called stopped: {m:?}"
            );
        }
        assert_eq!(
            m.cancelled(),
            host.record(&op, "exit", "cancelled") == "1",
            "{name} delay {i}"
        );
    }
    eprintln!("cancel race: stopped {stopped}, ended by itself while pending {ended_itself}, done before the cancel {before}");
    assert!(stopped > 0, "the range reaches into the command's run");
}

/// Restarts a lab target's sshd in a mount namespace of its own where /proc is an empty
/// tmpfs: every session it starts, and so the shim, runs on a host without /proc (as in
/// a container started without it). sshd itself needs no /proc.
fn restart_sshd_without_proc(lab: &opmark::lab::Lab, alias: &str) {
    lab.stop_sshd(alias).unwrap();
    let target = lab.target(alias).unwrap();
    let sshd = which("sshd").unwrap_or_else(|| PathBuf::from("/usr/sbin/sshd"));
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg("mount -t tmpfs none /proc && exec \"$@\"")
        .arg("no-proc")
        .arg(sshd)
        .arg("-f")
        .arg(target.sshd_config())
        .arg("-E")
        .arg(&target.log)
        .status()
        .unwrap();
    assert!(status.success(), "sshd without /proc did not start");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = crate::support::ssh(lab)
            .arg(alias)
            .arg("test -e /proc/self || echo no-proc")
            .output()
            .unwrap();
        if seen.stdout == b"no-proc\n" {
            return;
        }
        assert!(Instant::now() < deadline, "{seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn through_real_sshd_a_host_without_proc_runs_nothing_follows_old_claims_and_fails_doctor() {
    if !can_hide_proc("sshd-no-proc") {
        return;
    }
    let Some(lab) = crate::support::loopback_lab(1) else {
        return;
    };
    let env = crate::support::Sealed::new("sshd-no-proc");
    let work = crate::support::fresh_dir("sshd-no-proc");
    let opmark = |args: &[&str]| {
        env.opmark_with_lab(&lab)
            .arg("--json")
            .args(args)
            .output()
            .unwrap()
    };
    // Claimed while /proc was there; its exit record gone, as a crash mid-command leaves
    // it. Convergent: read as interrupted it would be superseded and run again.
    let old_runs = work.join("old-runs");
    let old_cmd = format!("echo x >> {}", old_runs.display());
    let first = crate::support::answer(opmark(&[
        "run",
        "target1",
        "--op",
        "old-1",
        "--class",
        "convergent",
        "--",
        &old_cmd,
    ]));
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let root = lab.target("target1").unwrap().marker_root();
    std::fs::remove_file(root.join("ops/old-1/exit")).unwrap();

    restart_sshd_without_proc(&lab, "target1");

    // Three runs at once of a command that takes a while: none claims, none runs.
    let (start, end) = (work.join("start"), work.join("end"));
    let cmd = format!(
        "touch {}; sleep 8; touch {}",
        start.display(),
        end.display()
    );
    let runs: Vec<_> = (0..3)
        .map(|_| {
            env.opmark_with_lab(&lab)
                .args(["--json", "run", "target1", "--op", "trio-1", "--", &cmd])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let a = crate::support::answer(run.wait_with_output().unwrap());
        // A run that saw another one still in flight in the ledger cannot say more
        // than indeterminate; none says it ran.
        assert!(
            ["not_applied", "indeterminate"].contains(&a.verdict()),
            "{a:?}"
        );
        assert_eq!(a.reason_code(), "shim_cannot_start", "{a:?}");
        let why = a.json["reason"].as_str().unwrap_or_default();
        assert!(
            why.contains("/proc") && why.contains("nothing ran"),
            "{a:?}"
        );
    }
    assert!(!start.exists(), "nothing ran");
    assert!(!root.join("ops/trio-1").exists(), "nothing was claimed");

    // The old claim: running, liveness unknown; a rerun follows it, never supersedes.
    let probe = opmark(&["probe", "target1", "old-1"]);
    let p: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    assert_eq!(p["marker_state"], "running", "{p}");
    assert_eq!(p["why"], "liveness_unknown", "{p}");
    let rerun = crate::support::answer(opmark(&[
        "run",
        "target1",
        "--op",
        "old-1",
        "--class",
        "convergent",
        "--wait",
        "1s",
        "--",
        &old_cmd,
    ]));
    assert_eq!(rerun.verdict(), "in_progress", "{rerun:?}");
    assert_eq!(lines(&old_runs), 1, "never run again");
    assert!(!root.join("superseded").read_dir().unwrap().any(|_| true));

    let doctor = opmark(&["doctor", "target1"]);
    assert_ne!(doctor.status.code(), Some(0), "doctor must fail");
    let d: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let liveness = d["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "liveness")
        .unwrap_or_else(|| panic!("{d}"));
    assert_eq!(liveness["status"], "fail", "{d}");
}

/// The repetition check a claim asks of the fingerprint index: `action` over `window_s`,
/// not counting the op ids in `declared`.
fn repeat_check(
    window_s: u64,
    action: opmark::policy::OnRepeat,
    declared: &[&str],
) -> shim::RepeatCheck<'static> {
    let declared: Vec<String> = declared.iter().map(|d| (*d).to_owned()).collect();
    shim::RepeatCheck {
        window: Duration::from_secs(window_s),
        action,
        declared: Box::leak(declared.into_boxed_slice()),
    }
}

fn repeats_frame(o: &Outcome) -> Option<&std::collections::BTreeMap<String, String>> {
    o.frames.iter().find_map(|f| match f {
        Frame::Repeats(fields) => Some(fields),
        _ => None,
    })
}

#[test]
fn the_fingerprint_index_holds_back_the_same_intent_under_another_op_id() {
    use opmark::policy::OnRepeat::{Allow, Block, Warn};
    for (name, shell) in shells() {
        let host = Host::new("fp-index", &shell);
        let effects = host.state_home.join("effects");
        let cmd = format!("echo ran >> {}", effects.display());
        let with = |check: shim::RepeatCheck<'static>| move |r: &mut RunCall| r.repeat = check;

        let first = host.run_with("rep-1", "a1", &cmd, with(repeat_check(3600, Block, &[])));
        assert!(first.started(), "{name}: {first:?}");
        let slot = host.root().join("fp").join(fp(&cmd)).join("0000000001");
        let record = std::fs::read_to_string(&slot).unwrap();
        assert!(record.contains("op=rep-1\n"), "{name}: {record}");

        // Another op id, same intent, within the window: refused, naming the earlier one.
        let held = host.run_with("rep-2", "a2", &cmd, with(repeat_check(3600, Block, &[])));
        assert!(!held.started(), "{name}: {held:?}");
        let r = held.refusal().expect("a refusal");
        assert_eq!(r.reason, shim::RefusalReason::Repeats, "{name}: {r:?}");
        assert_eq!(r.fields["earlier"], "rep-1", "{name}: {r:?}");
        assert_eq!(r.fields["earlier_state"], "completed", "{name}: {r:?}");
        assert!(r.fields["earlier_at"].parse::<u64>().is_ok(), "{r:?}");
        assert!(
            !host.marker("rep-2").exists(),
            "{name}: nothing was claimed"
        );
        assert_eq!(lines(&effects), 1, "{name}");
        // Held again, the same way, on a rerun of the same op id.
        let again = host.run_with("rep-2", "a3", &cmd, with(repeat_check(3600, Block, &[])));
        assert_eq!(
            again.refusal().unwrap().fields["earlier"],
            "rep-1",
            "{name}"
        );

        // Declared: it runs.
        let declared = host.run_with(
            "rep-2",
            "a4",
            &cmd,
            with(repeat_check(3600, Block, &["rep-1"])),
        );
        assert!(declared.started(), "{name}: {declared:?}");
        assert_eq!(lines(&effects), 2, "{name}");

        // Warn: says so in a W frame naming the latest earlier claim, then runs.
        let warned = host.run_with("rep-3", "a5", &cmd, with(repeat_check(3600, Warn, &[])));
        assert!(warned.started(), "{name}: {warned:?}");
        assert_eq!(
            repeats_frame(&warned).map(|f| f["earlier"].as_str()),
            Some("rep-2"),
            "{name}: {warned:?}"
        );
        // Allow, or a window of zero: silent.
        let allowed = host.run_with("rep-4", "a6", &cmd, with(repeat_check(3600, Allow, &[])));
        assert!(
            allowed.started() && repeats_frame(&allowed).is_none(),
            "{name}"
        );
        let no_window = host.run_with("rep-5", "a7", &cmd, with(repeat_check(0, Block, &[])));
        assert!(no_window.started(), "{name}: {no_window:?}");
        assert_eq!(lines(&effects), 5, "{name}");

        // Another intent is no repetition.
        let other = format!("echo other >> {}", effects.display());
        let different = host.run_with("rep-6", "a8", &other, with(repeat_check(3600, Block, &[])));
        assert!(different.started(), "{name}: {different:?}");

        // A claim whose marker never appeared (its claimer was refused later) stops
        // counting once it is old: only young ones may be between index and claim.
        let ghost_cmd = format!("echo ghost >> {}", effects.display());
        let ghost_dir = host.root().join("fp").join(fp(&ghost_cmd));
        std::fs::create_dir_all(&ghost_dir).unwrap();
        std::fs::write(ghost_dir.join("0000000001"), "op=ghost\nclaimed_at=1000\n").unwrap();
        let after_ghost = host.run_with(
            "rep-7",
            "a9",
            &ghost_cmd,
            with(repeat_check(u64::from(u32::MAX), Block, &[])),
        );
        assert!(after_ghost.started(), "{name}: {after_ghost:?}");

        // The temp names slots are linked from go once their claim is answered: with
        // the supervisor's leftovers after the exit record, with the spools of a refusal.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let temps: Vec<PathBuf> = std::fs::read_dir(host.root().join("fp"))
                .unwrap()
                .flatten()
                .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
                .map(|e| e.path())
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".t."))
                .collect();
            if temps.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "{name}: left behind: {temps:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn racing_claims_of_one_intent_under_different_op_ids_run_it_once() {
    let shells = shells();
    for round in 0..6 {
        let (name, shell) = &shells[round % shells.len()];
        let host = Host::new(&format!("fp-race{round}"), shell);
        let effects = host.state_home.join("effects");
        let cmd = format!("echo ran >> {}", effects.display());
        let fingerprint = fp(&cmd);
        let children: Vec<_> = (0..20)
            .map(|i| {
                let op = OpId::parse(&format!("racer-{i}")).unwrap();
                let attempt = format!("a{i}");
                let verb = Verb::Run(RunCall {
                    op: &op,
                    attempt_id: &attempt,
                    host_fingerprint: &fingerprint,
                    family: Family::Destructive,
                    timeout: None,
                    output_cap: 1024,
                    stdin: None,
                    supersede_interrupted: false,
                    repeat: repeat_check(3600, opmark::policy::OnRepeat::Block, &[]),
                    command: &cmd,
                    secrets: opmark::secret::Secrets::none(),
                    become_user: None,
                    locks: &[],
                    lock_wait: std::time::Duration::ZERO,
                    kind: opmark::shim::RunKind::Command,
                    put_from: 0,
                });
                host.command(&verb)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut started = 0;
        for child in children {
            let out = child.wait_with_output().unwrap();
            let o = parse(&out.stdout, &out.stderr);
            if o.started() {
                started += 1;
            } else {
                let r = o.refusal().expect("a loser gets a refusal");
                assert_eq!(r.reason, shim::RefusalReason::Repeats, "{name}: {r:?}");
                assert!(r.fields["earlier"].starts_with("racer-"), "{r:?}");
            }
        }
        assert_eq!(started, 1, "{name} round {round}");
        assert_eq!(lines(&effects), 1, "{name} round {round}");
    }
}

/// One request's reply out of a resident's whole stderr: its frames and output, and its
/// end frame's status (`None`: it was never answered).
fn resident_reply(stderr: &[u8], token: &str) -> (Outcome, Option<u32>) {
    let mut p = ReplyParser::expecting(token);
    let mut replies = Vec::new();
    // Past its end frame come the next request's frames, under another nonce: the
    // parser's complaint about them is not this reply's.
    let pushed = p.push_stderr(stderr, &mut replies);
    if p.end_status().is_none() {
        if let Err(e) = pushed {
            panic!("{e}: {}", String::from_utf8_lossy(stderr));
        }
    }
    let mut o = Outcome::default();
    for r in replies {
        match r {
            Reply::Stdout(b) => o.stdout.extend(b),
            Reply::Stderr(b) => o.stderr.extend(b),
            Reply::Frame(f) => o.frames.push(f),
        }
    }
    (o, p.end_status())
}

#[test]
fn a_resident_answers_pipelined_requests_as_calls_and_ends_when_out_of_step() {
    for (name, shell) in shells() {
        let host = Host::new("resident", &shell);
        let a = OpId::parse("res-a").unwrap();
        let b = OpId::parse("res-b").unwrap();
        let c = OpId::parse("res-c").unwrap();
        let d = OpId::parse("res-d").unwrap();
        let cmd_a = "echo one; echo two >&2";
        let (fp_a, fp_b) = (fp(cmd_a), fp("cat"));
        let run = |op, fp, command| {
            Verb::Run(RunCall {
                op,
                attempt_id: "at1",
                host_fingerprint: fp,
                family: Family::AppendOnly,
                timeout: None,
                output_cap: shim::DEFAULT_OUTPUT_CAP,
                stdin: None,
                supersede_interrupted: false,
                repeat: opmark::shim::RepeatCheck::OFF,
                command,
                secrets: opmark::secret::Secrets::none(),
                become_user: None,
                locks: &[],
                lock_wait: std::time::Duration::ZERO,
                kind: opmark::shim::RunKind::Command,
                put_from: 0,
            })
        };
        let mut with_stdin = RunCall {
            op: &b,
            attempt_id: "at1",
            host_fingerprint: &fp_b,
            family: Family::AppendOnly,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: "cat",
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        };
        with_stdin.stdin = Some(StdinSpec {
            len: 3,
            sha256_hex: hex::encode(Sha256::digest(b"abc")),
        });
        let requests = [
            shim::Request::new(&run(&a, &fp_a, cmd_a), None, None),
            shim::Request::new(&Verb::Run(with_stdin), Some(b"abc"), None),
            shim::Request::new(&Verb::Probe(&a), None, None),
            shim::Request::new(&run(&a, &fp_a, cmd_a), None, None),
            shim::Request::new(&Verb::Probe(&c), None, Some("00ff")),
        ];
        // A run refused before its data is read (a bad family, a command too long to be
        // read first) whose command text looks like a request: the resident must end
        // rather than read it as one.
        let forged = "q c=00000000000000000000000000000abc probe res-a\n";
        let long = format!("{forged}{}", "#".repeat(5000));
        let fp_d = fp(&long);
        let mut args = run(&d, &fp_d, &long).args();
        args[4] = "bogus".into();
        let refused_token = "00000000000000000000000000000def";
        let mut refused = format!("q c={refused_token} {}\n", args.join(" ")).into_bytes();
        refused.extend_from_slice(long.as_bytes());
        refused.push(b'\n');
        let after = shim::Request::new(&Verb::Probe(&a), None, None);

        let mut child = host
            .command_with_args(vec!["c=00".into(), "serve".into()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        // Pipelined: every request in one write, as a client may.
        let mut all: Vec<u8> = requests.iter().flat_map(|r| r.bytes.clone()).collect();
        all.extend_from_slice(&refused);
        all.extend_from_slice(&after.bytes);
        input.write_all(&all).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        let frames = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(frames.contains(" Q ready pid="), "{name}: {frames}");

        let (one, end) = resident_reply(&out.stderr, &requests[0].token);
        assert_eq!(end, Some(0), "{name}: {frames}");
        assert_eq!(one.exit().map(|x| x.code), Some(0), "{name}: {one:?}");
        assert_eq!(
            (&one.stdout[..], &one.stderr[..]),
            (&b"one\n"[..], &b"two\n"[..])
        );
        let (two, end) = resident_reply(&out.stderr, &requests[1].token);
        assert_eq!(end, Some(0), "{name}: {frames}");
        assert_eq!(two.stdout, b"abc", "{name}: the stdin, by count: {two:?}");
        let (three, _) = resident_reply(&out.stderr, &requests[2].token);
        assert_eq!(three.marker().state, MarkerState::Completed, "{name}");
        let (four, end) = resident_reply(&out.stderr, &requests[3].token);
        assert_eq!(end, Some(0), "{name}");
        assert!(
            four.refusal().is_some_and(|r| r.replay) && four.stdout == b"one\n",
            "{name}: the taken claim answers, nothing runs again: {four:?}"
        );
        let (five, end) = resident_reply(&out.stderr, &requests[4].token);
        assert_eq!(
            end,
            Some(0),
            "{name}: a refusal leaves the resident in step"
        );
        assert_eq!(
            five.refusal().map(|r| r.reason),
            Some(shim::RefusalReason::RootChanged),
            "{name}: r= is checked per request: {five:?}"
        );
        let (six, end) = resident_reply(&out.stderr, refused_token);
        assert_eq!(
            six.refusal().map(|r| r.reason),
            Some(shim::RefusalReason::BadArgs),
            "{name}: {six:?}"
        );
        assert_eq!(end, Some(4), "{name}: refused with its data unread");
        assert!(
            !frames.contains("c=00000000000000000000000000000abc")
                && resident_reply(&out.stderr, &after.token).1.is_none(),
            "{name}: nothing after an out-of-step request is answered: {frames}"
        );
        assert!(!host.marker("res-d").exists(), "{name}");
        assert!(host.marker("res-a").join("exit").exists(), "{name}");
    }
}

/// A local resident (`serve`) in a process group of its own, fed one request at a time.
struct Resident {
    child: std::process::Child,
    input: Option<std::process::ChildStdin>,
    frames: std::io::BufReader<std::process::ChildStderr>,
    seen: Vec<u8>,
}

impl Resident {
    fn start(host: &Host) -> Resident {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let mut child = host
            .command_with_args(vec!["c=00".into(), "serve".into()])
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take();
        let mut frames = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains(" Q ready pid=") {
            line.clear();
            assert!(frames.read_line(&mut line).unwrap() > 0, "no Q frame");
        }
        Resident {
            child,
            input,
            frames,
            seen: Vec::new(),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// `command` as run request `op`, answered (its end frame read).
    fn run(&mut self, op: &str, command: &str) -> Outcome {
        use std::io::BufRead;
        let op = OpId::parse(op).unwrap();
        let fingerprint = fp(command);
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "at1",
            host_fingerprint: &fingerprint,
            family: Family::AppendOnly,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        });
        let request = shim::Request::new(&verb, None, None);
        let input = self.input.as_mut().unwrap();
        input.write_all(&request.bytes).unwrap();
        input.flush().unwrap();
        let start = self.seen.len();
        let end = format!(" Z c={} ", request.token);
        loop {
            let mut line = Vec::new();
            assert!(
                self.frames.read_until(b'\n', &mut line).unwrap() > 0,
                "the resident ended: {}",
                String::from_utf8_lossy(&self.seen)
            );
            self.seen.extend_from_slice(&line);
            if String::from_utf8_lossy(&line).contains(&end) {
                break;
            }
        }
        let (o, status) = resident_reply(&self.seen[start..], &request.token);
        assert_eq!(status, Some(0), "{}", String::from_utf8_lossy(&self.seen));
        o
    }
}

/// The standby supervisor waiting for `resident`'s next command: its pid, once it says
/// it is ready in its FIFO's `.pid` file and lives (`None` after `within`).
fn standby_of(host: &Host, resident: i32, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        for entry in std::fs::read_dir(host.root().join("spool"))
            .unwrap()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&format!(".sb.{resident}.")) || !name.ends_with(".pid") {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            // Alive: a standby just lost is named until the resident replaces it.
            if let Some(Ok(pid)) = text.split_whitespace().next().map(str::parse::<i32>) {
                if group_and_session(pid).is_some() {
                    return Some(pid);
                }
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Fields 5 and 6 of `/proc/PID/stat`: its process group and session (`None`: gone, or
/// a zombie).
fn group_and_session(pid: i32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    (rest[0] != "Z").then(|| (rest[2].parse().unwrap(), rest[3].parse().unwrap()))
}

fn gone_within(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while group_and_session(pid).is_some() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_resident_hands_commands_to_a_standby_supervisor_that_outlives_it_and_never_waits_past_it() {
    for (name, shell) in shells() {
        let host = Host::new("standby", &shell);
        let dir = host.state_home.join("files");
        std::fs::create_dir_all(&dir).unwrap();
        let mut first = Resident::start(&host);
        // The first request makes the marker root; the standby comes after it.
        let one = first.run("sb-1", "true");
        assert_eq!(one.exit().map(|x| x.code), Some(0), "{name}: {one:?}");
        let standby = standby_of(&host, first.pid(), Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{name}: no standby supervisor"));
        // In a session of its own, out of the resident's process group.
        let (group, session) = group_and_session(standby).unwrap();
        assert_eq!((group, session), (standby, standby), "{name}");
        assert_ne!(group, first.pid(), "{name}");

        // The next command is the standby's: the marker records it as the supervisor.
        // Killing the resident's whole group mid-command leaves it running to its end.
        let count = dir.join("count");
        let started = dir.join("started");
        let command = format!(
            "echo s >> {}; sleep 1; echo once >> {}",
            started.display(),
            count.display()
        );
        let op = OpId::parse("sb-2").unwrap();
        let fingerprint = fp(&command);
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "at1",
            host_fingerprint: &fingerprint,
            family: Family::AppendOnly,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: &command,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        });
        let request = shim::Request::new(&verb, None, None);
        first
            .input
            .as_mut()
            .unwrap()
            .write_all(&request.bytes)
            .unwrap();
        host.wait_for_file(&started);
        assert_eq!(
            host.record("sb-2", "proc", "pid"),
            standby.to_string(),
            "{name}"
        );
        // Its captures' head writes unbuffered, as under stdbuf -o0 (the standby starts
        // head with the environment stdbuf would give it).
        if which("stdbuf").is_some() {
            for capture in host.record("sb-2", "proc", "captures").split(',') {
                let children = format!("/proc/{capture}/task/{capture}/children");
                let head = std::fs::read_to_string(children).unwrap_or_default();
                let head = head.split_whitespace().next().unwrap_or("none").to_owned();
                let environ = std::fs::read(format!("/proc/{head}/environ")).unwrap_or_default();
                let vars: Vec<String> = environ
                    .split(|&b| b == 0)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect();
                assert!(
                    vars.iter().any(|v| v == "_STDBUF_O=0")
                        && vars
                            .iter()
                            .any(|v| v.starts_with("LD_PRELOAD=") && v.contains("libstdbuf")),
                    "{name}: capture {capture}'s head {head}: {vars:?}"
                );
            }
        }
        kill(-first.pid(), "KILL");
        let _ = first.child.wait();
        let done = host.wait_for_state("sb-2", MarkerState::Completed);
        assert_eq!(done.exit_code, Some(0), "{name}: {done:?}");
        assert_eq!(lines(&count), 1, "{name}: ran to its end once");
        assert_eq!(lines(&started), 1, "{name}");

        // A resident whose standby waits: the resident's end is the standby's (EOF on
        // its FIFO), and its FIFO goes with it. The killed one's FIFO is reclaimed.
        let mut second = Resident::start(&host);
        let three = second.run("sb-3", "echo three");
        assert_eq!(three.stdout, b"three\n", "{name}: {three:?}");
        let idle = standby_of(&host, second.pid(), Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{name}: no standby supervisor"));
        // An idle standby killed: the next command detaches a supervisor as before, and
        // a new standby follows. A torn line in the FIFO is skipped, never run.
        kill(idle, "KILL");
        assert!(gone_within(idle, Duration::from_secs(5)), "{name}");
        let four = second.run("sb-4", "echo four");
        assert_eq!(four.stdout, b"four\n", "{name}: {four:?}");
        assert_ne!(
            host.record("sb-4", "proc", "pid"),
            idle.to_string(),
            "{name}"
        );
        let next = standby_of(&host, second.pid(), Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{name}: no standby after a lost one"));
        let fifo = std::fs::read_dir(host.root().join("spool"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with(&format!(".sb.{}.", second.pid())) && !n.ends_with(".pid")
            })
            .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .unwrap()
            .write_all(b"1 2 3 bogus /nowhere/ops/sb-4 and more\n7 7 7 x")
            .unwrap();
        let five = second.run("sb-5", "echo five");
        assert_eq!(five.stdout, b"five\n", "{name}: {five:?}");
        assert_eq!(
            host.record("sb-5", "proc", "pid"),
            next.to_string(),
            "{name}"
        );
        let idle = standby_of(&host, second.pid(), Duration::from_secs(10)).unwrap();
        let leftovers = |pid: i32| {
            std::fs::read_dir(host.root().join("spool"))
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!(".sb.{pid}."))
                })
                .count()
        };
        assert_eq!(leftovers(first.pid()), 0, "{name}: the killed one's FIFO");
        drop(second.input.take());
        let _ = second.child.wait();
        assert!(
            gone_within(idle, Duration::from_secs(5)),
            "{name}: an idle standby outlived its resident"
        );
        assert_eq!(leftovers(second.pid()), 0, "{name}");
    }
}

/// The `V` frame of an `output` read: the marker and the range's fields.
fn output_end(o: &Outcome) -> &shim::MarkerInfo {
    o.frames
        .iter()
        .find_map(|f| match f {
            Frame::Output(m) => Some(m),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no output answer: {o:?}"))
}

#[test]
fn output_reads_exact_ranges_of_the_kept_copy_and_changes_nothing_under_every_shell() {
    use shim::{OutputFrom, OutputStream};
    for (name, shell) in shells() {
        let host = Host::new("output", &shell);
        let ran = host.run("op-1", "a1", "printf abcdefghij; echo err >&2");
        assert_eq!(ran.exit().unwrap().code, 0, "{name}: {ran:?}");
        let op = OpId::parse("op-1").unwrap();
        let read = |stream, from, len| {
            host.call(
                &Verb::Output {
                    op: &op,
                    stream,
                    from,
                    len,
                },
                b"",
            )
        };
        let field = |o: &Outcome, k: &str| output_end(o).fields.get(k).cloned().unwrap();

        let middle = read(OutputStream::Stdout, OutputFrom::Start(2), 3);
        assert_eq!(middle.stdout, b"cde", "{name}");
        assert_eq!(
            (
                field(&middle, "from"),
                field(&middle, "len"),
                field(&middle, "kept")
            ),
            ("2".into(), "3".into(), "10".into()),
            "{name}"
        );
        assert_eq!(output_end(&middle).state, MarkerState::Completed, "{name}");
        let tail = read(OutputStream::Stdout, OutputFrom::End(4), 100);
        assert_eq!(tail.stdout, b"ghij", "{name}");
        assert_eq!(field(&tail, "from"), "6", "{name}");
        // Past the end: nothing, and where the copy ends.
        let past = read(OutputStream::Stdout, OutputFrom::Start(50), 10);
        assert!(past.stdout.is_empty(), "{name}: {past:?}");
        assert_eq!(
            (field(&past, "from"), field(&past, "len")),
            ("10".into(), "0".into())
        );
        let err = read(OutputStream::Stderr, OutputFrom::Start(0), 100);
        // Sent as the stream it is (an `E` payload), nothing of stdout with it.
        assert_eq!(
            (err.stdout.as_slice(), err.stderr.as_slice()),
            (&b""[..], &b"err\n"[..]),
            "{name}"
        );

        // An op id with no marker has no output, and gets none made.
        let never = OpId::parse("never").unwrap();
        let absent = host.call(
            &Verb::Output {
                op: &never,
                stream: OutputStream::Stdout,
                from: OutputFrom::Start(0),
                len: 10,
            },
            b"",
        );
        assert_eq!(absent.refusal().unwrap().reason, "absent", "{name}");
        assert!(!host.marker("never").exists(), "{name}");
        let bad = host.call_args(
            vec![
                "output".into(),
                "op-1".into(),
                "bogus".into(),
                "0".into(),
                "1".into(),
            ],
            b"",
        );
        assert_eq!(bad.refusal().unwrap().reason, "bad_args", "{name}: {bad:?}");
        // Reading changed nothing: the replay is the same.
        let again = host.run("op-1", "a2", "printf abcdefghij; echo err >&2");
        assert_eq!(again.stdout, b"abcdefghij", "{name}");
    }
}

#[test]
fn the_repeats_verb_reads_the_index_as_a_claim_would_and_writes_nothing() {
    use opmark::policy::OnRepeat;
    for (name, shell) in shells() {
        let host = Host::new("repeats-verb", &shell);
        let cmd = "echo wiped";
        let ran = host.run_with("op-1", "a1", cmd, |r| {
            r.repeat = repeat_check(3600, OnRepeat::Block, &[]);
        });
        assert_eq!(ran.exit().unwrap().code, 0, "{name}: {ran:?}");
        let ask = |op: &str, window: u64, declared: &[String]| {
            let op = OpId::parse(op).unwrap();
            let fingerprint = fp(cmd);
            let o = host.call(
                &Verb::Repeats {
                    op: &op,
                    fingerprint: &fingerprint,
                    window: Duration::from_secs(window),
                    declared,
                },
                b"",
            );
            o.frames
                .iter()
                .find_map(|f| match f {
                    Frame::IndexRepeat(found) => Some(found.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{name}: no repeats answer: {o:?}"))
        };
        // The slot files only (10-digit names): the temp name the claim linked its slot
        // from goes with the supervisor's own leftovers, which may be after the exit frame.
        let slots = || {
            std::fs::read_dir(host.root().join("fp").join(fp(cmd)))
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
                })
                .count()
        };
        let before = slots();
        assert_eq!(before, 1, "{name}: one claim, one slot");
        let found = ask("op-2", 3600, &[]).expect("op-1 is a repetition for op-2");
        assert_eq!(
            found.get("earlier").map(String::as_str),
            Some("op-1"),
            "{name}"
        );
        assert_eq!(
            found.get("earlier_state").map(String::as_str),
            Some("completed")
        );
        // Its own claim is no repetition; a declared one is none either; nor outside a
        // window of zero.
        assert_eq!(ask("op-1", 3600, &[]), None, "{name}");
        assert_eq!(ask("op-2", 3600, &["op-1".to_owned()]), None, "{name}");
        assert_eq!(ask("op-2", 0, &[]), None, "{name}");
        assert_eq!(slots(), before, "{name}: the read took a slot");
        assert!(!host.marker("op-2").exists(), "{name}");
    }
}

#[test]
fn fence_refuses_a_running_claim_and_gc_keeps_markers_younger_than_its_age() {
    for (name, shell) in shells() {
        let host = Host::new("fence-running", &shell);
        let ready = host.state_home.join("ready");
        let cmd = format!("touch {}; sleep 2; echo done", ready.display());
        let child = start_in_background(&host, "busy", &cmd, &ready);
        let busy = OpId::parse("busy").unwrap();
        for force in [false, true] {
            let fence = host.call(&Verb::Fence { op: &busy, force }, b"");
            assert_eq!(
                fence.refusal().map(|r| r.reason.to_string()),
                Some("running".to_owned()),
                "{name} (force {force}): {fence:?}"
            );
        }
        assert!(!host.marker("busy").join("fenced").exists(), "{name}");
        let done = host.wait_for_state("busy", MarkerState::Completed);
        assert_eq!(
            done.exit_code,
            Some(0),
            "{name}: the command ran to its end"
        );
        let _ = child.wait_with_output();

        // A day's age keeps a marker a few seconds old, output and all.
        let gc = host.call(
            &Verb::Gc {
                older_than: Duration::from_secs(86_400),
                dry_run: false,
                tombstones_older_than: None,
            },
            b"",
        );
        assert!(
            !gc.frames.iter().any(|f| matches!(f, Frame::GcRemoved(_))),
            "{name}: {:?}",
            gc.frames
        );
        assert!(host.marker("busy").join("out").exists(), "{name}");
    }
}

#[test]
fn gc_reclaims_old_cached_shims_of_other_versions_never_the_callers_own() {
    for (name, shell) in shells() {
        let host = Host::new("gc-own-shim", &shell);
        let ran = host.run("setup", "a1", "true");
        assert_eq!(ran.exit().unwrap().code, 0, "{name}: {ran:?}");
        // Two cached copies two hours old: the caller's own (it names it by its hash, as a
        // call whose text came in the channel does) and another version's.
        let cache = host.root().join("shim");
        std::fs::create_dir_all(&cache).unwrap();
        let own = format!("{}.sh", "a".repeat(64));
        let other = format!("{}.sh", "b".repeat(64));
        for f in [&own, &other] {
            std::fs::write(cache.join(f), "# a cached shim\n").unwrap();
            let status = Command::new("touch")
                .args(["-d", "2 hours ago"])
                .arg(cache.join(f))
                .status()
                .unwrap();
            assert!(status.success());
        }
        let gc = Verb::Gc {
            older_than: Duration::from_secs(60),
            dry_run: false,
            tombstones_older_than: None,
        };
        let mut args = vec![format!("h={}", "a".repeat(64))];
        args.extend(gc.args());
        let out = host.call_args(args, &shim::local_data(&gc, b""));
        assert!(out.refusal().is_none(), "{name}: gc answered: {out:?}");
        assert!(
            !cache.join(&other).exists(),
            "{name}: another version's old copy is reclaimed: {out:?}"
        );
        assert!(
            cache.join(&own).exists(),
            "{name}: the caller's own copy is never reclaimed: {out:?}"
        );
    }
}

#[test]
fn gc_keeps_the_newest_slot_of_each_intent_in_the_index() {
    for (name, shell) in shells() {
        let host = Host::new("gc-index", &shell);
        let cmd = "echo same intent";
        for (op, attempt) in [("op-1", "a1"), ("op-2", "a2")] {
            let ran = host.run(op, attempt, cmd);
            assert_eq!(ran.exit().unwrap().code, 0, "{name}: {ran:?}");
        }
        let index = host.root().join("fp").join(fp(cmd));
        let slots = || {
            let mut names: Vec<String> = std::fs::read_dir(&index)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(|c: char| c.is_ascii_digit()))
                .collect();
            names.sort();
            names
        };
        assert_eq!(slots().len(), 2, "{name}: one slot per claim");
        host.call(
            &Verb::Gc {
                older_than: Duration::ZERO,
                dry_run: false,
                tombstones_older_than: None,
            },
            b"",
        );
        // The older slot goes; the newest stays, naming the last claim, so a later claim
        // numbers after it instead of starting the index again.
        let left = slots();
        assert_eq!(left.len(), 1, "{name}: {left:?}");
        let newest = std::fs::read_to_string(index.join(&left[0])).unwrap();
        assert!(newest.contains("op=op-2"), "{name}: {newest}");
    }
}

#[test]
fn a_fence_of_an_interrupted_claim_whose_command_started_says_so_and_needs_force() {
    for (name, shell) in shells() {
        let host = Host::new("fence-started", &shell);
        let ran = host.run("crashed", "a1", "echo ran");
        assert_eq!(ran.exit().unwrap().code, 0, "{name}: {ran:?}");
        // The command started (its start gate is taken) and its supervisor is gone
        // without an exit record: interrupted, and it may have had its effect.
        forge_crash(&host, "crashed");
        assert_eq!(
            host.probe("crashed").state,
            MarkerState::Interrupted,
            "{name}"
        );
        let op = OpId::parse("crashed").unwrap();
        let unforced = host.call(
            &Verb::Fence {
                op: &op,
                force: false,
            },
            b"",
        );
        assert_eq!(
            unforced.refusal().map(|r| r.reason.to_string()),
            Some("interrupted".to_owned()),
            "{name}: only an operator's forced fence may close a started command: {unforced:?}"
        );
        let forced = host.call(
            &Verb::Fence {
                op: &op,
                force: true,
            },
            b"",
        );
        let marker = forced.marker();
        assert_eq!(marker.state, MarkerState::Fenced, "{name}");
        assert!(
            marker.started_before_fence(),
            "{name}: the record must say the command had started: {marker:?}"
        );
        // The fence is the op id's last word: a run under it hears `fenced` whatever its
        // command, not `conflict` (which would send its caller to fix the command).
        let other = host.run("crashed", "a2", "echo another command");
        assert_eq!(
            other.refusal().map(|r| r.reason.to_string()),
            Some("fenced".to_owned()),
            "{name}: {other:?}"
        );
    }
}

#[test]
fn a_claim_that_finds_the_marker_gone_after_its_mkdir_failed_claims_again_and_runs_once() {
    use std::os::unix::fs::PermissionsExt;
    // busybox ash runs its own mkdir applet, never one found on PATH.
    for (name, shell) in shells().into_iter().filter(|(n, _)| *n != "busybox-ash") {
        let host = Host::new("claim-again", &shell);
        let setup = host.run("setup", "a0", "true");
        assert_eq!(setup.exit().unwrap().code, 0, "{name}: {setup:?}");
        // Another call's claim of the op id, which it is about to take back (its
        // supervisor could not start) or to swap for its own (a supersede's two renames).
        let marker = host.marker("retaken");
        std::fs::create_dir_all(&marker).unwrap();
        // The first mkdir of the marker fails, as the name is taken, and the other call's
        // claim goes before this one reads what took it.
        let bin = host.state_home.join("vanishing-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let once = host.state_home.join("vanished");
        let script = bin.join("mkdir");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n{real} \"$@\" && exit 0\ncase $* in\n*/ops/retaken) [ -e '{once}' ] || {{ : >'{once}'; rm -rf '{marker}'; }} ;;\nesac\nexit 1\n",
                real = which("mkdir").unwrap().display(),
                once = once.display(),
                marker = marker.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let effects = host.state_home.join("effects");
        let cmd = format!("echo ran >> {}", effects.display());
        let op = OpId::parse("retaken").unwrap();
        let fingerprint = fp(&cmd);
        let req = run_request(&op, &fingerprint, &cmd, opmark::secret::Secrets::none());
        let out = host
            .command(&Verb::Run(req))
            .env(
                "PATH",
                format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
            )
            .output()
            .unwrap();
        let o = parse(&out.stdout, &out.stderr);
        assert!(once.exists(), "{name}: the claim met the taken name");
        assert_eq!(
            o.exit().map(|e| e.code),
            Some(0),
            "{name}: claimed on the second try and ran, not refused as absent or as an unusable root: {o:?}"
        );
        assert_eq!(lines(&effects), 1, "{name}");
    }
}

/// A directory with a `mkdir` that makes the directory it is asked for and then, when
/// that is a marker's `.superseding` lock, says so (`waiting` in `dir`) and waits for
/// `go` there: the window between a superseder's lock and its second look at the marker,
/// held open for a test.
fn mkdir_that_pauses_after_the_supersede_lock(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let real = which("mkdir").expect("mkdir");
    let bin = dir.join("pausing-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("mkdir");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{real} \"$@\" || exit\ncase $* in\n*/.superseding) : >'{dir}/waiting'\n\twhile [ ! -e '{dir}/go' ]; do sleep 0.05; done ;;\nesac\n",
            real = real.display(),
            dir = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn a_supersede_that_loses_the_race_to_a_fence_refuses_and_runs_nothing() {
    // busybox ash runs its own mkdir applet, never one found on PATH, so the window cannot
    // be held open there; the guard is the same line under every shell.
    for (name, shell) in shells().into_iter().filter(|(n, _)| *n != "busybox-ash") {
        let host = Host::new("supersede-race", &shell);
        let effects = host.state_home.join("effects");
        let cmd = format!("echo ran >> {}", effects.display());
        let first = host.run("raced", "a1", &cmd);
        assert_eq!(first.exit().unwrap().code, 0, "{name}: {first:?}");
        // Interrupted: it started, and its supervisor is gone without an exit record.
        forge_crash(&host, "raced");
        let pause = host.state_home.join("pause");
        std::fs::create_dir_all(&pause).unwrap();
        let bin = mkdir_that_pauses_after_the_supersede_lock(&pause);

        let op = OpId::parse("raced").unwrap();
        let fingerprint = fp(&cmd);
        let mut req = run_request(&op, &fingerprint, &cmd, opmark::secret::Secrets::none());
        req.attempt_id = "a2";
        req.family = Family::Convergent;
        req.supersede_interrupted = true;
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let superseder = host
            .command(&Verb::Run(req))
            .env("PATH", path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        host.wait_for_file(&pause.join("waiting"));
        // In the window, an operator fences the interrupted claim.
        let fence = host.call(
            &Verb::Fence {
                op: &op,
                force: true,
            },
            b"",
        );
        assert_eq!(
            fence.marker().state,
            MarkerState::Fenced,
            "{name}: {fence:?}"
        );
        std::fs::write(pause.join("go"), "").unwrap();

        let out = superseder.wait_with_output().unwrap();
        let o = parse(&out.stdout, &out.stderr);
        assert_eq!(
            o.refusal().map(|r| r.reason.to_string()),
            Some("fenced".to_owned()),
            "{name}: the second look after the lock sees the fence: {o:?}"
        );
        assert_eq!(
            lines(&effects),
            1,
            "{name}: only the execution before the crash"
        );
        assert_eq!(host.probe("raced").state, MarkerState::Fenced, "{name}");
    }
}

#[test]
fn a_command_that_catches_the_cancels_term_and_exits_0_keeps_its_status_and_is_not_called_cancelled(
) {
    for (name, shell) in shells() {
        let host = Host::new("cancel-caught", &shell);
        let ready = host.state_home.join("ready");
        let cmd = format!(
            "trap 'exit 0' TERM; touch {}; while :; do sleep 0.1; done",
            ready.display()
        );
        let child = start_in_background(&host, "catches", &cmd, &ready);
        let (outcome, marker) = cancel_answer(&host, "catches", Duration::from_secs(5));
        let _ = child.wait_with_output();
        // The TERM went out and the command ended by its own `exit 0`: its status is
        // its own, and the record says the cancel was pending, not that it stopped it.
        assert_eq!(marker.exit_code, Some(0), "{name}: {outcome:?} {marker:?}");
        assert_eq!(host.record("catches", "exit", "cancelled"), "0", "{name}");
        assert_eq!(
            host.record("catches", "exit", "cancel_pending"),
            "1",
            "{name}"
        );
    }
}

/// A run request of attempt `a1` with the secrets given, and every other option off.
fn run_request<'a>(
    op: &'a OpId,
    fingerprint: &'a str,
    command: &'a str,
    secrets: &'a opmark::secret::Secrets,
) -> RunCall<'a> {
    RunCall {
        op,
        attempt_id: "a1",
        host_fingerprint: fingerprint,
        family: Family::AppendOnly,
        timeout: None,
        output_cap: shim::DEFAULT_OUTPUT_CAP,
        stdin: None,
        supersede_interrupted: false,
        repeat: opmark::shim::RepeatCheck::OFF,
        command,
        secrets,
        become_user: None,
        locks: &[],
        lock_wait: std::time::Duration::ZERO,
        kind: opmark::shim::RunKind::Command,
        put_from: 0,
    }
}

/// Secrets read from files (a test must not change its process's environment).
fn secrets_from_files(host: &Host, pairs: &[(&str, &str)]) -> opmark::secret::Secrets {
    let dir = host.state_home.join("secret-sources");
    std::fs::create_dir_all(&dir).unwrap();
    let specs: Vec<opmark::secret::Spec> = pairs
        .iter()
        .map(|(name, value)| {
            let file = dir.join(name);
            std::fs::write(&file, value).unwrap();
            format!("{name}=file:{}", file.display()).parse().unwrap()
        })
        .collect();
    opmark::secret::Secrets::read(&specs).unwrap()
}

#[test]
fn a_secret_reaches_the_command_as_its_variable_and_its_output_only_as_the_mark() {
    let value = "pa55 w0rd/+:ünï";
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, value);
    for (name, shell) in shells() {
        let host = Host::new("secret", &shell);
        let secrets = secrets_from_files(
            &host,
            &[
                ("DB_PASSWORD", value),
                ("KEY", "-----BEGIN-----\nAAAAsecretline\n-----END-----\n"),
            ],
        );
        // The command checks the value itself (it prints only the verdict), exports it to
        // its children, prints it in three forms and ends with a line without a newline.
        let cmd = format!(
            "[ \"$(printf %s \"$DB_PASSWORD\" | sha256sum)\" = '{digest}  -' ] && echo same; \
             sh -c 'echo child=${{DB_PASSWORD:+set}}'; echo \"raw=$DB_PASSWORD\"; \
             printf 'b64=%s\\n' \"$(printf %s \"$DB_PASSWORD\" | base64)\" >&2; \
             printf '%s\\n' \"$KEY\" | sed -n 2p; printf 'last'",
            digest = crate::support::sha(value.as_bytes()),
        );
        let o = host.run_with_secrets("sec", "a1", &cmd, &secrets);
        let x = o.exit().unwrap_or_else(|| panic!("{name}: {:?}", o.frames));
        assert_eq!(x.code, 0, "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8(o.stdout.clone()).unwrap();
        assert_eq!(
            out,
            "same\nchild=set\nraw=[REDACTED:DB_PASSWORD]\n[REDACTED:KEY]\nlast",
            "{name}: the value reached the command; only the mark came out, and the last line kept its missing newline"
        );
        let err = String::from_utf8(o.stderr.clone()).unwrap();
        // Base64 padding says nothing of the value and stays.
        assert_eq!(
            err.trim_end_matches('\n').trim_end_matches('='),
            "b64=[REDACTED:DB_PASSWORD]",
            "{name}"
        );
        // The kept copy is what a replay, `output` and `show` read.
        let replay = host.run_with_secrets("sec", "a2", &cmd, &secrets);
        assert_eq!(replay.stdout, o.stdout, "{name}: the replay");
        let mut files = Vec::new();
        crate::redaction::files_under(&host.root(), &mut files);
        for path in files {
            let bytes = std::fs::read(&path).unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            for leak in [value, &b64, "AAAAsecretline"] {
                assert!(
                    !text.contains(leak),
                    "{name}: {} holds a secret: {text}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn a_secret_is_in_no_process_argument_while_the_command_runs() {
    let value = "hunter2-in-ps-9c1f";
    for (name, shell) in shells() {
        let host = Host::new("secret-ps", &shell);
        let secrets = secrets_from_files(&host, &[("TOKEN", value)]);
        let ready = host.state_home.join("ready");
        let cmd = format!(
            "echo \"$TOKEN\" >/dev/null; touch {}; sleep 2",
            ready.display()
        );
        let op = OpId::parse("psop").unwrap();
        let fingerprint = fp(&cmd);
        let verb = Verb::Run(run_request(&op, &fingerprint, &cmd, &secrets));
        let mut child = host
            .command(&verb)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let data = shim::local_data(&verb, b"");
        child.stdin.take().unwrap().write_all(&data).unwrap();
        // Every process's arguments, from the claim until the command ends.
        let mut looks = 0;
        while child.try_wait().unwrap().is_none() {
            for entry in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
                if let Ok(args) = std::fs::read(entry.path().join("cmdline")) {
                    assert!(
                        !String::from_utf8_lossy(&args).contains(value),
                        "{name}: pid {:?} shows the secret in its arguments",
                        entry.file_name()
                    );
                }
            }
            looks += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(ready.exists(), "{name}: the command ran");
        assert!(looks > 20, "{name}: looked {looks} times while it ran");
        let out = child.wait_with_output().unwrap();
        let o = parse(&out.stdout, &out.stderr);
        assert_eq!(o.exit().map(|x| x.code), Some(0), "{name}: {:?}", o.frames);
    }
}

#[test]
fn a_malformed_secrets_block_is_refused_before_the_claim() {
    for (name, shell) in shells() {
        let host = Host::new("secret-bad", &shell);
        let op = OpId::parse("badsec").unwrap();
        let fingerprint = fp("true");
        let verb = Verb::Run(run_request(
            &op,
            &fingerprint,
            "true",
            opmark::secret::Secrets::none(),
        ));
        // The run verb's arguments with SECRETS (`from_end` 6), BECOME (5), LOCKS (4) or LOCK_WAIT_S (3)
        // replaced: the
        // refusal's reason, having claimed nothing.
        let refused = |from_end: usize, value: &str, data: &[u8]| {
            let mut args = verb.args();
            let at = args.len() - from_end;
            args[at] = value.to_owned();
            let o = host.call_args(args, data);
            let r = o
                .refusal()
                .unwrap_or_else(|| panic!("{name} {value}: {:?}", o.frames));
            assert!(!host.marker("badsec").exists(), "{name} {value}: claimed");
            r.fields.get("reason").cloned().unwrap_or_default()
        };
        // Lower case could set the shim's own variables where the command starts (`m`,
        // the marker; `sv_shell`, what runs it); PATH and the like the command's shell.
        for list in [
            "e:1BAD:1",
            "e:A-B:1",
            "x:A:1",
            "e:A:0",
            "e:A:1,e:A:1",
            "e:m:1",
            "e:sv_shell:1",
            "e:PATH:1",
            "e:LD_PRELOAD:1",
        ] {
            assert_eq!(refused(6, list, b"v\nv\ntrue"), "secrets", "{name} {list}");
        }
        // sudo's password without --become.
        assert_eq!(
            refused(6, "p:SUDO_PASSWORD:1", b"pw\ntrue"),
            "secrets",
            "{name}"
        );
        // A --become user that is not a name.
        for user in ["-u", "a b", "x;y"] {
            assert_eq!(refused(5, user, b"true"), "become", "{name} {user}");
        }
        // Locks that are not NAME:N,... in name order, each once, N from 1 to 999; a
        // wait that is not a number of seconds.
        for locks in [
            "",
            "a/b:1",
            "apt",
            "apt:0",
            "apt:1000",
            "apt:01",
            "zz:1,apt:1",
            "apt:1,apt:2",
            ",apt:1",
            "-apt:1",
        ] {
            assert_eq!(refused(4, locks, b"true"), "locks", "{name} {locks:?}");
        }
        for wait in ["", "-1", "1.5", "x"] {
            assert_eq!(refused(3, wait, b"true"), "lock_wait", "{name} {wait:?}");
        }
        // A block shorter than its list says: the command never arrives.
        refused(6, "e:A:3", b"v\n");
    }
}

/// Puts an executable `name` with `body` (a sh script) in the host's stand-in directory,
/// which goes ahead of PATH for the host's calls from then on.
fn tool_on_path(host: &mut Host, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let bin = host.state_home.join("stand-ins");
    std::fs::create_dir_all(&bin).unwrap();
    let tool = bin.join(name);
    std::fs::write(&tool, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    host.path_first = Some(bin);
}

/// The argument lists a logging `sync` (see the test below) was called with, a line each.
fn sync_calls(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_claim_the_exit_record_and_a_fence_are_handed_to_sync_by_name() {
    // An fsync leaves no trace a test can read without a power loss, so this test watches
    // the shim ask for it: a `sync` ahead of PATH logs its arguments and runs the real
    // one. busybox ash runs its own sync applet, never one found on PATH; the lines are
    // the same under every shell.
    let real = which("sync").expect("sync");
    for (name, shell) in shells().into_iter().filter(|(n, _)| *n != "busybox-ash") {
        let mut host = Host::new("synced", &shell);
        let log = host.state_home.join("sync.log");
        tool_on_path(
            &mut host,
            "sync",
            &format!(
                "printf '%s\\n' \"$*\" >>'{log}'\nexec {real} \"$@\"\n",
                log = log.display(),
                real = real.display()
            ),
        );

        let run = host.run("synced-run", "a1", "exit 3");
        assert_eq!(run.exit().map(|x| x.code), Some(3), "{name}: {run:?}");
        // The supervisor syncs the exit record after the foreground may have answered.
        wait_supervisor_gone(&host, "synced-run");
        let m = host.marker("synced-run");
        let calls = sync_calls(&log);
        let claim = calls.iter().position(|c| c == "claim . ..");
        let exit = calls
            .iter()
            .position(|c| *c == format!("{0}/exit {0}", m.display()));
        assert!(
            claim.is_some(),
            "{name}: the claim and its directories are synced before the command may start: {calls:?}"
        );
        assert!(
            exit > claim,
            "{name}: the exit record and its directory are synced, after the claim: {calls:?}"
        );

        // A fence of an op id never run: its new marker's entry in ops/ and its record.
        std::fs::remove_file(&log).unwrap();
        let op = OpId::parse("synced-fence").unwrap();
        let fence = host.call(
            &Verb::Fence {
                op: &op,
                force: false,
            },
            b"",
        );
        assert_eq!(
            fence.marker().state,
            MarkerState::Fenced,
            "{name}: {fence:?}"
        );
        let f = host.marker("synced-fence");
        let calls = sync_calls(&log);
        let ops = calls
            .iter()
            .position(|c| *c == host.root().join("ops").display().to_string());
        let record = calls
            .iter()
            .position(|c| *c == format!("{0}/fenced {0}", f.display()));
        assert!(
            ops.is_some(),
            "{name}: the fence's marker is synced into ops/: {calls:?}"
        );
        assert!(
            record.is_some(),
            "{name}: the fence record and its directory are synced: {calls:?}"
        );
    }
}

#[test]
fn a_command_run_through_sudo_runs_once_and_answers_its_own_status() {
    // This machine's shim tests have no second user and no sudo rule, so a stand-in sudo
    // on PATH runs what it is given as the caller: what is tested here is the shim's side
    // (the command's subshell ends with sudo's status and never goes on to run the command
    // again as the login user). The real sudo, its password and its user:
    // tests/it/docker.rs::become_runs_through_sudo_with_a_password_that_appears_nowhere.
    for (name, shell) in shells() {
        let mut host = Host::new("become-once", &shell);
        let calls = host.state_home.join("sudo-calls");
        tool_on_path(
            &mut host,
            "sudo",
            &format!(
                "printf '%s\\n' \"$*\" >>'{calls}'\nwhile [ \"$#\" -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n",
                calls = calls.display()
            ),
        );
        let effects = host.state_home.join("effects");
        let cmd = format!("echo ran >> {}; exit 7", effects.display());
        let run = host.run_with("become-once", "a1", &cmd, |r| {
            r.become_user = Some("deploy")
        });
        assert_eq!(run.exit().map(|x| x.code), Some(7), "{name}: {run:?}");
        assert_eq!(lines(&effects), 1, "{name}: the command ran once");
        let sudo = std::fs::read_to_string(&calls).unwrap();
        assert!(
            sudo.lines().any(|l| l.contains("-u deploy -- /bin/sh -c")),
            "{name}: the command went through sudo as the become user: {sudo}"
        );
    }
}

#[test]
fn gc_at_any_age_leaves_a_running_and_an_interrupted_claim_whole_and_keeps_a_fresh_fence() {
    for (name, shell) in shells() {
        let host = Host::new("gc-live", &shell);
        // Interrupted: ran, and its supervisor is gone without an exit record.
        let first = host.run("crashed", "a1", "true");
        assert_eq!(first.exit().map(|x| x.code), Some(0), "{name}: {first:?}");
        forge_crash(&host, "crashed");
        // Running, for as long as the gc takes.
        let ready = host.state_home.join("ready");
        let go = host.state_home.join("go");
        let cmd = format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
            ready.display(),
            go.display()
        );
        let child = start_in_background(&host, "busy", &cmd, &ready);
        // Fenced a moment ago.
        let fresh = OpId::parse("fresh-fence").unwrap();
        host.call(
            &Verb::Fence {
                op: &fresh,
                force: false,
            },
            b"",
        );

        let gc = |older_than: u64| {
            host.call(
                &Verb::Gc {
                    older_than: Duration::from_secs(older_than),
                    dry_run: false,
                    tombstones_older_than: None,
                },
                b"",
            )
        };
        let removed = |o: &Outcome| -> Vec<String> {
            o.frames
                .iter()
                .filter_map(|f| match f {
                    Frame::GcRemoved(r) => Some(r.op.clone()),
                    _ => None,
                })
                .collect()
        };
        // A day's age keeps the fence; an age of nothing may take it, never the others.
        let day = gc(86_400);
        assert_eq!(
            removed(&day),
            Vec::<String>::new(),
            "{name}: {:?}",
            day.frames
        );
        let now = gc(0);
        assert!(
            !removed(&now)
                .iter()
                .any(|op| op == "busy" || op == "crashed"),
            "{name}: gc took a live or interrupted claim: {:?}",
            now.frames
        );
        assert_eq!(host.probe("busy").state, MarkerState::Running, "{name}");
        assert_eq!(
            host.probe("crashed").state,
            MarkerState::Interrupted,
            "{name}"
        );
        for op in ["busy", "crashed"] {
            assert!(host.marker(op).join("claim").exists(), "{name}: {op}");
            assert!(!host.marker(op).join("collected").exists(), "{name}: {op}");
        }
        std::fs::write(&go, "").unwrap();
        let _ = child.wait_with_output();
    }
}
