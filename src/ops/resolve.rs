//! Resolve: an operator's decision, recorded as an observation, and final: a later `run` of the op
//! id answers it without contacting the host (docs/decisions.md#operator-decision). `not-applied` first fences
//! the marker on the host, and is refused when the host's evidence contradicts it or the
//! host presents another key than the operation ran against. `abandoned` fences the same
//! way and is refused the same way; only a host that cannot be reached lets it stand
//! unfenced, and only with `--force` (the command may still be running there), recorded
//! as a probe that found the host unreachable, so later evidence of the command shows as
//! a contradiction explained as such. Nothing is recorded when a decision is refused. The
//! host is reached by the operation's recorded route (docs/guarantees.md#host-identity).

use serde::Serialize;

use super::host_changed::{self, Answered};
use super::reach::reach;
use super::{block_on, load_policy, open_existing_ledger, operator_name, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{CallError, Host, MarkerState, ReachError, RefusalReason};
use crate::ledger::{Durability, Event, History, OpKey, ProbeState, UnlessSettledSince};
use crate::op_id::OpId;
use crate::operation::identity::{self, Recorded};
use crate::text::printable;
use crate::vocab::Resolution;

/// The decision to record.
#[derive(Debug, Clone)]
pub struct ResolveRequest {
    /// The op id, unchecked.
    pub op: String,
    /// The host as the ledger names it; without it, the one host the ledger records the
    /// op id on (an op id used on several hosts needs it).
    pub host: Option<String>,
    /// What the operator decided.
    pub decision: Resolution,
    /// Why (recorded with the decision; not empty).
    pub note: String,
    /// The exit status vouched for (`applied` only).
    pub exit: Option<i32>,
    /// Who decides (default: the acting user; never a made-up name).
    pub by: Option<String>,
    /// Abandon even when the host cannot be reached (nothing on it checked or fenced).
    pub force: bool,
    /// Connection options overriding the recorded route (for the fence).
    pub options: HostOptions,
}

impl ResolveRequest {
    /// The host (empty until [`resolve`] found it in the ledger).
    fn host(&self) -> &str {
        self.host.as_deref().unwrap_or_default()
    }
}

/// The host an op id is recorded on, when `--host` was not given: there must be exactly
/// one (the ledger key is op id + host), else the error names them and the fix.
pub(crate) fn the_one_host(ledger: &crate::ledger::Ledger, op: &OpId) -> Result<String> {
    let mut hosts = ledger.hosts_of(op.as_str())?;
    match hosts.len() {
        1 => Ok(hosts.remove(0)),
        0 => Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no operation `{op}` in the ledger {}; `opmark list` shows what is recorded. Nothing was recorded",
                ledger.path().display()
            ),
        )),
        _ => Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "op id `{op}` is recorded on {} hosts ({}); say which with --host HOST. Nothing was recorded",
                hosts.len(),
                hosts.iter().map(|h| printable(h)).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// What was recorded (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct ResolveReport {
    pub op_id: String,
    pub host: String,
    pub decision: &'static str,
    pub by: String,
    pub note: String,
    /// The exit status vouched for (`--exit`, applied only).
    pub exit_code: Option<i32>,
    /// What the fence did on the host (not-applied, abandoned).
    pub fence: Option<String>,
    /// Sequence numbers of the recorded events.
    pub seqs: Vec<u64>,
}

