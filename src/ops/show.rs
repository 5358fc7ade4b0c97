//! Show: one operation's record, events and the views an investigator reads (outcome,
//! attempts, observations, contradictions), from the local ledger. The page for people
//! is drawn by `commands/show.rs` from this report.

use std::fmt::Write as _;

use serde::Serialize;

use super::{redacted_error, Context};
use crate::error::{Error, ErrorKind, Result};
use crate::ledger::history::{Attempt, LastWord};
use crate::ledger::projection::unresolved_after;
use crate::ledger::{Event, History, Ledger, OpKey, OperationRecord, StoredEvent};
use crate::op_id::OpId;
use crate::redact::Redactor;
use crate::text::{parse_at, printable, to_second};
use crate::vocab::ErrorCode;

/// Which operation.
#[derive(Debug, Clone)]
pub struct ShowRequest {
    /// The op id, or the start of one, unchecked.
    pub op: String,
    /// The host, when the op id was used on several.
    pub host: Option<String>,
    /// Only the newest this many events in the timeline (at least 1); the views
    /// (outcome, attempts, observations) are still made from every event.
    pub limit: Option<usize>,
}

/// One operation on one host.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    /// Which operation.
    #[serde(skip)]
    pub key: OpKey,
    /// Its projection, when an intent was recorded, with its observations counted.
    pub operation: Option<OperationView>,
    /// What the events settle.
    pub outcome: OutcomeLine,
    /// Its attempts, in dispatch order.
    pub attempts: Vec<AttemptView>,
    /// Its observations, in time order.
    pub observations: Vec<Observation>,
    /// The approvals used to let something run, oldest first.
    pub approvals: Vec<crate::ledger::history::Approval>,
    /// Its contradictions, in time order.
    pub contradictions: Vec<ContradictionView>,
    /// How many events the operation has (JSON `event_count`), whether or not
    /// `events` lists them all.
    #[serde(rename = "event_count")]
    pub event_count: usize,
    /// Its events in order: all of them for the views, the newest `--limit` in the
    /// document and the timeline.
    pub events: Timeline,
}

/// An operation's events: [`std::ops::Deref`] gives all of them, [`Timeline::shown`] and
/// the JSON document the newest `shown`.
#[derive(Debug, Clone)]
pub struct Timeline {
    all: Vec<StoredEvent>,
    shown: usize,
}

impl Timeline {
    /// The events a limited page shows: the newest ones, oldest first.
    pub fn shown(&self) -> &[StoredEvent] {
        &self.all[self.all.len() - self.shown..]
    }

    /// Events before the shown ones.
    pub fn left_out(&self) -> usize {
        self.all.len() - self.shown
    }
}

impl std::ops::Deref for Timeline {
    type Target = [StoredEvent];

    fn deref(&self) -> &[StoredEvent] {
        &self.all
    }
}

impl Serialize for Timeline {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.shown().serialize(s)
    }
}

impl Page {
    fn read(ledger: &Ledger, key: OpKey, limit: Option<usize>) -> Result<Page> {
        let operation = ledger
            .operation(&key)
            .map_err(|e| redacted_error(e.into()))?;
        let events = ledger
            .events_with_hashes(&key)
            .map_err(|e| redacted_error(e.into()))?;
        let history = History::of(&events);
        Ok(Page {
            outcome: outcome(operation.as_ref(), &events),
            attempts: attempts(&events),
            observations: observations(&events),
            approvals: history.approvals,
            contradictions: contradictions(&events),
            key,
            operation: operation.map(|record| OperationView {
                record,
                observations: history.observations,
            }),
            event_count: events.len(),
            events: Timeline {
                shown: limit.map_or(events.len(), |l| l.min(events.len())),
                all: events,
            },
        })
    }
}

/// An operation's projection row with the count of its observations beside its
/// attempts: `attempts` counts execution tries only, `observations` the replays and
/// follows answered from evidence (docs/ledger.md#observations).
#[derive(Debug, Clone, Serialize)]
pub struct OperationView {
    /// The projection row.
    #[serde(flatten)]
    pub record: OperationRecord,
    /// Observations recorded (`observed` events); JSON `observation_count`, since
    /// `observations` is the list of them in `show` and `run`.
    #[serde(rename = "observation_count")]
    pub observations: u32,
}

/// One host's page, or every host's of an op id run on several (docs/decisions.md#fleets).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ShowReport {
    /// The op id on one host.
    One(Box<Page>),
    /// The op id on several hosts, in the ledger's order.
    Hosts {
        /// The whole op id.
        op_id: String,
        /// One page per host.
        hosts: Vec<Page>,
    },
}

impl ShowReport {
    /// The pages, one per host.
    pub fn pages(&self) -> &[Page] {
        match self {
            ShowReport::One(page) => std::slice::from_ref(page.as_ref()),
            ShowReport::Hosts { hosts, .. } => hosts,
        }
    }
}

