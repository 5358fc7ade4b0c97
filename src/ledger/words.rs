//! The ledger's words: the typed values of the event fields that used to be free strings
//! (`Reconciled.decision`, `OperatorDecision.decision`, `Probed.state`, a refused
//! boundary's reason) and of the projection's `state` column.
//!
//! Each serialises to exactly the word older opmark versions wrote, so stored events and
//! rows read back unchanged and the hash chain (which covers the stored JSON text, never a
//! re-serialisation) keeps verifying. Old spellings still read (`not-applied` is
//! [`Decision::NotApplied`]); a word this version does not know reads as `Other` and is
//! written back as it was, so a newer opmark's events never break an older one's reads.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::vocab::{Boundary, Verdict};

/// Declares a word enum: known variants with their serialised names (plus spellings that
/// also read as them), and `Other(String)` for anything else.
macro_rules! words {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A word this version does not know, kept as it was written.
            Other(String),
        }

        impl $name {
            /// The serialised word.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $word, )+
                    $name::Other(s) => s,
                }
            }

            /// Every known variant, for tests and help texts.
            pub const KNOWN: &'static [$name] = &[$( $name::$variant ),+];
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $( $word $(| $alias)* => $name::$variant, )+
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Ok($name::from(s.as_ref()))
            }
        }
    };
}

words! {
    /// What a `reconcile` or an operator decided about an operation.
    Decision {
        /// An operator vouches that it ran (`resolve --as applied`).
        Applied = "applied",
        /// It did not run, and the marker is fenced. `not-applied` is an older spelling.
        NotApplied = "not_applied" | "not-applied",
        /// Nobody can tell; nothing runs under the op id again.
        Abandoned = "abandoned",
        /// The host's marker holds the exit record of one of our attempts.
        Completed = "completed",
        /// The exit was replayed from the host.
        Replayed = "replayed",
        /// The marker was found fenced.
        Fenced = "fenced",
        /// An operator approved a run policy blocked (`--approve`): settles nothing.
        Approved = "approved",
        /// The marker says the command is still running.
        StillRunning = "still_running",
        /// The marker was completed by an attempt this ledger never made.
        ForeignAttemptNeedsDecision = "foreign_attempt_needs_decision",
        /// The marker is interrupted: it may have had effects.
        InterruptedNeedsDecision = "interrupted_needs_decision",
        /// The marker is gone although an attempt of ours had reached it.
        MarkerMissingNeedsDecision = "marker_missing_needs_decision",
        /// The marker was absent but fencing it failed: a delayed attempt could arrive.
        AbsentFenceFailed = "absent_fence_failed",
        /// The host is not the machine, user or marker root the operation's attempts
        /// reached (another key among them): `run`'s `host_changed`, one word in every
        /// document. Ledgers written before it was one word say `host_key_mismatch`.
        HostChanged = "host_changed" | "host_key_mismatch",
        /// The host could not be reached (a report word; no event carries it).
        HostUnreachable = "host_unreachable",
        /// Another writer settled the operation first (a report word).
        AlreadySettled = "already_settled",
    }
}

impl Decision {
    /// Does this decision settle the operation's outcome? Anything else (`approved`, the
    /// `*_needs_decision` words, a word this version does not know) leaves it unresolved:
    /// a verdict never claims more than the evidence.
    pub fn settles(&self) -> bool {
        matches!(
            self,
            Decision::Applied
                | Decision::NotApplied
                | Decision::Abandoned
                | Decision::Completed
                | Decision::Replayed
                | Decision::Fenced
        )
    }

    /// Is this an operator's final word, which a later `run` answers without contacting
    /// the host (docs/guarantees.md#verdicts)?
    pub fn is_final_by_operator(&self) -> bool {
        matches!(
            self,
            Decision::Applied | Decision::NotApplied | Decision::Abandoned
        )
    }
}

words! {
    /// What a probe saw of the host marker (or that it saw nothing).
    ProbeState {
        /// No marker.
        Absent = "absent",
        /// Claimed and alive.
        Running = "running",
        /// The exit record exists.
        Completed = "completed",
        /// Claimed, process gone without an exit record.
        Interrupted = "interrupted",
        /// Tombstoned.
        Fenced = "fenced",
        /// The host could not be reached or the reply was lost.
        Unreachable = "unreachable",
    }
}

