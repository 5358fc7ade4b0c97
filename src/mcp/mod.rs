//! `opmark mcp`: the Model Context Protocol on stdio (docs/guarantees.md#agents-over-mcp), on the official
//! Rust SDK (`rmcp`).
//!
//! A thin layer: every tool calls the same operation the CLI runs ([`crate::ops`]), on a
//! thread of its own, and hands its report as the JSON document the CLI's `--json`
//! prints (schema `opmark/1`) to the client as structured content. So the policy, the
//! ledger, the verdicts and the reason codes are the CLI's, exactly. What the layer adds:
//! - no way to approve: the `run` tool has no `approve` argument, so `blocked` stays
//!   blocked (approval is a human's act, `opmark run --approve` or `opmark resolve`);
//! - no prompt ever: passphrase prompts are forbidden for the whole process;
//! - command output cut to `--max-output` per stream, with the byte counts, the digests
//!   and how to read the rest;
//! - a progress notification every few seconds while a tool runs, when the client asked
//!   for progress (a long `run` is not mistaken for a hung server).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, Implementation, ProgressNotificationParam, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::duration::parse_duration;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::cancel::{cancel, CancelRequest};
use crate::ops::document::{error_document, json_document};
use crate::ops::host_changed::Answered;
use crate::ops::list::{list, ListRequest};
use crate::ops::probe::{probe, ProbeRequest};
use crate::ops::reconcile::{reconcile, ReconcileRequest};
use crate::ops::run::{run, FleetOptions, RunRequest, Stdin, Unwatched};
use crate::ops::show::{show, ShowRequest};
use crate::ops::{Context, HostOptions};

/// How often a running tool reports progress to a client that asked for it.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The output kept on the host per stream by an MCP `run` (the CLI's default `--output-cap`).
const HOST_OUTPUT_CAP: u64 = 8 << 20;

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
}

/// Counts a tool thread as busy from creation until it ends, however it ends.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::SeqCst);
        Busy(Arc::clone(count))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Arguments of the `run` tool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunParams {
    /// Host alias from the ssh config, or [user@]host.
    pub host: String,
    /// The operation id: choose one per intended effect and keep it across retries; the
    /// same id never runs twice on a host (^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$).
    pub op_id: String,
    /// The command, run by the login shell with `-c` on the host, as ssh does.
    pub command: String,
    /// Bytes to forward to the command's stdin (part of the fingerprint).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Kill the command on the host after this long (e.g. `30s`, `5m`).
    #[serde(default)]
    pub timeout: Option<String>,
    /// How long to wait for a running operation before answering `in_progress` (default 30s).
    #[serde(default)]
    pub wait: Option<String>,
    /// Treat the command as at least this family: read-only, convergent, append-only,
    /// destructive (stricter only).
    #[serde(default)]
    pub class: Option<String>,
    /// The op id of an earlier operation this call deliberately repeats: the same command
    /// on the same host under a new op_id. Without it, a `blocked` result with reason_code
    /// `repeats_recent_operation` names the earlier op_id: call again with THAT op_id if
    /// you meant the same effect (it replays), or with `repeats` set to it to do it again.
    #[serde(default)]
    pub repeats: Option<String>,
    /// The op id of an earlier operation whose intent this one replaces (its command
    /// changed, e.g. after a `conflict`); recorded as a link on both.
    #[serde(default)]
    pub amends: Option<String>,
}

/// Arguments of the `probe` and `cancel` tools.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct HostOpParams {
    /// Host alias or [user@]host, as given to `run`.
    pub host: String,
    /// The operation id.
    pub op_id: String,
}

/// Arguments of the `show` tool.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShowParams {
    /// The operation id.
    pub op_id: String,
    /// The host, when the op id was used on several.
    #[serde(default)]
    pub host: Option<String>,
}

/// Arguments of the `list` tool.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListParams {
    /// Only operations whose outcome is not settled (default true).
    #[serde(default)]
    pub unresolved: Option<bool>,
    /// Only operations on this host (how to find a lost op id: filter by host, then match
    /// the command's `display` or `fingerprint`).
    #[serde(default)]
    pub host: Option<String>,
}

/// Arguments of the `reconcile` tool.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReconcileParams {
    /// Only these operations (default: every unresolved one).
    #[serde(default)]
    pub op_ids: Vec<String>,
    /// Only operations on this host.
    #[serde(default)]
    pub host: Option<String>,
}

