//! Plan: what `run` would do, without running or recording anything (`opmark run
//! --dry-run`, MCP `plan`). It reads the policy and the ledger (never creating or
//! writing it), and probes the marker on each host with the read-only `probe` verb; the
//! decision is [`crate::operation::plan`]'s, in the order `run` takes its own.

use std::io::Read as _;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{block_on, load_policy, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::host::Host;
use crate::ledger::fingerprint::{host_fingerprint, ledger_fingerprint, Intent};
use crate::ledger::history::History;
use crate::ledger::{Ledger, OpKey};
use crate::op_id::OpId;
use crate::operation::identity::{self, Recorded};
use crate::operation::plan::{after_probe, before_probe, LedgerFacts, PlanFacts, Would};
use crate::operation::repeat::{self, Declared, Repetition};
use crate::policy::OnRepeat;
use crate::redact::Redactor;
use crate::vocab::Verdict;

use super::run::Stdin;

/// What to plan: `run`'s request, read the same way.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The hosts, as the user names them.
    pub hosts: Vec<String>,
    /// The op id, unchecked; None: `run` would mint a fresh one.
    pub op: Option<String>,
    /// `--class`.
    pub class: Option<Family>,
    /// The bytes `run` would forward (they are part of the intent).
    pub stdin: Stdin,
    /// `--approve NOTE` was given.
    pub approve: bool,
    /// A signed approval is presented (`run` would check its signature and binding).
    pub approval: bool,
    /// `--repeats OP`.
    pub repeats: Option<String>,
    /// `--amends OP` (with the same command it declares the repetition too).
    pub amends: Option<String>,
    /// Connection options.
    pub options: HostOptions,
    /// `--secret`: read as `run` would read them (an unreadable one is the plan's
    /// error), and only their names kept (they are part of the intent).
    pub secrets: Vec<crate::secret::Spec>,
    /// `--become USER`.
    pub become_user: Option<String>,
    /// The command's words, joined with spaces as ssh does.
    pub command: Vec<String>,
}

/// What `run` would do on one host.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// `null`: `run` would mint one.
    pub op_id: Option<String>,
    pub host: String,
    /// The command as the ledger would record it (redacted).
    pub display: String,
    pub family: Family,
    /// The rule that decided the family.
    pub rule: String,
    /// The rule that denies the command, if any.
    pub deny_rule: Option<String>,
    /// The rule that asks for approval, if any.
    pub approval_rule: Option<String>,
    /// An approval would count for this run (see `approval_rule`).
    pub approved: bool,
    /// What the ledger holds of this op id on this host (`null`: nothing).
    pub ledger_state: Option<String>,
    pub ledger_verdict: Option<Verdict>,
    /// An earlier operation of the same intent in the ledger's repetition window.
    pub repeats: Option<PlanRepetition>,
    /// The marker's state from a read-only probe; `null` when no probe was needed (the
    /// answer was decided without the host) or possible (`probe_error`).
    pub marker_state: Option<String>,
    pub marker_exit_code: Option<i32>,
    /// Why the host could not be probed.
    pub probe_error: Option<String>,
    /// What `run` would do.
    pub would: Would,
}

/// A repetition the ledger shows.
#[derive(Debug, Clone, Serialize)]
pub struct PlanRepetition {
    pub op_id: String,
    pub state: String,
    /// `block` or `warn`, as the policy says.
    pub action: &'static str,
    /// `ledger`, or `host`: the host's fingerprint index (a claim another ledger or
    /// machine made).
    pub seen_in: &'static str,
}

