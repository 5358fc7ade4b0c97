//! The words of docs/guarantees.md#vocabulary as types: attempt boundaries, verdicts, retry reasons, reason codes
//! (of verdicts and of errors) and the reserved exit codes. Depends on no other module:
//! everything else speaks these words.
//!
//! Shared by the shim parser, the ledger and the operation state machine so that the
//! code, the ledger and the docs say the same thing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Exit codes reserved by opmark. Stable: agents branch on them.
pub mod exit_code {
    /// Success for commands other than `run`.
    pub const OK: u8 = 0;
    /// A check found problems: `reconcile` left operations unresolved, `audit verify`
    /// found a broken chain, `doctor` found a failing check.
    pub const FINDINGS: u8 = 1;
    /// Command-line usage error (unknown flag, missing argument). Nothing was sent.
    pub const USAGE: u8 = 2;
    /// `run` verdict `in_progress`: an earlier attempt holds the claim and is still running.
    pub const IN_PROGRESS: u8 = 240;
    /// `run` verdict `not_applied`: nothing ran and nothing can still run for this attempt.
    pub const NOT_APPLIED: u8 = 241;
    /// `run` verdict `indeterminate`: the command may have run; automatic retry blocked.
    pub const INDETERMINATE: u8 = 242;
    /// `run` verdict `conflict`: the op id is bound to a different fingerprint.
    pub const CONFLICT: u8 = 243;
    /// `run` verdict `blocked`: policy needs `--approve NOTE`.
    pub const BLOCKED: u8 = 244;
    /// `run` verdict `refused`, and any invalid input: nothing was sent.
    pub const REFUSED: u8 = 245;
    /// A configuration file (policy, ssh config, known_hosts) is malformed.
    pub const CONFIG: u8 = 246;
    /// The host could not be reached or authenticated (outside `run`, which gives a verdict).
    pub const UNREACHABLE: u8 = 247;
    /// The local ledger or a local file could not be read or written.
    pub const LOCAL_IO: u8 = 248;
    /// A bug in opmark or an answer from the host that breaks the protocol.
    pub const INTERNAL: u8 = 250;
    /// Stdout or stderr was a pipe whose reader went away (`opmark list | head`): the
    /// status a shell reports for a tool that SIGPIPE ended (128 + 13), printed quietly.
    pub const BROKEN_PIPE: u8 = 141;
}

/// The operator's decision recorded by `opmark resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Resolution {
    /// The effect happened.
    Applied,
    /// The effect did not happen; the marker is fenced so it never can.
    NotApplied,
    /// Nobody will find out; stop tracking it.
    Abandoned,
}

impl Resolution {
    /// The ledger's word for it (`applied`, `not_applied`, `abandoned`).
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Applied => "applied",
            Resolution::NotApplied => "not_applied",
            Resolution::Abandoned => "abandoned",
        }
    }
}

/// How far one attempt got, as the client actually observed it (docs/guarantees.md#attempt-boundaries).
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

/// The answer of `opmark run` (docs/guarantees.md#verdicts).
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

/// Why a verdict was reached, for machines (docs/guarantees.md#verdicts): stable snake_case codes an
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
    /// `blocked`: the policy needs `--approve NOTE`, or where approvals are signed
    /// (docs/trust.md#the-approval-flow), a token from `opmark approve`.
    ApprovalRequired,
    /// `blocked`: the signed approval presented does not verify: a bad signature, a key
    /// not among the approvers, or a statement changed after signing. Still held.
    ApprovalInvalid,
    /// `blocked`: the signed approval presented has expired. Still held.
    ApprovalExpired,
    /// `blocked`: the signed approval presented was made for another op id, host,
    /// intent, family or marker root. Still held.
    ApprovalMismatch,
    /// `blocked`: the signed approval presented let an attempt run already; one approval
    /// lets one attempt run. Still held.
    ApprovalUsed,
    /// `blocked`: the same intent ran on the same host under another op id within the
    /// family's `repeat_window` (docs/guarantees.md#repetitions); nothing was sent. Rerun
    /// under the earlier op id (a replay), or declare it with `--repeats EARLIER`.
    RepeatsRecentOperation,
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
    /// `conflict`: the host or store of evidence reached now is not the one the
    /// operation's attempts reached (docs/guarantees.md#evidence-identity): another host key, another user, or another
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
    /// `not_applied`: `--become USER` cannot work on the host (no sudo, a sudo that needs a
    /// terminal, a password that was not given or was wrong, a user sudo does not allow);
    /// checked before the claim, so nothing ran.
    BecomeRefused,
    /// `not_applied` (fleet runs): this host was never dispatched because `--max-failures`
    /// hosts had already ended badly; nothing was sent to it.
    NotDispatchedMaxFailures,
    /// `not_applied` (fleet runs): this host was never dispatched because an earlier
    /// `--serial` batch did not complete cleanly; nothing was sent to it.
    NotDispatchedBatchFailed,
    /// `in_progress`: `--detach`: the shim acknowledged the claim and the command runs
    /// on; `opmark run` with the same op id follows or replays it.
    Detached,
    /// `in_progress` (the command keeps running on the host) or `not_applied` (no
    /// connection within the budget; nothing was sent): the `--wait` budget, which bounds
    /// the whole invocation, connects included, is spent. A rerun with the same op id
    /// follows, replays or (when nothing was sent) runs it.
    WaitBudgetSpent,
    /// `not_applied`: a `--lock` was held by another operation until `--lock-wait` ran
    /// out (docs/host-protocol.md#host-locks); the command did not start, and a rerun with
    /// the same op id waits for the lock again.
    LockBusy,
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
                | ReasonCode::WaitBudgetSpent
                | ReasonCode::LockBusy
        )
    }
}

