//! A tool call's arguments: their types and schemas, the check that names a wrong field
//! before anything is sent, and the library requests they become.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use rmcp::model::{CallToolResult, JsonObject};

use crate::duration::parse_duration;
use crate::error::{Error, ErrorKind};
use crate::operation::output::OutputBytes;
use crate::ops::document::error_document;
use crate::ops::output::{OutputRequest, Select};
use crate::ops::run::{FleetOptions, RunRequest, Stdin};
use crate::ops::HostOptions;

/// The output kept on the host per stream by an MCP `run` (the CLI's default `--output-cap`).
pub(super) const HOST_OUTPUT_CAP: u64 = 8 << 20;

/// Arguments of the `run` tool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
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
    /// The budget of this call (default 30s), connects included: when it is spent the
    /// answer is `in_progress` and the command keeps running on the host; call `run`
    /// again with the same op_id to follow or replay it.
    #[serde(default)]
    pub wait: Option<String>,
    /// Treat the command as at least this family (stricter only).
    #[serde(default)]
    #[schemars(schema_with = "class_schema")]
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
    /// Answer `in_progress` as soon as the host claimed the operation and started the
    /// command, which keeps running; `run` with the same op_id later follows or replays it.
    #[serde(default)]
    pub detach: Option<bool>,
    /// A signed approval a human made with `opmark approve` and handed over (the token's
    /// whole text), for a run that is `blocked` with reason_code `approval_required`
    /// where approvals are signed. It counts only for the exact op_id, host and command it
    /// names, once, before it expires. Nothing here can make one.
    #[serde(default)]
    pub approval: Option<String>,
    /// Bytes of stdout and of stderr this result may carry (default: the server's, 16 KiB
    /// unless `opmark mcp --output-budget` says otherwise). A longer stream comes as its
    /// head (3/4) and tail (1/4) joined by one line saying which bytes were left out; the
    /// `output` tool reads them.
    #[serde(default)]
    #[schemars(range(min = 1024, max = 67108864))]
    pub output_budget: Option<u64>,
    /// Names of secrets this server was started with (`opmark mcp --secret
    /// NAME=env:VAR`), each given to the command as its environment variable NAME. Only
    /// names: a value never passes through MCP, and anything the command prints of one
    /// comes back as [REDACTED:NAME]. The names are part of the operation's intent.
    #[serde(default)]
    pub secrets: Option<Vec<String>>,
    /// Run the command as this user through sudo on the host (`root` for root). sudo's
    /// password, if it needs one, is the server's secret SUDO_PASSWORD named in `secrets`.
    #[serde(default, rename = "become")]
    pub become_user: Option<String>,
    /// Host locks the command holds while it runs, each `NAME` or `NAME:N` (a semaphore
    /// of N slots, default 1, in the host's marker root, shared by every client of that
    /// host): taken before the command starts, given back however it ends. One not free
    /// within `lock_wait` answers `not_applied` with reason_code `lock_busy`, naming its
    /// holder; nothing ran, and a retry with the same op_id may run it.
    #[serde(default)]
    pub locks: Option<Vec<String>>,
    /// How long the host waits for `locks` (e.g. `30s`; default `0s`: one try).
    #[serde(default)]
    pub lock_wait: Option<String>,
}

impl RunParams {
    /// `command` on `host` under `op_id`, every optional argument left out.
    pub(crate) fn plain(host: &str, op_id: &str, command: &str) -> RunParams {
        RunParams {
            host: host.to_owned(),
            op_id: op_id.to_owned(),
            command: command.to_owned(),
            stdin: None,
            timeout: None,
            wait: None,
            class: None,
            repeats: None,
            amends: None,
            detach: None,
            approval: None,
            output_budget: None,
            secrets: None,
            become_user: None,
            locks: None,
            lock_wait: None,
        }
    }
}