/// Reads the operation's page(s); an op id nobody recorded is `unknown_operation`.
pub fn show(ctx: &Context, req: &ShowRequest) -> Result<ShowReport> {
    if req.limit == Some(0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--limit 0 would show no event; give at least 1, or leave it out for the whole timeline",
        ));
    }
    let op = OpId::parse(&req.op)
        .map_err(|e| redacted_error(Error::new(ErrorKind::InvalidInput, e.to_string())))?;
    let (ledger, path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let not_found = || {
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no operation `{op}`{} in the ledger {}; `opmark list` shows what is recorded",
                req.host
                    .as_deref()
                    // Redacted before escaping: escapes would hide a secret's shape.
                    .map(|h| format!(" on host `{}`", printable(&Redactor::default().redact(h))))
                    .unwrap_or_default(),
                path.display()
            ),
        )
        .with_code(ErrorCode::UnknownOperation)
    };
    let Some(ledger) = ledger else {
        return Err(redacted_error(super::no_ledger_at(ctx, &path)));
    };
    let op = match complete_op_id(&ledger, &op, req.host.as_deref())? {
        Some(full) => full,
        None => return Err(redacted_error(not_found())),
    };
    let host = match &req.host {
        Some(h) => h.clone(),
        None => {
            let hosts = ledger
                .hosts_of(op.as_str())
                .map_err(|e| redacted_error(e.into()))?;
            match hosts.as_slice() {
                [] => return Err(redacted_error(not_found())),
                [one] => one.clone(),
                // A fleet run's op id (docs/decisions.md#fleets): every host's timeline.
                many => {
                    let hosts = many
                        .iter()
                        .map(|host| {
                            Page::read(&ledger, OpKey::new(op.as_str(), host.clone()), req.limit)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    return Ok(ShowReport::Hosts {
                        op_id: op.as_str().to_owned(),
                        hosts,
                    });
                }
            }
        }
    };
    let page = Page::read(&ledger, OpKey::new(op.as_str(), host), req.limit)?;
    if page.operation.is_none() && page.events.is_empty() {
        return Err(redacted_error(not_found()));
    }
    Ok(ShowReport::One(Box::new(page)))
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
                .with_code(ErrorCode::AmbiguousOperation),
            ))
        }
    }
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
            LastWord::Verdict(_) => format!("verdict at {}", to_second(&at)),
            LastWord::Reconciled(_) => format!("reconcile at {}", to_second(&at)),
            LastWord::Resolved { by, .. } => {
                format!("operator {} at {}", printable(by), to_second(&at))
            }
            LastWord::Cancelled { by } => {
                format!("cancel by {} at {}", printable(by), to_second(&at))
            }
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

/// One attempt as the page shows it: the ledger's own view of it (its events folded,
/// [`Attempt`]) and how long it was seen for.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptView {
    /// The attempt as its events tell it.
    #[serde(flatten)]
    pub attempt: Attempt,
    /// From dispatch to the last event about it, in milliseconds.
    pub duration_ms: Option<u64>,
}

/// The attempts, in dispatch order.
pub fn attempts(events: &[StoredEvent]) -> Vec<AttemptView> {
    History::of(events)
        .attempts
        .into_iter()
        .map(|attempt| AttemptView {
            duration_ms: millis_between(&attempt.dispatched_at, &attempt.last_seen_at),
            attempt,
        })
        .collect()
}

/// One observation: a replay, a follow, a probe, a reconcile, an operator decision or
/// approval, a fence, a supersede.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    /// When.
    pub at: String,
    /// `probe`, `reconcile`, `operator <name>`, `fence`, `supersede`.
    pub what: String,
    /// What it found or decided.
    pub found: String,
    /// What it did to the state, in words: `settled`, `reopened: ...`, `left unsettled:
    /// ...`, `no change: ...`, or an observation's own words.
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
            Event::Observed {
                kind,
                reading,
                effect,
            } => {
                // The observation says its own effect, in words.
                out.push(Observation {
                    at: e.at.clone(),
                    what: kind.as_str().replace('_', " "),
                    found: reading.clone(),
                    changed: effect.clone(),
                });
                continue;
            }
            Event::Approved { by, note, key, .. } => {
                let what = match key {
                    Some(key) => format!("signed approval by {by} (key {key})"),
                    None => format!("approval by {by}"),
                };
                out.push(Observation {
                    at: e.at.clone(),
                    what,
                    found: note.clone(),
                    changed: "no change to the outcome: it let the attempt that follows run"
                        .to_owned(),
                });
                continue;
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
                let mut f = result.as_str().to_owned();
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
            (false, true) => "reopened: the outcome is open again",
            (true, true) => "left unsettled: evidence for the verdict or reconcile that follows",
            (false, false) => "no change: already settled",
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

/// One contradiction between evidence (docs/ledger.md#contradictions), as `show` lists it.
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
    /// What the disagreement most likely means, in words.
    pub why: String,
}

/// Why evidence may disagree with what the ledger held: an operator decision taken while
/// the host could not be reached is the honest case (the command may still have been
/// running, and the later evidence is what happened); otherwise nothing opmark did
/// explains it.
fn why_contradicted(events: &[StoredEvent], before_seq: u64) -> String {
    let decided_unreached = events
        .iter()
        .take_while(|e| e.seq < before_seq)
        .collect::<Vec<_>>()
        .windows(2)
        .any(|pair| {
            matches!(
                (&pair[0].event, &pair[1].event),
                (
                    Event::Probed {
                        state: crate::ledger::ProbeState::Unreachable,
                        detail,
                        ..
                    },
                    Event::OperatorDecision { .. },
                ) if detail.starts_with("opmark resolve")
            )
        });
    if decided_unreached {
        "an operator decided while the host could not be reached, so the command may still have been running then; the later evidence from the host is what happened. Check the host and its effects".to_owned()
    } else {
        "nothing opmark recorded explains it: evidence was edited, or something ran outside opmark. Check the host".to_owned()
    }
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
                why: why_contradicted(events, e.seq),
            }),
            _ => None,
        })
        .collect()
}

fn millis_between(from: &str, to: &str) -> Option<u64> {
    let d = parse_at(to)? - parse_at(from)?;
    u64::try_from(d.whole_milliseconds()).ok()
}
