//! `opmark get HOST:PATH LOCAL`: one file read as one operation (the work is
//! [`crate::ops::get`]'s; the verdicts and exit codes are `run`'s).

use super::common;
use crate::cli::{GetArgs, GlobalArgs};
use crate::error::Result;
use crate::operation::{WaitScope, DEFAULT_WAIT};
use crate::ops::get::{get, GetRequest};
use crate::ops::run::RunAnswer;
use crate::vocab::Verdict;

/// Reads the file; says on stderr where it went (or the verdict when it was not read).
/// `--json`: the run document (its stdout left out: the content is in LOCAL) with a
/// `file` object.
pub fn run(global: &GlobalArgs, args: GetArgs) -> Result<u8> {
    let (approve, approval) = common::approvals(&args.approvals)?;
    let answer = get(
        &common::context(global),
        GetRequest {
            source: args.source,
            local: args.local,
            op: args.op,
            attempts: args.attempts,
            wait: args.wait.unwrap_or(DEFAULT_WAIT),
            wait_scope: match args.wait {
                Some(w) if !w.is_zero() => WaitScope::Invocation,
                _ => WaitScope::Probes,
            },
            options: common::host_options(&args.host_args),
            approve,
            approval,
        },
        &mut common::SayWatch,
    )?;
    let status = answer.run.exit_status();
    let (sha256, bytes) = answer
        .read
        .clone()
        .map_or((None, None), |(s, b)| (Some(s), Some(b)));
    if global.json {
        let mut doc = answer.run.document()?;
        if let serde_json::Value::Object(map) = &mut doc {
            map.insert(
                "file".into(),
                serde_json::json!({
                    "local": answer.local.display().to_string(),
                    "host": answer.source.host,
                    "path": answer.source.path,
                    "bytes": bytes,
                    "sha256": sha256,
                    "saved": answer.saved,
                }),
            );
        }
        common::print_text(&format!("{doc}\n"))?;
    }
    match &answer.run {
        RunAnswer::One { report, .. } => match (report.verdict, answer.saved) {
            (verdict, true) => crate::logging::say(format_args!(
                "opmark: {}:{} -> {}: read ({} bytes, sha256 {}){}",
                answer.source.host,
                answer.source.path,
                answer.local.display(),
                bytes.unwrap_or_default(),
                sha256.as_deref().map_or("", |s| &s[..16]),
                if verdict == Verdict::Replayed {
                    "; replayed from the host's copy of that read"
                } else {
                    ""
                }
            )),
            (Verdict::Completed | Verdict::Replayed, false) => crate::logging::say(format_args!(
                "opmark: {}:{}: not read: {}",
                answer.source.host,
                answer.source.path,
                report.stderr.lossy_string().trim_end()
            )),
            (verdict, false) => {
                crate::logging::say(format_args!("opmark: {verdict}: {}", report.reason))
            }
        },
        RunAnswer::Early(early) if !global.json => {
            crate::logging::say(format_args!("opmark: refused: {}", early.reason))
        }
        _ => {}
    }
    Ok(status)
}
