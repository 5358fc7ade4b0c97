//! The SPEC's words as types: attempt boundaries, verdicts, retry reasons.
//!
//! Shared by the shim parser, the ledger and the operation state machine so that the
//! code, the ledger and the docs say the same thing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::exit_code;

/// How far one attempt got, as the client actually observed it (SPEC section 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Boundary {
    /// Failed before the exec request left: resolve, connect, host key, auth.
    NotSent,
    /// The exec request was dispatched; no claim acknowledgement from the shim.
    SentNoResponse,
    /// The shim acknowledged the claim and started the command; no exit seen.
    Started,
    /// The exit status was received.
    ExitReceived,
    /// The shim refused: already claimed, fenced, conflict, bad input.
    Refused,
}

/// The answer of `opmark run` (SPEC section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// This invocation ran the command and received its exit status.
    Completed,
    /// The operation had already finished; its recorded result is returned.
    Replayed,
    /// An earlier attempt holds the claim and is still running.
    InProgress,
    /// Nothing ran and nothing can still run for this attempt.
    NotApplied,
    /// The command may have run; evidence cannot tell.
    Indeterminate,
    /// The op id is bound to a different fingerprint.
    Conflict,
    /// Policy needs a human decision (`--approve`).
    Blocked,
    /// Policy rejects the command, or the input is invalid; nothing was sent.
    Refused,
}

/// Why a later attempt was made; every attempt after the first names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryReason {
    /// The first attempt of an operation.
    FirstAttempt,
    /// A new `opmark run` of an op id that already has attempts (the caller retried).
    CallerRerun,
    /// The previous attempt never got a connection (boundary `not_sent`).
    ConnectionNotEstablished,
    /// The previous attempt was dispatched, the connection was lost, and a probe found
    /// the marker absent.
    ResponseLostAfterDispatch,
    /// The marker was interrupted and the family allows an automatic re-run.
    InterruptedRerun,
    /// An operator approved superseding an interrupted or blocked operation.
    OperatorApproved,
}

