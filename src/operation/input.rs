//! What a run is given: the caller's request ([`RunInput`]), the budget's scope, and what
//! the process shares with every run ([`RunEnv`]).

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::family::Family;
use crate::ledger::fingerprint::{InstallationKey, Intent};
use crate::ledger::Ledger;
use crate::op_id::OpId;
use crate::policy::{Classification, Policy};
use crate::ssh::{HostSpec, Pool};

use super::commit_group::CommitGroup;
use super::{output, repeat};

/// What the caller asked `opmark run` to do.
#[derive(Debug, Clone)]
pub struct RunInput {
    /// Where (host as typed plus connection options).
    pub host: HostSpec,
    /// The operation id (given or minted).
    pub op: OpId,
    /// The command string (words joined by spaces), run by `sh -c` on the host.
    pub command: String,
    /// `--class`: at least this family.
    pub class: Option<Family>,
    /// Spooled stdin, when `--stdin`.
    pub stdin: Option<Vec<u8>>,
    /// Stdin still in a local file, read just before this run starts (one of the many
    /// files of a put: only the files in flight are in memory); `stdin` is then `None`.
    pub stdin_from: Option<StdinFile>,
    /// The SHA-256 of `stdin` (or of `stdin_from`'s content), computed once: a put's
    /// content may be large, and the intent and every attempt's request need it.
    pub stdin_sha256: Option<[u8; 32]>,
    /// `--secret`: the command's secret environment variables, read.
    pub secrets: crate::secret::Secrets,
    /// `--become USER`: run the command as USER through sudo on the host.
    pub become_user: Option<String>,
    /// `--lock`: host locks the command holds while it runs, in the order the shim takes
    /// them ([`crate::host_lock::HostLock::set`]); recorded with the intent, not part of
    /// its fingerprint.
    pub locks: Vec<crate::host_lock::HostLock>,
    /// `--lock-wait`: how long the host waits for them before `lock_busy`.
    pub lock_wait: Duration,
    /// A command, or a file delivered (`opmark put`).
    pub kind: crate::shim::RunKind,
    /// `--timeout`, enforced by the shim on the host.
    pub timeout: Option<Duration>,
    /// `--attempts`, else the family's budget.
    pub attempts: Option<u32>,
    /// `--wait`: how long to follow a running operation, and to keep probing an
    /// unreachable host, before answering.
    pub wait: Duration,
    /// `--approve NOTE`.
    pub approve: Option<String>,
    /// Who approves (`$USER`).
    pub approver: String,
    /// `--approval FILE`: a signed approval, parsed (not yet verified).
    pub approval: Option<crate::approval::Token>,
    /// Stream output live (plain mode) instead of keeping it for JSON.
    pub live_output: bool,
    /// Per-stream output cap on the host.
    pub output_cap: u64,
    /// Live output lines start with this (`host: `) when several hosts run.
    pub prefix: Option<String>,
    /// `--detach`: answer `in_progress` (reason code `detached`) once the shim has
    /// acknowledged the claim, leaving the command running.
    pub detach: bool,
    /// `--repeats OP` / `--amends OP` (docs/guarantees.md#repetitions), ids checked.
    pub declared: repeat::Declared,
    /// What `wait` bounds besides the connects before dispatch and the probe windows.
    pub wait_scope: WaitScope,
    /// Counts the output delivered, for a caller reporting progress meanwhile.
    pub tally: Option<std::sync::Arc<output::OutputBytes>>,
    /// A get's content: stdout goes to this local file as it arrives (made if absent),
    /// never kept in memory; the bytes it already holds are the stream's first ones, so
    /// a read cut in an earlier invocation resumes after them ([`output::Output::into_file`]).
    pub stdout_to: Option<std::path::PathBuf>,
}

/// What the `--wait` budget bounds (docs/decisions.md#wait-budget). It always bounds the
/// connects before anything is sent and every probe window after a loss; the scopes
/// differ on a command that is connected and running when it is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitScope {
    /// The command line without `--wait`: a connected command streams to its end, as
    /// with ssh.
    Probes,
    /// The command line with `--wait D`: the whole invocation. Spent while the command
    /// runs, one last probe bounded by [`LAST_LOOK`] decides between `in_progress` (the
    /// marker says running) and `indeterminate` (the host said nothing).
    Invocation,
    /// MCP: a tool call never outlasts its budget. Spent while the command runs, the
    /// answer is `in_progress` at once (no look: the caller's timeout is hard).
    Call,
}

/// `--wait` (and MCP's `wait`) when not given.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// The bound of the last look at the marker when a command-line `--wait` runs out while
/// the command runs: what the budget may be overshot by (a probe on a live connection
/// takes a round trip; a cut link is what this bounds).
pub const LAST_LOOK: Duration = Duration::from_secs(3);

