//! `opmark approve OP [HOST] --note TEXT [--for D]`: a human signs an approval of one held
//! attempt with their SSH key (docs/trust.md#the-approval-flow). Nothing is sent and
//! nothing is recorded here: the approval is recorded when a run presents it and it
//! lets an attempt run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{load_policy, Context};
use crate::approval::{self, AllowedSigners, Statement, Token};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::ledger::{Ledger, OpKey};
use crate::op_id::OpId;
use crate::operation::identity;
use crate::vocab::Verdict;

/// What to approve, and with which key.
#[derive(Debug, Clone)]
pub struct ApproveRequest {
    pub op: String,
    /// Needed only when the op id was used on several hosts.
    pub host: Option<String>,
    pub note: String,
    /// How long the approval stays valid.
    pub ttl: Duration,
    /// `-i KEY`: a private key file, or a public key whose private half is in ssh-agent.
    pub key: Option<PathBuf>,
    /// `--intent HOST_FINGERPRINT`, as the blocked answer printed it: bound too.
    pub intent: Option<String>,
}

/// The signed approval (the `--json` document carries the token).
#[derive(Debug, Clone, Serialize)]
pub struct ApproveReport {
    pub op_id: String,
    pub host: String,
    /// The command being approved, redacted, as the ledger holds it.
    pub intent: String,
    pub family: Family,
    pub rule: String,
    pub expires: String,
    /// The signing key's `SHA256:` fingerprint.
    pub key: String,
    /// The approvers file that will check it, and the principal it lists the key under
    /// (null: no approvers file is configured here, so no run will check this token).
    pub approvers: Option<String>,
    pub principal: Option<String>,
    /// The token: the statement and its SSHSIG signature.
    pub token: String,
}

/// Signs the approval of `req.op`.
pub fn approve(ctx: &Context, req: &ApproveRequest) -> Result<ApproveReport> {
    let bad = |why: String| Error::new(ErrorKind::InvalidInput, why);
    let op = OpId::parse(&req.op).map_err(|e| bad(e.to_string()))?;
    if req.note.trim().is_empty() {
        return Err(bad(
            "--note is empty; say why you approve (it is signed into the approval and recorded when it is used)"
                .into(),
        ));
    }
    if req.ttl.is_zero() {
        return Err(bad(
            "--for 0 would expire at once; give a duration like 1h".into()
        ));
    }
    if let Some(intent) = &req.intent {
        if intent.len() != 64 || !intent.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(format!(
                "--intent {intent:?} is not a host fingerprint (64 hex digits, as the blocked answer prints it)"
            )));
        }
    }
    let policy = load_policy(ctx)?;
    // Approving reads the held operation: a mistyped ledger path is an error, never a new
    // empty ledger.
    let path = match &ctx.ledger {
        Some(p) => p.clone(),
        None => Ledger::default_path()?,
    };
    let Some(ledger) = Ledger::open_existing(&path, ctx.ledger_key.as_deref())? else {
        return Err(bad(format!(
            "no ledger at {}: approve the operation in the ledger its run recorded it in (--ledger or OPMARK_LEDGER)",
            path.display()
        )));
    };
    let host = match &req.host {
        Some(h) => h.clone(),
        None => super::resolve::the_one_host(&ledger, &op)?,
    };
    let key = OpKey::new(op.as_str(), host.clone());
    let Some(record) = ledger.operation(&key)? else {
        return Err(bad(format!(
            "no operation {op} on {host} in the ledger at {}: a run that is held records it; check the op id, the host and --ledger",
            ledger.path().display()
        )));
    };
    if matches!(record.verdict, Some(Verdict::Completed | Verdict::Replayed)) {
        return Err(bad(format!(
            "nothing to approve: op {op} on {host} has completed (a rerun replays it and needs no approval)"
        )));
    }
    let events = ledger.events(&key)?;
    let root = identity::recorded(&events)
        .roots
        .last()
        .map(|(_, r)| r.clone());
    let statement = Statement::new(
        op.as_str(),
        &host,
        root.as_deref(),
        &record.fingerprint,
        req.intent.as_deref(),
        record.family,
        i64::try_from(req.ttl.as_secs()).unwrap_or(i64::MAX / 2),
        req.note.trim(),
    )
    .map_err(|e| bad(e.to_string()))?;
    let signers = match approval::required(&policy) {
        Some(path) => Some(
            AllowedSigners::load(&path)
                .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?,
        ),
        None => None,
    };
    let token = sign(&statement, req.key.as_deref(), signers.as_ref())?;
    // A token no run would accept is no use to the human who made it: say so now.
    let principal = match &signers {
        Some(s) => Some(
            s.verify(&token)
                .map_err(|e| {
                    Error::new(ErrorKind::InvalidInput, format!("{e}; nothing was written"))
                })?
                .principal,
        ),
        None => None,
    };
    Ok(ApproveReport {
        op_id: op.to_string(),
        host,
        intent: record.display.clone(),
        family: record.family,
        rule: record.rule.clone(),
        expires: statement.expires_at(),
        key: token.key_fingerprint(),
        approvers: signers.map(|s| s.path.display().to_string()),
        principal,
        token: token
            .to_text()
            .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?,
    })
}

/// Signs with `-i KEY` (a private key file, or a `.pub` whose private half the agent
/// holds), else with the agent's first key that the approvers list (its first key when
/// no approvers file is configured).
fn sign(
    statement: &Statement,
    key: Option<&Path>,
    signers: Option<&AllowedSigners>,
) -> Result<Token> {
    let failed = |e: approval::ApprovalError| {
        Error::new(ErrorKind::InvalidInput, format!("{e}; nothing was written"))
    };
    let public = match key {
        Some(path) => match russh::keys::ssh_key::PublicKey::read_openssh_file(path) {
            Ok(public) => Some(public),
            Err(_) => return approval::sign_with_file(statement, path).map_err(failed),
        },
        None => None,
    };
    let socket = std::env::var_os("SSH_AUTH_SOCK")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                "no key to sign with: give -i KEY (your private key file), or start ssh-agent \
                 with your key in it (SSH_AUTH_SOCK is unset); nothing was written",
            )
        })?;
    crate::ops::block_on(async {
        let keys = approval::agent_keys(&socket).await.map_err(failed)?;
        let chosen = match &public {
            Some(p) => keys.iter().find(|(k, _)| k.key_data() == p.key_data()).map(|(k, _)| k.clone()).ok_or_else(|| {
                Error::new(ErrorKind::InvalidInput, "the key given with -i is not in ssh-agent: add it with ssh-add, or give the private key file; nothing was written")
            })?,
            None => keys
                .iter()
                .find(|(k, _)| signers.is_none_or(|s| s.lists(k)))
                .map(|(k, _)| k.clone())
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        match signers {
                            Some(s) => format!(
                                "ssh-agent holds no key that {} lists as an approver; nothing was written",
                                s.path.display()
                            ),
                            None => "ssh-agent holds no key; add yours with ssh-add; nothing was written".to_owned(),
                        },
                    )
                })?,
        };
        approval::sign_with_agent(statement, &socket, &chosen)
            .await
            .map_err(failed)
    })?
}