/// Why a verdict was reached, for machines (SPEC section 2): stable snake_case codes an
/// agent branches on together with [`ReasonCode::retryable`], never on prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// `completed`: this invocation ran the command and received its exit status.
    CommandExited,
    /// `replayed`: the host's marker held the recorded result.
    ReplayedFromHost,
    /// `replayed`: the ledger holds the exit, the host marker is gone (gc).
    ReplayedFromLedger,
    /// `in_progress`: an attempt holds the claim and is still running.
    StillRunning,
    /// `not_applied`: no connection could be made (refused, timed out, reset).
    ConnectFailed,
    /// `not_applied`: the host name does not resolve (ssh config, DNS).
    NameUnresolvable,
    /// `not_applied`: the host key is unknown, changed or revoked.
    HostKeyRejected,
    /// `not_applied`: every identity was refused.
    AuthRefused,
    /// `not_applied`: the operation was closed (its marker is fenced).
    Fenced,
    /// `indeterminate`: the marker is fenced, but its command had started before the
    /// fence (`opmark cancel` of an interrupted operation, or a forced operator fence):
    /// it may have had effects; nothing more can run under the op id.
    FencedAfterStart,
    /// `not_applied`: the host shim could not start the command (unusable marker root,
    /// missing tools); nothing ran.
    ShimCannotStart,
    /// `conflict`: the host's marker binds the op id to another intent.
    ConflictOnHost,
    /// `conflict`: the ledger binds the op id to another intent.
    ConflictInLedger,
    /// `refused`: the policy denies the command.
    PolicyDenied,
    /// `refused`: the input is invalid (op id, arguments); nothing was sent.
    InvalidInput,
    /// `blocked`: the policy needs `--approve NOTE`.
    ApprovalRequired,
    /// `indeterminate`: the claim was interrupted and the family is not re-run
    /// automatically.
    InterruptedNeedsApproval,
    /// `indeterminate`: dispatched, then the host could not be probed in time.
    UnreachableAfterDispatch,
    /// `indeterminate`: this attempt was not sent, an earlier one was and is unknown.
    EarlierDispatchUnknown,
    /// `indeterminate`: a retry was needed but the attempt budget is spent.
    AttemptBudgetSpent,
    /// `replayed`: an operator resolved the operation as applied; their word is final
    /// (exit status from `resolve --exit`, else unknown).
    ResolvedApplied,
    /// `not_applied`: an operator resolved the operation as not applied (fenced).
    ResolvedNotApplied,
    /// `not_applied`: an operator abandoned the operation; nothing runs under it again.
    ResolvedAbandoned,
    /// `indeterminate`: the host now presents another host key than the one the
    /// operation ran against: another machine (or a changed key); nothing concluded.
    HostKeyMismatch,
    /// `conflict`: the host or store of evidence reached now is not the one the
    /// operation's attempts reached (SPEC 17): another host key, another user, or another
    /// marker root id (wiped, rebuilt, another `$HOME`); nothing sent, nothing concluded.
    HostChanged,
    /// `in_progress` or `not_applied`: a signal (SIGINT, SIGTERM, SIGHUP) stopped this
    /// client; a command that started keeps running on the host, and a rerun with the
    /// same op id follows, replays or (when nothing was sent) runs it.
    ClientInterrupted,
    /// `not_applied` (the claim could not be written and was undone) or `indeterminate`
    /// (an interrupted claim could not be superseded): the host's marker root is out of
    /// space, inodes or quota. A human frees space; nothing is guessed meanwhile.
    HostDiskFull,
    /// `not_applied`: the channel closed before the shim's first line: the login shell
    /// or its startup files stopped it (a shell that cannot run `sh -c`, a `~/.bashrc`
    /// that exits); nothing was claimed.
    ShimDidNotStart,
    /// `not_applied`: the host has no util-linux `setsid -f` (busybox's has no `-f`),
    /// which the shim needs to detach the command; nothing ran.
    HostMissingSetsid,
    /// `not_applied` (fleet runs): this host was never dispatched because `--max-failures`
    /// hosts had already ended badly; nothing was sent to it.
    NotDispatchedMaxFailures,
    /// `not_applied` (fleet runs): this host was never dispatched because an earlier
    /// `--serial` batch did not complete cleanly; nothing was sent to it.
    NotDispatchedBatchFailed,
    /// `in_progress`: `--detach`: the shim acknowledged the claim and the command runs
    /// on; `opmark run` with the same op id follows or replays it.
    Detached,
}

impl ReasonCode {
    /// True only when rerunning with the same op id may change the outcome without a
    /// human: a host that may come back, a claim still running, a budget renewed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ReasonCode::StillRunning
                | ReasonCode::ConnectFailed
                | ReasonCode::UnreachableAfterDispatch
                | ReasonCode::EarlierDispatchUnknown
                | ReasonCode::AttemptBudgetSpent
                | ReasonCode::ClientInterrupted
                | ReasonCode::NotDispatchedMaxFailures
                | ReasonCode::NotDispatchedBatchFailed
                | ReasonCode::Detached
        )
    }
}

macro_rules! names {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$(<$ty>::$variant),+];

            /// The snake_case name used in JSON, the ledger and messages.
            pub fn as_str(self) -> &'static str {
                match self { $(<$ty>::$variant => $name),+ }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok(<$ty>::$variant),)+
                    _ => Err(format!("unknown {} `{s}`", stringify!($ty))),
                }
            }
        }
    };
}

names!(Boundary {
    NotSent => "not_sent",
    SentNoResponse => "sent_no_response",
    Started => "started",
    ExitReceived => "exit_received",
    Refused => "refused",
});

names!(Verdict {
    Completed => "completed",
    Replayed => "replayed",
    InProgress => "in_progress",
    NotApplied => "not_applied",
    Indeterminate => "indeterminate",
    Conflict => "conflict",
    Blocked => "blocked",
    Refused => "refused",
});

names!(RetryReason {
    FirstAttempt => "first_attempt",
    CallerRerun => "caller_rerun",
    ConnectionNotEstablished => "connection_not_established",
    ResponseLostAfterDispatch => "response_lost_after_dispatch",
    InterruptedRerun => "interrupted_rerun",
    OperatorApproved => "operator_approved",
});

