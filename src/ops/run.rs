//! Run: one operation end to end (the lifecycle itself is in `operation/`), or one
//! operation per host over several hosts (`operation/fleet.rs` schedules them). Input
//! that cannot run is refused before anything is recorded or sent.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sha2::Digest as _;

use super::document::{error_document, json_document};
use super::{
    block_on, host_spec, load_policy, open_ledger, operator, redacted_error, redactor_for_errors,
    session_id, Context, HostOptions,
};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::host::Pool;
use crate::ledger::{OpKey, OperationRecord};
use crate::op_id::OpId;
use crate::operation::fleet::{self, FleetShared, HostResult, Progress, Schedule, Summary};
use crate::operation::interrupt::{ClientSignal, Interrupts};
use crate::operation::repeat::Declared;
use crate::operation::{self, RunEnv, RunInput, RunReport};
use crate::vocab::{ReasonCode, Verdict};

/// Where the bytes forwarded to the command's stdin come from.
#[derive(Debug, Clone, Default)]
pub enum Stdin {
    /// Nothing is forwarded.
    #[default]
    None,
    /// This process's stdin, read to its end before anything is sent.
    Read,
    /// These bytes (`opmark mcp`, whose stdin is the protocol stream).
    Given(Vec<u8>),
    /// These bytes and their SHA-256, which the caller took already (a put's file): a
    /// second pass over 100 MB costs as much as sending them on loopback.
    Digested { bytes: Vec<u8>, sha256: [u8; 32] },
}

impl Stdin {
    /// The digest the caller gave with the bytes, if it did.
    fn known_digest(&self) -> Option<[u8; 32]> {
        match self {
            Stdin::Digested { sha256, .. } => Some(*sha256),
            _ => None,
        }
    }
}

/// How one operation spreads over several hosts (docs/decisions.md#fleets).
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// More hosts, one a line.
    pub hosts_file: Option<PathBuf>,
    /// At most this many hosts at once.
    pub forks: usize,
    /// Stop dispatching once this many hosts failed.
    pub max_failures: Option<usize>,
    /// Batches of this many hosts, each after the previous one ended clean.
    pub serial: Option<usize>,
    /// Live output lines prefixed with their host.
    pub prefix: bool,
    /// Leave the command running on the host and answer `in_progress`.
    pub detach: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            hosts_file: None,
            forks: 32,
            max_failures: None,
            serial: None,
            prefix: true,
            detach: false,
        }
    }
}

/// What to run, where.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The hosts, as the user names them (at least one, with `fleet.hosts_file`).
    pub hosts: Vec<String>,
    /// The op id, unchecked; None mints one.
    pub op: Option<String>,
    /// Treat the command as at least this family.
    pub class: Option<Family>,
    /// The bytes to forward.
    pub stdin: Stdin,
    /// Kill the command on the host after this long.
    pub timeout: Option<Duration>,
    /// At most this many attempts.
    pub attempts: Option<u32>,
    /// How long to wait for a running operation before answering `in_progress`; it
    /// bounds the connects of the whole invocation too (docs/decisions.md#wait-budget).
    pub wait: Duration,
    /// What `wait` bounds besides connects and probes: a running command too (MCP, and
    /// an explicit `--wait`), or not (docs/decisions.md#wait-budget).
    pub wait_scope: crate::operation::WaitScope,
    /// Output kept on the host per stream.
    pub output_cap: u64,
    /// The approval note of a blocked command (`--approve`).
    pub approve: Option<String>,
    /// A signed approval's token text (`--approval FILE`, MCP `approval`), unchecked.
    pub approval: Option<String>,
    /// `--repeats OP`: a deliberate repetition of an earlier operation, unchecked.
    pub repeats: Option<String>,
    /// `--amends OP`: the earlier operation this one replaces, unchecked.
    pub amends: Option<String>,
    /// Connection options.
    pub options: HostOptions,
    /// Several hosts.
    pub fleet: FleetOptions,
    /// `--secret NAME=SOURCE`: the command's secret environment variables, not yet read.
    pub secrets: Vec<crate::secret::Spec>,
    /// `--become USER`: run the command as USER through sudo on the host, unchecked.
    pub become_user: Option<String>,
    /// `--lock NAME[:N]`: host locks the command holds while it runs (each parsed; the
    /// set is checked here: a lock named twice is refused).
    pub locks: Vec<crate::host_lock::HostLock>,
    /// `--lock-wait`: how long the host waits for them (zero: one try).
    pub lock_wait: Duration,
    /// The command's words, joined with spaces as ssh does.
    pub command: Vec<String>,
    /// A command, or a file delivered (`opmark put` builds the command text itself).
    pub kind: crate::shim::RunKind,
    /// Stream the command's output to this process's stdout/stderr while it runs.
    pub live_output: bool,
    /// Counts the output delivered (every host's), for progress reports meanwhile.
    pub tally: Option<std::sync::Arc<crate::operation::output::OutputBytes>>,
    /// One host's stdout goes to this local file, resumed after what it holds (a get's
    /// content: [`crate::operation::RunInput::stdout_to`]).
    pub stdout_to: Option<std::path::PathBuf>,
}

