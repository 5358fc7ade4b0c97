//! `opmark mcp`: the Model Context Protocol on stdio (docs/guarantees.md#agents-over-mcp), on the official
//! Rust SDK (`rmcp`).
//!
//! A thin layer: every tool calls the same operation the CLI runs ([`crate::ops`]), on a
//! thread of its own, and hands its report as the JSON document the CLI's `--json`
//! prints (schema `opmark/2`) to the client as structured content. So the policy, the
//! ledger, the verdicts and the reason codes are the CLI's, exactly. What the layer adds:
//! - no way to approve: the `run` tool has no `approve` argument, so `blocked` stays
//!   blocked (approval is a human's act, `opmark run --approve` or `opmark resolve`);
//! - no prompt ever: passphrase prompts are forbidden for the whole process;
//! - command output cut to `--max-output` per stream, with the byte counts, the digests
//!   and how to read the rest;
//! - a progress notification every few seconds while a tool runs, when the client asked
//!   for progress (a long `run` is not mistaken for a hung server);
//! - a budget: `run` never outlasts its `wait` (spent, it answers `in_progress` and the
//!   command keeps running on the host), and has `detach`;
//! - arguments checked against the tool's own input schema before anything: an unknown
//!   or missing argument, or one of the wrong type, is an error document naming the
//!   `field` and the fix (`invalid_input`), never ignored;
//! - an output schema per tool: the document's published schema (schemas/), bundled into
//!   one document, with the fields this layer adds.
//! - tasks: a task-augmented `run` is a task named by its operation, so it outlives the
//!   server that started it ([`tasks`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolResult, Implementation, JsonObject, ProgressNotificationParam, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler};
use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::operation::output::OutputBytes;
use crate::ops::cancel::{cancel, CancelRequest};
use crate::ops::document::json_document;
use crate::ops::host_changed::Answered;
use crate::ops::list::{list, ListRequest};
use crate::ops::output::output;
use crate::ops::plan::{plan, PlanRequest};
use crate::ops::probe::{probe, ProbeRequest};
use crate::ops::reconcile::{reconcile, ReconcileRequest};
use crate::ops::run::{run, Unwatched};
use crate::ops::show::{show, ShowRequest};
use crate::ops::{Context, HostOptions};

mod arguments;
mod busy;
mod results;
mod schemas;
mod tasks;
mod wire;

use arguments::{
    arguments, input_schema, output_request, run_request, HostOpParams, ListParams, OutputParams,
    ReconcileParams, RunParams, ShowParams, CONFIGURED_SECRETS,
};
use busy::Busy;
use results::{cut_output, error_result};

/// How often a running tool reports progress to a client that asked for it.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The MCP server: the ssh config, ledger and policy `opmark mcp` was started with, for
/// every tool.
#[derive(Debug, Clone)]
pub struct Server {
    /// What the global options of `opmark mcp` named.
    ctx: Context,
    /// Bytes of stdout and of stderr kept in a tool result.
    max_output: usize,
    /// The tools, built by rmcp's macros from the `#[tool]` methods below.
    tool_router: ToolRouter<Server>,
    /// Tool threads still running: on SIGINT/SIGTERM the server waits for them (each run
    /// hears the signal too and records how far it got) before it exits.
    busy: Arc<AtomicUsize>,
    /// The tasks of task-augmented `run` calls, whichever wire asked for them.
    tasks: tasks::Tasks,
}

#[tool_router]
impl Server {
    /// A server for `ctx` (its ssh config, ledger and policy) keeping `max_output` bytes
    /// per output stream in a result.
    pub fn new(ctx: Context, max_output: u64) -> Self {
        let max_output = usize::try_from(max_output).unwrap_or(usize::MAX);
        let busy = Arc::new(AtomicUsize::new(0));
        Server {
            tasks: tasks::Tasks::new(ctx.clone(), max_output, Arc::clone(&busy)),
            ctx,
            max_output,
            tool_router: Self::tool_router(),
            busy,
        }
    }

