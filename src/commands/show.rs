//! `opmark show`: one operation's timeline, readable at 80 columns.

use std::fmt::Write as _;

use super::list::{printable, redacted_error, to_second};
use crate::cli::{GlobalArgs, ShowArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{Event, Ledger, OpKey, OperationRecord, StoredEvent};
use crate::op_id::OpId;

const WIDTH: usize = 80;

/// Prints the header and the timeline, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &ShowArgs) -> Result<u8> {
    let op = OpId::parse(&args.op)
        .map_err(|e| redacted_error(Error::new(ErrorKind::InvalidInput, e.to_string())))?;
    let (ledger, path) = Ledger::open_existing_default_or(global.ledger.as_deref())
        .map_err(|e| redacted_error(e.into()))?;
    let not_found = || {
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no operation `{op}`{} in the ledger {}; `opmark list` shows what is recorded",
                args.host
                    .as_deref()
                    .map(|h| format!(" on host `{}`", printable(h)))
                    .unwrap_or_default(),
                path.display()
            ),
        )
    };
    let Some(ledger) = ledger else {
        return Err(redacted_error(not_found()));
    };
    let host =
        match &args.host {
            Some(h) => h.clone(),
            None => {
                let hosts = ledger
                    .hosts_of(op.as_str())
                    .map_err(|e| redacted_error(e.into()))?;
                match hosts.as_slice() {
                    [] => return Err(redacted_error(not_found())),
                    [one] => one.clone(),
                    many => {
                        return Err(redacted_error(Error::new(
                            ErrorKind::InvalidInput,
                            format!(
                            "operation `{op}` exists on several hosts ({}); pick one with --host",
                            many.iter().map(|h| printable(h)).collect::<Vec<_>>().join(", ")
                        ),
                        )))
                    }
                }
            }
        };
    let key = OpKey::new(op.as_str(), host);
    let record = ledger
        .operation(&key)
        .map_err(|e| redacted_error(e.into()))?;
    let events = ledger.events(&key).map_err(|e| redacted_error(e.into()))?;
    if record.is_none() && events.is_empty() {
        return Err(redacted_error(not_found()));
    }
    if global.json {
        let doc = serde_json::json!({ "operation": record, "events": events });
        println!("{doc}");
    } else {
        print!("{}", render(&key, record.as_ref(), &events));
    }
    Ok(exit_code::OK)
}

/// The text form: header, then one line per event (wrapped to 80 columns).
pub fn render(key: &OpKey, record: Option<&OperationRecord>, events: &[StoredEvent]) -> String {
    let mut out = format!(
        "operation {} on {}\n",
        printable(&key.op_id),
        printable(&key.host)
    );
    let field = |out: &mut String, name: &str, value: &str| {
        wrap_into(out, &format!("  {name:<12} "), value);
    };
    match record {
        Some(r) => {
            field(&mut out, "command", &printable(&r.display));
            field(
                &mut out,
                "family",
                &format!("{} (rule: {})", r.family, printable(&r.rule)),
            );
            let mut state = printable(&r.state);
            if let Some(v) = r.verdict {
                if r.state != v.as_str() {
                    let _ = write!(state, ", last verdict {v}");
                }
            }
            if let Some(c) = r.exit_code {
                let _ = write!(state, ", exit {c}");
            }
            field(&mut out, "state", &state);
            field(
                &mut out,
                "outcome",
                if r.unresolved {
                    "UNRESOLVED (not settled by a verdict, reconcile or operator)"
                } else {
                    "settled"
                },
            );
            field(&mut out, "attempts", &r.attempts.to_string());
            field(&mut out, "fingerprint", &r.fingerprint);
            field(
                &mut out,
                "recorded",
                &format!(
                    "{} .. {} UTC",
                    to_second(&r.created_at),
                    to_second(&r.updated_at)
                ),
            );
        }
        None => field(
            &mut out,
            "intent",
            "none recorded (only observations exist for this op id)",
        ),
    }
    out.push_str("\ntimeline (UTC):\n");
    let seq_w = events.last().map_or(1, |e| e.seq.to_string().len()).max(2);
    let mut day = "";
    for e in events {
        let this_day = e.at.get(..10).unwrap_or("");
        if this_day != day {
            day = this_day;
            let _ = writeln!(out, "  {day}");
        }
        let time = e.at.get(11..23).unwrap_or(&e.at);
        let (indent, text) = describe(&e.event);
        let prefix = format!("  {time}  #{:<seq_w$} {}", e.seq, " ".repeat(indent * 2));
        wrap_into(&mut out, &prefix, &text);
    }
    out
}