/// Arguments of the `output` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputParams {
    /// The operation id.
    pub op_id: String,
    /// The host, as given to `run` (may be left out when the op id ran on one host).
    #[serde(default)]
    pub host: Option<String>,
    /// `stdout` (default) or `stderr`.
    #[serde(default)]
    #[schemars(schema_with = "stream_schema")]
    pub stream: Option<String>,
    /// Bytes A up to, not including, B (`"12288-52416512"`; `"A-"`: to the end), as a
    /// cut result's left-out line names them.
    #[serde(default)]
    pub range: Option<String>,
    /// The last this many bytes.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub tail: Option<u64>,
    /// Only the lines matching this regular expression, with their byte offsets.
    #[serde(default)]
    pub grep: Option<String>,
    /// At most this many bytes in the answer (default: the server's output budget); `to`
    /// says where a longer range stopped, so the next call starts there.
    #[serde(default)]
    #[schemars(range(min = 1024, max = 67108864))]
    pub output_budget: Option<u64>,
}

/// `stream` as an enumeration.
pub(super) fn stream_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["stdout", "stderr"],
        "description": "Which stream (default stdout)."
    })
}

/// `class` as an enumeration of the families (docs/trust.md#the-policy).
pub(super) fn class_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = crate::family::Family::ALL
        .iter()
        .map(|f| f.as_str())
        .collect();
    schemars::json_schema!({
        "type": "string",
        "enum": names,
        "description": "Treat the command as at least this family (stricter only)."
    })
}

/// Arguments of the `probe` and `cancel` tools.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostOpParams {
    /// Host alias or [user@]host, as given to `run`.
    pub host: String,
    /// The operation id.
    pub op_id: String,
}

/// Arguments of the `show` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShowParams {
    /// The operation id.
    pub op_id: String,
    /// The host, when the op id was used on several.
    #[serde(default)]
    pub host: Option<String>,
    /// Only the newest this many events (default: all); `event_count` says how many
    /// there are.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<u32>,
}

/// Arguments of the `list` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only operations whose outcome is not settled (default true).
    #[serde(default)]
    pub unresolved: Option<bool>,
    /// Only operations on this host (how to find a lost op id: filter by host, then match
    /// the command's `display` or `fingerprint`).
    #[serde(default)]
    pub host: Option<String>,
    /// At most this many operations, most recently active first (default 50).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<u32>,
}

/// Arguments of the `reconcile` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileParams {
    /// Only these operations (default: every unresolved one).
    #[serde(default)]
    pub op_ids: Vec<String>,
    /// Only operations on this host.
    #[serde(default)]
    pub host: Option<String>,
    /// At most this many operations contacted, most recently active first (default:
    /// every one in scope); `not_contacted_count` says how many wait for the next call.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<u32>,
}

/// The secrets `opmark mcp --secret` offers, fixed when the server starts (as its
/// [`Context`] is): a tool call names them, never gives a value.
pub(super) static CONFIGURED_SECRETS: std::sync::OnceLock<Vec<crate::secret::Spec>> =
    std::sync::OnceLock::new();

/// The configured secrets a call names, in its order; an unknown or repeated name is an
/// `invalid_input` error naming the field and what the server offers.
pub(super) fn configured_secrets(
    names: &[String],
) -> std::result::Result<Vec<crate::secret::Spec>, CallToolResult> {
    let offered = CONFIGURED_SECRETS
        .get()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut specs: Vec<crate::secret::Spec> = Vec::with_capacity(names.len());
    for name in names {
        let Some(spec) = offered.iter().find(|s| s.name == *name) else {
            let list: Vec<&str> = offered.iter().map(|s| s.name.as_str()).collect();
            let offers = if list.is_empty() {
                "it offers none".to_owned()
            } else {
                format!("it offers {}", list.join(", "))
            };
            return Err(argument_error(
                "secrets",
                format!(
                    "`secrets`: `{}` is not a secret this server offers ({offers}); a human starts `opmark mcp --secret NAME=env:VAR` to offer one, and a value is never passed here; nothing was sent",
                    crate::text::printable(name),
                ),
            ));
        };
        if specs.iter().any(|s| s.name == *name) {
            return Err(argument_error(
                "secrets",
                format!("`secrets`: `{name}` is named twice; name each once; nothing was sent"),
            ));
        }
        specs.push(spec.clone());
    }
    Ok(specs)
}