/// Told while a run goes on (the answer itself is the [`RunAnswer`]).
pub trait RunWatch {
    /// The op id was minted: said before dispatch, so a caller that loses us can retry
    /// with the same id.
    fn minted(&mut self, _op: &OpId) {}
    /// A fleet's counts changed.
    fn progress(&mut self, _progress: Progress) {}
    /// Something a person watching should know, that is no answer (a host named twice,
    /// stdin still being read).
    fn note(&mut self, _text: &str) {}
}

/// A watcher that hears nothing.
#[derive(Debug)]
pub struct Unwatched;

impl RunWatch for Unwatched {}

/// The answer given before anything was recorded or sent.
#[derive(Debug, Clone, Serialize)]
pub struct Early {
    pub op_id: Option<String>,
    pub verdict: Verdict,
    pub exit_code: Option<i32>,
    pub reason: String,
    pub reason_code: ReasonCode,
    pub retryable: bool,
    /// The process exit status.
    #[serde(skip)]
    pub status: u8,
}

/// An operation whose host evidence contradicts the ledger since the run began.
#[derive(Debug, Clone)]
pub struct NewContradiction {
    pub op_id: String,
    pub host: String,
    /// The exit code the ledger keeps.
    pub exit_code: Option<i32>,
}

/// The answer of a run.
#[derive(Debug)]
pub enum RunAnswer {
    /// Refused or interrupted before anything was recorded or sent.
    Early(Early),
    /// One host's verdict.
    One {
        report: Box<RunReport>,
        /// The signal that interrupted it, answered `client_interrupted`.
        interrupted: Option<ClientSignal>,
        contradictions: Vec<NewContradiction>,
    },
    /// Several hosts' verdicts, in the order given.
    Fleet {
        results: Vec<HostResult>,
        summary: Summary,
        interrupted: Option<ClientSignal>,
        contradictions: Vec<NewContradiction>,
    },
}

impl RunAnswer {
    /// The answer as the contract's JSON document (docs/guarantees.md#the-command-line-contract and docs/decisions.md#fleets): the run
    /// document of one host (with its whole output), or every host's and the summary.
    pub fn document(&self) -> Result<serde_json::Value> {
        match self {
            RunAnswer::Early(early) => json_document(early),
            RunAnswer::One { report, .. } => json_document(report.as_ref()),
            RunAnswer::Fleet {
                results, summary, ..
            } => json_document(&FleetDocument::of(results, summary)?),
        }
    }

    /// The process exit status: the command's own, or the verdict's reserved code.
    pub fn exit_status(&self) -> u8 {
        match self {
            RunAnswer::Early(early) => early.status,
            RunAnswer::One {
                interrupted: Some(signal),
                ..
            }
            | RunAnswer::Fleet {
                interrupted: Some(signal),
                ..
            } => signal.exit_code(),
            RunAnswer::One { report, .. } => report.exit_status(),
            RunAnswer::Fleet { summary, .. } => summary.exit_status,
        }
    }
}

/// The `--json` answer of a fleet run (docs/decisions.md#fleets).
#[derive(Serialize)]
struct FleetDocument<'a> {
    /// One run document per host (an error document, with `host`, for a host opmark
    /// itself failed on), in the order the hosts were given.
    hosts: Vec<serde_json::Value>,
    summary: &'a Summary,
}

