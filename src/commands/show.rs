//! `opmark show`: one operation's investigation page, readable at 80 columns: the
//! outcome first, then the intent, the attempts (number, boundary, parent, reason,
//! duration, exit), the observations (what was checked, when, what it changed), and the
//! full timeline. Contradictions between evidence come right after the outcome, in
//! capitals: they are the one thing an investigator must not miss. The report is
//! [`crate::ops::show`]'s; this file only draws it.

use std::fmt::Write as _;

use super::common;
use super::render::{printable, to_second, wrap_into};
use crate::cli::{GlobalArgs, ShowArgs};
use crate::error::{exit_code, Result};
use crate::ledger::{Event, LinkRelation, OpKey, OpState, OperationRecord, StoredEvent};
use crate::ops::show::{
    attempts, contradictions, observations, outcome, show, ShowRequest, Timeline,
};
use crate::text::Stamp;

/// Prints the header and the timeline, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &ShowArgs) -> Result<u8> {
    let report = show(
        &common::context(global),
        &ShowRequest {
            op: args.op.clone(),
            host: args.host.clone(),
            limit: args.limit,
        },
    )?;
    if global.json {
        common::print_json(&report)?;
    } else {
        let pages: Vec<String> = report
            .pages()
            .iter()
            .map(|p| render(&p.key, p.operation.as_ref().map(|o| &o.record), &p.events))
            .collect();
        crate::out!("{}", pages.join("\n"));
    }
    Ok(exit_code::OK)
}

