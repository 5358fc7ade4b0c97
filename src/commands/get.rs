//! `opmark get HOST:PATH LOCAL`: one file read as one operation (the work is
//! [`crate::ops::get`]'s; the verdicts and exit codes are `run`'s).

use super::common;
use crate::cli::{GetArgs, GlobalArgs};
use crate::error::Result;
use crate::ops::get::{get, GetRequest};
use crate::ops::run::RunAnswer;
use crate::vocab::Verdict;

/// Reads the file; says on stderr where it went (or the verdict when it was not read).
/// `--json`: the run document (its stdout left out: the content is in LOCAL) with a
/// `file` object.
pub fn run(global: &GlobalArgs, args: GetArgs) -> Result<u8> {
    let answer = get(
        &common::context(global),
        GetRequest {
            source: args.source,
            local: args.local,
            transfer: common::transfer_options(&args.transfer)?,
        },
        &mut common::SayWatch,
    )?;
    let (sha256, bytes) = answer
        .read
        .clone()
        .map_or((None, None), |(s, b)| (Some(s), Some(b)));
    let place = format!("{}:{}", answer.source.host, answer.source.path);
    let replayed =
        matches!(&answer.run, RunAnswer::One { report, .. } if report.verdict == Verdict::Replayed);
    let done = answer.saved.then(|| {
        format!(
            "{place} -> {}: read ({} bytes, sha256 {}){}",
            answer.local.display(),
            bytes.unwrap_or_default(),
            sha256.as_deref().map_or("", |s| &s[..16]),
            if replayed {
                "; replayed from the host's copy of that read"
            } else {
                ""
            }
        )
    });
    let file = serde_json::json!({
        "local": answer.local.display().to_string(),
        "host": answer.source.host,
        "path": answer.source.path,
        "bytes": bytes,
        "sha256": sha256,
        "saved": answer.saved,
    });
    common::say_transfer(global, &answer.run, file, done, &place, "not read")?;
    Ok(answer.run.exit_status())
}