impl FleetDocument<'_> {
    fn of<'a>(results: &[HostResult], summary: &'a Summary) -> Result<FleetDocument<'a>> {
        let hosts = results
            .iter()
            .map(|r| match &r.outcome {
                Ok(report) => json_document(report),
                Err(e) => {
                    let mut doc = error_document(e);
                    doc["host"] = r.host.clone().into();
                    Ok(doc)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(FleetDocument { hosts, summary })
    }
}

/// Runs the command on each host as one operation.
pub fn run(ctx: &Context, req: RunRequest, watch: &mut dyn RunWatch) -> Result<RunAnswer> {
    let (op, minted) = match &req.op {
        Some(text) => match OpId::parse(text) {
            Ok(op) => (op, false),
            Err(e) => {
                return Ok(refuse_before_anything(
                    ctx,
                    req.op.as_deref(),
                    &e.to_string(),
                ))
            }
        },
        None => (OpId::mint(), true),
    };
    let declared = match declared(&req, &op) {
        Ok(declared) => declared,
        Err(why) => return Ok(refuse_before_anything(ctx, Some(op.as_str()), &why)),
    };
    let approval = match parse_approval(&req) {
        Ok(approval) => approval,
        Err(why) => return Ok(refuse_before_anything(ctx, Some(op.as_str()), &why)),
    };
    let secrets = match checked_secrets(&req) {
        Ok(secrets) => secrets,
        Err(why) => return Ok(refuse_before_anything(ctx, Some(op.as_str()), &why)),
    };
    let locks = match crate::host_lock::HostLock::set(&req.locks) {
        Ok(locks) => locks,
        Err(why) => {
            return Ok(refuse_before_anything(
                ctx,
                Some(op.as_str()),
                &format!("{why}; nothing was sent"),
            ))
        }
    };
    let named = match all_hosts(&req) {
        Ok(named) => named,
        Err(why) => return Ok(refuse_before_anything(ctx, Some(op.as_str()), &why)),
    };
    for (option, value) in [
        ("--forks", Some(req.fleet.forks)),
        ("--serial", req.fleet.serial),
        ("--max-failures", req.fleet.max_failures),
    ] {
        if value == Some(0) {
            return Ok(refuse_before_anything(
                ctx,
                Some(op.as_str()),
                &format!("{option} must be at least 1; nothing was sent"),
            ));
        }
    }
    if req.attempts == Some(0) {
        return Ok(refuse_before_anything(
            ctx,
            Some(op.as_str()),
            "--attempts must be at least 1; nothing was sent",
        ));
    }
    let command = req.command.join(" ");
    if command.trim().is_empty() {
        return Ok(refuse_before_anything(
            ctx,
            Some(op.as_str()),
            "the command is empty; nothing was sent",
        ));
    }
    if let Err(e) = crate::host::check_command(&command) {
        return Ok(refuse_before_anything(
            ctx,
            Some(op.as_str()),
            &format!("{e}; nothing was sent"),
        ));
    }
    // The words a put's and a get's intents start with are theirs alone: a command of
    // that name would share their records (and the policy's rules) without being one.
    if req.kind == crate::shim::RunKind::Command {
        let first = command.split_whitespace().next();
        for (word, instead) in [
            (crate::shim::PUT_WORD, "opmark put LOCAL HOST:PATH"),
            (crate::shim::GET_WORD, "opmark get HOST:PATH LOCAL"),
        ] {
            if first == Some(word) {
                return Ok(refuse_before_anything(
                    ctx,
                    Some(op.as_str()),
                    &format!("`{word}` names a file transfer; use `{instead}`. Nothing was sent"),
                ));
            }
        }
    }
    let checked = Checked {
        op,
        minted,
        command,
        secrets,
        declared,
        approval,
        locks,
    };
    let answer = match named {
        Named::One(host) => block_on(run_operation(ctx, req, host, checked, watch)),
        Named::Fleet(hosts, twice) => {
            for host in twice {
                watch.note(&format!(
                    "host `{}` is named more than once; it is one operation with one entry",
                    crate::text::printable(&host)
                ));
            }
            block_on(run_on_hosts(ctx, req, hosts, checked, watch))
        }
    };
    // A stdin reader still blocked on a terminal after an interrupt does not hold the
    // exit: the process's runtime is never dropped, so nothing waits for it.
    answer?
}

/// `--approval`'s token, parsed (not yet verified); unreadable, why, with the fix.
pub(super) fn parse_approval(
    req: &RunRequest,
) -> std::result::Result<Option<crate::approval::Token>, String> {
    req.approval
        .as_deref()
        .map(crate::approval::Token::parse)
        .transpose()
        .map_err(|e| {
            format!("{e}; pass the file `opmark approve` wrote, unchanged. Nothing was sent")
        })
}

/// The request's secrets, read once, here (a value is never read again, and one that
/// cannot be read sends nothing), with `--become` checked against them; or why not,
/// naming the secret and its source, never a value, and the fix.
pub(super) fn checked_secrets(
    req: &RunRequest,
) -> std::result::Result<crate::secret::Secrets, String> {
    let secrets =
        crate::secret::Secrets::read(&req.secrets).map_err(|e| format!("{e}; nothing was sent"))?;
    match become_problem(req.become_user.as_deref(), &secrets) {
        Some(why) => Err(format!("{why}; nothing was sent")),
        None => Ok(secrets),
    }
}

/// What is wrong with `--become` and sudo's password together, if anything.
pub(crate) fn become_problem(
    user: Option<&str>,
    secrets: &crate::secret::Secrets,
) -> Option<String> {
    match user {
        Some(user) => crate::secret::check_become_user(user).err(),
        None if secrets.has_sudo_password() => Some(format!(
            "--secret {} is sudo's password for --become, and this run has no --become; add --become[=USER], or give the secret another name",
            crate::secret::SUDO_PASSWORD
        )),
        None => None,
    }
}

/// What `run` checked and read before anything is recorded or sent.
struct Checked {
    op: OpId,
    /// The op id was minted here (the caller is told it before dispatch).
    minted: bool,
    /// The command string, checked as sendable.
    command: String,
    /// The secrets, read once.
    secrets: crate::secret::Secrets,
    /// `--repeats` / `--amends`, checked as op ids other than this run's.
    declared: Declared,
    /// The signed approval, parsed.
    approval: Option<crate::approval::Token>,
    /// `--lock`: in the order the host takes them, each named once.
    locks: Vec<crate::host_lock::HostLock>,
}

/// What every operation of `req` shares (a run's one, a fleet's each host's, each file's
/// of a transfer), for the operation `op` whose command is `command` on `host`: no stdin,
/// secrets, locks, approval token, prefix or declared repetition yet (the callers set
/// those that are theirs).
pub(super) fn shared_input(
    req: &RunRequest,
    host: crate::host::HostSpec,
    op: OpId,
    command: String,
) -> RunInput {
    RunInput {
        host,
        op,
        command,
        class: req.class,
        stdin: None,
        stdin_sha256: None,
        stdin_from: None,
        secrets: crate::secret::Secrets::default(),
        become_user: req.become_user.clone(),
        locks: Vec::new(),
        lock_wait: req.lock_wait,
        kind: req.kind,
        timeout: req.timeout,
        attempts: req.attempts,
        wait: req.wait,
        approve: req.approve.clone(),
        approver: operator(None),
        approval: None,
        live_output: req.live_output,
        output_cap: req.output_cap,
        prefix: None,
        detach: req.fleet.detach,
        declared: Declared::default(),
        wait_scope: req.wait_scope,
        tally: req.tally.clone(),
        stdout_to: req.stdout_to.clone(),
    }
}

/// One host's operation: what was checked, the request's options, the spooled stdin.
fn run_input(
    ctx: &Context,
    req: &RunRequest,
    host: &str,
    checked: &Checked,
    stdin: Option<Vec<u8>>,
    digest: Option<[u8; 32]>,
    prefix: Option<String>,
) -> RunInput {
    RunInput {
        stdin_sha256: stdin
            .as_ref()
            .map(|s| digest.unwrap_or_else(|| sha2::Sha256::digest(s).into())),
        stdin,
        secrets: checked.secrets.clone(),
        locks: checked.locks.clone(),
        approval: checked.approval.clone(),
        prefix,
        declared: checked.declared.clone(),
        ..shared_input(
            req,
            host_spec(ctx, host, &req.options),
            checked.op.clone(),
            checked.command.clone(),
        )
    }
}

/// `--repeats` / `--amends`, checked as op ids (docs/guarantees.md#repetitions): a bad one
/// is named with the fix before anything is sent.
fn declared(req: &RunRequest, op: &OpId) -> std::result::Result<Declared, String> {
    let check = |flag: &str,
                 value: &Option<String>|
     -> std::result::Result<Option<String>, String> {
        let Some(text) = value else { return Ok(None) };
        let other = OpId::parse(text).map_err(|e| {
            format!("{flag} {text}: {e}; name the earlier operation by its op id (`opmark list`); nothing was sent")
        })?;
        if other == *op {
            return Err(format!(
                "{flag} {text} names this run's own op id; name the EARLIER operation (`opmark list`); nothing was sent"
            ));
        }
        Ok(Some(other.to_string()))
    };
    Ok(Declared {
        repeats: check("--repeats", &req.repeats)?,
        amends: check("--amends", &req.amends)?,
    })
}

/// The hosts named in the request, then those of `--hosts-file`, each checked as a
/// destination; a bad one is named (with its file and line) before anything is sent.
/// The hosts of a run: one (the single-host document), or several (the fleet document,
/// whatever happens to each: a bad name is that host's entry, not the run's end).
enum Named {
    One(String),
    /// Each host once, in the order given, with why it cannot be run when it cannot;
    /// then the hosts that were named more than once.
    Fleet(Vec<(String, Option<String>)>, Vec<String>),
}

fn all_hosts(req: &RunRequest) -> std::result::Result<Named, String> {
    let mut hosts = req.hosts.clone();
    if let Some(file) = &req.fleet.hosts_file {
        hosts.extend(hosts_from_file(file)?);
    }
    match hosts.as_slice() {
        [] => Err(
            "no hosts: name at least one HOST or a --hosts-file with hosts in it; nothing was sent"
                .to_owned(),
        ),
        // A host that cannot be a destination is bad input: refused before the ledger,
        // which would otherwise have to refuse to record it.
        [one] => crate::host::check_destination(one).map(|()| Named::One(one.clone())),
        _ => {
            let mut seen = BTreeSet::new();
            let mut twice = Vec::new();
            let mut fleet = Vec::new();
            for host in hosts {
                // Twice the same host is the same operation: it gets one entry, and a
                // word, since a list naming a host twice is often a mistake upstream.
                if !seen.insert(host.clone()) {
                    if !twice.contains(&host) {
                        twice.push(host.clone());
                    }
                    continue;
                }
                let bad = crate::host::check_destination(&host)
                    .err()
                    .map(|why| format!("{why}; nothing was sent to this host"));
                fleet.push((host, bad));
            }
            Ok(Named::Fleet(fleet, twice))
        }
    }
}

/// `--hosts-file`: one host a line; `#` starts a comment; blank lines are skipped.
fn hosts_from_file(file: &Path) -> std::result::Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "cannot read the hosts file {}: {e}; nothing was sent",
            file.display()
        )
    })?;
    let mut hosts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let at = || format!("{}:{}", file.display(), number + 1);
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        if line.split_whitespace().nth(1).is_some() {
            return Err(format!(
                "{}: `{line}` is not one host: write one host a line; nothing was sent",
                at()
            ));
        }
        crate::host::check_destination(line).map_err(|why| format!("{}: {why}", at()))?;
        hosts.push(line.to_owned());
    }
    Ok(hosts)
}

