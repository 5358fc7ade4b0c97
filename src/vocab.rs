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
    /// The previous attempt's connection was lost while the command ran; this attempt
    /// re-attaches to it.
    Reattach,
    /// The marker was interrupted and the family allows an automatic re-run.
    InterruptedRerun,
    /// An operator approved superseding an interrupted or blocked operation.
    OperatorApproved,
}

macro_rules! names {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
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
    Reattach => "reattach",
    InterruptedRerun => "interrupted_rerun",
    OperatorApproved => "operator_approved",
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
