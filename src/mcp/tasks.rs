//! Task-augmented `run` calls: the task is the operation.
//!
//! A task id is `OP_ID@HOST`. An op id cannot hold `@`, so the first `@` splits it back,
//! and any server process (this one, or one started after this one was killed) can answer
//! for any task id from the ledger and the host's marker alone: no task table has to
//! survive. One task is one operation on one host, because the `run` tool takes one host;
//! a fleet is one task per host, each with its own state and its own run document, so a
//! client never has to pick one host's outcome out of a mixed one.
//!
//! Two wires carry the same tasks. The tasks extension (`io.modelcontextprotocol/tasks`,
//! protocol 2026-07-28) goes through rmcp's own task handlers ([`super::Server`]). The
//! older tasks of protocol 2025-11-25 (`task` in `tools/call`, `tasks/result`,
//! `tasks/list`, a cancel that answers the task) are what the official Python SDK's only
//! task client speaks, and rmcp 3.11 no longer parses them, so they are answered in
//! front of the SDK, by [`super::wire`]; every other message still goes through the SDK.
//! A call that asks for no task is the plain tool call, with its `wait` budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolResult, JsonObject};
use serde_json::{json, Map, Value};

use super::arguments::{arguments, run_request, RunParams};
use super::busy::Busy;
use super::results::{cut_output, error_result};
use crate::error::{Error, ErrorKind};
use crate::ledger::fingerprint::{host_fingerprint, Intent};
use crate::ops::cancel::{cancel, CancelRequest};
use crate::ops::host_changed::Answered;
use crate::ops::list::{list, ListRequest};
use crate::ops::probe::{probe, ProbeRequest};
use crate::ops::run::{run, RunRequest, Stdin, Unwatched};
use crate::ops::show::{show, ShowRequest};
use crate::ops::{Context, HostOptions};

/// How often a client is asked to poll: a command's state changes at human speed, and
/// every `tasks/get` of a task not followed here costs a probe over SSH.
pub(super) const POLL_MS: u64 = 2000;

/// How long one follow of a task's command lasts before it is taken up again by the
/// next `tasks/get`; a thread per task never outlives a long command by much.
const FOLLOW_FOR: Duration = Duration::from_secs(600);

/// The tasks of one server process: what it has run or followed, by task id.
#[derive(Debug, Clone)]
pub struct Tasks {
    ctx: Context,
    max_output: usize,
    busy: Arc<std::sync::atomic::AtomicUsize>,
    live: Arc<Mutex<HashMap<String, Live>>>,
}

/// A task this process has a run request for.
#[derive(Debug, Clone)]
struct Live {
    request: RunRequest,
    budget: usize,
    created_at: String,
    updated_at: String,
    /// A run thread is following the command now.
    following: bool,
    /// The last run document (cut to the budget), when a run answered.
    answer: Option<CallToolResult>,
    /// What `tasks/cancel` answered, when it stopped or fenced the operation.
    cancelled: Option<Value>,
}

/// A task's state as the wire shows it, and the result `tasks/result` gives.
pub(super) struct State {
    pub(super) status: &'static str,
    pub(super) message: String,
    pub(super) created_at: String,
    pub(super) updated_at: String,
    pub(super) result: Option<CallToolResult>,
}

/// A JSON-RPC error: code and message.
pub type RpcError = (i64, String);

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// `OP_ID@HOST`.
pub fn task_id(op: &str, host: &str) -> String {
    format!("{op}@{host}")
}

/// The op id and host a task id names.
fn parse_task_id(id: &str) -> Result<(String, String), RpcError> {
    match id.split_once('@') {
        Some((op, host))
            if crate::op_id::OpId::parse(op).is_ok() && !host.is_empty() =>
        {
            Ok((op.to_owned(), host.to_owned()))
        }
        _ => Err((
            -32602,
            format!("`{id}` is not an opmark task id (OP_ID@HOST, as `tools/call` of `run` answered it)"),
        )),
    }
}