    /// Run a command on a host as one operation: at most one execution per op_id and
    /// host, however often this is called. SIDE EFFECTS: runs the command on the host
    /// (once), records the operation in the local ledger. The op_id is the retry key:
    /// after any error, timeout or lost answer, call again with the SAME op_id (it
    /// replays or follows, never runs twice); a new op_id means a new effect. Branch on
    /// `verdict`: completed/replayed = done (`exit_code` is the command's); in_progress =
    /// still running, call again later with the same op_id; not_applied = nothing ran,
    /// safe to retry when `retryable`; indeterminate = unknown outcome, do not retry under
    /// a new op_id, ask a human (`show`, `reconcile`); blocked = a human must approve
    /// outside MCP (or, with reason_code repeats_recent_operation, call with the earlier
    /// op_id it names, or set `repeats`); refused/conflict = change the command or op_id.
    /// Long output comes as head and tail; the `output` tool reads the rest. `plan` says
    /// what this call would do without doing it.
    #[tool(
        input_schema = input_schema::<RunParams>(),
        output_schema = output_schema("run", true),
        annotations(
        title = "Run a command at most once",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn run(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<RunParams>("run", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let max = p.output_budget.map_or(self.max_output, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        });
        let request = match run_request(p) {
            Ok(request) => request,
            Err(refused) => return Ok(refused),
        };
        let tally = request.tally.clone();
        let result = self
            .call_counting(meta, peer, tally, move |ctx| {
                let answer = run(ctx, request, &mut Unwatched)?;
                Ok((answer.document()?, answer.exit_status()))
            })
            .await;
        Ok(cut_output(result, max))
    }

    /// The state of an operation's marker on its host (absent, running, completed,
    /// interrupted, fenced). SIDE EFFECTS: none on the host (a read-only probe); the
    /// observation is recorded in the local ledger.
    #[tool(
        input_schema = input_schema::<HostOpParams>(),
        output_schema = output_schema("probe", false),
        annotations(
        title = "Probe an operation's marker",
        read_only_hint = true,
        open_world_hint = true
    ))]
    async fn probe(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<HostOpParams>("probe", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = ProbeRequest {
            host: p.host,
            op: p.op_id,
            options: HostOptions::default(),
        };
        Ok(self
            .call(meta, peer, move |ctx| match probe(ctx, &request)? {
                Answered::Report(report) => Ok((json_document(&report)?, 0)),
                Answered::HostChanged(c) => Ok((json_document(&c)?, c.exit_status())),
            })
            .await)
    }

    /// What `run` would do with exactly these arguments, without running or recording
    /// anything: the family and the rule that decided it, the deny and approval outcome,
    /// the repetition check in the ledger, the marker's state from a read-only probe, and
    /// the action (`run`, `replay`, `follow`, `supersede_and_run`, `block`, `refuse`,
    /// `conflict`, `not_applied`, `indeterminate`, or `unknown` when the host cannot be
    /// probed now) with the reason code `run` would answer. Takes `run`'s arguments.
    #[tool(
        input_schema = input_schema::<RunParams>(),
        output_schema = output_schema("plan", false),
        annotations(
        title = "Plan a run without acting",
        read_only_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn plan(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<RunParams>("plan", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = match run_request(p) {
            Ok(request) => request,
            Err(refused) => return Ok(refused),
        };
        let request = PlanRequest {
            hosts: request.hosts,
            op: request.op,
            class: request.class,
            stdin: request.stdin,
            approve: false,
            approval: request.approval.is_some(),
            repeats: request.repeats,
            amends: request.amends,
            options: HostOptions::default(),
            secrets: request.secrets,
            become_user: request.become_user,
            command: request.command,
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                let plans = plan(ctx, &request)?;
                Ok((json_document(&serde_json::json!({ "plans": plans }))?, 0))
            })
            .await)
    }

    /// Read any part of an operation's output from the copy its host keeps: a byte range
    /// (as a cut `run` result's left-out line names it), the tail, or the lines matching a
    /// regular expression with their byte offsets. Reads only: runs nothing, records
    /// nothing. Bytes beyond the run's output cap (`dropped_bytes`) were never kept.
    #[tool(
        input_schema = input_schema::<OutputParams>(),
        output_schema = output_schema("output", false),
        annotations(
        title = "Read an operation's output",
        read_only_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn output(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<OutputParams>("output", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = match output_request(p, self.max_output as u64) {
            Ok(request) => request,
            Err(refused) => return Ok(refused),
        };
        Ok(self
            .call(meta, peer, move |ctx| match output(ctx, &request)? {
                Answered::Report(report) => Ok((json_document(&report)?, 0)),
                Answered::HostChanged(c) => Ok((json_document(&c)?, c.exit_status())),
            })
            .await)
    }

    /// One operation's timeline from the local ledger: intent, attempts, observations,
    /// outcome. SIDE EFFECTS: none (reads the local ledger, contacts no host).
    #[tool(
        input_schema = input_schema::<ShowParams>(),
        output_schema = output_schema("show", false),
        annotations(
        title = "Show an operation",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn show(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<ShowParams>("show", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = ShowRequest {
            op: p.op_id,
            host: p.host,
            limit: p.limit.map(|n| n as usize),
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                Ok((json_document(&show(ctx, &request)?)?, 0))
            })
            .await)
    }

    /// Operations in the local ledger, newest first; unresolved ones only unless
    /// `unresolved` is false. SIDE EFFECTS: none (reads the local ledger). The way to
    /// find a lost op_id: filter by host, match the command.
    #[tool(
        input_schema = input_schema::<ListParams>(),
        output_schema = output_schema("list", false),
        annotations(
        title = "List operations",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn list(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<ListParams>("list", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = ListRequest {
            unresolved: p.unresolved.unwrap_or(true),
            host: p.host,
            since: None,
            limit: Some(
                p.limit
                    .map_or(crate::ops::list::DEFAULT_LIMIT, |n| n as usize),
            ),
            all: false,
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                Ok((json_document(&list(ctx, &request)?)?, 0))
            })
            .await)
    }

    /// Probe unresolved operations and settle what the evidence settles. SIDE EFFECTS:
    /// never runs a command; may fence an op id that never reached its host (so it can
    /// never run) and records what it settled in the local ledger.
    #[tool(
        input_schema = input_schema::<ReconcileParams>(),
        output_schema = output_schema("reconcile", false),
        annotations(
        title = "Reconcile unresolved operations",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn reconcile(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<ReconcileParams>("reconcile", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = ReconcileRequest {
            ops: p.op_ids,
            host: p.host,
            limit: p.limit.map(|n| n as usize),
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                let report = reconcile(ctx, &request, |_, _| {})?;
                Ok((json_document(&report)?, report.exit_status()))
            })
            .await)
    }

    /// Stop an operation on its host for good: its command is killed (TERM, then KILL
    /// after 10s), or the op id is fenced so it can never run. SIDE EFFECTS: signals the
    /// command on the host, or fences the op id there; recorded in the ledger. Only for
    /// op_ids this ledger knows; the answer says truthfully whether the cancel won
    /// (`cancel_outcome`).
    #[tool(
        input_schema = input_schema::<HostOpParams>(),
        output_schema = output_schema("cancel", false),
        annotations(
        title = "Cancel an operation",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn cancel(
        &self,
        args: JsonObject,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let p = match arguments::<HostOpParams>("cancel", args) {
            Ok(p) => p,
            Err(refused) => return Ok(refused),
        };
        let request = CancelRequest {
            host: p.host,
            op: p.op_id,
            grace: Duration::from_secs(10),
            by: Some("opmark-mcp".to_owned()),
            // An agent cancels only what the ledger knows: closing an unknown op id for
            // good is a human's call (`opmark cancel --force`).
            force: false,
            options: HostOptions::default(),
        };
        Ok(self
            .call(meta, peer, move |ctx| match cancel(ctx, &request)? {
                Answered::Report(r) => Ok((json_document(&r)?, r.exit_status())),
                Answered::HostChanged(c) => Ok((json_document(&c)?, c.exit_status())),
            })
            .await)
    }
}

impl Server {
    /// A task operation on a thread of its own (they probe hosts and read the ledger),
    /// its JSON-RPC error as the SDK's.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&tasks::Tasks) -> std::result::Result<T, tasks::RpcError> + Send + 'static,
    ) -> std::result::Result<T, ErrorData> {
        let tasks = self.tasks.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("opmark-mcp-tasks".into())
            .spawn(move || {
                let _ = tx.send(work(&tasks));
            })
            .map_err(|e| ErrorData::internal_error(format!("cannot start a thread: {e}"), None))?;
        match rx.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err((-32602, message))) => Err(ErrorData::invalid_params(message, None)),
            Ok(Err((_, message))) => Err(ErrorData::internal_error(message, None)),
            Err(_) => Err(ErrorData::internal_error(
                "the task's thread ended without an answer (opmark bug)",
                None,
            )),
        }
    }

    /// Runs an operation on its own thread (the operations block on the process's
    /// runtime), reporting progress meanwhile; `operation` answers its document and the
    /// exit status the CLI would give.
    async fn call(
        &self,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        operation: impl FnOnce(&Context) -> Result<(Value, u8)> + Send + 'static,
    ) -> CallToolResult {
        self.call_counting(meta, peer, None, operation).await
    }

    /// [`Server::call`], whose progress notifications also say how much output `tally`
    /// has counted so far (a command that prints is visibly alive).
    async fn call_counting(
        &self,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        tally: Option<Arc<OutputBytes>>,
        operation: impl FnOnce(&Context) -> Result<(Value, u8)> + Send + 'static,
    ) -> CallToolResult {
        let ctx = self.ctx.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let busy = Busy::new(&self.busy);
        let spawned = std::thread::Builder::new()
            .name("opmark-mcp-tool".into())
            .spawn(move || {
                let _busy = busy;
                let _ = tx.send(operation(&ctx));
            });
        if let Err(e) = spawned {
            return error_result(&Error::new(
                ErrorKind::Internal,
                format!("cannot start a thread for the tool: {e}; nothing was sent"),
            ));
        }
        let token = meta.get_progress_token();
        let started = Instant::now();
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.tick().await; // the first tick is immediate
        let done = loop {
            tokio::select! {
                done = &mut rx => break done,
                _ = tick.tick() => {
                    if let Some(token) = &token {
                        let secs = started.elapsed().as_secs_f64();
                        let mut message = format!("still working after {secs:.0}s");
                        if let Some(t) = &tally {
                            message.push_str(&format!(
                                "; output so far: {} bytes of stdout, {} of stderr",
                                t.stdout(),
                                t.stderr()
                            ));
                        }
                        let _ = peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), secs)
                                    .with_message(message),
                            )
                            .await;
                    }
                }
            }
        };
        match done {
            Ok(Ok((mut doc, status))) => {
                if let Value::Object(map) = &mut doc {
                    // The CLI's process exit status, so a client needs nothing else.
                    map.insert("exit_status".to_owned(), status.into());
                }
                CallToolResult::structured(doc)
            }
            Ok(Err(e)) => error_result(&e),
            Err(_) => error_result(&Error::new(
                ErrorKind::Internal,
                "the tool's thread ended without an answer (opmark bug); `opmark list` shows what was recorded",
            )),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    /// A `run` from a client that declared the tasks extension is a task (the extension
    /// lets the server decide); every other call is the tool's.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<RoleServer>,
    ) -> std::result::Result<rmcp::model::CallToolResponse, ErrorData> {
        let declared = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        if !(declared && request.name == "run") {
            let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
            return self.tool_router.call(tcc).await;
        }
        let args = request.arguments.unwrap_or_default();
        let (id, state) = self.blocking(move |tasks| tasks.start_run(args)).await?;
        Ok(rmcp::model::CallToolResponse::Task(
            rmcp::model::CreateTaskResult::new(extension_task(&id, &state)),
        ))
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _context: rmcp::service::RequestContext<RoleServer>,
    ) -> std::result::Result<rmcp::model::GetTaskResult, ErrorData> {
        let (id, state) = self
            .blocking(move |tasks| tasks.get(&request.task_id))
            .await?;
        use rmcp::model::TaskPayload;
        let result = || {
            state
                .result
                .as_ref()
                .and_then(|r| serde_json::to_value(r).ok())
                .and_then(|v| v.as_object().cloned())
                .unwrap_or_default()
        };
        let payload = match state.status {
            "working" => TaskPayload::Working,
            "completed" => TaskPayload::Completed { result: result() },
            "cancelled" => TaskPayload::Cancelled,
            // What a human must decide is outside MCP: no request the client could answer.
            "input_required" => TaskPayload::InputRequired {
                input_requests: Default::default(),
            },
            _ => {
                let mut error = JsonObject::new();
                error.insert("code".into(), (-32603).into());
                error.insert("message".into(), state.message.clone().into());
                error.insert(
                    "data".into(),
                    result()
                        .get("structuredContent")
                        .cloned()
                        .unwrap_or(Value::Null),
                );
                TaskPayload::Failed { error }
            }
        };
        Ok(rmcp::model::GetTaskResult::new(
            rmcp::model::DetailedTask::new(extension_task(&id, &state), payload),
        ))
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _context: rmcp::service::RequestContext<RoleServer>,
    ) -> std::result::Result<(), ErrorData> {
        // The cancel's outcome (won, or lost the race) is the next `tasks/get`'s.
        self.blocking(move |tasks| tasks.cancel_op(&request.task_id).map(|_| ()))
            .await
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("opmark", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "opmark runs remote commands over SSH so that one operation (op_id + host) \
                 executes at most once, even when a call is retried after a lost connection. \
                 Choose one op_id per intended effect and reuse it on every retry. Branch on \
                 `verdict` and `retryable`: completed/replayed = done; retryable=true = call \
                 run again later with the same op_id; indeterminate = ask a human (opmark \
                 show, opmark resolve); blocked = a human must approve outside MCP. A run \
                 never outlasts its `wait` (default 30s): spent, it answers in_progress \
                 (wait_budget_spent) and the command keeps running; `detach: true` answers \
                 at once. A wrong argument is an error whose `error.field` names it. \
                 `run` also takes task-augmented calls (`task` in tools/call): the task id is \
                 OP_ID@HOST, the operation itself, so tasks/get and tasks/result answer for it \
                 from any opmark mcp process on this ledger; tasks/cancel is the cancel tool.",
        )
    }
}

