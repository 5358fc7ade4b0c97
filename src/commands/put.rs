//! `opmark put LOCAL... HOST:PATH`: each file delivered as one operation (the work is
//! [`crate::ops::put`]'s; the verdicts and exit codes are `run`'s).

use super::common;
use crate::cli::{GlobalArgs, PutArgs};
use crate::error::Result;
use crate::operation::RunReport;
use crate::ops::put::{put, Delivered, PutAnswer, PutFile, PutRequest};
use crate::ops::run::RunAnswer;
use crate::vocab::Verdict;

/// Delivers the files; says on stderr what the host did with each (`written`,
/// `unchanged`), or the verdict when a delivery did not (yet) happen. `--json`: one file,
/// the run document with a `file` object; several, a document with one such per file
/// (`files`) and a `summary`.
pub fn run(global: &GlobalArgs, args: PutArgs) -> Result<u8> {
    let mut transfer = common::transfer_options(&args.transfer)?;
    transfer.secrets = sudo_password(&args.secrets)?;
    transfer.become_user = args.become_user;
    let mut watch = common::SayWatch::new(global);
    let answer = put(
        &common::context(global),
        PutRequest {
            locals: args.locals,
            destination: args.destination,
            mode: args.mode,
            recursive: args.recursive,
            transfer,
        },
        &mut watch,
    );
    watch.finish();
    let answer = answer?;
    match &answer.run {
        RunAnswer::Fleet { .. } => several(global, &answer),
        _ => one(global, &answer),
    }
}

/// `--secret` on a put: sudo's password for `--become`, and nothing else (a delivery runs
/// no command that could read a secret).
fn sudo_password(given: &[String]) -> Result<Vec<crate::secret::Spec>> {
    let invalid =
        |why: String| crate::error::Error::new(crate::error::ErrorKind::InvalidInput, why);
    let specs = crate::secret::Spec::parse_all(given)
        .map_err(|e| invalid(format!("{e}; nothing was sent")))?;
    if let Some(other) = specs
        .iter()
        .find(|s| s.name != crate::secret::SUDO_PASSWORD)
    {
        return Err(invalid(format!(
            "--secret {}: a put runs no command to give it to; its one secret is sudo's password for --become (--secret {}=env:VAR). Nothing was sent",
            other.name,
            crate::secret::SUDO_PASSWORD
        )));
    }
    Ok(specs)
}

/// One file: the run's document and words.
fn one(global: &GlobalArgs, answer: &PutAnswer) -> Result<u8> {
    let file = &answer.files[0];
    let report = match &answer.run {
        RunAnswer::One { report, .. } => Some(report.as_ref()),
        _ => None,
    };
    let delivered = report.and_then(delivered);
    let place = format!("{}:{}", file.target.host, file.target.path);
    let done = delivered.map(|d| done_line(&place, file, d, report.is_some_and(replayed)));
    common::say_transfer(
        global,
        &answer.run,
        file_object(file, delivered),
        done,
        &place,
        "not delivered",
    )?;
    Ok(answer.run.exit_status())
}

/// Several files: a line each on stderr, then the counts; `--json`, one document.
fn several(global: &GlobalArgs, answer: &PutAnswer) -> Result<u8> {
    let RunAnswer::Fleet { results, .. } = &answer.run else {
        return one(global, answer);
    };
    let (mut written, mut unchanged) = (0, 0);
    let mut lines = Vec::with_capacity(results.len());
    for (file, result) in answer.files.iter().zip(results) {
        let report = result.outcome.as_ref().ok();
        let delivered = report.and_then(delivered);
        match delivered {
            Some(Delivered::Written) => written += 1,
            Some(Delivered::Unchanged) => unchanged += 1,
            None => {}
        }
        let place = format!("{}:{}", file.target.host, file.target.path);
        lines.push(common::FileLine {
            done: delivered.map(|d| done_line(&place, file, d, report.is_some_and(replayed))),
            file: file_object(file, delivered),
            place,
        });
    }
    common::say_files(
        global,
        &answer.run,
        answer.op.as_ref(),
        lines,
        &[("written", written), ("unchanged", unchanged)],
        "not delivered",
    )?;
    Ok(answer.run.exit_status())
}

/// `HOST:PATH: written (N bytes, sha256 PREFIX)`, and the replay said.
fn done_line(place: &str, file: &PutFile, d: Delivered, replayed: bool) -> String {
    format!(
        "{place}: {} ({} bytes, sha256 {}){}",
        d.as_str(),
        file.bytes,
        &file.sha256[..16],
        if replayed {
            "; replayed: this op id had delivered it, nothing was sent again"
        } else {
            ""
        }
    )
}

/// The `file` object of a put's document.
fn file_object(file: &PutFile, delivered: Option<Delivered>) -> serde_json::Value {
    serde_json::json!({
        "local": file.local.display().to_string(),
        "host": file.target.host,
        "path": file.target.path,
        "bytes": file.bytes,
        "sha256": file.sha256,
        "mode": format!("{:04o}", file.mode),
        "delivered": delivered.map(Delivered::as_str),
    })
}

/// Was the answer a replay of an earlier invocation's?
fn replayed(report: &RunReport) -> bool {
    report.verdict == Verdict::Replayed
}

/// What the host did, when the delivery ended (its own word, kept with the operation).
fn delivered(report: &RunReport) -> Option<Delivered> {
    if matches!(report.verdict, Verdict::Completed | Verdict::Replayed)
        && report.exit_code == Some(0)
    {
        Delivered::from_output(&report.stdout.lossy_string())
    } else {
        None
    }
}
