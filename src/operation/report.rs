//! What a run answers: the report (`run --json`), the attempts and observations in it,
//! why a run stopped without a verdict, and opmark's progress lines on stderr.

use serde::Serialize;

use crate::family::Family;
use crate::ledger::LedgerError;
use crate::vocab::{ReasonCode, Verdict};

use super::decide::{self, AttemptSummary};
use super::record::LedgerWriteError;
use super::{output, repeat};

/// One observation this invocation recorded (a replay, a follow, a look that made no
/// attempt), as `run --json` reports it (docs/ledger.md#observations).
#[derive(Debug, Clone, Serialize)]
pub struct ObservationReport {
    /// `replay_from_ledger`, `replay_from_host`, `follow`, `probe`.
    pub kind: crate::ledger::ObservationKind,
    /// What it read.
    pub reading: String,
    /// What it did to the operation's state.
    pub effect: String,
}

/// The answer of `opmark run` (the `--json` document, docs/guarantees.md#the-command-line-contract).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Operation id.
    pub op_id: String,
    /// Host as the ledger names it.
    pub host: String,
    /// The attempt the verdict is about (the one that ran the command, when known).
    pub attempt_id: Option<String>,
    /// Family used for the decision.
    pub family: Family,
    /// The verdict.
    pub verdict: Verdict,
    /// The command's exit status; null when unknown.
    pub exit_code: Option<i32>,
    /// Captured stdout (lossy UTF-8 in the document; empty in plain mode, where it was
    /// streamed), spooled to a file beyond a megabyte.
    pub stdout: output::Captured,
    /// Captured stderr.
    pub stderr: output::Captured,
    /// Every attempt this invocation made (execution tries that may start the command;
    /// a replay or a follow makes none).
    pub attempts: Vec<AttemptSummary>,
    /// What this invocation observed instead of (or besides) running: replays, follows.
    pub observations: Vec<ObservationReport>,
    /// `blocked`: what a human decides on (intent, family, rule, earlier attempts, what
    /// approving would do); null otherwise.
    pub approval_needed: Option<decide::ApprovalNeeded>,
    /// The ledger fingerprint of the intent.
    pub fingerprint: String,
    /// Why this verdict, in words an agent can log.
    pub reason: String,
    /// Why this verdict, for machines (stable snake_case, docs/guarantees.md#verdicts).
    pub reason_code: ReasonCode,
    /// True only when a rerun with the same op id may change the outcome without a human.
    pub retryable: bool,
    /// The policy rule that decided the family.
    pub rule: String,
    /// The command was killed at `--timeout`.
    pub timed_out: bool,
    /// Output bytes the host dropped beyond its cap (stdout, stderr).
    pub dropped: (u64, u64),
    /// A ledger write that failed after dispatch: the verdict stands, the ledger does not
    /// hold it, and a rerun with the same op id replays it from the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_error: Option<LedgerWriteError>,
    /// The output delivered here lacks bytes the command wrote: it came from the host's
    /// capped copy (a replay, or a re-attach after bytes were dropped).
    pub truncated: bool,
    /// Bytes kept in the host's copy per stream (stdout, stderr): the cap a truncated
    /// replay was cut at.
    #[serde(skip)]
    pub kept: (u64, u64),
    /// The replay came from a tombstone: gc collected the output on the host, only the
    /// exit status is left (docs/host-protocol.md#tombstones).
    pub output_collected: bool,
    /// False when the command ran but its output cannot be had: the ledger holds only the
    /// exit status (the marker is gone, `replayed_from_ledger`) or gc collected it
    /// (`output_collected`). `stdout`/`stderr` are then empty and `truncated` says nothing:
    /// an empty string must not read as "it printed nothing".
    pub output_available: bool,
    /// The host's exit record says `opmark cancel` stopped the command (its exit code is
    /// then the signal's, 143 or 137, not the command's own).
    pub cancelled: bool,
    /// The earlier operation this run repeats (the same intent on the same host under
    /// another op id within the family's window), when the policy blocked or warned
    /// about it (docs/guarantees.md#repetitions); null otherwise.
    pub repeats: Option<repeat::Repetition>,
    /// `conflict_on_host`: whether the command, the stdin or both differ from the intent
    /// the host's claim holds; null for any other verdict, or when the claim does not
    /// say (a shim older than the claim's stdin digest).
    pub conflict_differs: Option<crate::vocab::Differs>,
}

impl RunReport {
    /// The process exit status for this report (docs/guarantees.md#verdicts).
    pub fn exit_status(&self) -> u8 {
        match self.verdict.reserved_exit_code() {
            Some(code) => code,
            None => self.exit_code.map_or(0, |c| (c & 0xff) as u8),
        }
    }
}

/// Why a run stopped without a verdict (every other outcome, a lost connection included,
/// is a verdict in the [`RunReport`]). Converted to the CLI's error at the edge (`ops`).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The ledger failed where the run cannot go on without it (before dispatch: a run
    /// never sends what it could not record).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The ssh config is malformed or unsupported: the user's to fix (exit 246), never a
    /// "safe to retry" verdict.
    #[error("{0}")]
    Config(String),
    /// A step the decisions rule out happened, or the shim broke the protocol.
    #[error("{0}")]
    Internal(String),
    /// A local file the run writes could not be opened (nothing was sent).
    #[error("{0}")]
    LocalIo(String),
}

/// opmark's own progress line on stderr.
pub fn progress(message: &str) {
    crate::logging::say(format_args!("opmark: {message}"));
}