/// A task as the tasks extension shows it.
fn extension_task(id: &str, state: &tasks::State) -> rmcp::model::Task {
    use rmcp::model::TaskStatus;
    let status = match state.status {
        "working" => TaskStatus::Working,
        "completed" => TaskStatus::Completed,
        "cancelled" => TaskStatus::Cancelled,
        "input_required" => TaskStatus::InputRequired,
        _ => TaskStatus::Failed,
    };
    rmcp::model::Task::new(id, status, &state.created_at, &state.updated_at)
        .with_status_message(&state.message)
        .with_poll_interval_ms(tasks::POLL_MS)
}

/// The published schema of a document (schemas/NAME.schema.json) as a tool's output
/// schema: bundled into one self-contained document (a client resolves no other file),
/// with the fields this layer adds to every document (`exit_status`) and, for `run`, to
/// the run document (the output counts, digests and cut marks of [`cut_output`]).
fn output_schema(name: &str, run_fields: bool) -> Arc<JsonObject> {
    let mut extra = vec![(
        "exit_status",
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": 255,
            "description": "The process exit status the CLI would give."}),
    )];
    if run_fields {
        for stream in ["stdout", "stderr"] {
            extra.push((
                if stream == "stdout" {
                    "stdout_bytes"
                } else {
                    "stderr_bytes"
                },
                serde_json::json!({"type": "integer", "minimum": 0,
                    "description": "Bytes of the whole stream (before the cut to --max-output)."}),
            ));
            extra.push((
                if stream == "stdout" {
                    "stdout_sha256"
                } else {
                    "stderr_sha256"
                },
                serde_json::json!({"type": "string", "pattern": "^[0-9a-f]{64}$"}),
            ));
            extra.push((
                if stream == "stdout" {
                    "stdout_truncated"
                } else {
                    "stderr_truncated"
                },
                serde_json::json!({"type": "boolean"}),
            ));
            extra.push((
                if stream == "stdout" {
                    "stdout_left_out"
                } else {
                    "stderr_left_out"
                },
                serde_json::json!({"type": "object", "required": ["from", "to"],
                    "additionalProperties": false,
                    "properties": {"from": {"type": "integer", "minimum": 0},
                                   "to": {"type": "integer", "minimum": 0}},
                    "description": "The bytes between head and tail that this result leaves out (from up to, not including, to); the output tool reads them."}),
            ));
        }
        extra.push(("output_rest", serde_json::json!({"type": "string"})));
    }
    let mut schema = schemas::bundled(name);
    schemas::add_document_fields(&mut schema, &extra);
    match schema {
        Value::Object(mut map) => {
            // Every document is an object; a root that only says `oneOf` must say so too,
            // or rmcp drops the schema for clients of older protocol versions.
            map.entry("type").or_insert_with(|| "object".into());
            Arc::new(map)
        }
        _ => unreachable!("a published schema is an object"),
    }
}