words! {
    /// What kind of observation a rerun (or another later look) made of an operation:
    /// evidence read, never an execution try (docs/ledger.md#observations).
    ObservationKind {
        /// The ledger already held the exit; the host marker was read (or found gone) to
        /// replay it.
        ReplayFromLedger = "replay_from_ledger",
        /// The host marker held the exit of an attempt this invocation did not make.
        ReplayFromHost = "replay_from_host",
        /// Another attempt held the claim and its running command was followed.
        Follow = "follow",
        /// A probe of the marker.
        Probe = "probe",
        /// `opmark reconcile` read the marker.
        Reconcile = "reconcile",
    }
}

impl ProbeState {
    /// Did the probe find a claim of the op id (running, completed or interrupted)?
    pub fn shows_claim(&self) -> bool {
        matches!(
            self,
            ProbeState::Running | ProbeState::Completed | ProbeState::Interrupted
        )
    }
}

words! {
    /// What the host's shim did for `opmark cancel`, as the ledger stores it (a
    /// `cancelled` event): the cancel frame's outcome, with a fence's earlier state.
    CancelResult {
        /// Signalled; the exit record (marked cancelled) is down.
        Cancelled = "cancelled",
        /// The exit record already existed: nothing was signalled.
        AlreadyCompleted = "already_completed",
        /// The marker was already fenced: nothing changed.
        AlreadyFenced = "already_fenced",
        /// An absent op id, fenced: nothing can run under it.
        FencedAbsent = "fenced:absent",
        /// A claim whose command never started, fenced by taking its start gate.
        FencedNotStarted = "fenced:not_started",
        /// An interrupted claim, fenced: it may have had effects.
        FencedInterrupted = "fenced:interrupted",
        /// Signals did not stop it in time.
        StillRunning = "still_running",
        /// The cancel's answer was lost: the TERM may have gone out.
        Unknown = "unknown",
    }
}

impl CancelResult {
    /// Does this result settle the operation's outcome? Yes when the exit record is down
    /// or the op id was fenced before anything could run; a fenced interrupted claim may
    /// have had effects, so it settles nothing.
    pub fn settles(&self) -> bool {
        matches!(
            self,
            CancelResult::Cancelled | CancelResult::FencedAbsent | CancelResult::FencedNotStarted
        )
    }

    /// Did the cancel change the host (killed the command, or fenced the op id)? The
    /// "already ..." results are observations.
    pub fn changed_the_host(&self) -> bool {
        matches!(
            self,
            CancelResult::Cancelled
                | CancelResult::FencedAbsent
                | CancelResult::FencedNotStarted
                | CancelResult::FencedInterrupted
        ) || matches!(self, CancelResult::Other(w) if w.starts_with("fenced:"))
    }
}

impl From<&crate::shim::CancelOutcome> for CancelResult {
    fn from(outcome: &crate::shim::CancelOutcome) -> Self {
        match outcome {
            crate::shim::CancelOutcome::Fenced { was } => {
                CancelResult::from(format!("fenced:{was}").as_str())
            }
            other => CancelResult::from(other.as_str()),
        }
    }
}

impl From<crate::shim::MarkerState> for ProbeState {
    fn from(m: crate::shim::MarkerState) -> Self {
        ProbeState::from(m.as_str())
    }
}

words! {
    /// Why an attempt was refused (a `refused` boundary), as the ledger stores it: the
    /// word of the shim's refusal (`shim::Refusal`, the whole frame with its marker), or
    /// opmark's own reason for not claiming. Named apart from the frame it summarises.
    RefusalWord {
        /// Another attempt holds the claim and runs.
        Running = "running",
        /// The exit record is there.
        Completed = "completed",
        /// A claim whose process is gone.
        Interrupted = "interrupted",
        /// The marker binds the op id to another intent.
        Conflict = "conflict",
        /// The marker is fenced.
        Fenced = "fenced",
        /// The reply carried an exit record as well as the refusal.
        AlreadyCompleted = "already_completed",
        /// Not claimed: the ledger already holds the exit, so opmark only probes.
        LedgerHoldsExit = "ledger_holds_exit",
    }
}