/// How the reason of every `host_changed` verdict begins (SPEC 17). Such a verdict
/// leaves the operation as unresolved (or settled) as it was: nothing was sent, and the
/// outcome where its attempts went is no better known than before.
pub const HOST_CHANGED_PREFIX: &str = "host changed: ";

names!(ReasonCode {
    CommandExited => "command_exited",
    ReplayedFromHost => "replayed_from_host",
    ReplayedFromLedger => "replayed_from_ledger",
    StillRunning => "still_running",
    ConnectFailed => "connect_failed",
    NameUnresolvable => "name_unresolvable",
    HostKeyRejected => "host_key_rejected",
    AuthRefused => "auth_refused",
    Fenced => "fenced",
    FencedAfterStart => "fenced_after_start",
    ShimCannotStart => "shim_cannot_start",
    ConflictOnHost => "conflict_on_host",
    ConflictInLedger => "conflict_in_ledger",
    PolicyDenied => "policy_denied",
    InvalidInput => "invalid_input",
    ApprovalRequired => "approval_required",
    InterruptedNeedsApproval => "interrupted_needs_approval",
    UnreachableAfterDispatch => "unreachable_after_dispatch",
    EarlierDispatchUnknown => "earlier_dispatch_unknown",
    AttemptBudgetSpent => "attempt_budget_spent",
    ResolvedApplied => "resolved_applied",
    ResolvedNotApplied => "resolved_not_applied",
    ResolvedAbandoned => "resolved_abandoned",
    HostKeyMismatch => "host_key_mismatch",
    HostChanged => "host_changed",
    ClientInterrupted => "client_interrupted",
    HostDiskFull => "host_disk_full",
    ShimDidNotStart => "shim_did_not_start",
    HostMissingSetsid => "host_missing_setsid",
    NotDispatchedMaxFailures => "not_dispatched_max_failures",
    NotDispatchedBatchFailed => "not_dispatched_batch_failed",
    Detached => "detached",
});

impl Verdict {
    /// The reserved exit code of a verdict, or `None` for `completed`/`replayed`, which
    /// exit with the command's own status.
    pub fn reserved_exit_code(self) -> Option<u8> {
        match self {
            Verdict::Completed | Verdict::Replayed => None,
            Verdict::InProgress => Some(exit_code::IN_PROGRESS),
            Verdict::NotApplied => Some(exit_code::NOT_APPLIED),
            Verdict::Indeterminate => Some(exit_code::INDETERMINATE),
            Verdict::Conflict => Some(exit_code::CONFLICT),
            Verdict::Blocked => Some(exit_code::BLOCKED),
            Verdict::Refused => Some(exit_code::REFUSED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_causes_that_can_pass_without_a_human_are_retryable() {
        let retryable: Vec<&str> = ReasonCode::ALL
            .iter()
            .filter(|c| c.retryable())
            .map(|c| c.as_str())
            .collect();
        assert_eq!(
            retryable,
            [
                "still_running",
                "connect_failed",
                "unreachable_after_dispatch",
                "earlier_dispatch_unknown",
                "attempt_budget_spent",
                "client_interrupted",
                "not_dispatched_max_failures",
                "not_dispatched_batch_failed",
                "detached"
            ]
        );
    }

    #[test]
    fn reserved_codes_are_distinct_per_verdict() {
        let mut codes: Vec<u8> = [
            Verdict::InProgress,
            Verdict::NotApplied,
            Verdict::Indeterminate,
            Verdict::Conflict,
            Verdict::Blocked,
            Verdict::Refused,
        ]
        .iter()
        .filter_map(|v| v.reserved_exit_code())
        .collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), 6);
        assert_eq!(Verdict::Completed.reserved_exit_code(), None);
    }

    #[test]
    fn names_round_trip() {
        assert_eq!("sent_no_response".parse(), Ok(Boundary::SentNoResponse));
        assert_eq!("indeterminate".parse(), Ok(Verdict::Indeterminate));
        assert_eq!(
            RetryReason::ResponseLostAfterDispatch.to_string(),
            "response_lost_after_dispatch"
        );
        assert!("failed".parse::<Verdict>().is_err());
    }
}