/// When a stdin still open after this long is worth a word on stderr.
const STDIN_NOTE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the bytes to forward off the runtime's threads, so that Ctrl-C while stdin is a
/// terminal still works; `Err` carries the answer to an interruption.
async fn spool_stdin(
    stdin: Stdin,
    op: &OpId,
    interrupts: &Interrupts,
    watch: &mut dyn RunWatch,
) -> Result<std::result::Result<Option<Vec<u8>>, RunAnswer>> {
    match stdin {
        Stdin::Given(bytes) | Stdin::Digested { bytes, .. } => return Ok(Ok(Some(bytes))),
        Stdin::None => return Ok(Ok(None)),
        Stdin::Read => {}
    }
    let reader = tokio::task::spawn_blocking(|| {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map(|_| buf)
    });
    tokio::pin!(reader);
    // A pipe that was fed but never closes would keep opmark reading forever, as it
    // would keep ssh streaming: say once what is being waited for.
    let mut noted = false;
    let read = loop {
        tokio::select! {
            biased;
            signal = interrupts.wait() => return Ok(Err(interrupted_before_anything(op, signal))),
            read = &mut reader => break read,
            () = tokio::time::sleep(STDIN_NOTE_AFTER), if !noted => {
                noted = true;
                watch.note(&format!(
                    "still reading stdin to forward it ({} s, no end of file yet); nothing is sent before it closes. Close it, or give -n (or </dev/null) if the command needs no input",
                    STDIN_NOTE_AFTER.as_secs()
                ));
            }
        }
    };
    let buf = read
        .map_err(|e| Error::new(ErrorKind::Internal, format!("the stdin reader failed: {e}")))?
        .map_err(|e| {
            Error::new(
                ErrorKind::LocalIo,
                format!("cannot read stdin to forward it: {e}; nothing was sent"),
            )
        })?;
    Ok(Ok(Some(buf)))
}