impl RefusalWord {
    /// Does this refusal prove a claim of the op id existed on the host (so a marker
    /// found absent later was removed, not never made)?
    pub fn proves_claim(&self) -> bool {
        matches!(
            self,
            RefusalWord::Running
                | RefusalWord::Completed
                | RefusalWord::Interrupted
                | RefusalWord::Conflict
                | RefusalWord::AlreadyCompleted
        )
    }

    /// The refusal of an event written before refused boundaries carried their reason:
    /// older opmark put the shim's reason (or its own sentence) first in the detail.
    pub fn from_legacy_detail(detail: &str) -> RefusalWord {
        match detail.split([' ', ':', ',']).next().unwrap_or("") {
            "already" => RefusalWord::AlreadyCompleted,
            "not" => RefusalWord::LedgerHoldsExit,
            word => RefusalWord::from(word),
        }
    }
}

/// An operation's lifecycle state, the projection's `state` column.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OpState {
    /// Intended, nothing sent.
    Intended,
    /// An attempt was dispatched.
    Dispatched,
    /// An attempt reached this boundary: `not_sent`, `sent_no_response` or `started`
    /// (build with [`OpState::boundary`], which names the other two by their own variant).
    Boundary(Boundary),
    /// An exit status arrived (`exit_received`; also a boundary name).
    ExitReceived,
    /// An interrupted claim was moved aside.
    Superseded,
    /// The marker was fenced.
    Fenced,
    /// Refused: the `refused` boundary or the `refused` verdict (one word in the column,
    /// so one state).
    Refused,
    /// The last verdict (build with [`OpState::verdict`]).
    Verdict(Verdict),
    /// `reconciled:<decision>`.
    Reconciled(Decision),
    /// `resolved:<decision>`.
    Resolved(Decision),
    /// `run` was interrupted by a signal.
    ClientInterrupted,
    /// Stopped or fenced by `opmark cancel`.
    Cancelled,
    /// A state this version does not know, kept as it was written.
    Other(String),
}

impl OpState {
    /// The state after an attempt reached `b`.
    pub fn boundary(b: Boundary) -> OpState {
        match b {
            Boundary::ExitReceived => OpState::ExitReceived,
            Boundary::Refused => OpState::Refused,
            b => OpState::Boundary(b),
        }
    }

    /// The state after verdict `v`.
    pub fn verdict(v: Verdict) -> OpState {
        match v {
            Verdict::Refused => OpState::Refused,
            v => OpState::Verdict(v),
        }
    }
}

impl fmt::Display for OpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpState::Intended => f.write_str("intended"),
            OpState::Dispatched => f.write_str("dispatched"),
            OpState::Boundary(b) => f.write_str(b.as_str()),
            OpState::ExitReceived => f.write_str("exit_received"),
            OpState::Superseded => f.write_str("superseded"),
            OpState::Fenced => f.write_str("fenced"),
            OpState::Refused => f.write_str("refused"),
            OpState::Verdict(v) => f.write_str(v.as_str()),
            OpState::Reconciled(d) => write!(f, "reconciled:{d}"),
            OpState::Resolved(d) => write!(f, "resolved:{d}"),
            OpState::ClientInterrupted => f.write_str("client_interrupted"),
            OpState::Cancelled => f.write_str("cancelled"),
            OpState::Other(s) => f.write_str(s),
        }
    }
}

impl FromStr for OpState {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "intended" => OpState::Intended,
            "dispatched" => OpState::Dispatched,
            "exit_received" => OpState::ExitReceived,
            "superseded" => OpState::Superseded,
            "fenced" => OpState::Fenced,
            "refused" => OpState::Refused,
            "client_interrupted" => OpState::ClientInterrupted,
            "cancelled" => OpState::Cancelled,
            _ => {
                if let Some(d) = s.strip_prefix("reconciled:") {
                    OpState::Reconciled(Decision::from(d))
                } else if let Some(d) = s.strip_prefix("resolved:") {
                    OpState::Resolved(Decision::from(d))
                } else if let Ok(b) = s.parse::<Boundary>() {
                    OpState::Boundary(b)
                } else if let Ok(v) = s.parse::<Verdict>() {
                    OpState::Verdict(v)
                } else {
                    OpState::Other(s.to_owned())
                }
            }
        })
    }
}