/// A local file whose content is a run's stdin, with the digest it had when the run was
/// planned: read when the run starts, and refused then if it changed meanwhile.
#[derive(Debug, Clone)]
pub struct StdinFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// Its content's SHA-256 when it was planned.
    pub sha256: [u8; 32],
}

impl RunInput {
    /// Reads `stdin_from` into `stdin`: the content the run was planned with, or an error
    /// naming the file when it cannot be read or changed since (nothing is sent for it).
    pub async fn load_stdin(mut self) -> Result<RunInput, crate::error::Error> {
        use crate::error::{Error, ErrorKind};
        let Some(from) = self.stdin_from.take() else {
            return Ok(self);
        };
        let content = tokio::fs::read(&from.path).await.map_err(|e| {
            Error::new(
                ErrorKind::LocalIo,
                format!(
                    "cannot read {}: {e}; nothing was sent for it",
                    from.path.display()
                ),
            )
        })?;
        if <[u8; 32]>::from(Sha256::digest(&content)) != from.sha256 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} changed while the files were being sent (it is not the content read before the first one went); nothing was sent for it. Run the same command again with a new op id",
                    from.path.display()
                ),
            ));
        }
        self.stdin = Some(content);
        self.stdin_sha256 = Some(from.sha256);
        Ok(self)
    }

    /// The SHA-256 of the stdin given: kept from when it was read, else computed.
    pub fn stdin_digest(&self) -> Option<[u8; 32]> {
        self.stdin_sha256
            .or_else(|| self.stdin_from.as_ref().map(|f| f.sha256))
            .or_else(|| self.stdin.as_ref().map(|s| Sha256::digest(s).into()))
    }

    /// The canonical intent: the command and the digest of the stdin it is given.
    pub fn intent(&self) -> Intent<'_> {
        Intent {
            command: &self.command,
            stdin_sha256: self.stdin_digest(),
            secret_names: self.secrets.names(),
            become_user: self.become_user.as_deref(),
        }
    }
}

/// The family a run uses and the rule that decided it: the policy's, made stricter (never
/// milder) by `--class`.
pub(crate) fn family_and_rule(
    classification: &Classification,
    class: Option<Family>,
) -> (Family, String) {
    let family = class.map_or(classification.family, |class| {
        classification.family.max(class)
    });
    let rule = classification
        .parts
        .iter()
        .find(|p| p.family == classification.family)
        .map_or_else(|| "no parts: read-only".to_owned(), |p| p.rule.clone());
    (family, rule)
}

/// What the process using the library shares with a run.
#[derive(Debug)]
pub struct RunEnv<'a> {
    /// The ledger.
    pub ledger: &'a mut Ledger,
    /// The policy.
    pub policy: &'a Policy,
    /// The per-installation fingerprint key.
    pub key: &'a InstallationKey,
    /// This session's id.
    pub session_id: String,
    /// SSH connections, shared by every call of this process.
    pub pool: &'a Pool,
    /// A fleet's shared commit of the writes before dispatch (`None`: each its own).
    pub group: Option<&'a CommitGroup>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(path: &std::path::Path, content: &[u8]) -> RunInput {
        RunInput {
            host: HostSpec::default(),
            op: OpId::parse("load-1").unwrap(),
            command: "opmark-put --mode 0644 -- 'x'".into(),
            class: None,
            stdin: None,
            stdin_sha256: None,
            stdin_from: Some(StdinFile {
                path: path.to_path_buf(),
                sha256: Sha256::digest(content).into(),
            }),
            secrets: Default::default(),
            become_user: None,
            locks: Vec::new(),
            lock_wait: Duration::ZERO,
            kind: crate::shim::RunKind::Put,
            timeout: None,
            attempts: None,
            wait: DEFAULT_WAIT,
            approve: None,
            approver: "t".into(),
            approval: None,
            live_output: false,
            output_cap: 1024,
            prefix: None,
            detach: false,
            declared: Default::default(),
            wait_scope: WaitScope::Probes,
            tally: None,
            stdout_to: None,
        }
    }

    #[tokio::test]
    async fn a_file_read_at_the_start_of_its_run_is_the_content_planned_or_refused() {
        let dir = std::env::temp_dir().join(format!("opmark-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"planned").unwrap();
        let input = planned(&path, b"planned");
        let intent_before = input.intent().stdin_sha256;
        let loaded = input.clone().load_stdin().await.unwrap();
        assert_eq!(loaded.stdin.as_deref(), Some(&b"planned"[..]));
        assert_eq!(
            loaded.intent().stdin_sha256,
            intent_before,
            "the intent is the same before and after the read"
        );

        std::fs::write(&path, b"edited meanwhile").unwrap();
        let e = input.clone().load_stdin().await.unwrap_err();
        assert!(e.message.contains("changed while"), "{}", e.message);
        std::fs::remove_file(&path).unwrap();
        let e = input.load_stdin().await.unwrap_err();
        assert!(e.message.contains("cannot read"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