/// Records the decision (after fencing, for not-applied and abandoned).
pub fn resolve(ctx: &Context, args: &ResolveRequest) -> Result<Answered<ResolveReport>> {
    let op =
        OpId::parse(&args.op).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    if args.note.trim().is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--note is empty; say why (it is recorded with the decision)",
        ));
    }
    let note = args.note.trim();
    if note.starts_with('<') && note.ends_with('>') {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "--note {note} is the placeholder `opmark reconcile` printed; write what you found on the host (it is recorded with the decision). Nothing was recorded"
            ),
        ));
    }
    if let Some(code) = args.exit {
        if args.decision != Resolution::Applied {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "--exit goes with --as applied only (an operation that did not apply has no exit status); nothing was recorded",
            ));
        }
        if !(0..=255).contains(&code) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("--exit {code} is not an exit status (0 to 255); nothing was recorded"),
            ));
        }
    }
    // The decision is recorded under a name: never a made-up one.
    let by = operator_name(args.by.as_deref()).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "cannot tell who is deciding: $USER and $LOGNAME are unset and the uid has no \
             passwd entry; give --operator NAME. Nothing was recorded",
        )
    })?;
    let policy = load_policy(ctx)?;
    let mut ledger = open_existing_ledger(ctx, &policy)?;
    let filled;
    let args = match &args.host {
        Some(_) => args,
        None => {
            filled = ResolveRequest {
                host: Some(the_one_host(&ledger, &op)?),
                ..args.clone()
            };
            &filled
        }
    };
    let key = OpKey::new(op.as_str(), args.host().to_owned());
    let Some(seen) = ledger.operation(&key)? else {
        let hosts = ledger.hosts_of(op.as_str())?;
        let hint = if hosts.is_empty() {
            "`opmark list` shows what is recorded".to_owned()
        } else {
            format!(
                "it is recorded on: {}",
                hosts
                    .iter()
                    .map(|h| printable(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no operation `{op}` on host `{}` in the ledger {}; {hint}. Nothing was recorded",
                printable(args.host()),
                ledger.path().display()
            ),
        )
        // The same code as `show` gives an op id nobody recorded.
        .with_code(crate::vocab::ErrorCode::UnknownOperation));
    };
    let history = ledger.events(&key)?;
    // A final decision stands (docs/decisions.md#operator-decision): a second one, from this machine or any
    // other sharing the ledger, is refused, naming the first.
    if let Some(d) = History::of(&history).final_decision {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "operation `{op}` on `{}` was already settled by operator {} at {} ({}); nothing was recorded. `opmark show {op} --host {}` shows it",
                printable(args.host()),
                printable(&d.by),
                d.at,
                d.decision,
                printable(args.host())
            ),
        ));
    }
    let recorded = identity::recorded(&history);
    let decision = args.decision.as_str();
    let mut events = Vec::new();
    let mut fence_text = None;
    match args.decision {
        Resolution::NotApplied => {
            let text = match fence(ctx, args, &op, &recorded) {
                Ok(text) => text,
                Err(e) => {
                    return host_changed::answer(
                        host_changed::Subcommand::Resolve,
                        op.as_str(),
                        args.host(),
                        e.into_error(),
                    )
                }
            };
            events.push(Event::Fenced {
                detail: format!("opmark resolve --as not-applied by {by}: {text}"),
            });
            fence_text = Some(text);
        }
        // Abandoning is for operations nobody can check, often on a host that is gone:
        // only a host that cannot be reached lets the decision stand without the fence
        // (a later `run` answers from the ledger), and the ledger records that the host
        // was not reached, so a later probe that finds the command running or completed
        // is a contradiction, never silent. A host that answers is heard: one that says
        // the command is running or completed refuses the decision, as for not-applied.
        Resolution::Abandoned => match fence(ctx, args, &op, &recorded) {
            Ok(text) => {
                events.push(Event::Fenced {
                    detail: format!("opmark resolve --as abandoned by {by}: {text}"),
                });
                fence_text = Some(text);
            }
            Err(NotFenced::Unreachable(_, cause)) if !args.force => {
                return Err(Error::new(
                    ErrorKind::Unreachable,
                    format!(
                        "cannot abandon {op} on {host} yet: the host cannot be reached ({cause}), and nothing was recorded. Abandoning now would record a decision while the command may still be running on {host} (an unreachable host is often only a cut link): nothing there can be checked or fenced, a delayed attempt could still start, and the host's later evidence would contradict the decision. Wait and run `opmark reconcile` when the host is back, or look with `opmark show {op} --host {host}` and check the host by other means; to record it anyway, add --force",
                        host = printable(args.host()),
                    ),
                ));
            }
            Err(NotFenced::Unreachable(e, _)) => {
                let text = format!("not fenced: {}", e.message);
                events.push(Event::Probed {
                    attempt_id: None,
                    state: ProbeState::Unreachable,
                    exit_code: None,
                    detail: format!(
                        "opmark resolve --as abandoned --force by {by}: the host was not reached, so nothing on it was checked or fenced; the command may still have been running ({})",
                        e.message
                    ),
                    claim: None,
                });
                fence_text = Some(text);
            }
            Err(refused) => {
                return host_changed::answer(
                    host_changed::Subcommand::Resolve,
                    op.as_str(),
                    args.host(),
                    refused.into_error(),
                )
            }
        },
        Resolution::Applied => {}
    }
    events.push(Event::OperatorDecision {
        by: by.clone(),
        decision: decision.into(),
        note: args.note.clone(),
        exit_code: args.exit,
    });
    // Conditional on what was read above: of two operators deciding at once, one wins.
    let seqs = ledger.append_if(
        &key,
        &events,
        Durability::Full,
        Some(UnlessSettledSince(seen.last_seq)),
    )?;
    Ok(Answered::Report(ResolveReport {
        op_id: op.as_str().to_owned(),
        host: args.host().to_owned(),
        decision,
        by,
        note: args.note.clone(),
        exit_code: args.exit,
        fence: fence_text,
        seqs,
    }))
}

