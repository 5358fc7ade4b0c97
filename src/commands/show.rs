//! `opmark show`: one operation's investigation page, readable at 80 columns: the
//! outcome first, then the intent, the attempts (number, boundary, parent, reason,
//! duration, exit), the observations (what was checked, when, what it changed), and the
//! full timeline. Contradictions between evidence come right after the outcome, in
//! capitals: they are the one thing an investigator must not miss.

use std::fmt::Write as _;

use serde::Serialize;

use super::common::redacted_error;
use super::render::{parse_at, printable, to_second, wrap_into};
use crate::cli::{GlobalArgs, ShowArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::history::Word;
use crate::ledger::projection::unresolved_after;
use crate::ledger::{
    Event, History, Ledger, OpKey, OpState, OperationRecord, Redactor, StoredEvent,
};
use crate::op_id::OpId;
use crate::vocab::{Boundary, RetryReason};

/// Prints the header and the timeline, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &ShowArgs) -> Result<u8> {
    let op = OpId::parse(&args.op)
        .map_err(|e| redacted_error(Error::new(ErrorKind::InvalidInput, e.to_string())))?;
    let (ledger, path) =
        Ledger::open_existing_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let not_found = || {
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no operation `{op}`{} in the ledger {}; `opmark list` shows what is recorded",
                args.host
                    .as_deref()
                    // Redacted before escaping: escapes would hide a secret's shape.
                    .map(|h| format!(" on host `{}`", printable(&Redactor::default().redact(h))))
                    .unwrap_or_default(),
                path.display()
            ),
        )
        .with_code("unknown_operation")
    };
    let Some(ledger) = ledger else {
        return Err(redacted_error(not_found()));
    };
    let op = match complete_op_id(&ledger, &op, args.host.as_deref())? {
        Some(full) => full,
        None => return Err(redacted_error(not_found())),
    };
    let host = match &args.host {
        Some(h) => h.clone(),
        None => {
            let hosts = ledger
                .hosts_of(op.as_str())
                .map_err(|e| redacted_error(e.into()))?;
            match hosts.as_slice() {
                [] => return Err(redacted_error(not_found())),
                [one] => one.clone(),
                // A fleet run's op id (SPEC section 11): every host's timeline.
                many => return show_hosts(global, &ledger, &op, many),
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
        let doc = serde_json::json!({
            "operation": record,
            "outcome": outcome(record.as_ref(), &events),
            "attempts": attempts(&events),
            "observations": observations(&events),
            "contradictions": contradictions(&events),
            "events": events,
        });
        super::common::print_json(&doc)?;
    } else {
        print!("{}", render(&key, record.as_ref(), &events));
    }
    Ok(exit_code::OK)
}

/// The op id `given` stands for: itself when the ledger knows it, else the one recorded
/// op id it is a prefix of (on `host`, when given); None when nothing matches. Several
/// matches are an error listing them, since picking one would show the wrong operation.
fn complete_op_id(ledger: &Ledger, given: &OpId, host: Option<&str>) -> Result<Option<OpId>> {
    if !ledger
        .hosts_of(given.as_str())
        .map_err(|e| redacted_error(e.into()))?
        .is_empty()
    {
        return Ok(Some(given.clone()));
    }
    let filter = crate::ledger::ListFilter {
        host: host.map(str::to_owned),
        ..Default::default()
    };
    let mut candidates: Vec<String> = ledger
        .list(&filter)
        .map_err(|e| redacted_error(e.into()))?
        .into_iter()
        .map(|o| o.op_id)
        .filter(|id| id.starts_with(given.as_str()))
        .collect();
    candidates.sort();
    candidates.dedup();
    match candidates.as_slice() {
        [] => Ok(None),
        [one] => OpId::parse(one)
            .map(Some)
            .map_err(|e| Error::new(ErrorKind::Internal, e.to_string())),
        many => {
            const SHOWN: usize = 10;
            let mut listed = many
                .iter()
                .take(SHOWN)
                .map(|id| printable(id))
                .collect::<Vec<_>>()
                .join(", ");
            if many.len() > SHOWN {
                let _ = write!(listed, " and {} more", many.len() - SHOWN);
            }
            Err(redacted_error(
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "`{given}` is the start of {} operation ids ({listed}); give more of the id",
                        many.len()
                    ),
                )
                .with_code("ambiguous_operation"),
            ))
        }
    }
}