/// What a run sets up before its first host, whether it has one host or many.
struct Setup {
    /// From here on a signal is answered, never the silent default death.
    interrupts: Interrupts,
    policy: crate::policy::Policy,
    /// Opened once before any host is tried, so that a ledger problem is one error.
    ledger: crate::ledger::Ledger,
    /// The ledger's own key (checked when it was opened), never the config dir's.
    key: crate::ledger::fingerprint::InstallationKey,
    /// What the ledger held under this op id before the run: to tell the caller about
    /// evidence this run finds contradicting it.
    known: Vec<OperationRecord>,
}

fn set_up(ctx: &Context, op: &OpId) -> Result<Setup> {
    let interrupts = install_interrupts()?;
    let policy = load_policy(ctx)?;
    let ledger = open_ledger(ctx, &policy)?;
    let key = ledger.key().clone();
    let known = ledger.operations_by_id(op.as_str())?;
    Ok(Setup {
        interrupts,
        policy,
        ledger,
        key,
        known,
    })
}

/// The stdin to forward, read once for every host (`Err`: the answer to an interruption
/// while reading); then a minted op id is told to the caller, before anything is sent.
async fn read_stdin(
    stdin: Stdin,
    checked: &Checked,
    interrupts: &Interrupts,
    watch: &mut dyn RunWatch,
) -> Result<std::result::Result<Option<Vec<u8>>, RunAnswer>> {
    let stdin = spool_stdin(stdin, &checked.op, interrupts, watch).await?;
    if stdin.is_ok() && checked.minted {
        watch.minted(&checked.op);
    }
    Ok(stdin)
}