/// The run request from the tool's arguments; bad input is an `invalid_input` error
/// document naming the field, before anything is recorded or sent (a bad op id the same
/// shape as a bad class).
pub(super) fn run_request(p: RunParams) -> std::result::Result<RunRequest, CallToolResult> {
    let duration = |what: &str, text: &Option<String>| {
        text.as_deref()
            .map(|t| {
                parse_duration(t)
                    .map_err(|e| argument_error(what, format!("`{what}`: {e}; nothing was sent")))
            })
            .transpose()
    };
    if let Err(e) = crate::op_id::OpId::parse(&p.op_id) {
        return Err(argument_error(
            "op_id",
            format!("`op_id`: {e}; choose one matching ^[A-Za-z0-9][A-Za-z0-9._:-]{{0,127}}$ and keep it across retries; nothing was sent"),
        ));
    }
    let class = p
        .class
        .as_deref()
        .map(|c| {
            c.parse::<crate::family::Family>().map_err(|_| {
                argument_error(
                    "class",
                    format!("`class`: `{c}` is not a family; use read-only, convergent, append-only or destructive; nothing was sent"),
                )
            })
        })
        .transpose()?;
    let secrets = configured_secrets(p.secrets.as_deref().unwrap_or_default())?;
    let locks = p
        .locks
        .unwrap_or_default()
        .iter()
        .map(|l| {
            crate::host_lock::HostLock::parse(l)
                .map_err(|e| argument_error("locks", format!("`locks`: {e}; nothing was sent")))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RunRequest {
        locks,
        lock_wait: duration("lock_wait", &p.lock_wait)?.unwrap_or_default(),
        secrets,
        become_user: p.become_user,
        timeout: duration("timeout", &p.timeout)?,
        wait: duration("wait", &p.wait)?.unwrap_or(crate::operation::DEFAULT_WAIT),
        // A tool call never outlasts its budget (docs/decisions.md#wait-budget).
        wait_scope: crate::operation::WaitScope::Call,
        hosts: vec![p.host],
        op: Some(p.op_id),
        class,
        stdin: p
            .stdin
            .map_or(Stdin::None, |s| Stdin::Given(s.into_bytes())),
        attempts: None,
        output_cap: HOST_OUTPUT_CAP,
        approve: None,
        approval: p.approval,
        repeats: p.repeats,
        amends: p.amends,
        options: HostOptions::default(),
        fleet: FleetOptions {
            detach: p.detach.unwrap_or(false),
            ..FleetOptions::default()
        },
        command: vec![p.command],
        kind: crate::shim::RunKind::Command,
        // The client gets the output in the result; stdout is the protocol stream.
        live_output: false,
        tally: Some(Arc::new(OutputBytes::default())),
        stdout_to: None,
    })
}

/// The input schema of a tool, from its arguments' type (closed: `additionalProperties`
/// is false, since unknown arguments are refused).
pub(super) fn input_schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::tool::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("the input schema of a tool is not an object: {e}"))
}

/// A tool's arguments, checked against its input schema first, so that the client hears
/// which field is wrong and how to fix it (not serde's "failed to deserialize
/// parameters"): an unknown argument, a missing one, or a value of the wrong type or
/// outside its enumeration is an `invalid_input` error document with `error.field`.
pub(super) fn arguments<T: DeserializeOwned + JsonSchema + 'static>(
    tool: &str,
    args: JsonObject,
) -> std::result::Result<T, CallToolResult> {
    let schema = input_schema::<T>();
    if let Some((field, message)) = argument_problem(tool, &schema, &args) {
        return Err(argument_error(&field, message));
    }
    serde_json::from_value(Value::Object(args)).map_err(|e| {
        argument_error(
            "arguments",
            format!("the arguments of `{tool}` do not fit its input schema: {e}; nothing was sent"),
        )
    })
}

/// The first problem of `args` against a tool's input `schema`: the field and a message
/// saying what is wrong and what to send instead.
pub(super) fn argument_problem(
    tool: &str,
    schema: &JsonObject,
    args: &JsonObject,
) -> Option<(String, String)> {
    let empty = serde_json::Map::new();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let known = props
        .keys()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    for key in args.keys() {
        if !props.contains_key(key) {
            let human = if key.contains("approv") {
                "; approval is a human's act, outside MCP (`opmark run --approve NOTE` or `opmark resolve`)"
            } else {
                ""
            };
            return Some((
                key.clone(),
                format!("`{tool}` has no argument `{key}`{human}; its arguments are {known}; nothing was sent"),
            ));
        }
    }
    let required = schema.get("required").and_then(Value::as_array);
    for field in required.into_iter().flatten().filter_map(Value::as_str) {
        if args.get(field).is_none_or(Value::is_null) {
            let what = props
                .get(field)
                .and_then(|p| p.get("description"))
                .and_then(Value::as_str)
                .unwrap_or("");
            return Some((
                field.to_owned(),
                format!("`{tool}` needs the argument `{field}`: {what} Send it and call again; nothing was sent"),
            ));
        }
    }
    for (key, value) in args {
        if value.is_null() {
            continue; // an optional argument left out
        }
        if let Some(problem) = value_problem(&props[key], value) {
            return Some((
                key.clone(),
                format!("`{tool}` argument `{key}`: {problem}; nothing was sent"),
            ));
        }
    }
    None
}

