//! `opmark get HOST:PATH... LOCAL`: each file read as one operation (the work is
//! [`crate::ops::get`]'s; the verdicts and exit codes are `run`'s).

use super::common;
use crate::cli::{GetArgs, GlobalArgs};
use crate::error::Result;
use crate::ops::get::{get, GetAnswer, GetRequest, GotFile};
use crate::ops::run::RunAnswer;
use crate::vocab::Verdict;

/// Reads the files; says on stderr where each went (or the verdict when it was not
/// read). `--json`: one file, the run document (its stdout left out: the content is in
/// LOCAL) with a `file` object; several, a document with one such per file (`files`) and
/// a `summary`.
pub fn run(global: &GlobalArgs, args: GetArgs) -> Result<u8> {
    let mut watch = common::SayWatch::new(global);
    let answer = get(
        &common::context(global),
        GetRequest {
            sources: args.sources,
            local: args.local,
            recursive: args.recursive,
            transfer: common::transfer_options(&args.transfer)?,
        },
        &mut watch,
    );
    watch.finish();
    let answer = answer?;
    match &answer.run {
        RunAnswer::Fleet { results, .. } => {
            let lines = answer
                .files
                .iter()
                .zip(results)
                .map(|(file, result)| {
                    let replayed = result
                        .outcome
                        .as_ref()
                        .is_ok_and(|r| r.verdict == Verdict::Replayed);
                    line(file, replayed)
                })
                .collect();
            let read = answer.files.iter().filter(|f| f.saved).count();
            common::say_files(
                global,
                &answer.run,
                answer.op.as_ref(),
                lines,
                &[("read", read)],
                "not read",
            )?;
        }
        _ => one(global, &answer)?,
    }
    Ok(answer.run.exit_status())
}

/// One file: the run's document and words.
fn one(global: &GlobalArgs, answer: &GetAnswer) -> Result<()> {
    if let Some(listed) = &answer.listed {
        // `get -r` that read no file: the listing's answer (it failed, or found none).
        return common::say_transfer(
            global,
            &answer.run,
            serde_json::Value::Null,
            listed.empty.clone(),
            &listed.place,
            "not listed",
        );
    }
    let replayed =
        matches!(&answer.run, RunAnswer::One { report, .. } if report.verdict == Verdict::Replayed);
    let line = line(&answer.files[0], replayed);
    common::say_transfer(
        global,
        &answer.run,
        line.file,
        line.done,
        &line.place,
        "not read",
    )
}

/// What is said of one file read: where from and to, and its `file` object.
fn line(file: &GotFile, replayed: bool) -> common::FileLine {
    let (sha256, bytes) = file
        .read
        .clone()
        .map_or((None, None), |(s, b)| (Some(s), Some(b)));
    let place = format!("{}:{}", file.source.host, file.source.path);
    let done = file.saved.then(|| {
        format!(
            "{place} -> {}: read ({} bytes, sha256 {}){}",
            file.local.display(),
            bytes.unwrap_or_default(),
            sha256.as_deref().map_or("", |s| &s[..16]),
            if replayed {
                "; replayed from the host's copy of that read"
            } else {
                ""
            }
        )
    });
    common::FileLine {
        file: serde_json::json!({
            "local": file.local.display().to_string(),
            "host": file.source.host,
            "path": file.source.path,
            "bytes": bytes,
            "sha256": sha256,
            "saved": file.saved,
        }),
        done,
        place,
    }
}