/// Everything from the first signal handler on: from here a signal is answered, never
/// the silent default death.
async fn run_operation(
    ctx: &Context,
    mut req: RunRequest,
    host: String,
    checked: Checked,
    watch: &mut dyn RunWatch,
) -> Result<RunAnswer> {
    let op = &checked.op;
    let Setup {
        interrupts,
        policy,
        mut ledger,
        key,
        known,
    } = set_up(ctx, op)?;
    if let Some(answer) = typo_answer(ctx, &req, std::slice::from_ref(&host), op) {
        return Ok(answer);
    }
    // Taken, not copied: the request is not sent with it.
    let digest = req.stdin.known_digest();
    let stdin =
        match read_stdin(std::mem::take(&mut req.stdin), &checked, &interrupts, watch).await? {
            Ok(stdin) => stdin,
            Err(answer) => return Ok(answer),
        };
    let op_text = op.to_string();
    let input = run_input(ctx, &req, &host, &checked, stdin, digest, None);
    interrupts.set_context(format!(
        "op {op} may be running on {host}: `opmark run` with --op {op} follows or replays it, `opmark cancel {host} {op}` stops it",
        op = op_text,
    ));
    let pool = Pool::new(10);
    let report = operation::run_interruptible(
        RunEnv {
            ledger: &mut ledger,
            policy: &policy,
            key: &key,
            session_id: session_id(),
            pool: &pool,
            group: None,
        },
        input,
        &interrupts,
    )
    .await?;
    tracing::info!(
        "verdict {} ({}), exit {}: {}",
        report.verdict,
        report.reason_code,
        report
            .exit_code
            .map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
        report.reason
    );
    if report.reason_code == ReasonCode::ClientInterrupted {
        let signal = interrupts.received().unwrap_or(ClientSignal::Int);
        return Ok(RunAnswer::One {
            report: Box::new(report),
            interrupted: Some(signal),
            contradictions: Vec::new(),
        });
    }
    let key = OpKey::new(report.op_id.clone(), report.host.clone());
    let now: Vec<_> = ledger.operation(&key).ok().flatten().into_iter().collect();
    Ok(RunAnswer::One {
        contradictions: new_contradictions(&known, &now),
        report: Box::new(report),
        interrupted: None,
    })
}