/// Why the fence was not put in place. Every variant's error says that nothing was
/// recorded and what to do.
enum NotFenced {
    /// The host could not be reached, or the fence's answer was lost: the host affirmed
    /// nothing about the operation.
    Unreachable(Error, String),
    /// The host answered and refused (it says the command is running or completed, or
    /// refused for another reason), or it presents another key than the operation ran
    /// against (another machine), or the answer made no sense.
    Refused(Error),
}

impl NotFenced {
    fn into_error(self) -> Error {
        match self {
            NotFenced::Unreachable(e, _) | NotFenced::Refused(e) => e,
        }
    }
}

/// Fences the marker (force: an interrupted claim too). Refuses when the host says the
/// command completed or is running (the evidence contradicts "not applied"), and when
/// the host presents another key than the operation ran against (another machine).
fn fence(
    ctx: &Context,
    args: &ResolveRequest,
    op: &OpId,
    recorded: &Recorded,
) -> std::result::Result<String, NotFenced> {
    let dest = reach(ctx, args.host(), &args.options, recorded.route.as_ref()).map_err(|e| {
        NotFenced::Refused(Error::new(
            ErrorKind::Unreachable,
            format!(
                "cannot fence {op} on {}: {e}; nothing was recorded",
                printable(args.host())
            ),
        ))
    })?;
    let host = printable(args.host());
    let reached = block_on(async {
        let reached = Host::connect_checked(&dest, recorded.root(), |key, route| {
            recorded.check(args.host(), op.as_str(), key, Some(route))
        })
        .await;
        let target = reached.map_err(|e| match e {
            ReachError::Connect(e) => NotFenced::Unreachable(
                Error::new(
                    ErrorKind::Unreachable,
                    format!(
                        "cannot fence {op} on {host}: {e}; nothing was recorded. A not-applied decision needs the fence so a delayed attempt can never run"
                    ),
                ),
                e.to_string(),
            ),
            changed => NotFenced::Refused(host_changed::reach_error(
                changed,
                "nothing was fenced or recorded",
            )),
        })?;
        Ok::<_, NotFenced>(target.fence(op, true).await)
    });
    let answer = match reached {
        Ok(answer) => answer?,
        Err(e) => return Err(NotFenced::Refused(e)),
    };
    let refusal = match answer {
        Ok(fenced) => return Ok(format!("{} ({})", fenced.outcome, fenced.marker.summary())),
        Err(CallError::Refused(r)) => r,
        Err(CallError::NoAnswer(_)) => {
            return Err(NotFenced::Refused(Error::new(
                ErrorKind::Internal,
                "the shim answered the fence without a fence frame; nothing was recorded",
            )))
        }
        Err(e) => {
            return Err(NotFenced::Unreachable(
                Error::new(
                    ErrorKind::Unreachable,
                    format!("the fence of {op} on {host} got no answer ({e}); nothing was recorded. Probe it, then retry"),
                ),
                format!("the fence got no answer: {e}"),
            ))
        }
    };
    if refusal.reason == RefusalReason::RootChanged {
        return Err(NotFenced::Refused(host_changed::root_changed(
            recorded,
            args.host(),
            op.as_str(),
            &refusal,
        )));
    }
    let seen = CallError::Refused(refusal.clone()).seen();
    let decision = args.decision.as_str().replace('_', " ");
    let message = match refusal.reason {
        RefusalReason::Marker(MarkerState::Completed) => format!(
            "the host says {op} completed ({seen}): that contradicts {decision}; nothing was recorded. Use --as applied, or investigate with `opmark show {op}`"
        ),
        RefusalReason::Marker(MarkerState::Running) => format!(
            "the host says {op} is running ({seen}): it cannot be declared {decision}; nothing was recorded. Wait for it (or `opmark cancel {host} {op}`), then `opmark reconcile`"
        ),
        _ => format!(
            "the host refused to fence {op} ({seen}); nothing was recorded. Check the host with `opmark doctor`"
        ),
    };
    Err(NotFenced::Refused(Error::new(
        ErrorKind::InvalidInput,
        message,
    )))
}
