//! Several operations to one host, each its own (a put of several files: one operation
//! per file, docs/commands.md#several-files-and-directories): each has its own op id,
//! command text and stdin, and is claimed, probed, replayed and recorded as a `run` of
//! it alone would be. They are scheduled as a fleet's hosts are
//! (`operation/fleet.rs`): up to `--forks` at once over the one connection, the writes
//! due before their dispatches grouped into shared fsync'd commits. What makes this
//! pipelined is only that: many operations in flight on one connection, never one
//! request standing for several operations, so each keeps its own at-most-once record.

use super::run::{
    checked_secrets, fleet_shared, install_interrupts, new_contradictions, parse_approval,
    refuse_before_anything, shared_input, typo_answer, RunAnswer, RunRequest, RunWatch,
};
use super::{block_on, host_spec, load_policy, open_ledger, Context};
use crate::error::Result;
use crate::op_id::OpId;
use crate::operation::fleet::{self, Progress, Schedule, Summary};
use crate::operation::RunInput;

/// One operation of [`run_each`].
#[derive(Debug, Clone)]
pub struct EachOperation {
    /// Its own op id.
    pub op: OpId,
    /// Its command text (for a put, the delivery's intent).
    pub command: String,
    /// Its stdin: a file's content, read when its run starts (a put), or none (a get).
    pub stdin_from: Option<crate::operation::StdinFile>,
    /// The local file its stdout goes to (a get's content), or none (kept in memory).
    pub stdout_to: Option<std::path::PathBuf>,
}

/// Runs `each` on the one host of `req`, every operation its own; `req` gives what they
/// share (kind, attempts, wait, approvals, connection options, `fleet.forks`), and its
/// op, command and stdin are not used. `base` names the whole in what is said before
/// any operation exists (a host name that resolves nowhere, an interruption).
/// The answer is a fleet's: one result per operation, in the order of `each`.
pub fn run_each(
    ctx: &Context,
    req: RunRequest,
    base: &OpId,
    each: Vec<EachOperation>,
    watch: &mut dyn RunWatch,
) -> Result<RunAnswer> {
    let [host] = req.hosts.as_slice() else {
        return Ok(refuse_before_anything(
            ctx,
            Some(base.as_str()),
            "several operations go to one host; name one; nothing was sent",
        ));
    };
    let host = host.clone();
    if let Err(why) = crate::host::check_destination(&host) {
        return Ok(refuse_before_anything(ctx, Some(base.as_str()), &why));
    }
    if req.fleet.forks == 0 {
        return Ok(refuse_before_anything(
            ctx,
            Some(base.as_str()),
            "--forks must be at least 1; nothing was sent",
        ));
    }
    if req.attempts == Some(0) {
        return Ok(refuse_before_anything(
            ctx,
            Some(base.as_str()),
            "--attempts must be at least 1; nothing was sent",
        ));
    }
    // A signed approval names one operation: it cannot stand for several.
    if req.approval.is_some() && each.len() > 1 {
        return Ok(refuse_before_anything(
            ctx,
            Some(base.as_str()),
            "--approval names one operation and this is several (one per file); give --approve NOTE, or put the held file on its own with its approval. Nothing was sent",
        ));
    }
    let approval = match parse_approval(&req) {
        Ok(approval) => approval,
        Err(why) => return Ok(refuse_before_anything(ctx, Some(base.as_str()), &why)),
    };
    // Read once for them all (sudo's password for `--become`).
    let secrets = match checked_secrets(&req) {
        Ok(secrets) => secrets,
        Err(why) => return Ok(refuse_before_anything(ctx, Some(base.as_str()), &why)),
    };
    for one in &each {
        if let Err(e) = crate::host::check_command(&one.command) {
            return Ok(refuse_before_anything(
                ctx,
                Some(one.op.as_str()),
                &format!("{e}; nothing was sent"),
            ));
        }
    }
    block_on(async move {
        let interrupts = install_interrupts()?;
        let policy = load_policy(ctx)?;
        let ledger = open_ledger(ctx, &policy)?;
        let key = ledger.key().clone();
        if let Some(answer) = typo_answer(ctx, &req, std::slice::from_ref(&host), base) {
            return Ok(answer);
        }
        let mut known = Vec::new();
        for one in &each {
            known.extend(ledger.operations_by_id(one.op.as_str())?);
        }
        drop(ledger);
        interrupts.set_context(format!(
            "the {} operations of op {base} may be running on {host}: the same command with --op {base} follows or replays each",
            each.len()
        ));
        let spec = host_spec(ctx, &host, &req.options);
        let ops: Vec<OpId> = each.iter().map(|one| one.op.clone()).collect();
        let inputs: Vec<RunInput> = each
            .into_iter()
            .map(|one| RunInput {
                stdin_from: one.stdin_from,
                approval: approval.clone(),
                secrets: secrets.clone(),
                // Each file's answer is said whole, never streamed, and none detaches.
                live_output: false,
                detach: false,
                tally: None,
                stdout_to: one.stdout_to,
                ..shared_input(&req, spec.clone(), one.op, one.command)
            })
            .collect();
        let shared = fleet_shared(ctx, policy, key);
        let plan = Schedule {
            forks: req.fleet.forks,
            max_failures: None,
            serial: None,
            failed_before: 0,
            one_host: true,
        };
        let results = fleet::run_fleet(&shared, inputs, plan, &interrupts, |p: Progress| {
            watch.progress(p);
        })
        .await;
        let summary = Summary::of(&results);
        let mut now = Vec::new();
        if let Ok(ledger) = open_ledger(ctx, shared.policy.as_ref()) {
            for op in &ops {
                now.extend(ledger.operations_by_id(op.as_str()).unwrap_or_default());
            }
        }
        Ok(RunAnswer::Fleet {
            results,
            summary,
            interrupted: interrupts.received(),
            contradictions: new_contradictions(&known, &now),
        })
    })?
}