/// Indentation level (0 operation, 1 attempt, 2 within an attempt) and the line's text.
fn describe(event: &Event) -> (usize, String) {
    let p = |s: &str| printable(s);
    match event {
        Event::SessionStarted {
            session,
            pid,
            version,
        } => (
            0,
            format!(
                "session {} started (pid {pid}, opmark {})",
                p(session),
                p(version)
            ),
        ),
        Event::Intended {
            session,
            family,
            rule,
            ..
        } => (
            0,
            format!(
                "intended: family {family} (rule {}), session {}",
                p(rule),
                p(session)
            ),
        ),
        Event::AttemptDispatched {
            attempt_id,
            number,
            parent,
            reason,
        } => (
            1,
            match parent {
                Some(parent) => format!(
                    "attempt {} (#{number}) dispatched: retry of {} because {reason}",
                    p(attempt_id),
                    p(parent)
                ),
                None => format!("attempt {} (#{number}) dispatched: {reason}", p(attempt_id)),
            },
        ),
        Event::BoundaryReached {
            boundary, detail, ..
        } => (2, with_detail(&format!("boundary {boundary}"), detail)),
        Event::ExitReceived {
            exit_code,
            signal,
            timed_out,
            stdout_bytes,
            stderr_bytes,
            stdout_sha256,
            stderr_sha256,
            ..
        } => {
            let mut s = match (exit_code, signal) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(sig)) => format!("killed by {}", p(sig)),
                (None, None) => "exit status unknown".to_owned(),
            };
            if *timed_out {
                s.push_str(" (timed out)");
            }
            let _ = write!(
                s,
                "; stdout {stdout_bytes} B sha256 {}, stderr {stderr_bytes} B sha256 {}",
                short_hash(stdout_sha256),
                short_hash(stderr_sha256)
            );
            (2, s)
        }
        Event::Probed {
            attempt_id,
            state,
            exit_code,
            detail,
        } => {
            let mut s = format!("probe: marker {}", p(state));
            if let Some(c) = exit_code {
                let _ = write!(s, ", exit {c}");
            }
            if let Some(a) = attempt_id {
                let _ = write!(s, " (about attempt {})", p(a));
            }
            (0, with_detail(&s, detail))
        }
        Event::Reconciled { decision, detail } => (
            0,
            with_detail(&format!("reconciled: {}", p(decision)), detail),
        ),
        Event::OperatorDecision { by, decision, note } => (
            0,
            with_detail(&format!("operator {} decided {}", p(by), p(decision)), note),
        ),
        Event::Fenced { detail } => (0, with_detail("fenced", detail)),
        Event::Superseded { attempt_id, note } => (
            2,
            with_detail(
                &format!("claim of attempt {} superseded", p(attempt_id)),
                note,
            ),
        ),
        Event::Verdict {
            attempt_id,
            verdict,
            exit_code,
            reason,
        } => {
            let mut s = format!("verdict {verdict}");
            if let Some(c) = exit_code {
                let _ = write!(s, ", exit {c}");
            }
            if let Some(a) = attempt_id {
                let _ = write!(s, " (attempt {})", p(a));
            }
            (0, with_detail(&s, reason))
        }
    }
}

fn with_detail(head: &str, detail: &str) -> String {
    if detail.is_empty() {
        head.to_owned()
    } else {
        format!("{head}: {}", printable(detail))
    }
}

fn short_hash(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// Appends `prefix` + `text`, wrapping at [`WIDTH`] with continuation lines aligned under
/// the text's first column. Words longer than a line are split.
fn wrap_into(out: &mut String, prefix: &str, text: &str) {
    let indent = prefix.chars().count();
    let room = WIDTH.saturating_sub(indent).max(20);
    let mut line = String::new();
    let mut lines = Vec::new();
    for word in text.split(' ') {
        let mut word: String = word.to_owned();
        loop {
            let used = line.chars().count();
            let wlen = word.chars().count();
            let need = if used == 0 { wlen } else { used + 1 + wlen };
            if need <= room {
                if used > 0 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if used > 0 {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A single word longer than the room: split it.
            let head: String = word.chars().take(room).collect();
            lines.push(head);
            word = word.chars().skip(room).collect();
        }
    }
    lines.push(line);
    for (i, l) in lines.iter().enumerate() {
        if i == 0 {
            out.push_str(prefix);
        } else {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(l);
        out.push('\n');
    }
}