/// Every host of an operation run on several hosts, grouped: the text timelines one
/// after the other, or `{"op_id", "hosts": [<the one-host document>...]}`.
fn show_hosts(global: &GlobalArgs, ledger: &Ledger, op: &OpId, hosts: &[String]) -> Result<u8> {
    let mut docs = Vec::new();
    let mut text = String::new();
    for host in hosts {
        let key = OpKey::new(op.as_str(), host.clone());
        let record = ledger
            .operation(&key)
            .map_err(|e| redacted_error(e.into()))?;
        let events = ledger.events(&key).map_err(|e| redacted_error(e.into()))?;
        if global.json {
            docs.push(serde_json::json!({
                "operation": record,
                "outcome": outcome(record.as_ref(), &events),
                "attempts": attempts(&events),
                "observations": observations(&events),
                "contradictions": contradictions(&events),
                "events": events,
            }));
        } else {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&render(&key, record.as_ref(), &events));
        }
    }
    if global.json {
        super::common::print_json(&serde_json::json!({ "op_id": op.as_str(), "hosts": docs }))?;
    } else {
        print!("{text}");
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
    let o = outcome(record, events);
    field(&mut out, "outcome", &o.text);
    for c in contradictions(events) {
        field(
            &mut out,
            "CONTRADICTED",
            &format!(
                "expected {}, but {} (event #{}) saw {}; the ledger keeps the first settled exit. Check the host: evidence was edited or something ran outside opmark",
                printable(&c.expected.to_string()),
                printable(&c.source),
                c.evidence_seq,
                printable(&c.seen.to_string())
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
    let tries = attempts(events);
    if !tries.is_empty() {
        out.push_str("\nattempts:\n");
        for a in &tries {
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
            if let Some(d) = a.duration_ms {
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
                p(result)
            );
            if let Some(c) = exit_code {
                let _ = write!(s, ", exit {c}");
            }
            (0, with_detail(&s, detail))
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

/// The operation's outcome, as the events settle it.
#[derive(Debug, Clone, Serialize)]
pub struct OutcomeLine {
    /// Still not settled by a verdict, a reconcile or an operator.
    pub unresolved: bool,
    /// The last word on it: a verdict, `reconciled:<decision>` or `resolved:<decision>`.
    pub last_word: Option<String>,
    /// The best-known exit code (received, recorded on the host, or in a verdict).
    pub exit_code: Option<i32>,
    /// One line for people.
    pub text: String,
}

/// What the events say about the outcome.
pub fn outcome(record: Option<&OperationRecord>, events: &[StoredEvent]) -> OutcomeLine {
    let h = History::of(events);
    let mut unresolved = h.unresolved;
    let mut exit_code = h.exit_code;
    let last_word = h.last_word.map(|(word, at)| {
        let by = match &word {
            Word::Verdict(_) => format!("verdict at {}", to_second(&at)),
            Word::Reconciled(_) => format!("reconcile at {}", to_second(&at)),
            Word::Resolved { by, .. } => {
                format!("operator {} at {}", printable(by), to_second(&at))
            }
            Word::Cancelled { by } => format!("cancel by {} at {}", printable(by), to_second(&at)),
        };
        (word.name(), by)
    });
    if let Some(r) = record {
        // The projection is the authority on "unresolved"; the fold above only names why.
        unresolved = r.unresolved;
        if r.contradictions > 0 {
            // Later evidence disagreed; the projection kept the first settled exit.
            exit_code = r.exit_code;
        }
    }
    let exit = exit_code.map(|c| format!(", exit {c}")).unwrap_or_default();
    let text = match (&last_word, unresolved) {
        (Some((word, by)), false) => {
            let word = word.split_once(':').map_or(word.as_str(), |(_, d)| d);
            format!("{word}{exit} (settled by {by} UTC)")
        }
        (Some((word, by)), true) => format!(
            "UNRESOLVED: {word}{exit} ({by} UTC); next: `opmark reconcile`, or `opmark resolve` when only a person can tell"
        ),
        (None, true) => format!(
            "UNRESOLVED: no verdict yet{exit}; next: `opmark reconcile`"
        ),
        (None, false) => format!("settled{exit}"),
    };
    OutcomeLine {
        unresolved,
        last_word: last_word.map(|(w, _)| w),
        exit_code,
        text,
    }
}

/// One attempt as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptView {
    /// 1, 2, ...
    pub number: u32,
    /// Attempt id.
    pub attempt_id: String,
    /// The attempt it retried.
    pub parent: Option<String>,
    /// Why it was made.
    pub reason: RetryReason,
    /// The furthest boundary observed.
    pub boundary: Option<Boundary>,
    /// Its exit code, when received.
    pub exit_code: Option<i32>,
    /// When it was dispatched.
    pub dispatched_at: String,
    /// The last event about it.
    pub last_seen_at: String,
    /// From dispatch to the last event about it, in milliseconds.
    pub duration_ms: Option<u64>,
    /// How it reached the host, when it connected (SPEC section 9).
    pub route: Option<crate::host::Route>,
    /// The host key fingerprint it saw (`SHA256:...`), when it connected.
    pub host_key: Option<String>,
    /// The marker root id its shim reported (SPEC 17): the store of evidence it reached.
    pub root_id: Option<String>,
}

/// The attempts, in dispatch order.
pub fn attempts(events: &[StoredEvent]) -> Vec<AttemptView> {
    History::of(events)
        .attempts
        .into_iter()
        .map(|a| AttemptView {
            duration_ms: millis_between(&a.dispatched_at, &a.last_seen_at),
            number: a.number,
            attempt_id: a.attempt_id,
            parent: a.parent,
            reason: a.reason,
            boundary: a.boundary,
            exit_code: a.exit_code,
            dispatched_at: a.dispatched_at,
            last_seen_at: a.last_seen_at,
            route: a.route,
            host_key: a.host_key,
            root_id: a.root_id,
        })
        .collect()
}

/// One observation: a probe, a reconcile, an operator decision, a fence, a supersede.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    /// When.
    pub at: String,
    /// `probe`, `reconcile`, `operator <name>`, `fence`, `supersede`.
    pub what: String,
    /// What it found or decided.
    pub found: String,
    /// What it changed: `settled`, `reopened`, `left open`, `no change`.
    pub changed: String,
}

/// The observations, in time order.
pub fn observations(events: &[StoredEvent]) -> Vec<Observation> {
    let mut out = Vec::new();
    let mut unresolved = false;
    for e in events {
        let before = unresolved;
        unresolved = unresolved_after(unresolved, &e.event);
        let (what, found) = match &e.event {
            Event::Probed {
                state,
                exit_code,
                detail,
                ..
            } => {
                let mut f = format!("marker {state}");
                if let Some(c) = exit_code {
                    let _ = write!(f, ", exit {c}");
                }
                if !detail.is_empty() {
                    let _ = write!(f, " ({detail})");
                }
                ("probe".to_owned(), f)
            }
            Event::Reconciled { decision, detail } => {
                ("reconcile".to_owned(), format!("{decision}: {detail}"))
            }
            Event::OperatorDecision {
                by, decision, note, ..
            } => (format!("operator {by}"), format!("{decision}: {note}")),
            Event::Fenced { detail } => ("fence".to_owned(), detail.clone()),
            Event::Superseded { attempt_id, note } => (
                "supersede".to_owned(),
                format!("claim of {attempt_id} moved aside: {note}"),
            ),
            Event::Contradiction {
                source,
                evidence_seq,
                expected,
                seen,
            } => (
                "CONTRADICTION".to_owned(),
                format!("{source} #{evidence_seq} saw {seen}, expected {expected}"),
            ),
            Event::Cancelled {
                by,
                result,
                exit_code,
                detail,
                ..
            } => {
                let mut f = result.clone();
                if let Some(c) = exit_code {
                    let _ = write!(f, ", exit {c}");
                }
                if !detail.is_empty() {
                    let _ = write!(f, " ({detail})");
                }
                (format!("cancel by {by}"), f)
            }
            _ => continue,
        };
        let changed = match (before, unresolved) {
            (true, false) => "settled",
            (false, true) => "reopened",
            (true, true) => "left open",
            (false, false) => "no change",
        };
        out.push(Observation {
            at: e.at.clone(),
            what,
            found,
            changed: changed.to_owned(),
        });
    }
    out
}

/// One contradiction between evidence (SPEC section 3), as `show` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ContradictionView {
    /// When it was recorded.
    pub at: String,
    /// Its own sequence number.
    pub seq: u64,
    /// Kind of the event that brought the disagreeing evidence.
    pub source: String,
    /// That event's sequence number.
    pub evidence_seq: u64,
    /// What the ledger held.
    pub expected: crate::ledger::Observed,
    /// What the evidence said.
    pub seen: crate::ledger::Observed,
}

/// The contradictions, in time order.
pub fn contradictions(events: &[StoredEvent]) -> Vec<ContradictionView> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Contradiction {
                source,
                evidence_seq,
                expected,
                seen,
            } => Some(ContradictionView {
                at: e.at.clone(),
                seq: e.seq,
                source: source.clone(),
                evidence_seq: *evidence_seq,
                expected: expected.clone(),
                seen: seen.clone(),
            }),
            _ => None,
        })
        .collect()
}

fn millis_between(from: &str, to: &str) -> Option<u64> {
    let d = parse_at(to)? - parse_at(from)?;
    u64::try_from(d.whole_milliseconds()).ok()
}

/// `2024-05-01T10:00:00.123456Z` → `10:00:00.123`.
fn clock(at: &str) -> &str {
    at.get(11..23).unwrap_or(at)
}

/// `1234` ms → `1.2s`; `65000` → `1m05s`.
fn seconds(ms: u64) -> String {
    if ms >= 60_000 {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    } else {
        format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
    }
}