/// The task status a run document's verdict maps to, and a line saying why.
fn status_of(doc: &Value) -> (&'static str, String) {
    let verdict = doc.get("verdict").and_then(Value::as_str).unwrap_or("");
    let reason_code = doc.get("reason_code").and_then(Value::as_str).unwrap_or("");
    let reason = doc
        .get("reason")
        .or_else(|| doc.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match verdict {
        "in_progress" => (
            "working",
            format!("the command is running on the host ({reason_code})"),
        ),
        "completed" | "replayed" if doc.get("cancelled") == Some(&Value::Bool(true)) => (
            "cancelled",
            format!(
                "stopped by opmark cancel, exit {}",
                doc.get("exit_code")
                    .map_or("unknown".to_owned(), Value::to_string)
            ),
        ),
        "completed" | "replayed" => {
            let exit = doc
                .get("exit_code")
                .map_or("unknown".to_owned(), Value::to_string);
            ("completed", format!("{verdict}, exit code {exit}"))
        }
        // The human's part is in the document: `tasks/result` carries it whole.
        "blocked" => (
            "input_required",
            format!("blocked ({reason_code}): a human must decide outside MCP: {reason}"),
        ),
        "" => {
            let e = doc.get("error").cloned().unwrap_or(Value::Null);
            (
                "failed",
                format!(
                    "error ({}): {}",
                    e.get("reason_code")
                        .and_then(Value::as_str)
                        .unwrap_or("error"),
                    e.get("message").and_then(Value::as_str).unwrap_or("")
                ),
            )
        }
        other => (
            "failed",
            format!("verdict {other} ({reason_code}): {reason}"),
        ),
    }
}

/// What a cancel that stopped the command or fenced the op id found, from the ledger's
/// observations: a later verdict (the follow that saw the signal's exit) must not read
/// as the command having completed by itself.
fn cancel_won(page: &crate::ops::show::Page) -> Option<String> {
    page.observations
        .iter()
        .rev()
        .find(|o| o.what.starts_with("cancel by"))
        .filter(|o| {
            o.found.starts_with("cancelled")
                || o.found.starts_with("fenced")
                || o.found.starts_with("already_fenced")
        })
        .map(|o| format!("{} ({}): {}", o.what, o.at, o.found))
}

/// The wire's task object.
fn task_json(id: &str, s: &State) -> Value {
    json!({
        "taskId": id,
        "status": s.status,
        "statusMessage": s.message,
        "createdAt": s.created_at,
        "lastUpdatedAt": s.updated_at,
        "ttl": Value::Null,
        "pollInterval": POLL_MS,
    })
}

fn rpc_error(e: &Error) -> RpcError {
    let code = if e.kind == ErrorKind::InvalidInput {
        -32602
    } else {
        -32603
    };
    (code, e.to_string())
}

impl Tasks {
    pub fn new(ctx: Context, max_output: usize, busy: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        Tasks {
            ctx,
            max_output,
            busy,
            live: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Whether this message is one of the task methods of the 2025-11-25 wire, answered
    /// here: a `run` call with `task`, `tasks/result`, `tasks/list`, and `tasks/get` and
    /// `tasks/cancel` unless the client declared the tasks extension (at `initialize`,
    /// `extension_session`, or in the request's `_meta`), whose are the SDK's.
    pub fn handles(message: &Value, extension_session: bool) -> bool {
        let method = message.get("method").and_then(Value::as_str).unwrap_or("");
        if message.get("id").is_none() {
            return false;
        }
        let params = message.get("params");
        match method {
            "tasks/result" | "tasks/list" => true,
            "tasks/get" | "tasks/cancel" => {
                let in_meta = params
                    .and_then(|p| p.get("_meta"))
                    .and_then(|m| m.get("io.modelcontextprotocol/clientCapabilities"))
                    .is_some_and(declares_extension);
                !(extension_session || in_meta)
            }
            "tools/call" => {
                params.and_then(|p| p.get("task")).is_some()
                    && params.and_then(|p| p.get("name")).and_then(Value::as_str) == Some("run")
            }
            _ => false,
        }
    }

    /// The JSON-RPC answer line to a message [`Tasks::handles`]. Blocks (SSH probes, a
    /// `tasks/result` waiting for the end): call it off the async runtime.
    pub fn answer(&self, message: &Value) -> Vec<u8> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let params = message.get("params").cloned().unwrap_or(json!({}));
        let task = || {
            params
                .get("taskId")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let result = match message.get("method").and_then(Value::as_str).unwrap_or("") {
            "tools/call" => self.start(&params),
            "tasks/get" => self.get(&task()).map(|(id, s)| task_json(&id, &s)),
            "tasks/result" => self.result(&task()),
            "tasks/cancel" => self.cancel(&task()),
            _ => self.list(),
        };
        let mut line = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        }
        .to_string()
        .into_bytes();
        line.push(b'\n');
        line
    }

    /// A task-augmented `run`: checks the arguments, starts the run on a thread of its
    /// own and answers the task at once.
    fn start(&self, params: &Value) -> Result<Value, RpcError> {
        let args = params
            .get("arguments")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let (id, state) = self.start_run(args)?;
        Ok(json!({"task": task_json(&id, &state)}))
    }

    /// Starts (or takes up again, for the same op id) the run a task-augmented call
    /// asks for; the task as it stands.
    pub(super) fn start_run(&self, args: JsonObject) -> Result<(String, State), RpcError> {
        let bad = |r: CallToolResult| {
            let doc = r.structured_content.unwrap_or(Value::Null);
            (
                -32602,
                doc["error"]["message"]
                    .as_str()
                    .unwrap_or("invalid arguments")
                    .to_owned(),
            )
        };
        let p = arguments::<RunParams>("run", args).map_err(bad)?;
        let budget = p.output_budget.map_or(self.max_output, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        });
        let mut request = run_request(p).map_err(bad)?;
        // A task is polled, not waited on: each follow lasts long, and ends in the next
        // `tasks/get` taking it up again.
        request.wait = FOLLOW_FOR;
        request.fleet.detach = false;
        let id = task_id(request.op.as_deref().unwrap_or(""), &request.hosts[0]);
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let entry = live.entry(id.clone()).or_insert_with(|| Live {
                request: request.clone(),
                budget,
                created_at: now(),
                updated_at: now(),
                following: false,
                answer: None,
                cancelled: None,
            });
            // The same op id again is a retry of the same task: the run it starts
            // replays or follows, or answers `conflict` if the command changed.
            entry.request = request;
            entry.budget = budget;
        }
        self.follow(&id);
        self.get(&id)
    }

    /// Starts a run thread for a live task unless one is following it already.
    fn follow(&self, id: &str) {
        let request = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let Some(entry) = live.get_mut(id) else {
                return;
            };
            if entry.following {
                return;
            }
            entry.following = true;
            entry.request.clone()
        };
        let (ctx, tasks, key, busy) = (
            self.ctx.clone(),
            Arc::clone(&self.live),
            id.to_owned(),
            Busy::new(&self.busy),
        );
        let spawned = std::thread::Builder::new()
            .name("opmark-mcp-task".into())
            .spawn(move || {
                let _busy = busy;
                let answer = run(&ctx, request, &mut Unwatched).and_then(|a| {
                    let mut doc = a.document()?;
                    doc["exit_status"] = a.exit_status().into();
                    Ok(doc)
                });
                let mut live = tasks.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(entry) = live.get_mut(&key) {
                    entry.following = false;
                    entry.updated_at = now();
                    entry.answer = Some(match answer {
                        Ok(doc) => cut_output(CallToolResult::structured(doc), entry.budget),
                        Err(e) => error_result(&e),
                    });
                }
            });
        if spawned.is_err() {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = live.get_mut(id) {
                entry.following = false;
            }
        }
    }

    /// A task's state: from this process's run when it has one, else from the ledger
    /// and the marker.
    pub(super) fn get(&self, id: &str) -> Result<(String, State), RpcError> {
        let (op, host) = parse_task_id(id)?;
        let id = task_id(&op, &host);
        let known = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        let Some(live) = known else {
            return self.by_evidence(&id, &op, &host).map(|s| (id, s));
        };
        let state = |status, message: String, result| State {
            status,
            message,
            created_at: live.created_at.clone(),
            updated_at: live.updated_at.clone(),
            result,
        };
        if let Some(cancel) = &live.cancelled {
            let message = cancel["reason"].as_str().unwrap_or("cancelled").to_owned();
            return Ok((id, state("cancelled", message, live.answer.clone())));
        }
        if live.following {
            return Ok((
                id,
                state("working", "the command is running on the host".into(), None),
            ));
        }
        let Some(answer) = live.answer.clone() else {
            return Ok((id, state("working", "starting".into(), None)));
        };
        let doc = answer.structured_content.clone().unwrap_or(Value::Null);
        let (status, message) = status_of(&doc);
        if status == "working" {
            // The follow's own budget ran out; the command still runs: follow it again.
            self.follow(&id);
        }
        Ok((id, state(status, message, Some(answer))))
    }

    /// The state of a task this process did not start: the ledger says whether the op
    /// id exists and how it was settled; the marker says whether the command still runs
    /// or finished. A running or finished command whose recorded command is its real one
    /// (the marker's digest of it matches) is followed or replayed by `run` itself, so
    /// the result is the run document; anything else is answered from the ledger and
    /// never runs anything.
    fn by_evidence(&self, id: &str, op: &str, host: &str) -> Result<State, RpcError> {
        let shown = show(
            &self.ctx,
            &ShowRequest {
                op: op.to_owned(),
                host: Some(host.to_owned()),
                limit: Some(1),
            },
        )
        .map_err(|e| (-32602, format!("no task `{id}`: {e}")))?;
        let page = shown
            .pages()
            .iter()
            .find(|p| p.key.host == host)
            .or(shown.pages().first())
            .ok_or((-32602, format!("no task `{id}` in this ledger")))?;
        let record = page.operation.as_ref().map(|o| &o.record).ok_or((
            -32602,
            format!("no task `{id}`: the ledger has no intent for it"),
        ))?;
        let record_json = serde_json::to_value(record).unwrap_or(Value::Null);
        let created_at = record.created_at.clone();
        let updated_at = record.updated_at.clone();
        let marker = probe(
            &self.ctx,
            &ProbeRequest {
                host: host.to_owned(),
                op: op.to_owned(),
                options: HostOptions::default(),
            },
        );
        if let Ok(Answered::Report(m)) = &marker {
            let command_is_real = m.host_fingerprint.as_deref()
                == Some(
                    host_fingerprint(&Intent {
                        command: &record.display,
                        stdin_sha256: None,
                        secret_names: &[],
                        become_user: None,
                    })
                    .as_str(),
                );
            if (m.state == "running" || m.state == "completed") && command_is_real {
                let replay = m.state == "completed";
                self.adopt(id, op, host, &record.display, created_at.clone(), replay);
                let (_, state) = self.get(id)?;
                return Ok(state);
            }
            if m.state == "running" {
                return Ok(State {
                    status: "working",
                    message: "the command is running on the host (its recorded command is redacted, so this server cannot follow it: poll again)".into(),
                    created_at,
                    updated_at,
                    result: None,
                });
            }
        }
        // From the ledger's word and the marker's, without the run document: the ledger
        // keeps the command redacted, so nothing can follow or replay it from here.
        let (marker_state, marker_doc) = match &marker {
            Ok(Answered::Report(m)) => (
                m.state.clone(),
                serde_json::to_value(m).unwrap_or(Value::Null),
            ),
            Ok(Answered::HostChanged(c)) => (
                "host_changed".to_owned(),
                serde_json::to_value(c).unwrap_or(Value::Null),
            ),
            Err(e) => ("unknown".to_owned(), json!({"error": e.to_string()})),
        };
        let doc = json!({
            "schema": "opmark/2",
            "op_id": op,
            "host": host,
            "verdict": record_json["verdict"],
            "exit_code": record_json["exit_code"],
            "reason_code": "task_from_ledger",
            "reason": format!("answered from the ledger ({}) and the host's marker ({marker_state}); this server cannot rebuild the run document (the ledger keeps the command redacted): `run` with the same op_id and command replays it, `output` reads the output, `show` has the timeline", page.outcome.text),
            "operation": record_json,
            "marker": marker_doc,
        });
        let state = record_json["state"].as_str().unwrap_or("");
        let last_word = page.outcome.last_word.as_deref().unwrap_or("");
        let (status, message) = if let Some(found) = cancel_won(page) {
            ("cancelled", found)
        } else if state == "cancelled" {
            ("cancelled", page.outcome.text.clone())
        } else if marker_state == "completed" {
            (
                "completed",
                format!(
                    "the command finished on the host, exit {}",
                    marker_doc["exit_code"]
                ),
            )
        } else if !record_json["verdict"].is_null() {
            status_of(&doc)
        } else if marker_state == "unknown" {
            (
                "working",
                format!(
                    "no verdict yet and the host cannot be probed now ({}); poll again",
                    marker_doc["error"]
                ),
            )
        } else if !record.unresolved && last_word.ends_with(":applied") {
            ("completed", page.outcome.text.clone())
        } else {
            (
                "failed",
                format!(
                    "{} (the host's marker is {marker_state})",
                    page.outcome.text
                ),
            )
        };
        Ok(State {
            status,
            message,
            created_at,
            updated_at,
            result: Some(CallToolResult::structured(doc)),
        })
    }

    /// Makes a task this process did not start its own: the same op id, host and
    /// command, so `run` follows or replays it (it cannot run it again).
    fn adopt(
        &self,
        id: &str,
        op: &str,
        host: &str,
        command: &str,
        created_at: String,
        replay: bool,
    ) {
        let p = RunParams::plain(host, op, command);
        let Ok(mut request) = run_request(p) else {
            return;
        };
        request.wait = FOLLOW_FOR;
        request.stdin = Stdin::None;
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_insert_with(|| Live {
                request,
                budget: self.max_output,
                created_at,
                updated_at: now(),
                following: false,
                answer: None,
                cancelled: None,
            });
        self.follow(id);
        if !replay {
            return;
        }
        // A replay answers within a probe's time: wait briefly, so a finished task
        // reads as finished on the first `tasks/get`.
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(100));
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if live.get(id).is_some_and(|l| !l.following) {
                break;
            }
        }
    }

    /// The run document, once the task is no longer working (waiting for it, as the
    /// protocol asks).
    fn result(&self, id: &str) -> Result<Value, RpcError> {
        loop {
            let (key, state) = self.get(id)?;
            // A cancelled command's run document comes once the follow saw it end.
            let following = self
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .is_some_and(|l| l.following);
            if state.status != "working" && (state.result.is_some() || !following) {
                let result = state.result.unwrap_or_else(|| {
                    CallToolResult::structured(json!({"schema": "opmark/2", "task": id, "status": state.status, "reason": state.message}))
                });
                return serde_json::to_value(result).map_err(|e| (-32603, e.to_string()));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS / 2));
        }
    }

    /// `opmark cancel` of the task's operation; the task as it stands afterwards, with
    /// the cancel's own words (whether it stopped the command, or lost the race).
    fn cancel(&self, id: &str) -> Result<Value, RpcError> {
        let (id, state, doc) = self.cancel_op(id)?;
        let mut task = task_json(&id, &state);
        task["cancel"] = doc;
        Ok(task)
    }

    /// `opmark cancel` of a task's operation: the task afterwards (its message the
    /// cancel's own words) and the cancel document.
    pub(super) fn cancel_op(&self, id: &str) -> Result<(String, State, Value), RpcError> {
        let (op, host) = parse_task_id(id)?;
        let id = task_id(&op, &host);
        let report = cancel(
            &self.ctx,
            &CancelRequest {
                host: host.clone(),
                op: op.clone(),
                grace: Duration::from_secs(10),
                by: Some("opmark-mcp".to_owned()),
                force: false,
                options: HostOptions::default(),
            },
        )
        .map_err(|e| rpc_error(&e))?;
        let doc = match report {
            Answered::Report(r) => serde_json::to_value(&r),
            Answered::HostChanged(c) => serde_json::to_value(&c),
        }
        .map_err(|e| (-32603, e.to_string()))?;
        let outcome = doc["cancel_outcome"].as_str().unwrap_or("");
        let won = matches!(outcome, "cancelled" | "fenced" | "already_fenced");
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = live.get_mut(&id) {
                if won {
                    entry.cancelled = Some(doc.clone());
                }
                entry.updated_at = now();
            }
        }
        let (id, mut state) = self.get(&id)?;
        if won {
            state.status = "cancelled";
        }
        state.message = format!(
            "cancel_outcome {outcome}: {}",
            doc["reason"].as_str().unwrap_or("")
        );
        Ok((id, state, doc))
    }

    /// Recent operations of this ledger as tasks, from the ledger alone (no probes).
    fn list(&self) -> Result<Value, RpcError> {
        let report = list(
            &self.ctx,
            &ListRequest {
                unresolved: false,
                limit: Some(crate::ops::list::DEFAULT_LIMIT),
                ..ListRequest::default()
            },
        )
        .map_err(|e| rpc_error(&e))?;
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let tasks: Vec<Value> = report
            .operations
            .iter()
            .map(|o| {
                let id = task_id(&o.op_id, &o.host);
                let r = serde_json::to_value(&o.record).unwrap_or(Value::Null);
                let page = show(
                    &self.ctx,
                    &ShowRequest {
                        op: o.op_id.clone(),
                        host: Some(o.host.clone()),
                        limit: Some(1),
                    },
                )
                .ok();
                let won = page.as_ref().and_then(|p| {
                    p.pages()
                        .iter()
                        .find(|p| p.key.host == o.host)
                        .and_then(cancel_won)
                });
                let (status, message) = if live.get(&id).is_some_and(|l| l.following) {
                    ("working", "the command is running on the host".to_owned())
                } else if let Some(found) = won {
                    ("cancelled", found)
                } else if r["state"] == "cancelled" {
                    ("cancelled", "cancelled".to_owned())
                } else if r["verdict"].is_null() {
                    // No verdict: a probe (tasks/get) tells; the list reads the ledger only.
                    let word = page
                        .as_ref()
                        .and_then(|p| p.pages().first().map(|p| p.outcome.clone()));
                    match word {
                        Some(w)
                            if !o.unresolved
                                && w.last_word
                                    .as_deref()
                                    .is_some_and(|l| l.ends_with(":applied")) =>
                        {
                            ("completed", w.text)
                        }
                        Some(w) if !o.unresolved => ("failed", w.text),
                        _ => (
                            "working",
                            "no verdict yet; tasks/get probes the host".to_owned(),
                        ),
                    }
                } else {
                    status_of(&r)
                };
                task_json(
                    &id,
                    &State {
                        status,
                        message,
                        created_at: o.created_at.clone(),
                        updated_at: o.updated_at.clone(),
                        result: None,
                    },
                )
            })
            .collect();
        Ok(json!({ "tasks": tasks }))
    }
}

