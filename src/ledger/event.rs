//! The ledger's events: what happened to an operation, in the vocabulary of docs/guarantees.md#vocabulary.
//!
//! Events are the source of truth; they are stored as serde-tagged JSON (`"kind"`), and
//! the stored JSON text is what the hash chain covers.

use serde::{Deserialize, Serialize};

use super::error::LedgerError;
use super::words::{CancelResult, Decision, ObservationKind, ProbeState, RefusalWord};
use crate::family::Family;
use crate::redact::Redactor;
use crate::ssh::Route;
use crate::vocab::{Boundary, RetryReason, Verdict};

/// One thing that happened to an operation (or to a session working on it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// An opmark process started working (recorded under the operation it works on).
    SessionStarted {
        /// Session id (`OPMARK_SESSION` or minted).
        session: String,
        /// The opmark process id.
        pid: u32,
        /// opmark's version.
        version: String,
    },
    /// The operation was intended: what it means to do and why policy allows it.
    Intended {
        /// Session that intends it.
        session: String,
        /// Family decided by policy (and `--class`).
        family: Family,
        /// The command, redacted, for people.
        display: String,
        /// Ledger fingerprint (HMAC) of the intent.
        fingerprint: String,
        /// The policy rule that decided the family.
        rule: String,
        /// The names of the command's secrets (`--secret`), never their values. Left out
        /// of the payload when there are none, so earlier events keep their bytes.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        secrets: Vec<String>,
        /// `--become USER`: the user the command runs as through sudo. Left out when none.
        #[serde(default, rename = "become", skip_serializing_if = "Option::is_none")]
        become_user: Option<String>,
        /// `--lock`: the host locks the command holds while it runs (`NAME` or `NAME:N`),
        /// with the intent but not part of its fingerprint (docs/commands.md#host-locks-commands-that-must-not-overlap).
        /// Left out when none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        locks: Vec<String>,
    },
    /// An attempt is about to leave this machine.
    AttemptDispatched {
        /// Fresh id of this attempt.
        attempt_id: String,
        /// 1 for the first attempt of the operation, then 2, 3, ...
        number: u32,
        /// The attempt this one retries, if any.
        parent: Option<String>,
        /// Why this attempt was made.
        reason: RetryReason,
    },
    /// How far an attempt got, as observed.
    BoundaryReached {
        /// The attempt.
        attempt_id: String,
        /// The boundary.
        boundary: Boundary,
        /// What was observed (redacted).
        detail: String,
        /// Why it was refused (`refused` boundaries). Absent from other boundaries and from
        /// events older opmark wrote, whose detail began with the reason instead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refusal: Option<RefusalWord>,
    },
    /// The exit status of an attempt arrived.
    ExitReceived {
        /// The attempt.
        attempt_id: String,
        /// Exit code, when the command exited.
        exit_code: Option<i32>,
        /// Signal name, when it was killed.
        signal: Option<String>,
        /// Killed by opmark's `--timeout`.
        timed_out: bool,
        /// Bytes of stdout seen.
        stdout_bytes: u64,
        /// Bytes of stderr seen.
        stderr_bytes: u64,
        /// SHA-256 hex of stdout (never the output itself).
        stdout_sha256: String,
        /// SHA-256 hex of stderr.
        stderr_sha256: String,
    },
    /// A probe looked at the host marker (an observation, not an attempt).
    Probed {
        /// The attempt the probe was about, if any.
        attempt_id: Option<String>,
        /// What the probe saw: a marker state, or `unreachable`.
        state: ProbeState,
        /// Exit code recorded in the marker.
        exit_code: Option<i32>,
        /// What else was seen (redacted).
        detail: String,
        /// What the marker's claim record said, when the probe saw a claimed marker
        /// (absent from older events and from probes that did not reach a marker).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        claim: Option<ClaimSeen>,
    },
    /// A later look at the operation answered from evidence (a replay, a follow of a
    /// running command): an observation, never an attempt (docs/ledger.md#observations).
    Observed {
        /// What kind of observation. Stored as `observation`: `kind` is the event's tag.
        #[serde(rename = "observation")]
        kind: ObservationKind,
        /// What it read, in words (redacted): which evidence, whose attempt, what exit.
        reading: String,
        /// What it did to the operation's state, in words (redacted): "settled as
        /// completed exit 3", "left unsettled: still running", ...
        effect: String,
    },
    /// An approval (`--approve NOTE`) was used to let something run (docs/decisions.md#approvals).
    /// When: the event's own time.
    Approved {
        /// Who approved: the user (`$USER`, else the uid) and the session; for a signed
        /// approval, the signer's principal.
        by: String,
        /// The note given with `--approve`, or signed into the approval (redacted).
        note: String,
        /// A signed approval (docs/trust.md#the-approval-flow): the signing key's
        /// `SHA256:` fingerprint. Absent for `--approve NOTE`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// A signed approval's nonce: recorded with the attempt it lets run, so the same
        /// approval never lets another.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nonce: Option<String>,
    },
    /// `reconcile` settled (or failed to settle) the operation.
    Reconciled {
        /// The decision; see [`Decision::settles`].
        decision: Decision,
        /// Why (redacted).
        detail: String,
    },
    /// An operator decided (`resolve`, `--approve`).
    OperatorDecision {
        /// Who decided.
        by: String,
        /// applied, not_applied, abandoned, approved, ...
        decision: Decision,
        /// Why (redacted).
        note: String,
        /// `resolve --as applied --exit N`: the exit status the operator vouches for.
        /// Absent from older events (and from other decisions), so their JSON is unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// The host marker was fenced: the op id can never be claimed again.
    Fenced {
        /// What was done (redacted).
        detail: String,
    },
    /// An interrupted claim was moved aside so the operation can be claimed again.
    Superseded {
        /// The attempt whose claim was superseded.
        attempt_id: String,
        /// Why (redacted).
        note: String,
    },
    /// An attempt's connection was made, before its request left: how the host was
    /// reached and which host key it presented (docs/guarantees.md#host-identity). Later probes, reconciles
    /// and fences go the same way and refuse a host presenting another key.
    Connected {
        /// The attempt.
        attempt_id: String,
        /// How the host was reached (paths and names only, nothing secret).
        route: Route,
        /// The host key fingerprint accepted, as OpenSSH prints it (`SHA256:...`).
        host_key: String,
    },
    /// The host's shim reported the id of the marker root an attempt reached (docs/guarantees.md#evidence-identity):
    /// the store of evidence its claim lives in. Later calls for the operation name it,
    /// and the shim refuses when its root has another id.
    MarkerRoot {
        /// The attempt.
        attempt_id: String,
        /// The root's id, 32 hex digits.
        root_id: String,
    },
    /// Two pieces of evidence disagree: a later observation says something other than the
    /// settled truth the ledger holds (docs/ledger.md#contradictions). Recorded by the ledger itself right
    /// after the disagreeing event; the projection keeps the first settled truth.
    Contradiction {
        /// Kind of the event that brought the disagreeing evidence (`probed`, ...).
        source: String,
        /// Sequence number of that event.
        evidence_seq: u64,
        /// What the ledger held.
        expected: Observed,
        /// What the evidence said.
        seen: Observed,
    },
    /// The verdict given to the caller.
    Verdict {
        /// The attempt the verdict is about, if one was made.
        attempt_id: Option<String>,
        /// The verdict.
        verdict: Verdict,
        /// The exit code, when known.
        exit_code: Option<i32>,
        /// Why (redacted).
        reason: String,
    },
    /// `opmark run` was interrupted by a signal (SIGINT, SIGTERM, SIGHUP) and stopped
    /// following the operation; the command, if it started, keeps running on the host.
    ClientInterrupted {
        /// The attempt in hand when the signal came, if one was made.
        attempt_id: Option<String>,
        /// How far that attempt had got (`not_sent`: nothing left this machine).
        boundary: Boundary,
        /// `INT`, `TERM` or `HUP`.
        signal: String,
        /// What it means for the operation (redacted).
        detail: String,
    },
    /// `opmark cancel` stopped the operation on its host (or found nothing to stop).
    Cancelled {
        /// Who cancelled (`--by`, else `$USER`).
        by: String,
        /// Time between TERM and KILL, in milliseconds.
        grace_ms: u64,
        /// What the host shim did: `cancelled` (signalled; the exit record is down),
        /// `already_completed`, `already_fenced`, `fenced:<was>` (`absent`, `not_started`,
        /// `interrupted`), `still_running`, or `unknown` when its answer was lost.
        result: CancelResult,
        /// The exit code the host recorded, when there is one.
        exit_code: Option<i32>,
        /// The marker afterwards, in words (redacted).
        detail: String,
    },
    /// This operation is linked to another on the same host (docs/guarantees.md#repetitions):
    /// a declared repetition (`--repeats`) or an amendment (`--amends`), recorded under
    /// both operations (the reverse word under the other one) so `show` displays it on
    /// both. A link changes neither operation's state or outcome.
    Linked {
        /// What this operation is to the other.
        relation: LinkRelation,
        /// The other operation's id.
        other_op: String,
        /// The other operation's host (as the ledger names it).
        other_host: String,
    },
    /// A repetition was detected before dispatch (docs/guarantees.md#repetitions): the same
    /// intent ran on the same host under another op id within the family's window. With
    /// `action` `block` nothing was sent; with `warn` the run went on.
    RepetitionHeld {
        /// The earlier operation's id.
        earlier_op: String,
        /// Its state when seen (a ledger state, or a host marker state).
        earlier_state: String,
        /// When it was intended (ledger) or claimed (host), UTC RFC 3339.
        earlier_at: String,
        /// How its host was reached, in words.
        route: String,
        /// Where it was seen: `ledger` or `host` (the shim's fingerprint index).
        seen_in: String,
        /// What the policy did: `block` or `warn`.
        action: String,
    },
}