#[tool_router]
impl Server {
    /// A server for `ctx` (its ssh config, ledger and policy) keeping `max_output` bytes
    /// per output stream in a result.
    pub fn new(ctx: Context, max_output: u64) -> Self {
        Server {
            ctx,
            max_output: usize::try_from(max_output).unwrap_or(usize::MAX),
            tool_router: Self::tool_router(),
            busy: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Run a command on a host as one operation: at most one execution per op_id and
    /// host, however often this is called. The result is opmark's JSON verdict: branch on
    /// `verdict` and `retryable` (true: call again later with the SAME op_id). `blocked`
    /// needs a human's approval outside MCP; it cannot be approved here.
    #[tool(annotations(
        title = "Run a command at most once",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn run(
        &self,
        Parameters(p): Parameters<RunParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let max = self.max_output;
        let request = match run_request(p) {
            Ok(request) => request,
            Err(e) => return Ok(error_result(&e)),
        };
        let result = self
            .call(meta, peer, move |ctx| {
                let answer = run(ctx, request, &mut Unwatched)?;
                Ok((answer.document()?, answer.exit_status()))
            })
            .await;
        Ok(cut_output(result, max))
    }

    /// The state of an operation's marker on its host (absent, running, completed,
    /// interrupted, fenced). Reads only; the observation is recorded in the ledger.
    #[tool(annotations(
        title = "Probe an operation's marker",
        read_only_hint = true,
        open_world_hint = true
    ))]
    async fn probe(
        &self,
        Parameters(p): Parameters<HostOpParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
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

    /// One operation's timeline from the local ledger: intent, attempts, observations,
    /// outcome.
    #[tool(annotations(
        title = "Show an operation",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn show(
        &self,
        Parameters(p): Parameters<ShowParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let request = ShowRequest {
            op: p.op_id,
            host: p.host,
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                Ok((json_document(&show(ctx, &request)?)?, 0))
            })
            .await)
    }

    /// Operations in the local ledger, newest first; unresolved ones only unless
    /// `unresolved` is false.
    #[tool(annotations(
        title = "List operations",
        read_only_hint = true,
        open_world_hint = false
    ))]
    async fn list(
        &self,
        Parameters(p): Parameters<ListParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let request = ListRequest {
            unresolved: p.unresolved.unwrap_or(true),
            host: p.host,
            since: None,
            limit: None,
            all: false,
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                Ok((json_document(&list(ctx, &request)?)?, 0))
            })
            .await)
    }

    /// Probe unresolved operations and settle what the evidence settles (never runs a
    /// command).
    #[tool(annotations(
        title = "Reconcile unresolved operations",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn reconcile(
        &self,
        Parameters(p): Parameters<ReconcileParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let request = ReconcileRequest {
            ops: p.op_ids,
            host: p.host,
        };
        Ok(self
            .call(meta, peer, move |ctx| {
                let report = reconcile(ctx, &request, |_, _| {})?;
                Ok((json_document(&report)?, report.exit_status()))
            })
            .await)
    }

    /// Stop an operation on its host for good: its command is killed (TERM, then KILL
    /// after 10s), or the op id is fenced so it can never run.
    #[tool(annotations(
        title = "Cancel an operation",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn cancel(
        &self,
        Parameters(p): Parameters<HostOpParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
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
    /// Runs an operation on its own thread (the operations block on the process's
    /// runtime), reporting progress meanwhile; `operation` answers its document and the
    /// exit status the CLI would give.
    async fn call(
        &self,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
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
                        let _ = peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), secs)
                                    .with_message(format!("still working after {secs:.0}s")),
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
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("opmark", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "opmark runs remote commands over SSH so that one operation (op_id + host) \
                 executes at most once, even when a call is retried after a lost connection. \
                 Choose one op_id per intended effect and reuse it on every retry. Branch on \
                 `verdict` and `retryable`: completed/replayed = done; retryable=true = call \
                 run again later with the same op_id; indeterminate = ask a human (opmark \
                 show, opmark resolve); blocked = a human must approve outside MCP.",
            )
    }
}

/// The run request from the tool's arguments; bad input is an `invalid_input` error
/// before anything is recorded or sent.
fn run_request(p: RunParams) -> Result<RunRequest> {
    let duration = |what: &str, text: &Option<String>| -> Result<Option<Duration>> {
        text.as_deref()
            .map(|t| {
                parse_duration(t).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!("{what}: {e}; nothing was sent"),
                    )
                })
            })
            .transpose()
    };
    let class = p
        .class
        .as_deref()
        .map(|c| {
            c.parse::<crate::family::Family>().map_err(|_| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("class `{c}` is not a family; use read-only, convergent, append-only or destructive; nothing was sent"),
                )
            })
        })
        .transpose()?;
    Ok(RunRequest {
        timeout: duration("timeout", &p.timeout)?,
        wait: duration("wait", &p.wait)?.unwrap_or(Duration::from_secs(30)),
        hosts: vec![p.host],
        op: Some(p.op_id),
        class,
        stdin: p
            .stdin
            .map_or(Stdin::None, |s| Stdin::Given(s.into_bytes())),
        attempts: None,
        output_cap: HOST_OUTPUT_CAP,
        approve: None,
        repeats: p.repeats,
        amends: p.amends,
        options: HostOptions::default(),
        fleet: FleetOptions::default(),
        command: vec![p.command],
        // The client gets the output in the result; stdout is the protocol stream.
        live_output: false,
    })
}