/// Plans every host. Bad input is an error before anything is read or sent, as `run`
/// refuses it.
pub fn plan(ctx: &Context, req: &PlanRequest) -> Result<Vec<Plan>> {
    let invalid = |why: String| Error::new(ErrorKind::InvalidInput, why);
    let op = req
        .op
        .as_deref()
        .map(OpId::parse)
        .transpose()
        .map_err(|e| invalid(format!("{e}; nothing was sent")))?;
    if req.hosts.is_empty() {
        return Err(invalid(
            "no hosts: name at least one HOST; nothing was sent".into(),
        ));
    }
    for host in &req.hosts {
        crate::host::check_destination(host)
            .map_err(|why| invalid(format!("{why}; nothing was sent")))?;
    }
    let command = req.command.join(" ");
    if command.trim().is_empty() {
        return Err(invalid("the command is empty; nothing was sent".into()));
    }
    crate::host::check_command(&command).map_err(|e| invalid(format!("{e}; nothing was sent")))?;
    if let (Some(op), Some(earlier)) = (&op, &req.repeats) {
        let earlier = OpId::parse(earlier)
            .map_err(|e| invalid(format!("--repeats {earlier}: {e}; nothing was sent")))?;
        if earlier == *op {
            return Err(invalid(format!(
                "--repeats {earlier} names this run's own op id; name the EARLIER operation; nothing was sent"
            )));
        }
    }
    let secrets = crate::secret::Secrets::read(&req.secrets)
        .map_err(|e| invalid(format!("{e}; nothing was sent")))?;
    if let Some(why) = super::run::become_problem(req.become_user.as_deref(), &secrets) {
        return Err(invalid(format!("{why}; nothing was sent")));
    }
    let secret_names: Vec<String> = secrets.names().to_vec();
    let stdin = match &req.stdin {
        Stdin::None => None,
        Stdin::Given(bytes) | Stdin::Digested { bytes, .. } => Some(bytes.clone()),
        Stdin::Read => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|e| {
                Error::new(
                    ErrorKind::LocalIo,
                    format!("cannot read stdin (part of the intent): {e}; nothing was sent"),
                )
            })?;
            Some(buf)
        }
    };
    let policy = load_policy(ctx)?;
    let classification = policy.classify(&command);
    let (family, rule) = crate::operation::family_and_rule(&classification, req.class);
    let family_policy = policy.family(family).clone();
    let display = Redactor::with_patterns(policy.redact_patterns()).redact_owned(&command);
    let intent = Intent {
        command: &command,
        stdin_sha256: stdin.as_ref().map(|s| Sha256::digest(s).into()),
        secret_names: &secret_names,
        become_user: req.become_user.as_deref(),
    };
    let host_fp = host_fingerprint(&intent);
    let ledger = open_if_there(ctx, &policy)?;
    let signed = crate::approval::required(&policy).is_some();
    let approved = if signed { req.approval } else { req.approve };
    let declared = Declared {
        repeats: req.repeats.clone(),
        amends: req.amends.clone(),
    };
    let mut plans = Vec::new();
    for typed in &req.hosts {
        let (host, fresh) = super::reach::ledger_name(ctx, typed, &req.options)?;
        let mut facts = LedgerFacts {
            not_run_yet: true,
            ..Default::default()
        };
        let mut record = None;
        let mut recorded = Recorded::default();
        let mut repeats = None;
        if let (Some(ledger), Some(op)) = (&ledger, &op) {
            let key = OpKey::new(op.as_str(), host.clone());
            let ledger_fp = ledger_fingerprint(&intent, ledger.key());
            if let Some(existing) = ledger.operation(&key)? {
                let events = ledger.events(&key)?;
                let history = History::of(&events);
                facts = LedgerFacts {
                    known: true,
                    other_intent: existing.fingerprint != ledger_fp,
                    decision: history.final_decision.clone(),
                    exit_code: crate::operation::decide::earlier(Some(&existing), approved)
                        .ledger_exit,
                    reached_host: history.reached_host(),
                    not_run_yet: existing.attempts == 0
                        || existing.verdict == Some(Verdict::Blocked),
                };
                recorded = identity::recorded(&events);
                record = Some(existing);
            }
            if facts.not_run_yet {
                repeats = repeat::in_ledger(
                    ledger,
                    &key,
                    &ledger_fp,
                    family_policy.repeat_window,
                    family_policy.on_repeat,
                    &declared,
                )?;
            }
        }
        // Only a fresh claim meets the host's index, and only when the ledger found none.
        let index = (facts.not_run_yet
            && repeats.is_none()
            && family_policy.on_repeat != OnRepeat::Allow
            && !family_policy.repeat_window.is_zero())
        .then(|| {
            (
                host_fp.as_str(),
                family_policy.repeat_window,
                declared.ops(),
            )
        });
        let action = match family_policy.on_repeat {
            OnRepeat::Block => "block",
            _ => "warn",
        };
        let blocking = repeats
            .as_ref()
            .map(|r| (r.op_id.as_str(), r.action == "block", r.seen_in));
        let base = PlanFacts {
            family,
            after_interrupted: family_policy.after_interrupted,
            deny: classification.deny.as_deref(),
            approval: classification.approval.as_deref(),
            approved,
            ledger: &facts,
            repeats: blocking,
            marker: None,
            host_fp: &host_fp,
        };
        let mut marker = None;
        let would = match before_probe(&base) {
            Some(would) => would,
            None => {
                let probed = match (&op, fresh) {
                    // A fresh op id: no marker can exist under a name not yet minted.
                    (None, _) => Probed::Marker(absent(), None),
                    (Some(_), Err(e)) => Probed::Unreachable(e.to_string()),
                    (Some(op), Ok(dest)) => {
                        let dest = match recorded.route.as_ref() {
                            Some(route) => {
                                super::reach::reach(ctx, &host, &req.options, Some(route))
                                    .unwrap_or(dest)
                            }
                            None => dest,
                        };
                        block_on(probe_only(&dest, op, &host, &recorded, index))??
                    }
                };
                match probed {
                    Probed::Changed(why) => Would::host_changed(why),
                    Probed::Marker(m, found) => {
                        let from_host = found.map(|fields| {
                            Repetition::from_host(
                                &fields,
                                "the host's fingerprint index".into(),
                                action,
                            )
                        });
                        let held_by_host = from_host
                            .as_ref()
                            .map(|r| (r.op_id.as_str(), r.action == "block", r.seen_in));
                        let m = Ok(m);
                        let facts = PlanFacts {
                            marker: Some(&m),
                            repeats: held_by_host.or(base.repeats),
                            ..base
                        };
                        let would = before_probe(&facts).unwrap_or_else(|| after_probe(&facts));
                        if from_host.is_some() {
                            repeats = from_host;
                        }
                        if op.is_some() {
                            marker = Some(m);
                        }
                        would
                    }
                    Probed::Unreachable(why) => {
                        let m = Err(why);
                        let would = after_probe(&PlanFacts {
                            marker: Some(&m),
                            ..base
                        });
                        marker = Some(m);
                        would
                    }
                }
            }
        };
        let (marker_state, marker_exit_code, probe_error) = match &marker {
            Some(Ok(m)) => (Some(m.state.as_str().to_owned()), m.exit_code, None),
            Some(Err(why)) => (None, None, Some(why.clone())),
            None => (None, None, None),
        };
        plans.push(Plan {
            op_id: op.as_ref().map(|o| o.as_str().to_owned()),
            host,
            display: display.clone(),
            family,
            rule: rule.clone(),
            deny_rule: classification.deny.clone(),
            approval_rule: classification.approval.clone(),
            approved,
            ledger_state: record.as_ref().map(|r| r.state.to_string()),
            ledger_verdict: record.as_ref().and_then(|r| r.verdict),
            repeats: repeats.map(|r| PlanRepetition {
                op_id: r.op_id,
                state: r.state,
                action: r.action,
                seen_in: r.seen_in,
            }),
            marker_state,
            marker_exit_code,
            probe_error,
            would,
        });
    }
    Ok(plans)
}