/// Several hosts (docs/decisions.md#fleets): one operation per host, scheduled by
/// [`fleet::run_fleet`].
async fn run_on_hosts(
    ctx: &Context,
    mut req: RunRequest,
    named: Vec<(String, Option<String>)>,
    checked: Checked,
    watch: &mut dyn RunWatch,
) -> Result<RunAnswer> {
    let op = &checked.op;
    // The host tasks open their own ledger handles; this one was opened so that a ledger
    // problem is one error before any host is tried.
    let Setup {
        interrupts,
        policy,
        ledger,
        key,
        known,
    } = set_up(ctx, op)?;
    drop(ledger);
    // A bad name is that host's answer (a typo resolves nowhere: `name_unresolvable`),
    // decided before anything is recorded; the other hosts run.
    let early: Vec<Option<HostResult>> = named
        .iter()
        .map(|(host, bad)| {
            let error = match bad {
                Some(why) => Error::new(ErrorKind::InvalidInput, why.clone()),
                None => {
                    let why = super::hosts::unresolvable(ctx, host, &req.options)?;
                    Error::new(ErrorKind::Unreachable, why).with_code(ReasonCode::NameUnresolvable)
                }
            };
            Some(HostResult {
                host: host.clone(),
                outcome: Err(redacted_error(error)),
            })
        })
        .collect();
    let hosts: Vec<String> = named
        .iter()
        .zip(&early)
        .filter(|(_, e)| e.is_none())
        .map(|((host, _), _)| host.clone())
        .collect();
    let failed_before = early.iter().filter(|e| e.is_some()).count();
    // Taken, not copied: the request is not sent with it.
    let digest = req.stdin.known_digest();
    let stdin =
        match read_stdin(std::mem::take(&mut req.stdin), &checked, &interrupts, watch).await? {
            Ok(stdin) => stdin,
            Err(answer) => return Ok(answer),
        };
    interrupts.set_context(format!(
        "op {op} may be running on {} hosts: `opmark run` with --op {op} and the same hosts follows or replays it, `opmark cancel HOST {op}` stops it on one",
        hosts.len()
    ));
    let prefix = req.fleet.prefix;
    let inputs: Vec<RunInput> = hosts
        .iter()
        .map(|host| {
            let prefix = prefix.then(|| format!("{host}: "));
            run_input(ctx, &req, host, &checked, stdin.clone(), digest, prefix)
        })
        .collect();
    let shared = fleet_shared(ctx, policy, key);
    let plan = Schedule {
        forks: req.fleet.forks,
        max_failures: req.fleet.max_failures,
        serial: req.fleet.serial,
        failed_before,
        one_host: false,
    };
    let mut ran = if inputs.is_empty() {
        Vec::new()
    } else {
        fleet::run_fleet(&shared, inputs, plan, &interrupts, |p: Progress| {
            watch.progress(p);
        })
        .await
    }
    .into_iter();
    // Back in the order the hosts were given.
    let results: Vec<HostResult> = early
        .into_iter()
        .filter_map(|e| e.or_else(|| ran.next()))
        .collect();
    let summary = Summary::of(&results);
    let contradictions = open_ledger(ctx, shared.policy.as_ref())
        .and_then(|l| Ok(l.operations_by_id(op.as_str())?))
        .map(|now| new_contradictions(&known, &now))
        .unwrap_or_default();
    Ok(RunAnswer::Fleet {
        results,
        summary,
        interrupted: interrupts.received(),
        contradictions,
    })
}

