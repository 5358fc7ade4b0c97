//! `opmark put LOCAL HOST:PATH`: one file delivered as one operation (the work is
//! [`crate::ops::put`]'s; the verdicts and exit codes are `run`'s).

use super::common;
use crate::cli::{GlobalArgs, PutArgs};
use crate::error::Result;
use crate::operation::{WaitScope, DEFAULT_WAIT};
use crate::ops::put::{put, Delivered, PutAnswer, PutRequest};
use crate::ops::run::RunAnswer;
use crate::vocab::Verdict;

/// Delivers the file; says on stderr what the host did with it (`written`, `unchanged`),
/// or the verdict when the delivery did not (yet) happen. `--json`: the run document
/// with a `file` object.
pub fn run(global: &GlobalArgs, args: PutArgs) -> Result<u8> {
    let (approve, approval) = common::approvals(&args.approvals)?;
    let answer = put(
        &common::context(global),
        PutRequest {
            local: args.local.clone(),
            destination: args.destination,
            op: args.op,
            mode: args.mode,
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
    let delivered = delivered(&answer);
    if global.json {
        let mut doc = answer.run.document()?;
        if let serde_json::Value::Object(map) = &mut doc {
            map.insert(
                "file".into(),
                serde_json::json!({
                    "local": args.local.display().to_string(),
                    "host": answer.target.host,
                    "path": answer.target.path,
                    "bytes": answer.bytes,
                    "sha256": answer.sha256,
                    "mode": format!("{:04o}", answer.mode),
                    "delivered": delivered.map(Delivered::as_str),
                }),
            );
        }
        common::print_text(&format!("{doc}\n"))?;
    }
    match &answer.run {
        RunAnswer::One { report, .. } => match (report.verdict, delivered) {
            (verdict, Some(d)) => crate::logging::say(format_args!(
                "opmark: {}:{}: {} ({} bytes, sha256 {}){}",
                answer.target.host,
                answer.target.path,
                d.as_str(),
                answer.bytes,
                &answer.sha256[..16],
                if verdict == Verdict::Replayed {
                    "; replayed: this op id had delivered it, nothing was sent again"
                } else {
                    ""
                }
            )),
            (Verdict::Completed | Verdict::Replayed, None) => crate::logging::say(format_args!(
                "opmark: {}:{}: not delivered: {}",
                answer.target.host,
                answer.target.path,
                report.stderr.lossy_string().trim_end()
            )),
            (verdict, _) => {
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

/// What the host did, when the delivery ended (its own word, kept with the operation).
fn delivered(answer: &PutAnswer) -> Option<Delivered> {
    match &answer.run {
        RunAnswer::One { report, .. }
            if matches!(report.verdict, Verdict::Completed | Verdict::Replayed)
                && report.exit_code == Some(0) =>
        {
            Delivered::from_output(&report.stdout.lossy_string())
        }
        _ => None,
    }
}