/// How long a signalled server waits for its running tools to record how far they got.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves MCP on stdin/stdout until the client closes the stream, or SIGINT/SIGTERM.
pub async fn serve(ctx: Context, max_output: u64, secrets: Vec<crate::secret::Spec>) -> Result<()> {
    use rmcp::ServiceExt as _;
    // Each is read when a call names it (a rotated value is the new one), but one that
    // cannot be read now is the operator's mistake to hear about at start.
    crate::secret::Secrets::read(&secrets).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("{e}; the server did not start"),
        )
    })?;
    let _ = CONFIGURED_SECRETS.set(secrets);
    use tokio::signal::unix::{signal, SignalKind};
    let server = Server::new(ctx, max_output);
    let busy = Arc::clone(&server.busy);
    // Listening here keeps a signal from killing a run mid-record; the runs' own
    // handlers hear it too and answer `client_interrupted` with what they reached.
    let listen = |kind| {
        signal(kind).map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("cannot install the signal handlers: {e}"),
            )
        })
    };
    let (mut int, mut term) = (
        listen(SignalKind::interrupt())?,
        listen(SignalKind::terminate())?,
    );
    let (pipe, copying) = wire::stdio(server.tasks.clone());
    let service = server.serve(pipe).await.map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("the MCP session could not start: {e}"),
        )
    })?;
    tokio::select! {
        ended = service.waiting() => {
            ended.map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("the MCP session ended abnormally: {e}"),
                )
            })?;
        }
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while busy.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The SDK's last answers are in the pipe: out to stdout before the process ends.
    let _ = tokio::time::timeout(Duration::from_secs(1), copying).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::run::Stdin;
    use sha2::{Digest, Sha256};

    fn run_result(stdout: &str) -> CallToolResult {
        CallToolResult::structured(serde_json::json!({
            "schema": "opmark/2", "op_id": "op-1", "host": "web1",
            "stdout": stdout, "stderr": "", "verdict": "completed",
        }))
    }

    fn doc(r: &CallToolResult) -> &serde_json::Map<String, Value> {
        r.structured_content.as_ref().unwrap().as_object().unwrap()
    }

    #[test]
    fn output_beyond_the_budget_keeps_head_and_tail_and_names_the_bytes_left_out() {
        let whole: String = (0..1000).map(|i| format!("line {i:04}\n")).collect();
        let r = cut_output(run_result(&whole), 1000);
        let d = doc(&r);
        let cut = d["stdout"].as_str().unwrap();
        // Head: the first 750 bytes; tail: the last 250; between them one line.
        assert!(cut.starts_with(&whole[..750]), "{cut}");
        assert!(cut.ends_with(&whole[whole.len() - 250..]), "{cut}");
        let note = "[opmark: 9000 bytes of stdout left out here, bytes 750-9750 of 10000; read them with the output tool: op_id \"op-1\", host \"web1\", stream \"stdout\", range \"750-9750\"]";
        assert!(cut.contains(note), "{cut}");
        assert_eq!(cut.len(), 1000 + note.len() + 2);
        assert_eq!(
            d["stdout_left_out"],
            serde_json::json!({"from": 750, "to": 9750})
        );
        assert_eq!(d["stdout_bytes"], 10000);
        assert_eq!(d["stdout_truncated"], true);
        assert_eq!(
            d["stdout_sha256"],
            hex::encode(Sha256::digest(whole.as_bytes()))
        );
        assert!(d["output_rest"].as_str().unwrap().contains("`output` tool"));
        assert_eq!(d["stderr_truncated"], false);
        assert!(!d.contains_key("stderr_left_out"));
        // The text content is the same document, for clients that read only text.
        let text = serde_json::to_string(&r.content[0]).unwrap();
        assert!(text.contains("stdout_truncated"), "{text}");
    }

    #[test]
    fn a_cut_falls_on_character_boundaries_and_says_what_the_host_never_kept() {
        let mut r = run_result(&"é".repeat(10));
        if let Some(Value::Object(d)) = r.structured_content.as_mut() {
            d.insert("dropped".into(), serde_json::json!([6, 0]));
        }
        let r = cut_output(r, 5);
        let d = doc(&r);
        // 20 bytes of two-byte characters: head 3 bytes rounds down to one character,
        // the tail's start (byte 18) is a boundary already.
        let cut = d["stdout"].as_str().unwrap();
        assert!(cut.starts_with("é\n[opmark: 16 bytes"), "{cut}");
        assert!(cut.ends_with("]\né"), "{cut}");
        assert!(cut.contains("the host kept only bytes 0-14"), "{cut}");
    }

    #[test]
    fn output_within_max_is_whole_and_says_so() {
        let r = cut_output(run_result("hello\n"), 16 << 10);
        let d = doc(&r);
        assert_eq!(d["stdout"], "hello\n");
        assert_eq!(d["stdout_bytes"], 6);
        assert_eq!(d["stdout_truncated"], false);
        assert!(!d.contains_key("output_rest"));
    }

    #[test]
    fn the_run_tool_cannot_approve_and_rejects_bad_durations_before_anything() {
        let p = RunParams {
            timeout: Some("soon".into()),
            ..RunParams::plain("web1", "op-1", "reboot")
        };
        let again = RunParams {
            timeout: None,
            ..p.clone()
        };
        let e = run_request(p).unwrap_err();
        let e = &doc(&e)["error"];
        assert_eq!(e["reason_code"], "invalid_input");
        assert_eq!(e["field"], "timeout");
        assert!(e["message"].as_str().unwrap().contains("timeout"), "{e}");
        let ok = run_request(again).unwrap();
        assert_eq!(ok.approve, None);
        assert!(matches!(ok.stdin, Stdin::None));
        assert!(!ok.live_output);
    }

    fn args(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    fn refused(
        r: std::result::Result<RunParams, CallToolResult>,
    ) -> serde_json::Map<String, Value> {
        let r = r.expect_err("arguments accepted");
        assert_eq!(r.is_error, Some(true));
        doc(&r)["error"].as_object().unwrap().clone()
    }

    #[test]
    fn an_unknown_argument_is_refused_naming_it_and_the_arguments_there_are() {
        let e = refused(arguments::<RunParams>(
            "run",
            args(
                serde_json::json!({"host": "web1", "op_id": "op-1", "command": "true", "approve": "yes"}),
            ),
        ));
        assert_eq!(e["reason_code"], "invalid_input");
        assert_eq!(e["field"], "approve");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("`approve`") && m.contains("`op_id`"), "{m}");
        assert!(m.contains("opmark run --approve"), "{m}");
    }

    #[test]
    fn a_missing_argument_is_refused_naming_it_and_what_it_is() {
        let e = refused(arguments::<RunParams>(
            "run",
            args(serde_json::json!({"host": "web1", "command": "true"})),
        ));
        assert_eq!(e["field"], "op_id");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("needs the argument `op_id`"), "{m}");
        assert!(m.contains("keep it across retries"), "{m}");
        assert!(!m.contains("deserialize"), "{m}");
    }

    #[test]
    fn a_value_of_the_wrong_type_or_outside_the_enum_is_refused_naming_the_field() {
        let e = refused(arguments::<RunParams>(
            "run",
            args(
                serde_json::json!({"host": "web1", "op_id": "op-1", "command": "true", "detach": "yes"}),
            ),
        ));
        assert_eq!(e["field"], "detach");
        assert!(
            e["message"].as_str().unwrap().contains("expected boolean"),
            "{e:?}"
        );
        let e = refused(arguments::<RunParams>(
            "run",
            args(
                serde_json::json!({"host": "web1", "op_id": "op-1", "command": "true", "class": "harmless"}),
            ),
        ));
        assert_eq!(e["field"], "class");
        assert!(
            e["message"].as_str().unwrap().contains("\"read-only\""),
            "{e:?}"
        );
        let ok = arguments::<RunParams>(
            "run",
            args(serde_json::json!({"host": "web1", "op_id": "op-1", "command": "true", "class": "destructive", "stdin": null})),
        )
        .unwrap();
        assert_eq!(ok.class.as_deref(), Some("destructive"));
    }

    #[test]
    fn a_bad_op_id_is_an_error_document_like_a_bad_class() {
        let base = RunParams::plain("web1", "no spaces", "true");
        let bad_op = run_request(base.clone()).unwrap_err();
        let bad_class = run_request(RunParams {
            op_id: "op-1".into(),
            class: Some("harmless".into()),
            ..base
        })
        .unwrap_err();
        for (r, field) in [(&bad_op, "op_id"), (&bad_class, "class")] {
            assert_eq!(r.is_error, Some(true));
            let e = &doc(r)["error"];
            assert_eq!(e["reason_code"], "invalid_input", "{e}");
            assert_eq!(e["field"], field, "{e}");
        }
    }

    #[test]
    fn every_tool_declares_an_output_schema_and_class_is_an_enum() {
        let tools = Server::tool_router().list_all();
        assert_eq!(tools.len(), 8);
        for tool in &tools {
            let out = tool
                .output_schema
                .as_ref()
                .unwrap_or_else(|| panic!("{}", tool.name));
            assert!(out.contains_key("$schema"), "{}", tool.name);
            assert_eq!(
                out.get("type"),
                Some(&Value::from("object")),
                "{}",
                tool.name
            );
            assert_eq!(
                tool.input_schema.get("additionalProperties"),
                Some(&Value::Bool(false)),
                "{}",
                tool.name
            );
        }
        let run = tools.iter().find(|t| t.name == "run").unwrap();
        let class = &run.input_schema["properties"]["class"];
        assert_eq!(
            class["enum"],
            serde_json::json!(["read-only", "convergent", "append-only", "destructive"])
        );
    }
}
