//! What several subcommands need: the library's [`Context`] and [`HostOptions`] from the
//! parsed command line, and stdout through the one output object of [`super::render`].

use crate::cli::{GlobalArgs, HostArgs};
use crate::error::Result;
use crate::host::HostSpec;
use crate::ledger::Ledger;
use crate::ops::{Context, HostOptions};
use crate::policy::Policy;

pub use crate::ops::document::{error_document, json_document, SCHEMA};
pub use crate::ops::{block_on, operator, operator_name, reach_error, redacted_error, session_id};

/// The library's context from the global options.
pub fn context(global: &GlobalArgs) -> Context {
    Context {
        ssh_config: global.ssh_config.clone(),
        ledger: global.ledger.clone(),
        ledger_from_env: global.ledger_from_env,
        ledger_key: global.ledger_key.clone(),
        policy: global.policy.clone(),
    }
}

/// The library's connection options from `-p -i -J -l -o -4 -6`, with where the flags
/// and the destination stood on the command line.
pub fn host_options(args: &HostArgs) -> HostOptions {
    HostOptions {
        port: args.port,
        identity: args.identity.clone(),
        jump: args.jump.clone(),
        login: args.login.clone(),
        option: args.option.clone(),
        ipv4: args.ipv4,
        ipv6: args.ipv6,
        flag_positions: args.positions,
    }
}

/// The policy named by `--policy`/`OPMARK_POLICY`, the user's file, or the built-in one.
pub fn load_policy(global: &GlobalArgs) -> Result<Policy> {
    crate::ops::load_policy(&context(global))
}

/// Opens (creating if needed) the ledger, with the policy's extra redaction patterns.
pub fn open_ledger(global: &GlobalArgs, policy: &Policy) -> Result<Ledger> {
    crate::ops::open_ledger(&context(global), policy)
}

/// Where to connect, from the host argument and the OpenSSH-style flags.
pub fn host_spec(global: &GlobalArgs, host: &str, args: &HostArgs) -> HostSpec {
    crate::ops::host_spec(&context(global), host, &host_options(args))
}

/// Prints one JSON document on stdout, through [`Out`](super::render::Out).
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    super::render::Out.json(value)
}

/// Prints `run`'s document, through [`Out`](super::render::Out).
pub fn print_run_json(report: &crate::operation::RunReport) -> Result<()> {
    super::render::Out.run_json(report)
}

/// `print!` for a command's answer, through [`Out`](super::render::Out): returns from
/// the calling function with [`ErrorKind::StdoutClosed`](crate::error::ErrorKind) (exit
/// 141) when stdout cannot take it.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::commands::render::Out.text(&format!($($arg)*))?
    };
}

/// `println!` as [`out!`](crate::out) does it.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::commands::render::Out.text(&format!("{}\n", format_args!($($arg)*)))?
    };
}

/// Prints `text` on stdout, through [`Out`](super::render::Out).
pub fn print_text(text: &str) -> Result<()> {
    super::render::Out.text(text)
}

/// What a person watching a run, put or get sees while it goes on: the op id minted
/// (before anything is sent), notes, and with several hosts or files a line of counts
/// on a terminal.
#[derive(Debug)]
pub struct SayWatch {
    show_progress: bool,
    drawn: bool,
}