/// The reason code of an error document (`{"error": {"reason_code", ...}}`, see
/// docs/guarantees.md#the-command-line-contract): a verdict's [`ReasonCode`] when the error is one (a host key rejected before a
/// probe), else a code of its own. Kept apart from [`ReasonCode`], which is the closed
/// set a `run` verdict carries (its JSON schema and `run --help` list exactly those).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A verdict's reason code.
    Reason(ReasonCode),
    /// The command line does not parse.
    Usage,
    /// A configuration file is malformed.
    ConfigInvalid,
    /// The host could not be reached.
    Unreachable,
    /// A local file or the ledger could not be read or written.
    LocalIo,
    /// An opmark bug or a protocol violation.
    Internal,
    /// Stdout was closed or full.
    StdoutClosed,
    /// No such operation in the ledger.
    UnknownOperation,
    /// An op id prefix that fits several operations.
    AmbiguousOperation,
}

impl ErrorCode {
    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Reason(code) => code.as_str(),
            ErrorCode::Usage => "usage",
            ErrorCode::ConfigInvalid => "config_invalid",
            ErrorCode::Unreachable => "unreachable",
            ErrorCode::LocalIo => "local_io",
            ErrorCode::Internal => "internal",
            ErrorCode::StdoutClosed => "stdout_closed",
            ErrorCode::UnknownOperation => "unknown_operation",
            ErrorCode::AmbiguousOperation => "ambiguous_operation",
        }
    }

    /// True only when the same command may succeed later without a human: a host that
    /// may come back (`connect_failed`, `unreachable`). A verdict's code that is
    /// retryable in a `run` (a claim still running) is not one an error can carry on
    /// its own, so only the connect failure counts here.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Unreachable | ErrorCode::Reason(ReasonCode::ConnectFailed)
        )
    }
}

impl ErrorCode {
    /// The codes an error has of its own (not a verdict's), in declaration order.
    pub const OWN: &'static [ErrorCode] = &[
        ErrorCode::Usage,
        ErrorCode::ConfigInvalid,
        ErrorCode::Unreachable,
        ErrorCode::LocalIo,
        ErrorCode::Internal,
        ErrorCode::StdoutClosed,
        ErrorCode::UnknownOperation,
        ErrorCode::AmbiguousOperation,
    ];
}

impl From<ReasonCode> for ErrorCode {
    fn from(code: ReasonCode) -> Self {
        ErrorCode::Reason(code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// How the reason of every `host_changed` verdict begins (docs/guarantees.md#evidence-identity). Such a verdict
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
    ApprovalInvalid => "approval_invalid",
    ApprovalExpired => "approval_expired",
    ApprovalMismatch => "approval_mismatch",
    ApprovalUsed => "approval_used",
    RepeatsRecentOperation => "repeats_recent_operation",
    InterruptedNeedsApproval => "interrupted_needs_approval",
    UnreachableAfterDispatch => "unreachable_after_dispatch",
    EarlierDispatchUnknown => "earlier_dispatch_unknown",
    AttemptBudgetSpent => "attempt_budget_spent",
    ResolvedApplied => "resolved_applied",
    ResolvedNotApplied => "resolved_not_applied",
    ResolvedAbandoned => "resolved_abandoned",
    HostChanged => "host_changed",
    ClientInterrupted => "client_interrupted",
    HostDiskFull => "host_disk_full",
    ShimDidNotStart => "shim_did_not_start",
    HostMissingSetsid => "host_missing_setsid",
    BecomeRefused => "become_refused",
    NotDispatchedMaxFailures => "not_dispatched_max_failures",
    NotDispatchedBatchFailed => "not_dispatched_batch_failed",
    Detached => "detached",
    WaitBudgetSpent => "wait_budget_spent",
    LockBusy => "lock_busy",
});

/// What a `conflict_on_host` run sends differently from the intent the host's claim
/// holds (JSON `conflict_differs`), told from the claim's fingerprint and stdin digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Differs {
    /// Another command, the same stdin.
    Command,
    /// The same command, another stdin (or none where there was one, or the reverse).
    Stdin,
    /// Both.
    CommandAndStdin,
}

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
    fn an_error_code_of_its_own_never_spells_a_verdicts_reason_code() {
        // One word, one meaning: bad input is the verdict's `invalid_input` in both.
        for code in ErrorCode::OWN {
            assert!(
                code.as_str().parse::<ReasonCode>().is_err(),
                "{code} is also a ReasonCode: use ErrorCode::Reason for it"
            );
        }
        assert_eq!(
            ErrorCode::from(ReasonCode::InvalidInput).as_str(),
            "invalid_input"
        );
        assert!(ErrorCode::from(ReasonCode::ConnectFailed).retryable());
        assert!(!ErrorCode::from(ReasonCode::StillRunning).retryable());
    }

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
                "detached",
                "wait_budget_spent",
                "lock_busy"
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