/// How one operation relates to another ([`Event::Linked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkRelation {
    /// This operation deliberately repeats the other (`--repeats`).
    Repeats,
    /// The other operation deliberately repeats this one.
    RepeatedBy,
    /// This operation replaces the other's intent (`--amends`).
    Amends,
    /// The other operation replaces this one's intent.
    AmendedBy,
}

impl LinkRelation {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkRelation::Repeats => "repeats",
            LinkRelation::RepeatedBy => "repeated_by",
            LinkRelation::Amends => "amends",
            LinkRelation::AmendedBy => "amended_by",
        }
    }

    /// The word recorded under the other operation.
    pub fn reverse(self) -> LinkRelation {
        match self {
            LinkRelation::Repeats => LinkRelation::RepeatedBy,
            LinkRelation::RepeatedBy => LinkRelation::Repeats,
            LinkRelation::Amends => LinkRelation::AmendedBy,
            LinkRelation::AmendedBy => LinkRelation::Amends,
        }
    }
}

impl Event {
    /// The serde tag, also stored in its own column for queries.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionStarted { .. } => "session_started",
            Event::Intended { .. } => "intended",
            Event::AttemptDispatched { .. } => "attempt_dispatched",
            Event::BoundaryReached { .. } => "boundary_reached",
            Event::ExitReceived { .. } => "exit_received",
            Event::Probed { .. } => "probed",
            Event::Observed { .. } => "observed",
            Event::Approved { .. } => "approved",
            Event::Reconciled { .. } => "reconciled",
            Event::OperatorDecision { .. } => "operator_decision",
            Event::Fenced { .. } => "fenced",
            Event::Superseded { .. } => "superseded",
            Event::Connected { .. } => "connected",
            Event::MarkerRoot { .. } => "marker_root",
            Event::Contradiction { .. } => "contradiction",
            Event::Verdict { .. } => "verdict",
            Event::ClientInterrupted { .. } => "client_interrupted",
            Event::Cancelled { .. } => "cancelled",
            Event::Linked { .. } => "linked",
            Event::RepetitionHeld { .. } => "repetition_held",
        }
    }

    /// The attempt this event is about, if any.
    pub fn attempt_id(&self) -> Option<&str> {
        match self {
            Event::AttemptDispatched { attempt_id, .. }
            | Event::BoundaryReached { attempt_id, .. }
            | Event::ExitReceived { attempt_id, .. }
            | Event::Superseded { attempt_id, .. }
            | Event::Connected { attempt_id, .. }
            | Event::MarkerRoot { attempt_id, .. } => Some(attempt_id),
            Event::Probed { attempt_id, .. }
            | Event::Verdict { attempt_id, .. }
            | Event::ClientInterrupted { attempt_id, .. } => attempt_id.as_deref(),
            _ => None,
        }
    }

    /// A copy with every free-text field passed through `redactor`. The ledger applies
    /// this itself before storing, whatever the caller already did.
    pub fn redacted(&self, redactor: &Redactor) -> Event {
        let r = |s: &String| redactor.redact_owned(s);
        let mut e = self.clone();
        match &mut e {
            Event::SessionStarted {
                session, version, ..
            } => {
                *session = r(session);
                *version = r(version);
            }
            Event::Intended {
                session,
                display,
                rule,
                ..
            } => {
                *session = r(session);
                *display = r(display);
                *rule = r(rule);
            }
            Event::AttemptDispatched { .. }
            | Event::Connected { .. }
            | Event::MarkerRoot { .. }
            | Event::Linked { .. } => {}
            Event::RepetitionHeld {
                earlier_state,
                route,
                ..
            } => {
                *earlier_state = r(earlier_state);
                *route = r(route);
            }
            Event::BoundaryReached {
                detail, refusal, ..
            } => {
                *detail = r(detail);
                if let Some(RefusalWord::Other(s)) = refusal {
                    *s = r(s);
                }
            }
            Event::Fenced { detail } => *detail = r(detail),
            Event::ExitReceived { signal, .. } => {
                if let Some(s) = signal {
                    *s = r(s);
                }
            }
            Event::Probed { state, detail, .. } => {
                if let ProbeState::Other(s) = state {
                    *s = r(s);
                }
                *detail = r(detail);
            }
            Event::Observed {
                kind,
                reading,
                effect,
            } => {
                if let ObservationKind::Other(w) = kind {
                    *kind = ObservationKind::Other(r(w));
                }
                *reading = r(reading);
                *effect = r(effect);
            }
            Event::Approved { by, note, .. } => {
                *by = r(by);
                *note = r(note);
            }
            Event::Reconciled { decision, detail } => {
                redact_decision(decision, redactor);
                *detail = r(detail);
            }
            Event::OperatorDecision {
                by, decision, note, ..
            } => {
                *by = r(by);
                redact_decision(decision, redactor);
                *note = r(note);
            }
            Event::Superseded { note, .. } => *note = r(note),
            Event::Contradiction {
                source,
                expected,
                seen,
                ..
            } => {
                *source = r(source);
                for o in [expected, seen] {
                    o.state = r(&o.state);
                    if let Some(a) = &mut o.attempt {
                        *a = r(a);
                    }
                }
            }
            Event::Verdict { reason, .. } => *reason = r(reason),
            Event::ClientInterrupted { signal, detail, .. } => {
                *signal = r(signal);
                *detail = r(detail);
            }
            Event::Cancelled {
                by, result, detail, ..
            } => {
                *by = r(by);
                // Only a word this version does not know can hold free text.
                if let CancelResult::Other(w) = result {
                    *result = CancelResult::Other(r(w));
                }
                *detail = r(detail);
            }
        }
        e
    }
}