/// An error as the CLI's error document, marked as a tool error.
fn error_result(e: &Error) -> CallToolResult {
    CallToolResult::structured_error(error_document(e))
}

/// Cuts `stdout` and `stderr` of a run document to `max` bytes each (at a character
/// boundary), adding `<stream>_bytes`, `<stream>_sha256` (of the whole text as returned
/// by the CLI) and `<stream>_truncated`, and, when cut, `output_rest` saying how to read it.
fn cut_output(mut result: CallToolResult, max: usize) -> CallToolResult {
    let Some(Value::Object(doc)) = result.structured_content.as_mut() else {
        return result;
    };
    let mut cut_any = false;
    for stream in ["stdout", "stderr"] {
        let Some(Value::String(text)) = doc.get(stream).cloned() else {
            continue;
        };
        let digest = hex::encode(Sha256::digest(text.as_bytes()));
        let truncated = text.len() > max;
        let kept = if truncated {
            let mut end = max;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end].to_owned()
        } else {
            text.clone()
        };
        cut_any |= truncated;
        doc.insert(stream.to_owned(), kept.into());
        doc.insert(format!("{stream}_bytes"), text.len().into());
        doc.insert(format!("{stream}_sha256"), digest.into());
        doc.insert(format!("{stream}_truncated"), truncated.into());
    }
    if cut_any {
        let op = doc.get("op_id").and_then(Value::as_str).unwrap_or("OP");
        let host = doc.get("host").and_then(Value::as_str).unwrap_or("HOST");
        doc.insert(
            "output_rest".to_owned(),
            format!(
                "output cut to {max} bytes per stream for MCP; the whole output: `opmark --json run {host} --op {op} -- <same command>` replays it without running anything again (`opmark show {op}` has the byte counts and digests)"
            )
            .into(),
        );
    }
    let text = Value::Object(doc.clone()).to_string();
    result.content = vec![rmcp::model::ContentBlock::text(text)];
    result
}

/// How long a signalled server waits for its running tools to record how far they got.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves MCP on stdin/stdout until the client closes the stream, or SIGINT/SIGTERM.
pub async fn serve(ctx: Context, max_output: u64) -> Result<()> {
    use rmcp::ServiceExt as _;
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
    let service = server.serve(rmcp::transport::stdio()).await.map_err(|e| {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_result(stdout: &str) -> CallToolResult {
        CallToolResult::structured(serde_json::json!({
            "schema": "opmark/1", "op_id": "op-1", "host": "web1",
            "stdout": stdout, "stderr": "", "verdict": "completed",
        }))
    }

    fn doc(r: &CallToolResult) -> &serde_json::Map<String, Value> {
        r.structured_content.as_ref().unwrap().as_object().unwrap()
    }

    #[test]
    fn output_beyond_max_is_cut_with_count_digest_and_the_way_to_the_rest() {
        let r = cut_output(run_result(&"é".repeat(10)), 5);
        let d = doc(&r);
        // 20 bytes of two-byte characters, cut at a character boundary below 5.
        assert_eq!(d["stdout"], "éé");
        assert_eq!(d["stdout_bytes"], 20);
        assert_eq!(d["stdout_truncated"], true);
        assert_eq!(
            d["stdout_sha256"],
            hex::encode(Sha256::digest("é".repeat(10).as_bytes()))
        );
        assert!(d["output_rest"].as_str().unwrap().contains("--op op-1"));
        assert_eq!(d["stderr_truncated"], false);
        // The text content is the same document, for clients that read only text.
        let text = serde_json::to_string(&r.content[0]).unwrap();
        assert!(text.contains("stdout_truncated"), "{text}");
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
            host: "web1".into(),
            op_id: "op-1".into(),
            command: "reboot".into(),
            stdin: None,
            timeout: Some("soon".into()),
            wait: None,
            class: None,
            repeats: None,
            amends: None,
        };
        let again = RunParams {
            timeout: None,
            ..p.clone()
        };
        let e = run_request(p).unwrap_err();
        assert_eq!(e.reason_code(), "invalid_input");
        assert!(e.message.contains("timeout"), "{}", e.message);
        let ok = run_request(again).unwrap();
        assert_eq!(ok.approve, None);
        assert!(matches!(ok.stdin, Stdin::None));
        assert!(!ok.live_output);
    }
}