/// What the operations of one process's fleet share: the policy, the ledger's key, this
/// session, one connection pool, and a ledger handle for each operation's task.
pub(super) fn fleet_shared(
    ctx: &Context,
    policy: crate::policy::Policy,
    key: crate::ledger::fingerprint::InstallationKey,
) -> FleetShared {
    let ledger_ctx = ctx.clone();
    let ledger_policy = policy.clone();
    FleetShared {
        policy: Arc::new(policy),
        key,
        session_id: session_id(),
        pool: Arc::new(Pool::new(10)),
        open_ledger: Arc::new(move || open_ledger(&ledger_ctx, &ledger_policy)),
    }
}

/// A name that resolves nowhere and is no Host of the ssh config is a typo far more often
/// than an outage: answered once the ledger is known to open (its problem comes first)
/// and before anything is recorded, so it never becomes an operation.
pub(super) fn typo_answer(
    ctx: &Context,
    req: &RunRequest,
    hosts: &[String],
    op: &OpId,
) -> Option<RunAnswer> {
    hosts.iter().find_map(|host| {
        let why = super::hosts::unresolvable(ctx, host, &req.options)?;
        Some(RunAnswer::Early(Early {
            op_id: Some(op.as_str().to_owned()),
            verdict: Verdict::NotApplied,
            exit_code: None,
            reason: why,
            reason_code: ReasonCode::NameUnresolvable,
            retryable: ReasonCode::NameUnresolvable.retryable(),
            status: Verdict::NotApplied.reserved_exit_code().unwrap_or(241),
        }))
    })
}

/// The signal handlers of a run: from here on a signal is answered, never the silent
/// default death.
pub(super) fn install_interrupts() -> Result<Interrupts> {
    Interrupts::install().map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("cannot install the signal handlers: {e}; nothing was sent"),
        )
    })
}

/// The operations whose host evidence contradicts the ledger since `known` was read
/// (before this run): a contradiction is recorded and never silent.
pub(super) fn new_contradictions(
    known: &[OperationRecord],
    now: &[OperationRecord],
) -> Vec<NewContradiction> {
    now.iter()
        .filter(|record| {
            let before = known
                .iter()
                .find(|r| r.host == record.host && r.op_id == record.op_id)
                .map_or(0, |r| r.contradictions);
            record.contradictions > before
        })
        .map(|record| NewContradiction {
            op_id: record.op_id.clone(),
            host: record.host.clone(),
            exit_code: record.exit_code,
        })
        .collect()
}

/// Invalid input: the verdict is `refused`, nothing is recorded or sent.
pub(super) fn refuse_before_anything(ctx: &Context, op: Option<&str>, reason: &str) -> RunAnswer {
    // The reason may quote the input, and the input may hold a secret.
    let reason = redactor_for_errors(ctx.policy.as_deref()).redact_owned(reason);
    RunAnswer::Early(Early {
        op_id: op.filter(|o| OpId::parse(o).is_ok()).map(str::to_owned),
        verdict: Verdict::Refused,
        exit_code: None,
        reason,
        reason_code: ReasonCode::InvalidInput,
        retryable: false,
        status: Verdict::Refused.reserved_exit_code().unwrap_or(245),
    })
}

/// A signal before the operation was recorded (while stdin was read): nothing was
/// recorded or sent, so nothing can run.
fn interrupted_before_anything(op: &OpId, signal: ClientSignal) -> RunAnswer {
    RunAnswer::Early(Early {
        op_id: Some(op.as_str().to_owned()),
        verdict: Verdict::NotApplied,
        exit_code: None,
        reason: format!(
            "interrupted by {signal} before anything was recorded or sent; nothing ran. `opmark run` with op id {op} runs it (at most once)"
        ),
        reason_code: ReasonCode::ClientInterrupted,
        retryable: ReasonCode::ClientInterrupted.retryable(),
        status: signal.exit_code(),
    })
}