/// The text form: header, then one line per event of the timeline (wrapped to 80
/// columns; a `--limit`ed one says how many earlier events it leaves out).
pub fn render(key: &OpKey, record: Option<&OperationRecord>, timeline: &Timeline) -> String {
    let events: &[StoredEvent] = timeline;
    let mut out = format!(
        "operation {} on {}\n",
        printable(&key.op_id),
        printable(&key.host)
    );
    let field = |out: &mut String, name: &str, value: &str| {
        wrap_into(out, &format!("  {name:<12} "), value);
    };
    let o = outcome(record, events);
    field(&mut out, "outcome", &o.text);
    for c in contradictions(events) {
        field(
            &mut out,
            "CONTRADICTED",
            &format!(
                "expected {}, but {} (event #{}) saw {}; the ledger keeps the first settled exit. Why: {}",
                printable(&c.expected.to_string()),
                printable(&c.source),
                c.evidence_seq,
                printable(&c.seen.to_string()),
                c.why
            ),
        );
    }
    match record {
        Some(r) => {
            field(&mut out, "command", &printable(&r.display));
            field(
                &mut out,
                "family",
                // No parentheses around it: a named rule already ends in `(name)`.
                &format!("{}, by {}", r.family, printable(&r.rule)),
            );
            let mut state = printable(&r.state.to_string());
            if let Some(v) = r.verdict {
                if r.state != OpState::verdict(v) {
                    let _ = write!(state, ", last verdict {v}");
                }
            }
            if let Some(c) = r.exit_code {
                let _ = write!(state, ", exit {c}");
            }
            field(&mut out, "state", &state);
            field(&mut out, "attempts", &r.attempts.to_string());
            let history = crate::ledger::History::of(events);
            field(
                &mut out,
                "observations",
                &format!(
                    "{} (replays and follows; not attempts)",
                    history.observations
                ),
            );
            for a in &history.approvals {
                field(
                    &mut out,
                    "approved",
                    &format!(
                        "by {}{} at {} UTC: {}",
                        printable(&a.by),
                        a.key.as_deref().map_or(String::new(), |k| format!(
                            " (signed, key {})",
                            printable(k)
                        )),
                        to_second(&a.at),
                        printable(&a.note)
                    ),
                );
            }
            field(&mut out, "fingerprint", &r.fingerprint);
            for line in links(events) {
                field(&mut out, "link", &line);
            }
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
    let tries = attempts(events);
    if !tries.is_empty() {
        out.push_str("\nattempts:\n");
        for view in &tries {
            let a = &view.attempt;
            let head = match &a.parent {
                Some(parent) => format!(
                    "{} retry of {} because {}",
                    printable(&a.attempt_id),
                    printable(parent),
                    a.reason
                ),
                None => format!("{} {}", printable(&a.attempt_id), a.reason),
            };
            wrap_into(&mut out, &format!("  #{:<3}", a.number), &head);
            let mut line = format!(
                "boundary: {}, exit: {}",
                a.boundary.map_or("none recorded", |b| b.as_str()),
                a.exit_code.map_or("unknown".to_owned(), |c| c.to_string())
            );
            if let Some(d) = view.duration_ms {
                let _ = write!(line, ", seen for {}", seconds(d));
            }
            let _ = write!(
                line,
                " ({} .. {} UTC)",
                clock(&a.dispatched_at),
                clock(&a.last_seen_at)
            );
            wrap_into(&mut out, "      ", &line);
            if let (Some(route), Some(key)) = (&a.route, &a.host_key) {
                wrap_into(&mut out, "      ", &format!("host key {}", printable(key)));
                wrap_into(
                    &mut out,
                    "      ",
                    &format!("reached {}", printable(&route.describe())),
                );
            }
            if let Some(root) = &a.root_id {
                wrap_into(
                    &mut out,
                    "      ",
                    &format!("marker root {}", printable(root)),
                );
            }
        }
    }
    let seen = observations(events);
    if !seen.is_empty() {
        out.push_str("\nobservations (UTC):\n");
        for o in &seen {
            let text = format!("{}: {} [{}]", o.what, printable(&o.found), o.changed);
            wrap_into(&mut out, &format!("  {} ", to_second(&o.at)), &text);
        }
    }
    out.push_str("\ntimeline (UTC):\n");
    if timeline.left_out() > 0 {
        let _ = writeln!(
            out,
            "  ({} earlier event{} not shown; drop --limit for all)",
            timeline.left_out(),
            if timeline.left_out() == 1 { "" } else { "s" }
        );
    }
    let seq_w = events.last().map_or(1, |e| e.seq.to_string().len()).max(2);
    let mut day = String::new();
    for e in timeline.shown() {
        let at = Stamp::of(&e.at);
        let this_day = at.day();
        if this_day != day {
            let _ = writeln!(out, "  {this_day}");
            day = this_day;
        }
        let time = at.clock();
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
            secrets,
            become_user,
            locks,
            ..
        } => {
            let mut line = format!(
                "intended: family {family} (rule {}), session {}",
                p(rule),
                p(session)
            );
            if !secrets.is_empty() {
                let names: Vec<String> = secrets.iter().map(|n| p(n).to_string()).collect();
                line.push_str(&format!(", secrets {}", names.join(", ")));
            }
            if let Some(user) = become_user {
                line.push_str(&format!(", runs as {} (sudo)", p(user)));
            }
            if !locks.is_empty() {
                let names: Vec<String> = locks.iter().map(|l| p(l).to_string()).collect();
                line.push_str(&format!(", holds host locks {}", names.join(", ")));
            }
            (0, line)
        }
        Event::AttemptDispatched {
            attempt_id,
            number,
            parent,
            reason,
        } => (
            1,
            // Recorded before it leaves: its boundaries say how far it got.
            match parent {
                Some(parent) => format!(
                    "attempt {} (#{number}) begun: retry of {} because {reason}",
                    p(attempt_id),
                    p(parent)
                ),
                None => format!("attempt {} (#{number}) begun: {reason}", p(attempt_id)),
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
            ..
        } => {
            let mut s = format!("probe: marker {}", p(state.as_str()));
            if let Some(c) = exit_code {
                let _ = write!(s, ", exit {c}");
            }
            if let Some(a) = attempt_id {
                let _ = write!(s, " (about attempt {})", p(a));
            }
            (0, with_detail(&s, detail))
        }
        Event::Observed {
            kind,
            reading,
            effect,
        } => (
            0,
            format!(
                "observed ({}): {}; {}",
                p(&kind.as_str().replace('_', " ")),
                p(reading),
                p(effect)
            ),
        ),
        Event::Approved { by, note, key, .. } => {
            let who = match key {
                Some(key) => format!("approved (signed) by {} with key {}", p(by), p(key)),
                None => format!("approved by {}", p(by)),
            };
            (0, with_detail(&who, note))
        }
        Event::Reconciled { decision, detail } => (
            0,
            with_detail(&format!("reconciled: {}", p(decision.as_str())), detail),
        ),
        Event::OperatorDecision {
            by,
            decision,
            note,
            exit_code,
        } => {
            let mut s = format!("operator {} decided {}", p(by), p(decision.as_str()));
            if let Some(c) = exit_code {
                let _ = write!(s, ", exit {c}");
            }
            (0, with_detail(&s, note))
        }
        Event::Connected {
            route, host_key, ..
        } => (
            2,
            format!(
                "connected to {} with host key {}",
                p(&route.describe()),
                p(host_key)
            ),
        ),
        Event::MarkerRoot { root_id, .. } => (2, format!("reached marker root {}", p(root_id))),
        Event::Fenced { detail } => (0, with_detail("fenced", detail)),
        Event::Superseded { attempt_id, note } => (
            2,
            with_detail(
                &format!("claim of attempt {} superseded", p(attempt_id)),
                note,
            ),
        ),
        Event::Contradiction {
            source,
            evidence_seq,
            expected,
            seen,
        } => (
            0,
            format!(
                "CONTRADICTION: {} #{evidence_seq} saw {}, expected {}",
                p(source),
                p(&seen.to_string()),
                p(&expected.to_string())
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
        Event::ClientInterrupted {
            boundary,
            signal,
            detail,
            ..
        } => (
            2,
            with_detail(
                &format!(
                    "client interrupted by SIG{} at boundary {boundary}",
                    p(signal)
                ),
                detail,
            ),
        ),
        Event::Linked {
            relation,
            other_op,
            other_host,
        } => {
            let (o, h) = (p(other_op), p(other_host));
            let text = match relation {
                LinkRelation::Repeats => format!("repeats op {o} on {h} (declared with --repeats)"),
                LinkRelation::RepeatedBy => {
                    format!("repeated by op {o} on {h} (declared with --repeats)")
                }
                LinkRelation::Amends => {
                    format!("amends op {o} on {h}: replaces its intent (--amends)")
                }
                LinkRelation::AmendedBy => format!(
                    "amended by op {o} on {h}: its intent replaces this one's, whose outcome stands"
                ),
            };
            (0, text)
        }
        Event::RepetitionHeld {
            earlier_op,
            earlier_state,
            earlier_at,
            route,
            seen_in,
            action,
        } => {
            let what = if action == "block" {
                "held back as a repetition of"
            } else {
                "warned: repeats"
            };
            (
                0,
                format!(
                    "{what} op {} ({}, at {}, via {}; seen in the {})",
                    p(earlier_op),
                    p(earlier_state),
                    p(earlier_at),
                    p(route),
                    p(seen_in)
                ),
            )
        }
        Event::Cancelled {
            by,
            grace_ms,
            result,
            exit_code,
            detail,
        } => {
            let mut s = format!(
                "cancel by {} (grace {}): {}",
                p(by),
                seconds(*grace_ms),
                p(result.as_str())
            );
            if let Some(c) = exit_code {
                let _ = write!(s, ", exit {c}");
            }
            (0, with_detail(&s, detail))
        }
    }
}

/// The operation's links to others (docs/guarantees.md#repetitions), in words, once each.
fn links(events: &[StoredEvent]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for e in events {
        if let Event::Linked { .. } = &e.event {
            let line = describe(&e.event).1;
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
    }
    lines
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

/// `2024-05-01T10:00:00.123456Z` → `10:00:00.123`.
fn clock(at: &str) -> String {
    Stamp::of(at).clock()
}

/// `1234` ms → `1.2s`; `65000` → `1m05s`.
fn seconds(ms: u64) -> String {
    if ms >= 60_000 {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    } else {
        format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
    }
}