/// Only a word this version does not know can hold free text.
fn redact_decision(decision: &mut Decision, redactor: &Redactor) {
    if let Decision::Other(s) = decision {
        *s = redactor.redact_owned(s);
    }
}

/// What a probe saw of a marker's claim record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimSeen {
    /// The attempt the claim record names; `None`: the marker has no claim record.
    pub attempt: Option<String>,
}

/// One side of a [`Event::Contradiction`]: a state and exit code as some evidence has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// `completed` (the ledger's settled truth), or the marker state a probe reported.
    pub state: String,
    /// The exit code, when the evidence holds one.
    pub exit_code: Option<i32>,
    /// The attempt it names, when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
}

impl std::fmt::Display for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.state)?;
        if let Some(code) = self.exit_code {
            write!(f, " exit {code}")?;
        }
        if let Some(attempt) = &self.attempt {
            write!(f, " (attempt {attempt})")?;
        }
        Ok(())
    }
}

/// An event as stored: its place in the chain and when it was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredEvent {
    /// Global sequence number (1, 2, 3, ... across all operations).
    pub seq: u64,
    /// Operation id.
    pub op_id: String,
    /// Host.
    pub host: String,
    /// UTC time it was recorded, RFC 3339 with microseconds.
    pub at: String,
    /// The event.
    pub event: Event,
    /// SHA-256 hex of the previous event (64 zeros for the first).
    pub prev_hash: String,
    /// SHA-256 hex of this event.
    pub hash: String,
}

/// An event from its stored payload; a payload that does not decode is named by its
/// sequence number only (never its content, which may hold a secret the redactor missed).
pub(crate) fn decode(seq: u64, payload: &str) -> Result<Event, LedgerError> {
    serde_json::from_str(payload).map_err(|e| LedgerError::Corrupt {
        seq,
        why: format!("{:?} at column {}", e.classify(), e.column()),
    })
}