impl SayWatch {
    /// Counts drawn only when a person watches stderr and no document is asked for.
    pub fn new(global: &GlobalArgs) -> SayWatch {
        use std::io::IsTerminal as _;
        SayWatch {
            show_progress: !global.json && std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// Takes the counts off before the answer: the screen keeps the output, not them.
    pub fn finish(&mut self) {
        if std::mem::take(&mut self.drawn) {
            crate::logging::set_status(None);
        }
    }
}

impl crate::ops::run::RunWatch for SayWatch {
    fn minted(&mut self, op: &crate::op_id::OpId) {
        crate::logging::say(format_args!("opmark: op {op}"));
    }

    fn note(&mut self, text: &str) {
        crate::logging::say(format_args!("opmark: {text}"));
    }

    /// `opmark: 3/20 done, 5 running, 1 failed`, kept under the output as the terminal's
    /// status line (taken off before each output line and drawn again after it, cut to
    /// the terminal's width: see [`crate::logging::set_status`]). A hand-written line
    /// rather than indicatif: one line of counts needs no dependency.
    fn progress(&mut self, p: crate::operation::fleet::Progress) {
        if self.show_progress {
            self.drawn = true;
            crate::logging::set_status(Some(&format!(
                "opmark: {}/{} done, {} running, {} failed",
                p.done, p.total, p.running, p.failed
            )));
        }
    }
}

/// The token of `--approval FILE` (`-`: standard input). Unreadable: an error naming the
/// file and the fix, before anything is recorded or sent.
pub fn read_approval(path: &std::path::Path, stdin_forwarded: bool) -> Result<String> {
    use std::io::Read as _;
    let bad = |why: String| crate::error::Error::new(crate::error::ErrorKind::InvalidInput, why);
    if path == std::path::Path::new("-") {
        if stdin_forwarded {
            return Err(bad(
                "--approval - reads the token from standard input, which --stdin forwards to \
                 the command: give the token as a file instead; nothing was sent"
                    .into(),
            ));
        }
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| {
            bad(format!(
                "--approval -: standard input cannot be read: {e}; nothing was sent"
            ))
        })?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| {
        bad(format!(
            "--approval {}: {e}; pass the file `opmark approve` wrote; nothing was sent",
            path.display()
        ))
    })
}

/// The options `put` and `get` share, read: a signed approval's file read once, before
/// anything is sent; `--wait` bounding the whole transfer when given, as for `run`.
pub fn transfer_options(
    args: &crate::cli::TransferArgs,
) -> Result<crate::ops::transfer::TransferOptions> {
    use crate::operation::WaitScope;
    let approval = match args.approvals.approval.as_deref() {
        None => None,
        Some(path) => Some(read_approval(path, false)?),
    };
    Ok(crate::ops::transfer::TransferOptions {
        op: args.op.clone(),
        attempts: args.attempts,
        wait: args.wait.unwrap_or(crate::operation::DEFAULT_WAIT),
        wait_scope: match args.wait {
            Some(w) if !w.is_zero() => WaitScope::Invocation,
            _ => WaitScope::Probes,
        },
        approve: args.approvals.approve.clone(),
        approval,
        options: host_options(&args.host_args),
        forks: args.forks,
        become_user: None,
        secrets: Vec::new(),
    })
}

/// A transfer's answer (`put`, `get`): with `--json` the run document with `file`; on
/// stderr `done` when the transfer happened, else why not (`PLACE: not DONE_WORD: ` the
/// host's words, or the verdict's reason).
pub fn say_transfer(
    global: &GlobalArgs,
    run: &crate::ops::run::RunAnswer,
    file: serde_json::Value,
    done: Option<String>,
    place: &str,
    not_done: &str,
) -> Result<()> {
    use crate::ops::run::RunAnswer;
    use crate::vocab::Verdict;
    if global.json {
        let mut doc = run.document()?;
        if let serde_json::Value::Object(map) = &mut doc {
            map.insert("file".into(), file);
        }
        print_text(&format!("{doc}\n"))?;
    }
    match run {
        RunAnswer::One { report, .. } => match (report.verdict, done) {
            (_, Some(line)) => crate::logging::say(format_args!("opmark: {line}")),
            (Verdict::Completed | Verdict::Replayed, None) => crate::logging::say(format_args!(
                "opmark: {place}: {not_done}: {}",
                report.stderr.lossy_string().trim_end()
            )),
            (verdict, None) => {
                crate::logging::say(format_args!("opmark: {verdict}: {}", report.reason))
            }
        },
        RunAnswer::Early(early) if !global.json => {
            crate::logging::say(format_args!("opmark: refused: {}", early.reason))
        }
        _ => {}
    }
    Ok(())
}

/// One file of a transfer of several: where (`HOST:PATH`), its `file` object, and the
/// line said when it was transferred (`None`: it was not, and the verdict says why).
#[derive(Debug)]
pub struct FileLine {
    /// `HOST:PATH`.
    pub place: String,
    /// The `file` object of its entry in the document.
    pub file: serde_json::Value,
    /// What was done, when it was.
    pub done: Option<String>,
}

/// A transfer of several files (`put` of several, `get` of several): a line per file on
/// stderr, then the counts (`counts`: each word with how many files it names; the rest
/// are `not_done`) and the rerun that finishes the rest; `--json`, one document: `op_id`,
/// `files` (each file's run document with its `file` object) and `summary`
/// (`file_count`, `WORD_count` for each count, `failed_count`, `verdicts`,
/// `exit_status`).
pub fn say_files(
    global: &GlobalArgs,
    run: &crate::ops::run::RunAnswer,
    op: Option<&crate::op_id::OpId>,
    files: Vec<FileLine>,
    counts: &[(&str, usize)],
    not_done: &str,
) -> Result<()> {
    use crate::vocab::Verdict;
    let crate::ops::run::RunAnswer::Fleet {
        results, summary, ..
    } = run
    else {
        return Err(crate::error::Error::new(
            crate::error::ErrorKind::Internal,
            "a transfer of several files answered as one (opmark bug)",
        ));
    };
    let mut docs = Vec::with_capacity(files.len());
    for (line, result) in files.into_iter().zip(results) {
        match (&line.done, &result.outcome) {
            (Some(done), _) => crate::logging::say(format_args!("opmark: {done}")),
            (None, Ok(report)) => {
                let why = match report.verdict {
                    Verdict::Completed | Verdict::Replayed => {
                        report.stderr.lossy_string().trim_end().to_owned()
                    }
                    _ => report.reason.clone(),
                };
                crate::logging::say(format_args!(
                    "opmark: {}: {not_done}: {} ({}): {why}",
                    line.place, report.verdict, report.reason_code
                ))
            }
            (None, Err(e)) => crate::logging::say(format_args!(
                "opmark: {}: error ({}): {}",
                line.place,
                e.reason_code(),
                e.message
            )),
        }
        if global.json {
            let mut doc = match &result.outcome {
                Ok(report) => json_document(report)?,
                Err(e) => error_document(e),
            };
            doc["file"] = line.file;
            docs.push(doc);
        }
    }
    let op = op.map(ToString::to_string).unwrap_or_default();
    let done: usize = counts.iter().map(|(_, n)| n).sum();
    let failed = results.len().saturating_sub(done);
    let said: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
    // Not yet settled: a rerun under the op id can still transfer them. A delivery that
    // ran and failed, or a conflict, answers the same to every rerun under it.
    let unsettled = results.iter().any(|r| match &r.outcome {
        Ok(report) => matches!(
            report.verdict,
            Verdict::NotApplied | Verdict::InProgress | Verdict::Indeterminate
        ),
        Err(_) => true,
    });
    let next = if unsettled {
        format!("; the same command with --op {op} settles the rest and replays the others")
    } else if failed > 0 {
        format!("; a rerun with --op {op} answers the same: fix the cause, then give a new op id")
    } else {
        String::new()
    };
    crate::logging::say(format_args!(
        "opmark: {} files, op {op}: {}, {failed} {not_done}{next}",
        results.len(),
        said.join(", "),
    ));
    if global.json {
        let mut totals = serde_json::Map::new();
        totals.insert("file_count".into(), results.len().into());
        for (word, n) in counts {
            totals.insert(format!("{word}_count"), (*n).into());
        }
        totals.insert("failed_count".into(), failed.into());
        totals.insert("verdicts".into(), serde_json::json!(summary.verdicts));
        totals.insert("exit_status".into(), summary.exit_status.into());
        let doc = serde_json::json!({
            "schema": SCHEMA,
            "op_id": op,
            "files": docs,
            "summary": totals,
        });
        print_text(&format!("{doc}\n"))?;
    }
    Ok(())
}