impl Serialize for OpState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    fn read<T: for<'de> Deserialize<'de>>(word: &str) -> T {
        serde_json::from_str(&format!("\"{word}\"")).unwrap()
    }

    /// The stored words are a contract with every ledger already written: these names
    /// must never change.
    #[test]
    fn decision_names_are_pinned() {
        let names: Vec<&str> = Decision::KNOWN.iter().map(Decision::as_str).collect();
        assert_eq!(
            names,
            [
                "applied",
                "not_applied",
                "abandoned",
                "completed",
                "replayed",
                "fenced",
                "approved",
                "still_running",
                "foreign_attempt_needs_decision",
                "interrupted_needs_decision",
                "marker_missing_needs_decision",
                "absent_fence_failed",
                "host_changed",
                "host_unreachable",
                "already_settled",
            ]
        );
        for d in Decision::KNOWN {
            assert_eq!(json(d), format!("\"{}\"", d.as_str()));
            assert_eq!(&read::<Decision>(d.as_str()), d);
        }
    }

    #[test]
    fn the_old_spelling_of_not_applied_reads_and_settles() {
        let d: Decision = read("not-applied");
        assert_eq!(d, Decision::NotApplied);
        assert!(d.settles() && d.is_final_by_operator());
    }

    #[test]
    fn a_host_key_mismatch_an_older_reconcile_recorded_reads_as_host_changed_and_stays_open() {
        let d: Decision = read("host_key_mismatch");
        assert_eq!(d, Decision::HostChanged);
        assert_eq!(json(&d), "\"host_changed\"");
        assert!(!d.settles());
    }

    #[test]
    fn only_proven_decisions_settle() {
        let settling: Vec<&str> = Decision::KNOWN
            .iter()
            .filter(|d| d.settles())
            .map(Decision::as_str)
            .collect();
        assert_eq!(
            settling,
            [
                "applied",
                "not_applied",
                "abandoned",
                "completed",
                "replayed",
                "fenced"
            ]
        );
        let unknown: Decision = read("something_new");
        assert_eq!(unknown, Decision::Other("something_new".into()));
        assert!(!unknown.settles());
        assert_eq!(json(&unknown), "\"something_new\"", "written back as read");
    }

    #[test]
    fn probe_state_names_are_pinned() {
        let names: Vec<&str> = ProbeState::KNOWN.iter().map(ProbeState::as_str).collect();
        assert_eq!(
            names,
            [
                "absent",
                "running",
                "completed",
                "interrupted",
                "fenced",
                "unreachable"
            ]
        );
        for m in [
            crate::shim::MarkerState::Absent,
            crate::shim::MarkerState::Running,
            crate::shim::MarkerState::Completed,
            crate::shim::MarkerState::Interrupted,
            crate::shim::MarkerState::Fenced,
        ] {
            assert_eq!(ProbeState::from(m).as_str(), m.as_str());
            assert!(!matches!(ProbeState::from(m), ProbeState::Other(_)));
        }
    }

    /// Every cancel frame the shim sends is stored as a known word, the words that
    /// ledgers already hold read back as the same results, and only what the evidence
    /// proves settles the operation.
    #[test]
    fn every_cancel_outcome_is_stored_as_a_known_word_and_only_proofs_settle() {
        use crate::shim::CancelOutcome as O;
        let fenced = |was: &str| O::Fenced { was: was.into() };
        let stored: Vec<String> = [
            O::Cancelled,
            O::AlreadyCompleted,
            O::AlreadyFenced,
            fenced("absent"),
            fenced("not_started"),
            fenced("interrupted"),
            O::Still {
                state: "running".into(),
            },
        ]
        .iter()
        .map(|o| {
            let r = CancelResult::from(o);
            assert!(!matches!(r, CancelResult::Other(_)), "{o:?} -> {r:?}");
            r.as_str().to_owned()
        })
        .collect();
        assert_eq!(
            stored,
            [
                "cancelled",
                "already_completed",
                "already_fenced",
                "fenced:absent",
                "fenced:not_started",
                "fenced:interrupted",
                "still_running"
            ]
        );
        let settling: Vec<&str> = CancelResult::KNOWN
            .iter()
            .filter(|r| r.settles())
            .map(CancelResult::as_str)
            .collect();
        assert_eq!(
            settling,
            ["cancelled", "fenced:absent", "fenced:not_started"]
        );
        assert!(CancelResult::FencedInterrupted.changed_the_host());
        assert!(!CancelResult::AlreadyCompleted.changed_the_host());
    }

    #[test]
    fn refusal_names_are_pinned_and_old_details_still_read() {
        let names: Vec<&str> = RefusalWord::KNOWN.iter().map(RefusalWord::as_str).collect();
        assert_eq!(
            names,
            [
                "running",
                "completed",
                "interrupted",
                "conflict",
                "fenced",
                "already_completed",
                "ledger_holds_exit"
            ]
        );
        // The details older opmark wrote on refused boundaries.
        for (detail, want, proves) in [
            ("running", RefusalWord::Running, true),
            (
                "conflict: the marker binds another intent",
                RefusalWord::Conflict,
                true,
            ),
            (
                "already completed on the host",
                RefusalWord::AlreadyCompleted,
                true,
            ),
            (
                "not claimed: the ledger already holds this operation's exit; probing to replay",
                RefusalWord::LedgerHoldsExit,
                false,
            ),
            ("fenced", RefusalWord::Fenced, false),
            ("busy", RefusalWord::Other("busy".into()), false),
        ] {
            let got = RefusalWord::from_legacy_detail(detail);
            assert_eq!(got, want, "{detail}");
            assert_eq!(got.proves_claim(), proves, "{detail}");
        }
    }

    #[test]
    fn op_states_round_trip_through_their_column_text() {
        let states = [
            OpState::Intended,
            OpState::Dispatched,
            OpState::Boundary(Boundary::Started),
            OpState::Boundary(Boundary::SentNoResponse),
            OpState::ExitReceived,
            OpState::Superseded,
            OpState::Fenced,
            OpState::Verdict(Verdict::Completed),
            OpState::Verdict(Verdict::Indeterminate),
            OpState::Reconciled(Decision::NotApplied),
            OpState::Resolved(Decision::Abandoned),
            OpState::ClientInterrupted,
            OpState::Cancelled,
        ];
        let texts: Vec<String> = states.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "intended",
                "dispatched",
                "started",
                "sent_no_response",
                "exit_received",
                "superseded",
                "fenced",
                "completed",
                "indeterminate",
                "reconciled:not_applied",
                "resolved:abandoned",
                "client_interrupted",
                "cancelled",
            ]
        );
        for (s, t) in states.iter().zip(&texts) {
            assert_eq!(&t.parse::<OpState>().unwrap(), s);
            assert_eq!(json(s), format!("\"{t}\""));
        }
        // What the fold builds reads back as itself, for every boundary and verdict.
        let all_boundaries = [
            Boundary::NotSent,
            Boundary::SentNoResponse,
            Boundary::Started,
            Boundary::ExitReceived,
            Boundary::Refused,
        ];
        for b in all_boundaries {
            let s = OpState::boundary(b);
            assert_eq!(s.to_string(), b.as_str());
            assert_eq!(s.to_string().parse::<OpState>().unwrap(), s);
        }
        for v in [
            Verdict::Completed,
            Verdict::Replayed,
            Verdict::InProgress,
            Verdict::NotApplied,
            Verdict::Indeterminate,
            Verdict::Conflict,
            Verdict::Blocked,
            Verdict::Refused,
        ] {
            let s = OpState::verdict(v);
            assert_eq!(s.to_string(), v.as_str());
            assert_eq!(s.to_string().parse::<OpState>().unwrap(), s);
        }
        // A row an older opmark wrote with the old spelling equals its replay.
        assert_eq!(
            "resolved:not-applied".parse::<OpState>().unwrap(),
            OpState::Resolved(Decision::NotApplied)
        );
        assert_eq!(
            "something".parse::<OpState>().unwrap(),
            OpState::Other("something".into())
        );
    }
}
