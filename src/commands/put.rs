//! `opmark put LOCAL HOST:PATH`: one file delivered as one operation (the work is
//! [`crate::ops::put`]'s; the verdicts and exit codes are `run`'s).

use super::common;
use crate::cli::{GlobalArgs, PutArgs};
use crate::error::Result;
use crate::ops::put::{put, Delivered, PutAnswer, PutRequest};
use crate::ops::run::RunAnswer;
use crate::vocab::Verdict;

/// Delivers the file; says on stderr what the host did with it (`written`, `unchanged`),
/// or the verdict when the delivery did not (yet) happen. `--json`: the run document
/// with a `file` object.
pub fn run(global: &GlobalArgs, args: PutArgs) -> Result<u8> {
    let answer = put(
        &common::context(global),
        PutRequest {
            local: args.local.clone(),
            destination: args.destination,
            mode: args.mode,
            transfer: common::transfer_options(&args.transfer)?,
        },
        &mut common::SayWatch,
    )?;
    let delivered = delivered(&answer);
    let place = format!("{}:{}", answer.target.host, answer.target.path);
    let done = delivered.map(|d| {
        format!(
            "{place}: {} ({} bytes, sha256 {}){}",
            d.as_str(),
            answer.bytes,
            &answer.sha256[..16],
            if replayed(&answer.run) {
                "; replayed: this op id had delivered it, nothing was sent again"
            } else {
                ""
            }
        )
    });
    let file = serde_json::json!({
        "local": args.local.display().to_string(),
        "host": answer.target.host,
        "path": answer.target.path,
        "bytes": answer.bytes,
        "sha256": answer.sha256,
        "mode": format!("{:04o}", answer.mode),
        "delivered": delivered.map(Delivered::as_str),
    });
    common::say_transfer(global, &answer.run, file, done, &place, "not delivered")?;
    Ok(answer.run.exit_status())
}

/// Was the answer a replay of an earlier invocation's?
fn replayed(run: &RunAnswer) -> bool {
    matches!(run, RunAnswer::One { report, .. } if report.verdict == Verdict::Replayed)
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