/// Whether client capabilities declare the tasks extension.
pub fn declares_extension(capabilities: &Value) -> bool {
    capabilities
        .get("extensions")
        .and_then(|e| e.get(rmcp::model::TASKS_EXTENSION_ID))
        .is_some()
}

/// The initialize answer with the tasks capability of the wire [`Tasks`] serves added.
pub fn advertise(line: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(line).ok()?;
    let result = v.get_mut("result")?.as_object_mut()?;
    if !result.contains_key("protocolVersion") {
        return None;
    }
    let caps: &mut Map<String, Value> = result.get_mut("capabilities")?.as_object_mut()?;
    caps.insert(
        "tasks".into(),
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
    );
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_names_the_operation_and_splits_back_at_the_first_at_sign() {
        let id = task_id("deploy-7", "admin@web1.example");
        assert_eq!(id, "deploy-7@admin@web1.example");
        assert_eq!(
            parse_task_id(&id).unwrap(),
            ("deploy-7".to_owned(), "admin@web1.example".to_owned())
        );
        for bad in ["no-host@", "@web1", "no at sign", "bad op@web1"] {
            assert_eq!(parse_task_id(bad).unwrap_err().0, -32602, "{bad}");
        }
    }

    #[test]
    fn verdicts_map_onto_task_states() {
        let doc = |v: Value| status_of(&v).0;
        assert_eq!(doc(json!({"verdict": "in_progress"})), "working");
        assert_eq!(
            doc(json!({"verdict": "completed", "exit_code": 3})),
            "completed"
        );
        assert_eq!(
            doc(json!({"verdict": "replayed", "exit_code": 0})),
            "completed"
        );
        assert_eq!(
            doc(json!({"verdict": "completed", "exit_code": 143, "cancelled": true})),
            "cancelled"
        );
        assert_eq!(doc(json!({"verdict": "blocked"})), "input_required");
        for v in ["not_applied", "indeterminate", "conflict", "refused"] {
            let (status, message) = status_of(&json!({"verdict": v, "reason_code": "why"}));
            assert_eq!(status, "failed", "{v}");
            assert!(message.contains(v) && message.contains("why"), "{message}");
        }
        assert_eq!(
            doc(json!({"error": {"reason_code": "unknown_host", "message": "no"}})),
            "failed"
        );
    }

    #[test]
    fn only_task_augmented_runs_and_task_methods_are_answered_here() {
        let handles = |v: Value| Tasks::handles(&v, false);
        assert!(handles(
            json!({"id": 1, "method": "tools/call", "params": {"name": "run", "task": {"ttl": 60000}}})
        ));
        assert!(!handles(
            json!({"id": 1, "method": "tools/call", "params": {"name": "run"}})
        ));
        assert!(!handles(
            json!({"id": 1, "method": "tools/call", "params": {"name": "show", "task": {}}})
        ));
        for m in ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"] {
            assert!(handles(json!({"id": 1, "method": m})), "{m}");
            assert!(!handles(json!({"method": m})), "a notification: {m}");
        }
        assert!(!handles(json!({"id": 1, "method": "tools/list"})));
        // The extension's own tasks/get and tasks/cancel are the SDK's.
        assert!(!Tasks::handles(
            &json!({"id": 1, "method": "tasks/get"}),
            true
        ));
        assert!(!handles(
            json!({"id": 1, "method": "tasks/cancel", "params": {"_meta":
            {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}})
        ));
        assert!(Tasks::handles(
            &json!({"id": 1, "method": "tasks/list"}),
            true
        ));
    }

    #[test]
    fn the_initialize_answer_advertises_the_task_methods_and_nothing_else_changes() {
        let init = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}}"#;
        let out: Value = serde_json::from_slice(&advertise(init).unwrap()).unwrap();
        assert_eq!(
            out["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"],
            json!({})
        );
        assert_eq!(out["result"]["capabilities"]["tools"], json!({}));
        assert!(advertise(br#"{"jsonrpc":"2.0","id":3,"result":{"capabilities":{}}}"#).is_none());
        assert!(advertise(b"not json").is_none());
    }
}