/// Whether `value` fits a property schema's `type`, `enum`, `minimum` and (for arrays)
/// `items`: the forms schemars writes for these arguments.
pub(super) fn value_problem(prop: &Value, value: &Value) -> Option<String> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let types: Vec<&str> = match prop.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let got = kind(value);
    let fits = |t: &&str| *t == got || (*t == "number" && got == "integer");
    if !types.is_empty() && !types.iter().any(fits) {
        let want: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
        return Some(format!("expected {}, got {got} {value}", want.join(" or ")));
    }
    if let Some(allowed) = prop.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let names: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return Some(format!("{value} is not one of {}", names.join(", ")));
        }
    }
    if let (Some(min), Some(n)) = (prop.get("minimum").and_then(Value::as_f64), value.as_f64()) {
        if n < min {
            return Some(format!("{value} is below the minimum {min}"));
        }
    }
    if let (Some(items), Value::Array(values)) = (prop.get("items"), value) {
        return values.iter().find_map(|v| value_problem(items, v));
    }
    None
}

/// An argument the client got wrong, as the error document with `error.field` naming it.
pub(super) fn argument_error(field: &str, message: String) -> CallToolResult {
    let mut doc = error_document(&Error::new(ErrorKind::InvalidInput, message));
    if let Some(Value::Object(error)) = doc.get_mut("error") {
        error.insert("field".to_owned(), field.into());
    }
    CallToolResult::structured_error(doc)
}

/// The output request from the tool's arguments; bad input is an `invalid_input` error
/// document naming the field, before anything is sent.
pub(super) fn output_request(
    p: OutputParams,
    default_budget: u64,
) -> std::result::Result<OutputRequest, CallToolResult> {
    let stream = match p.stream.as_deref() {
        None | Some("stdout") => crate::host::OutputStream::Stdout,
        Some("stderr") => crate::host::OutputStream::Stderr,
        Some(other) => {
            return Err(argument_error(
                "stream",
                format!("`stream` is `stdout` or `stderr`, not `{other}`; nothing was sent"),
            ))
        }
    };
    let chosen = [p.range.is_some(), p.tail.is_some(), p.grep.is_some()];
    if chosen.iter().filter(|&&c| c).count() > 1 {
        let field = if p.range.is_some() { "range" } else { "tail" };
        return Err(argument_error(
            field,
            "give at most one of `range`, `tail` and `grep`; nothing was sent".into(),
        ));
    }
    let select = if let Some(range) = &p.range {
        let parsed = range.split_once('-').and_then(|(a, b)| {
            let from = a.trim().parse::<u64>().ok()?;
            let to = match b.trim() {
                "" => None,
                b => Some(b.parse::<u64>().ok()?),
            };
            Some((from, to))
        });
        match parsed {
            Some((from, to)) if to.is_none_or(|to| to > from) => Select::Range { from, to },
            _ => {
                return Err(argument_error(
                    "range",
                    format!(
                        "`range` `{range}` is not A-B with A below B (bytes A up to, not including, B, e.g. \"0-4096\"; \"A-\" for everything from A); nothing was sent"
                    ),
                ))
            }
        }
    } else if let Some(n) = p.tail {
        Select::Tail(n)
    } else if let Some(pattern) = p.grep {
        Select::Grep(pattern)
    } else {
        Select::All
    };
    Ok(OutputRequest {
        op: p.op_id,
        host: p.host,
        stream,
        select,
        max_bytes: p.output_budget.unwrap_or(default_budget),
        options: HostOptions::default(),
    })
}