/// The ledger when it exists, read as it is: a plan never creates one.
fn open_if_there(ctx: &Context, policy: &crate::policy::Policy) -> Result<Option<Ledger>> {
    let path = match ctx.ledger.as_deref() {
        Some(p) => p.to_path_buf(),
        None => Ledger::default_path().map_err(|e| super::redacted_error(e.into()))?,
    };
    if !crate::ledger::is_postgres_url(&path) && !path.exists() {
        return Ok(None);
    }
    super::open_existing_ledger(ctx, policy).map(Some)
}

/// The marker a fresh op id has: none.
fn absent() -> crate::host::MarkerInfo {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("state".to_owned(), "absent".to_owned());
    crate::host::MarkerInfo::from_fields(fields).expect("a state is all a marker needs")
}

/// What the read-only probe found.
enum Probed {
    /// The marker, and for an absent one the host index's earlier claim of the intent.
    Marker(
        crate::host::MarkerInfo,
        Option<std::collections::BTreeMap<String, String>>,
    ),
    /// The host could not be reached or did not answer: the plan's `probe_error`.
    Unreachable(String),
    /// Another key, user or marker root than the operation's attempts reached.
    Changed(String),
}

/// The marker by the read-only `probe` verb, on a host presenting a key the operation
/// ran against.
async fn probe_only(
    dest: &crate::host::Destination,
    op: &OpId,
    host: &str,
    recorded: &Recorded,
    index: Option<(&str, std::time::Duration, Vec<String>)>,
) -> Result<Probed> {
    use crate::host::{CallError, ReachError, RefusalReason};
    let reached = Host::connect_checked(dest, recorded.root(), |key, route| {
        recorded.check(host, op.as_str(), key, Some(route))
    })
    .await;
    let reached = match reached {
        Ok(reached) => reached,
        Err(ReachError::KeyMismatch(why) | ReachError::HostChanged(why)) => {
            return Ok(Probed::Changed(why))
        }
        Err(ReachError::Connect(e)) => return Ok(Probed::Unreachable(e.to_string())),
    };
    let marker = reached.probe(op).await;
    let found = match (&marker, index) {
        (Ok(m), Some((fp, window, declared))) if m.state == crate::host::MarkerState::Absent => {
            match reached.repeats(op, fp, window, &declared).await {
                Ok(found) => found,
                Err(e) => return Ok(Probed::Unreachable(e.to_string())),
            }
        }
        _ => None,
    };
    Ok(match marker {
        Ok(marker) => Probed::Marker(marker, found),
        Err(CallError::Refused(r)) if r.reason == RefusalReason::RootChanged => {
            Probed::Changed(recorded.root_changed(host, op.as_str(), &r))
        }
        Err(e) => Probed::Unreachable(e.to_string()),
    })
}
