//! The command line: clap derive types for every subcommand of docs/guarantees.md#the-command-line-contract.
//!
//! Only parsing lives here; each subcommand's behaviour is in `commands/<name>.rs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::family::Family;
use crate::ssh::destination::{ArgPlace, FlagPositions};

use crate::duration::parse_duration;

/// Parses `65536`, `64k`, `8m` or `1g` (binary multiples) into bytes; at least 1 KiB.
fn parse_size(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text)?;
    if bytes < 1024 {
        return Err(format!("size `{text}` is below the 1k minimum"));
    }
    Ok(bytes)
}

/// A file mode in octal, `644` or `0755`: permission bits, set-id and sticky bits.
fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text.trim(), 8) {
        Ok(mode) if mode <= 0o7777 => Ok(mode),
        _ => Err(format!(
            "mode `{text}` is not a file mode; write octal permission bits such as 644 or 0755"
        )),
    }
}

/// A byte count or offset, `4096`, `64k`, `8m`, `1g` (no minimum).
fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, mult) = match t.strip_suffix(['k', 'm', 'g']) {
        Some(d) => (
            d,
            match t.chars().last() {
                Some('k') => 1u64 << 10,
                Some('m') => 1 << 20,
                _ => 1 << 30,
            },
        ),
        None => (t.as_str(), 1),
    };
    let n: u64 = digits.parse().map_err(|_| {
        format!("size `{text}` is not a number of bytes; write it like 65536, 64k, 8m or 1g")
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size `{text}` is too large"))
}

/// `--range A-B` (B excluded) or `A-` (to the end), byte offsets as [`parse_bytes`] reads them.
fn parse_range(text: &str) -> Result<(u64, Option<u64>), String> {
    let fix = "write it as A-B (bytes A up to, not including, B), e.g. 0-4096 or 1m-2m, or A- for everything from A";
    let Some((from, to)) = text.split_once('-') else {
        return Err(format!("range `{text}` has no `-`; {fix}"));
    };
    let from = parse_bytes(from).map_err(|e| format!("range `{text}`: {e}; {fix}"))?;
    let to = match to.trim() {
        "" => None,
        to => Some(parse_bytes(to).map_err(|e| format!("range `{text}`: {e}; {fix}"))?),
    };
    if to.is_some_and(|to| to <= from) {
        return Err(format!(
            "range `{text}` is empty: B is the byte after the last one wanted, so it must be above A; {fix}"
        ));
    }
    Ok((from, to))
}

/// What `opmark --help` ends with. Written one logical line per paragraph or table row:
/// [`command`] wraps it at the help's width (see [`crate::text::wrap_hanging`]).
pub const EXIT_CODES_HELP: &str = "\
Exit status of `opmark run`: the command's own status for the verdicts `completed` and `replayed`; otherwise one reserved code per verdict:
  240 in_progress   241 not_applied   242 indeterminate   243 conflict
  244 blocked       245 refused (policy or input; nothing sent)
  130/143/129 stopped by SIGINT/SIGTERM/SIGHUP (a started command keeps running on the host; `opmark run` with the same op id follows it, `opmark cancel HOST OP` stops it)
Other commands: 0 ok, 1 findings (unresolved operations, broken audit chain, failing doctor check), 2 usage error, 243 conflict (host_changed: another machine, user or marker root than the operation's), 245 invalid input, 246 malformed configuration, 247 host unreachable or not authenticated, 248 local ledger/file error, 250 internal error; 141 (quietly) when the reader of stdout went away, as for a tool that SIGPIPE ended (`opmark list | head`).
With --json the JSON document on stdout is authoritative.";

/// What `opmark run --help` ends with: an agent learns the exit codes and the reason
/// codes it branches on from the tool itself. Kept in step with `vocab::ReasonCode` by a
/// test that looks for every code here. One logical line per paragraph or table row, as
/// [`EXIT_CODES_HELP`].
pub const RUN_HELP: &str = "\
Exit status: the command's own for `completed` and `replayed`; otherwise
  240 in_progress   241 not_applied   242 indeterminate   243 conflict
  244 blocked       245 refused (policy or input; nothing sent)
  246 malformed configuration   248 local ledger/file error
  250 internal error
  130/143/129 stopped by SIGINT/SIGTERM/SIGHUP (a started command keeps running on the host; rerun with the same --op to follow it, `opmark cancel HOST OP` to stop it)

With --json, stdout is one JSON line (schema opmark/2) with `verdict`, `reason_code` and `retryable`; branch on those. retryable=true: rerun with the SAME --op later.
Reason codes (retryable marked *):
  completed      command_exited
  replayed       replayed_from_host, replayed_from_ledger, resolved_applied
  in_progress    still_running*, client_interrupted*, detached*, wait_budget_spent*
  not_applied    connect_failed*, client_interrupted*, wait_budget_spent*, not_dispatched_max_failures*, not_dispatched_batch_failed*, lock_busy*, name_unresolvable, host_key_rejected, auth_refused, fenced, shim_cannot_start, shim_did_not_start, host_missing_setsid, become_refused, host_disk_full, resolved_not_applied, resolved_abandoned
  indeterminate  unreachable_after_dispatch*, earlier_dispatch_unknown*, attempt_budget_spent*, wait_budget_spent*, interrupted_needs_approval, host_disk_full, fenced_after_start
  conflict       conflict_on_host, conflict_in_ledger, host_changed
  blocked        approval_required (a human approves: --approve NOTE where approvals are self-service, else `opmark approve` signs a token for --approval FILE), approval_invalid, approval_expired, approval_mismatch, approval_used (a signed approval that does not count; the run stays held), repeats_recent_operation (the same command ran on the host under another op id within the family's repeat_window: rerun with that --op to replay it, or with --repeats THAT_OP to run it again on purpose)
  refused        policy_denied, invalid_input
Errors outside a verdict are {\"error\": {reason_code, message, retryable}}.

Several hosts (or --hosts-file): one operation per host under the same op id. Exit 0 when every host completed or replayed with exit 0; else the reserved code of the most severe verdict (indeterminate > conflict > blocked > not_applied > in_progress > refused); 1 when all completed or replayed but some exit status was non-zero. --json prints {\"schema\",\"hosts\":[one run document per host],\"summary\"}.

Without a terminal on stdin (or with -o BatchMode=yes) opmark never prompts: a key that needs a passphrase and no agent fails at once with auth_refused.";

/// The command line as opmark parses it and prints its help: [`Cli`], with the texts its
/// help ends with wrapped at the width clap wraps the rest at (the terminal's, else
/// `COLUMNS`, else 100), each row's continuation under its own column. clap wraps every
/// line on its own and never joins them, so a text wrapped for another width would come
/// out ragged.
pub fn command() -> clap::Command {
    use clap::CommandFactory as _;
    let width = help_width();
    Cli::command()
        .term_width(width)
        .after_long_help(crate::text::wrap_hanging(EXIT_CODES_HELP, width))
        .mut_subcommand("run", |run| {
            run.after_help(crate::text::wrap_hanging(RUN_HELP, width))
        })
}

/// The width clap's help is wrapped at, found as clap finds it.
fn help_width() -> usize {
    terminal_size::terminal_size()
        .map(|(terminal_size::Width(w), _)| usize::from(w))
        .or_else(|| std::env::var("COLUMNS").ok()?.trim().parse().ok())
        .filter(|&w| w > 0)
        .unwrap_or(100)
}

/// Run remote commands over SSH so that one logical operation executes at most once.
#[derive(Debug, Parser)]
#[command(name = "opmark", version, about)]
pub struct Cli {
    /// Options shared by every subcommand.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line clap parsed into `matches`, with where its connection flags and
    /// destination stood among the `-o` options: ssh takes the first value given, and
    /// the derive keeps the values but not their places.
    pub fn from_matches(matches: &clap::ArgMatches) -> Result<Cli, clap::Error> {
        let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(matches)?;
        // A global option's source is recorded where clap parsed it: before the
        // subcommand, or after it.
        let source = matches.value_source("ledger").or_else(|| {
            matches
                .subcommand()
                .and_then(|(_, sub)| sub.value_source("ledger"))
        });
        cli.global.ledger_from_env = source == Some(clap::parser::ValueSource::EnvVariable);
        if let (Some(args), Some((_, sub))) = (cli.command.host_args_mut(), matches.subcommand()) {
            args.positions = flag_positions(sub);
        }
        Ok(cli)
    }
}

/// Where `-l`, `-p`, `-J` and the destination stood among the `-o` options, by the
/// indices clap recorded for them. A fleet's hosts all stand where the first was named.
fn flag_positions(m: &clap::ArgMatches) -> FlagPositions {
    let present = |id: &str| matches!(m.try_get_raw(id), Ok(Some(_)));
    let options: Vec<usize> = m
        .indices_of("option")
        .map(Iterator::collect)
        .unwrap_or_default();
    let place = |id: &str| {
        if !present(id) {
            return None;
        }
        let index = m.index_of(id)?;
        let after_options = options.iter().filter(|&&o| o < index).count();
        Some(ArgPlace {
            after_options,
            index,
        })
    };
    let unplaced = FlagPositions::default();
    FlagPositions {
        user: place("login").unwrap_or(unplaced.user),
        port: place("port").unwrap_or(unplaced.port),
        jump: place("jump").unwrap_or(unplaced.jump),
        // put's and get's HOST:PATH name the host where they stand.
        destination: place("host")
            .or_else(|| place("hosts"))
            .or_else(|| place("destination"))
            .or_else(|| place("sources"))
            .unwrap_or(unplaced.destination),
    }
}

/// Removes every `OPMARK_*` variable whose value is empty from this process's
/// environment, so that `OPMARK_LEDGER=` means "unset" (as an empty `XDG_*` does) rather
/// than "a value is required". Call before parsing, while the process has one thread.
pub fn forget_empty_env() {
    let empty: Vec<std::ffi::OsString> = std::env::vars_os()
        .filter(|(k, v)| k.to_string_lossy().starts_with("OPMARK_") && v.is_empty())
        .map(|(k, _)| k)
        .collect();
    for key in empty {
        std::env::remove_var(key);
    }
}

/// How a boolean environment variable may be written, as people write them in service
/// files and MCP configurations: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`.
pub fn env_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "y" => Some(true),
        "0" | "false" | "no" | "off" | "n" => Some(false),
        _ => None,
    }
}

/// Checks the environment fallbacks that clap would misread, and writes them the one way
/// it reads them: `OPMARK_QUIET` as a boolean, `OPMARK_PERSIST` as a duration or a
/// boolean (`off` = no reuse). An error names the variable, not a flag the user never
/// typed, so an MCP server configured with `OPMARK_QUIET=1` serves instead of dying.
pub fn normalise_env() -> Result<(), String> {
    if let Some(value) = std::env::var_os("OPMARK_QUIET") {
        let text = value.to_string_lossy().into_owned();
        let quiet = env_bool(&text).ok_or_else(|| {
            format!(
                "OPMARK_QUIET={text:?} is not a boolean: use 1 or 0 (also true/false, yes/no, on/off), or unset it"
            )
        })?;
        std::env::set_var("OPMARK_QUIET", if quiet { "true" } else { "false" });
    }
    if let Some(value) = std::env::var_os("OPMARK_PERSIST") {
        let text = value.to_string_lossy().into_owned();
        let normal = match env_bool(&text) {
            Some(false) => "0".to_owned(),
            Some(true) => "5m".to_owned(),
            None => {
                crate::ssh::keeper::parse_persist(&text).map_err(|e| {
                    format!(
                        "OPMARK_PERSIST={text:?}: {e}; use a duration like 5m or 1h, or off (0) to turn connection reuse off"
                    )
                })?;
                text
            }
        };
        std::env::set_var("OPMARK_PERSIST", normal);
    }
    Ok(())
}

/// Options every subcommand accepts, each with an environment fallback.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// ssh_config file to resolve host aliases from (default ~/.ssh/config, then
    /// /etc/ssh/ssh_config; with -F only that file, as ssh; `none` for no file).
    #[arg(
        short = 'F',
        long = "ssh-config",
        env = "OPMARK_SSH_CONFIG",
        global = true,
        value_name = "PATH"
    )]
    pub ssh_config: Option<PathBuf>,
    /// Ledger: a SQLite file (default ${XDG_STATE_HOME:-~/.local/state}/opmark/ledger.db)
    /// or a shared PostgreSQL ledger, `postgres://...`/`postgresql://...` (needs --ledger-key).
    #[arg(long, env = "OPMARK_LEDGER", global = true, value_name = "PATH|URL")]
    pub ledger: Option<PathBuf>,
    /// Where `ledger` came from: true for `OPMARK_LEDGER` (set from clap's value source).
    #[arg(skip)]
    pub ledger_from_env: bool,
    /// The ledger's installation key file (default: beside the ledger, `ledger.key` for
    /// `ledger.db`). Create one with `opmark ledger keygen PATH`.
    #[arg(
        long = "ledger-key",
        env = "OPMARK_LEDGER_KEY",
        global = true,
        value_name = "PATH"
    )]
    pub ledger_key: Option<PathBuf>,
    /// Command-classes policy file (default: the user's file, else the shipped one).
    #[arg(long, env = "OPMARK_POLICY", global = true, value_name = "PATH")]
    pub policy: Option<PathBuf>,
    /// Print one JSON document on stdout; it is authoritative over the exit status.
    #[arg(long, global = true)]
    pub json: bool,
    /// Quiet: no `opmark:` lines on stderr (the command's own output still flows).
    #[arg(short = 'q', long = "quiet", env = "OPMARK_QUIET", global = true)]
    pub quiet: bool,
    /// Verbose tracing on stderr (-v info, -vv debug, -vvv trace).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Keep connections open in a per-user background keeper for D after their last use,
    /// so later opmark processes reuse them (like ssh's ControlPersist); 0 turns reuse
    /// off and every run connects itself.
    #[arg(
        long,
        env = "OPMARK_PERSIST",
        global = true,
        value_name = "D",
        default_value = "5m",
        value_parser = crate::ssh::keeper::parse_persist
    )]
    pub persist: Duration,
}

/// How `run` spreads one operation over several hosts (docs/decisions.md#fleets), and `--detach`.
#[derive(Debug, Args, Clone)]
pub struct FleetArgs {
    /// Read more hosts from FILE: one a line, `#` comments and blank lines ignored.
    #[arg(long = "hosts-file", value_name = "FILE")]
    pub hosts_file: Option<PathBuf>,
    /// Run at most N hosts at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub forks: usize,
    /// Stop dispatching to new hosts once N hosts ended in anything but completed or
    /// replayed with exit 0 (hosts already dispatched finish and are reported).
    #[arg(long = "max-failures", value_name = "N")]
    pub max_failures: Option<usize>,
    /// Rolling batches of N hosts: the next batch starts only when every host of the
    /// previous one completed or replayed with exit 0.
    #[arg(long, value_name = "N")]
    pub serial: Option<usize>,
    /// Do not prefix output lines with `host: ` when several hosts run.
    #[arg(long = "no-prefix")]
    pub no_prefix: bool,
    /// Return `in_progress` (reason code `detached`) as soon as the host acknowledged the
    /// claim; the command runs on, and `opmark run` with the same op id follows or replays.
    #[arg(long)]
    pub detach: bool,
}

impl Default for FleetArgs {
    fn default() -> Self {
        FleetArgs {
            hosts_file: None,
            forks: 32,
            max_failures: None,
            serial: None,
            no_prefix: false,
            detach: false,
        }
    }
}

/// Where to connect, OpenSSH style, shared by every subcommand that talks to a host.
#[derive(Debug, Args, Clone, Default)]
pub struct HostArgs {
    /// Port to connect to (overrides the ssh config).
    #[arg(short = 'p', long = "port", value_name = "PORT")]
    pub port: Option<u16>,
    /// Identity (private key) file; may be given several times.
    #[arg(short = 'i', long = "identity", value_name = "FILE")]
    pub identity: Vec<PathBuf>,
    /// Jump host(s), comma separated, like ssh -J.
    #[arg(short = 'J', long = "jump", value_name = "[USER@]HOST[:PORT][,...]")]
    pub jump: Option<String>,
    /// Remote user (wins over the ssh config, and over a user@host given after it), like
    /// ssh -l.
    #[arg(short = 'l', long = "login", value_name = "USER")]
    pub login: Option<String>,
    /// An ssh_config option, `Key=Value` or `"Key Value"`; may be given several times;
    /// wins over the config files, like ssh -o.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE")]
    pub option: Vec<String>,
    /// IPv4 addresses only, like ssh -4.
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6 addresses only, like ssh -6.
    #[arg(short = '6')]
    pub ipv6: bool,
    /// Where `-l`, `-p`, `-J` and the destination stood ([`Cli::from_matches`]).
    #[arg(skip)]
    pub positions: FlagPositions,
}

// The operator's decision is the library's word (`ops::resolve` takes it); clap reads it
// as `--as`'s values.
pub use crate::vocab::Resolution;

/// The subcommands.
// One value per process, parsed once and moved into its command: boxing `run`'s many
// options would save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run CMD on each HOST as one operation (at most one execution per op id and host).
    Run(RunArgs),
    /// Show the state of an operation's marker on its host (absent, running, completed,
    /// interrupted, fenced).
    Probe(ProbeArgs),
    /// List operations in the ledger, most recently active first (whole op ids, local
    /// times unless --utc).
    List(ListArgs),
    /// One operation's timeline: intent, attempts, observations, verdict (OP may be a
    /// unique prefix of the op id).
    Show(ShowArgs),
    /// Probe every unresolved operation and settle what the evidence settles.
    Reconcile(ReconcileArgs),
    /// Record an operator's decision about an operation.
    Resolve(ResolveArgs),
    /// Sign an approval of a held operation with your SSH key (a human's act; the run
    /// presents it with --approval).
    Approve(ApproveArgs),
    /// Show the family of a command and the rule that decided it, per part.
    Classify(ClassifyArgs),
    /// Ledger integrity checks.
    Audit(AuditArgs),
    /// The ledger's installation key.
    Ledger(LedgerArgs),
    /// Delete finished or fenced markers older than a retention period on a host.
    Gc(GcArgs),
    /// Counts for a dashboard and health: unknown outcomes, needs_human, replays, retries,
    /// conflicts, repetitions, approvals, contradictions, suspected duplicate effects.
    Stats(StatsArgs),
    /// Check that a host is usable: reachable, key known, shim runs, marker root sound.
    Doctor(DoctorArgs),
    /// The host locks (`run --lock`) held and waited for on a host, whichever client took
    /// them.
    Locks(LocksArgs),
    /// Deliver local files to HOST:PATH, one operation each: written beside PATH, checked
    /// by SHA-256, synced and renamed into place (a rerun replays; the same content
    /// already there is not written again).
    Put(PutArgs),
    /// Read HOST:PATH into a local file, one operation each file: the host's copy checked
    /// by SHA-256 here, synced and renamed into place (a rerun replays the host's copy).
    Get(GetArgs),
    /// Disposable local SSH targets (real OpenSSH sshd) to try opmark against.
    Lab(LabArgs),
    /// Stop a running operation on its host for good: TERM, then KILL after the grace;
    /// an absent or unstarted one is fenced so it can never run.
    Cancel(CancelArgs),
    /// Print how HOST resolves through the ssh config, in `ssh -G` style.
    Config(ConfigArgs),
    /// Print (a part of) an operation's recorded output, read from the copy its host keeps
    /// (a byte range, the tail, or the lines matching a pattern); reads only.
    Output(OutputArgs),
    /// Serve the Model Context Protocol on stdio: tools run, plan, probe, output, show,
    /// list, reconcile, cancel, for agent frameworks (never prompts, never approves).
    Mcp(McpArgs),
    /// The command-classes policy in effect.
    Policy(PolicyArgs),
    /// Print a shell completion script (bash, zsh or fish) on stdout.
    Completions(CompletionsArgs),
    /// Print the manual page (roff) on stdout, e.g. for
    /// `opmark man > ~/.local/share/man/man1/opmark.1`.
    Man,
    /// The per-user connection keeper that lets later runs reuse connections
    /// (see --persist): status, stop. `mux` is its older name.
    #[command(alias = "mux")]
    Keeper(KeeperArgs),
}

impl Command {
    /// The connection options of a subcommand that connects to a host.
    fn host_args_mut(&mut self) -> Option<&mut HostArgs> {
        match self {
            Command::Run(a) => Some(&mut a.host_args),
            Command::Probe(a) => Some(&mut a.host_args),
            Command::Output(a) => Some(&mut a.host_args),
            Command::Resolve(a) => Some(&mut a.host_args),
            Command::Gc(a) => Some(&mut a.host_args),
            Command::Doctor(a) => Some(&mut a.host_args),
            Command::Locks(a) => Some(&mut a.host_args),
            Command::Put(a) => Some(&mut a.transfer.host_args),
            Command::Get(a) => Some(&mut a.transfer.host_args),
            Command::Cancel(a) => Some(&mut a.host_args),
            Command::Config(a) => Some(&mut a.host_args),
            Command::List(_)
            | Command::Show(_)
            | Command::Reconcile(_)
            | Command::Approve(_)
            | Command::Classify(_)
            | Command::Audit(_)
            | Command::Ledger(_)
            | Command::Stats(_)
            | Command::Lab(_)
            | Command::Mcp(_)
            | Command::Policy(_)
            | Command::Completions(_)
            | Command::Man
            | Command::Keeper(_) => None,
        }
    }
}

/// `opmark keeper`.
#[derive(Debug, Args)]
pub struct KeeperArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: KeeperAction,
}

/// `opmark keeper` actions.
#[derive(Debug, Subcommand)]
pub enum KeeperAction {
    /// Whether a keeper runs, and the connections it holds.
    Status,
    /// Stop the keeper: its connections close (a command running on one is seen by its
    /// caller as a lost connection: probe, then decide).
    Stop,
    /// Run the keeper in the foreground (started by opmark itself when needed).
    #[command(hide = true)]
    Serve {
        /// The keeper's 0700 directory (default $XDG_RUNTIME_DIR/opmark).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// `opmark policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// The policy action.
    #[command(subcommand)]
    pub action: PolicyAction,
}

/// `opmark policy` actions.
#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Print the policy in effect and where it comes from, as TOML that loads back to
    /// the same policy (a starting point for your own file).
    Show,
}

/// The environment variable the completion scripts set when they ask the binary for
/// candidates (`COMPLETE=bash opmark -- WORDS...`).
pub const COMPLETE_VAR: &str = "COMPLETE";

/// Shell completion of HOST arguments: the ssh config's Host entries and known_hosts
/// names (asked of `opmark` itself when the shell completes: `COMPLETE=bash opmark`).
fn complete_hosts() -> clap_complete::engine::ArgValueCandidates {
    clap_complete::engine::ArgValueCandidates::new(host_candidates)
}

/// Shell completion of op ids: the ledger's most recently active operations.
fn complete_ops() -> clap_complete::engine::ArgValueCandidates {
    clap_complete::engine::ArgValueCandidates::new(op_candidates)
}

/// Candidates for a HOST: the ssh config's plain `Host` names and known_hosts names.
fn host_candidates() -> Vec<clap_complete::engine::CompletionCandidate> {
    crate::ops::hosts::known_names(&context_of_line())
        .into_iter()
        .map(clap_complete::engine::CompletionCandidate::new)
        .collect()
}

/// Candidates for an OP: the op ids of the ledger's most recently active operations
/// (never creates a ledger; none when there is none), each with its host and command.
fn op_candidates() -> Vec<clap_complete::engine::CompletionCandidate> {
    let request = crate::ops::list::ListRequest {
        limit: Some(200),
        ..Default::default()
    };
    let Ok(report) = crate::ops::list::list(&context_of_line(), &request) else {
        return Vec::new();
    };
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for o in report.operations.into_iter().map(|v| v.record) {
        if seen.contains(&o.op_id) {
            continue;
        }
        seen.push(o.op_id.clone());
        let help = format!("{}: {}", o.host, crate::text::fit(&o.display, 40));
        out.push(clap_complete::engine::CompletionCandidate::new(o.op_id).help(Some(help.into())));
    }
    out
}

/// The ssh config and ledger of the command line being completed: its `-F`, `--ledger`
/// and `--ledger-key` when typed already (the words after `--`), else the environment's.
fn context_of_line() -> crate::ops::Context {
    let words: Vec<std::ffi::OsString> = std::env::args_os()
        .skip_while(|w| w != "--")
        .skip(1)
        .collect();
    let value_of = |flags: &[&str], var: &str| -> Option<PathBuf> {
        let mut found = None;
        for (i, w) in words.iter().enumerate() {
            let Some(w) = w.to_str() else { continue };
            for flag in flags {
                if w == *flag {
                    found = words.get(i + 1).map(PathBuf::from);
                } else if let Some(v) = w.strip_prefix(&format!("{flag}=")) {
                    found = Some(PathBuf::from(v));
                }
            }
        }
        found.or_else(|| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    };
    crate::ops::Context {
        ssh_config: value_of(&["-F", "--ssh-config"], "OPMARK_SSH_CONFIG"),
        ledger: value_of(&["--ledger"], "OPMARK_LEDGER"),
        // Completion names no ledger in a message.
        ledger_from_env: false,
        ledger_key: value_of(&["--ledger-key"], "OPMARK_LEDGER_KEY"),
        policy: None,
    }
}

/// `opmark completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: ShellArg,
}

/// Shells `opmark completions` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellArg {
    /// Bash (source it, or put it in ~/.local/share/bash-completion/completions/opmark).
    Bash,
    /// Zsh (put it as `_opmark` in a directory of your $fpath).
    Zsh,
    /// Fish (put it in ~/.config/fish/completions/opmark.fish).
    Fish,
}

/// `opmark mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Command output a tool result carries per stream (bytes, or k/m/g): the head (3/4)
    /// and the tail (1/4), with one line naming the bytes left out; the `output` tool
    /// reads them. A call's `output_budget` overrides it.
    #[arg(long = "output-budget", visible_alias = "max-output", value_parser = parse_size, default_value = "16k", value_name = "SIZE")]
    pub max_output: u64,
    /// Offer a secret to the tools' `secrets` argument: the command of a call naming
    /// NAME gets the environment variable NAME, its value read (at each call) from this
    /// process's environment variable VAR or the file PATH. A call names secrets, never
    /// gives one; nothing a call returns shows a value. Repeatable.
    #[arg(long = "secret", value_name = "NAME=env:VAR|file:PATH")]
    pub secrets: Vec<String>,
}

/// `opmark config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Host alias, [user@]host or ssh://[user@]host[:port].
    #[arg(add = complete_hosts())]
    pub host: String,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Host alias from the ssh config, or [user@]host; several for a fleet run (one
    /// operation per host, same op id).
    #[arg(value_name = "HOST", required_unless_present = "hosts_file")]
    #[arg(add = complete_hosts())]
    pub hosts: Vec<String>,
    /// Operation id (^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$). Minted and printed when absent.
    #[arg(long = "op", value_name = "ID")]
    #[arg(add = complete_ops())]
    pub op: Option<String>,
    /// Treat the command as at least this family (stricter only, never less strict).
    #[arg(long = "class", value_enum, value_name = "FAMILY")]
    pub class: Option<Family>,
    /// Forward opmark's stdin to the command, read to end of file first (it is part of
    /// the operation, and a retry resends it). Without it, a file on stdin is forwarded,
    /// a terminal or /dev/null is not, and a pipe that stays silent is refused.
    #[arg(long, conflicts_with = "no_stdin")]
    pub stdin: bool,
    /// Never read stdin, as ssh -n (the same as </dev/null).
    #[arg(short = 'n', long = "no-stdin")]
    pub no_stdin: bool,
    /// Kill the command's process group on the host after this long (e.g. 30s, 5m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,
    /// Automatic attempts within this run (default: the family's budget in the policy).
    #[arg(long, value_name = "N")]
    pub attempts: Option<u32>,
    /// Bound the whole invocation: connects before anything is sent (spent:
    /// `not_applied`, `wait_budget_spent`), probes after a lost connection, and the
    /// command itself, which keeps running on the host when the budget runs out (one
    /// last probe, at most 3s, then `in_progress` or `indeterminate`). Without it, a
    /// connected command streams to its end as with ssh, and connects and probes get
    /// 30s.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// Cap on the output kept on the host per stream (bytes, or with k/m/g suffix);
    /// beyond it bytes are counted and dropped, with a note.
    #[arg(long = "output-cap", env = "OPMARK_OUTPUT_CAP", value_parser = parse_size, default_value = "8m", value_name = "SIZE")]
    pub output_cap: u64,
    /// `--approve` / `--approval`.
    #[command(flatten)]
    pub approvals: ApprovalArgs,
    /// Declares a deliberate repetition of the earlier operation OP (the same command on
    /// the same host under a new op id), which the family's `on_repeat` would otherwise
    /// block or warn about; recorded as a link that `show` displays on both.
    #[arg(long, value_name = "OP")]
    pub repeats: Option<String>,
    /// This new operation replaces the earlier operation OP, whose command changed (after
    /// a `conflict`, say); recorded as a link on both, the earlier keeps its outcome. With
    /// the same command it also counts as declaring the repetition.
    #[arg(long, value_name = "OP")]
    pub amends: Option<String>,
    /// Give the command the environment variable NAME on the host, its value read from
    /// this process's environment variable VAR or from the file PATH (one trailing
    /// newline left out). Repeatable. The value travels inside the connection to the
    /// shim only: never in the host's process list, the marker, the ledger or a log; the
    /// intent binds the name. Anything the command prints of it is kept and shown as
    /// [REDACTED:NAME].
    #[arg(long = "secret", value_name = "NAME=env:VAR|file:PATH")]
    pub secrets: Vec<String>,
    /// Run the command as USER (root when --become is given alone) through sudo on the
    /// host; sudo's password, if it needs one, as --secret SUDO_PASSWORD=env:VAR. Checked
    /// before the claim: a sudo that needs a terminal or a password not given runs nothing.
    #[arg(long = "become", value_name = "USER", num_args = 0..=1, require_equals = true, default_missing_value = "root")]
    pub become_user: Option<String>,
    /// Hold the host lock NAME (a semaphore of N slots, default 1, in the host's marker
    /// root, seen by every client of the host) while the command runs: taken on the host
    /// before the command starts, given back however it ends. Repeatable. One not free
    /// within --lock-wait answers not_applied (lock_busy) naming its holder; nothing ran.
    #[arg(long = "lock", value_name = "NAME[:N]", value_parser = crate::host_lock::HostLock::parse)]
    pub locks: Vec<crate::host_lock::HostLock>,
    /// How long the host waits for the --lock locks (default 0s: one try).
    #[arg(long = "lock-wait", value_parser = parse_duration, default_value = "0s", value_name = "DURATION")]
    pub lock_wait: Duration,
    /// Say what `run` would do (run, replay, follow, block and why, refuse) without
    /// running or recording anything: the policy and the ledger are read, and the
    /// marker on each host is probed read-only.
    #[arg(long)]
    pub dry_run: bool,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
    /// Several hosts at once, and detaching.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// The command; its words are joined by spaces and run by the login shell with `-c` on the host, as ssh does.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `opmark probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Host alias or [user@]host.
    #[arg(add = complete_hosts())]
    pub host: String,
    /// Operation id.
    #[arg(add = complete_ops())]
    pub op: String,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark output`.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Operation id.
    #[arg(add = complete_ops())]
    pub op: String,
    /// Host alias or [user@]host, as given to `opmark run`; may be left out when the op id
    /// ran on one host.
    #[arg(add = complete_hosts())]
    pub host: Option<String>,
    /// Bytes A up to, not including, B of the stream (e.g. 0-4096, 1m-2m; `A-`: to the end).
    #[arg(long, value_name = "A-B", value_parser = parse_range, conflicts_with_all = ["tail", "grep"])]
    pub range: Option<(u64, Option<u64>)>,
    /// The last SIZE bytes of the stream (e.g. 4096, 16k).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes, conflicts_with = "grep")]
    pub tail: Option<u64>,
    /// Only the lines matching this regular expression, each after its byte offset in the
    /// stream (as `grep -b`).
    #[arg(long, value_name = "REGEX")]
    pub grep: Option<String>,
    /// Which stream.
    #[arg(long, value_enum, default_value = "stdout", value_name = "STREAM")]
    pub stream: StreamArg,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `--stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StreamArg {
    /// The command's stdout.
    Stdout,
    /// The command's stderr.
    Stderr,
}

/// `opmark cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Host alias or [user@]host, as given to `opmark run`.
    #[arg(add = complete_hosts())]
    pub host: String,
    /// Operation id.
    #[arg(add = complete_ops())]
    pub op: String,
    /// How long the command has between TERM and KILL (e.g. 500ms, 10s, 1m).
    #[arg(long, value_parser = parse_duration, default_value = "10s", value_name = "DURATION")]
    pub grace: Duration,
    /// Who cancels; recorded in the ledger (default $USER).
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Cancel an op id this ledger has no record of on that host (started from another
    /// machine, say). Without it such a cancel sends nothing: an absent op id would be
    /// fenced for good, and a typo must not close an op id.
    #[arg(long)]
    pub force: bool,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only operations whose outcome is not settled.
    #[arg(long)]
    pub unresolved: bool,
    /// Only operations on this host.
    #[arg(long, value_name = "HOST")]
    #[arg(add = complete_hosts())]
    pub host: Option<String>,
    /// Only operations active within this long before now (e.g. 30m, 2h, 7d).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub since: Option<Duration>,
    /// At most this many operations (the most recently active; default 50).
    #[arg(long, value_name = "N", conflicts_with = "all")]
    pub limit: Option<usize>,
    /// Every matching operation, not only the newest 50.
    #[arg(long)]
    pub all: bool,
    /// Times in UTC instead of the local time zone.
    #[arg(long)]
    pub utc: bool,
    /// Every column whole (command, family), however wide the rows get.
    #[command(flatten)]
    pub wide: WideArgs,
}

/// `--wide` or `-o wide`, as kubectl says it: tables with every column whole.
#[derive(Debug, Args, Clone, Default)]
pub struct WideArgs {
    /// Every column whole, however wide the rows get (default: fit the screen, never
    /// cutting op ids or hosts).
    #[arg(long = "wide")]
    pub wide: bool,
    /// `-o wide` is `--wide`.
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub output: Option<OutputArg>,
}

impl WideArgs {
    /// True for `--wide` or `-o wide`.
    pub fn wide(&self) -> bool {
        self.wide || self.output == Some(OutputArg::Wide)
    }
}

/// Table formats (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    /// Every column whole.
    Wide,
}

impl ListArgs {
    /// True for `--wide` or `-o wide`.
    pub fn wide(&self) -> bool {
        self.wide.wide()
    }
}

/// `opmark stats`.
#[derive(Debug, Default, Args)]
pub struct StatsArgs {
    /// Only events recorded within this long before now, and the operations active in
    /// that time (e.g. 1h, 7d). Without it: the whole ledger, from its counters.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub since: Option<Duration>,
    /// Name at most this many suspected duplicates (default 20, by host); their
    /// counts always cover all of them.
    #[arg(long, value_name = "N", conflicts_with = "all")]
    pub limit: Option<usize>,
    /// Name every suspected duplicate, not only the first 20.
    #[arg(long)]
    pub all: bool,
    /// `text` (the default), `json` (as --json) or `prometheus`: the text exposition
    /// format for node_exporter's textfile collector; write it atomically with
    /// `opmark stats --format prometheus > DIR/opmark.prom.tmp && mv DIR/opmark.prom.tmp DIR/opmark.prom`.
    /// With --json only `json` agrees (absent: JSON).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<StatsFormat>,
}

/// How `opmark stats` writes its counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum StatsFormat {
    /// A table for people.
    #[default]
    Text,
    /// One JSON document (the same as `--json`).
    Json,
    /// Prometheus text exposition format (`opmark_` metrics).
    Prometheus,
}

/// `opmark show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Operation id, or a prefix of it that matches only one operation.
    #[arg(add = complete_ops())]
    pub op: String,
    /// The host, when the op id was used on several.
    #[arg(long, value_name = "HOST")]
    #[arg(add = complete_hosts())]
    pub host: Option<String>,
    /// Only the newest N events in the timeline (the outcome, attempts and observations
    /// still read every event; `event_count` says how many there are).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

/// `opmark reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Only these operations (default: every unresolved one).
    #[arg(add = complete_ops())]
    pub ops: Vec<String>,
    /// Only operations on this host.
    #[arg(long, value_name = "HOST")]
    #[arg(add = complete_hosts())]
    pub host: Option<String>,
    /// At most this many operations contacted, the most recently active first (default:
    /// every unresolved one); the rest are counted and wait for the next reconcile.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Every column whole, however wide the rows get.
    #[command(flatten)]
    pub wide: WideArgs,
}

/// `opmark resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// Operation id.
    #[arg(add = complete_ops())]
    pub op: String,
    /// The operation's host (needed only when the op id was used on several hosts).
    #[arg(long, value_name = "HOST")]
    #[arg(add = complete_hosts())]
    pub host: Option<String>,
    /// The decision.
    #[arg(long = "as", value_enum, value_name = "DECISION")]
    pub decision: Resolution,
    /// Why; recorded in the ledger (redacted).
    #[arg(long, value_name = "TEXT")]
    pub note: String,
    /// Who decides (default $USER, else $LOGNAME, else the uid's passwd name).
    #[arg(long = "operator", visible_alias = "by", value_name = "NAME")]
    pub by: Option<String>,
    /// With `--as applied`: the exit status the operation had (0-255); a later `run` of
    /// the op id replays it.
    #[arg(long = "exit", value_name = "N")]
    pub exit: Option<i32>,
    /// With `--as abandoned`: record it even when the host cannot be reached, so nothing
    /// on it can be checked or fenced (the command may still be running there).
    #[arg(long)]
    pub force: bool,
    /// Connection options (for fencing the marker on not-applied or abandoned; the
    /// operation's recorded route is used without them).
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark approve`.
#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// Operation id of the held run.
    #[arg(add = complete_ops())]
    pub op: String,
    /// The operation's host (needed only when the op id was used on several hosts).
    #[arg(add = complete_hosts())]
    pub host: Option<String>,
    /// Why you approve; signed into the approval and recorded when a run uses it.
    #[arg(long, value_name = "TEXT")]
    pub note: String,
    /// How long the approval stays valid (e.g. 30m, 1h).
    #[arg(long = "for", value_parser = parse_duration, default_value = "1h", value_name = "DURATION")]
    pub ttl: Duration,
    /// The key to sign with: a private key file, or a public key whose private half is in
    /// ssh-agent (default: the agent's first key that the approvers file lists).
    #[arg(short = 'i', value_name = "KEY")]
    pub key: Option<PathBuf>,
    /// The intent's host fingerprint, as the blocked answer's `opmark approve` line gives
    /// it: the approval then also binds the exact command and stdin the host will see.
    #[arg(long, value_name = "HOST_FINGERPRINT")]
    pub intent: Option<String>,
    /// Write the token to this file (mode 0600) instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `opmark classify`.
#[derive(Debug, Args)]
pub struct ClassifyArgs {
    /// The command, as it would be given to `opmark run`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `opmark audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The audit action.
    #[command(subcommand)]
    pub action: AuditAction,
}

/// `opmark audit` actions.
#[derive(Debug, Subcommand)]
pub enum AuditAction {
    /// Check the ledger's hash chain; name the first broken event.
    Verify(VerifyArgs),
}

/// `opmark audit verify`.
#[derive(Debug, Default, Args)]
pub struct VerifyArgs {
    /// Walk the whole chain, replay every operation and recount the counters (the
    /// default; for scripts that want to say so).
    #[arg(long, conflicts_with = "incremental")]
    pub full: bool,
    /// Read only the events after the last checkpoint a verify recorded (either backend),
    /// and replay only the operations they touch; says so. What was verified before the
    /// checkpoint is trusted: edits there are what the full walk is for. Without a
    /// checkpoint: the full walk.
    #[arg(long, conflicts_with = "archive")]
    pub incremental: bool,
    /// Also verify the archive `opmark ledger archive` wrote, up to the ledger's cut, as
    /// one chain with the ledger.
    #[arg(long, value_name = "FILE")]
    pub archive: Option<PathBuf>,
}

/// `opmark ledger`.
#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// The ledger action.
    #[command(subcommand)]
    pub action: LedgerAction,
}

/// `opmark ledger` actions.
#[derive(Debug, Subcommand)]
pub enum LedgerAction {
    /// Write a new installation key (32 random bytes, mode 0600) to PATH, for a ledger
    /// named with --ledger-key; never overwrites an existing file.
    Keygen {
        /// Where to write the key.
        path: PathBuf,
    },
    /// Copy this SQLite ledger (--ledger, or the default) event for event into an empty
    /// PostgreSQL ledger, then verify the chain there. The copy keeps this ledger's key:
    /// use it with --ledger-key on every machine that shares the new ledger.
    Migrate {
        /// The PostgreSQL ledger: postgres://USER@HOST[:PORT]/DATABASE (empty database).
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Copy this SQLite ledger (--ledger, or the default) to the new FILE, mode 0600: one
    /// consistent snapshot, taken while other runs append. Copy a ledger this way, not
    /// with cp: its newest commits may be in the write-ahead log beside the file
    /// (ledger.db-wal). The copy opens with this ledger's key (--ledger-key).
    Backup {
        /// The copy to write (a new file; never overwritten).
        file: PathBuf,
    },
    /// Move the settled operations finished more than D ago (the oldest stretch of the
    /// chain, up to the first operation still unresolved or active) into the new archive
    /// FILE; the ledger keeps the cut, and `audit verify --archive FILE` checks both as
    /// one chain. Unresolved operations are never archived. SQLite and PostgreSQL alike.
    Archive {
        /// How old an operation's last event must be (e.g. 90d).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        before: Duration,
        /// The archive to write (a new file, mode 0600).
        file: PathBuf,
    },
}

/// `opmark gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Host alias or [user@]host.
    #[arg(add = complete_hosts())]
    pub host: String,
    /// Remove finished or fenced markers older than this (e.g. 30d).
    #[arg(long = "older-than", value_parser = parse_duration, value_name = "DURATION")]
    pub older_than: Duration,
    /// Print what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove the tombstones (exit status, fingerprint, attempt, times: what stops a
    /// late rerun from running again) of markers older than this. Without it they stay.
    #[arg(long = "tombstones-older-than", value_parser = parse_duration, value_name = "DURATION")]
    pub tombstones_older_than: Option<Duration>,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Host alias or [user@]host.
    #[arg(add = complete_hosts())]
    pub host: String,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark locks HOST`.
#[derive(Debug, Args)]
pub struct LocksArgs {
    /// Host alias or [user@]host.
    #[arg(add = complete_hosts())]
    pub host: String,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// A human's approval of a blocked operation, given to `run`, `put` and `get`.
#[derive(Debug, Args)]
pub struct ApprovalArgs {
    /// Operator approval where approvals are self-service: lets a blocked operation
    /// supersede and run once; the note is recorded. Where the policy names `approvers`,
    /// it does not count: use --approval.
    #[arg(long, value_name = "NOTE", conflicts_with = "approval")]
    pub approve: Option<String>,
    /// A signed approval (the file `opmark approve` wrote, or `-` for standard input):
    /// lets this one blocked attempt run where approvals are signed.
    #[arg(long, value_name = "FILE")]
    pub approval: Option<std::path::PathBuf>,
}

/// `opmark put LOCAL... HOST:PATH`.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// The local files to deliver (directories too, with -r).
    #[arg(value_name = "LOCAL", required = true, num_args = 1..)]
    pub locals: Vec<PathBuf>,
    /// Where: HOST:PATH (PATH absolute, or relative to the login directory; ending in /,
    /// the local file's name is taken). With several files or -r, the directory they go
    /// into, each file its own operation.
    #[arg(value_name = "HOST:PATH")]
    pub destination: String,
    /// The files' mode on the host, in octal (default: each local file's).
    #[arg(long, value_parser = parse_mode, value_name = "MODE")]
    pub mode: Option<u32>,
    /// Put the files of directories, at every depth, under the directory's name (`.`:
    /// its files directly); the directories are made on the host as needed.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Write the files as USER (root when --become is given alone) through sudo on the
    /// host: they are theirs, as USER makes them (a relative PATH is from the login
    /// directory). Checked before the claim, as for run.
    #[arg(long = "become", value_name = "USER", num_args = 0..=1, require_equals = true, default_missing_value = "root")]
    pub become_user: Option<String>,
    /// sudo's password for --become, if it needs one: SUDO_PASSWORD=env:VAR or
    /// SUDO_PASSWORD=file:PATH, never on the command line (the one secret a put takes).
    #[arg(long = "secret", value_name = "SUDO_PASSWORD=env:VAR|file:PATH")]
    pub secrets: Vec<String>,
    /// The options `put` and `get` share.
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// `opmark get HOST:PATH... LOCAL`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// Where from: HOST:PATH (PATH absolute, or relative to the login directory); several,
    /// of one host, each file its own operation.
    #[arg(value_name = "HOST:PATH", required = true, num_args = 1..)]
    pub sources: Vec<String>,
    /// The local file to write (an existing directory takes the remote file's name; with
    /// several files or -r, the existing directory they go into).
    #[arg(value_name = "LOCAL")]
    pub local: PathBuf,
    /// Read the regular files of a directory, at every depth, into LOCAL/NAME (`DIR/.`:
    /// into LOCAL directly), each its own operation, after a listing that is an
    /// operation too (`OP:list`), so a rerun reads the same set into the same place.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// The options `put` and `get` share.
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// What `put` and `get` take besides their files.
#[derive(Debug, Args)]
pub struct TransferArgs {
    /// Operation id (^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$). Minted and printed when absent;
    /// rerun with the same id after a lost connection: it resumes or replays, and never
    /// transfers twice.
    #[arg(long = "op", value_name = "ID")]
    #[arg(add = complete_ops())]
    pub op: Option<String>,
    /// Automatic attempts (default: the family's budget in the policy).
    #[arg(long, value_name = "N")]
    pub attempts: Option<u32>,
    /// Budget for the whole transfer, as for `run --wait` (default: 30s for connects and
    /// probes, the transfer itself unbounded).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// `--approve` / `--approval`: for a transfer the policy holds.
    #[command(flatten)]
    pub approvals: ApprovalArgs,
    /// With several files: at most this many operations (one per file) in flight at once.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub forks: usize,
    /// Connection options.
    #[command(flatten)]
    pub host_args: HostArgs,
}

/// `opmark lab`.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// The lab action.
    #[command(subcommand)]
    pub action: LabAction,
}

/// Where lab targets listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlacementArg {
    /// 127.0.0.1 at free ports (works without root).
    Loopback,
    /// Each target in its own network namespace behind a veth pair (root only).
    Netns,
    /// Each target a container with its own sshd, on a bridge network of the lab
    /// (needs a Docker engine; the image is built once with debootstrap, or --image).
    Docker,
}

/// The image a docker lab builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LabKindArg {
    /// Debian's userland and OpenSSH, made with debootstrap (the default).
    Debian,
    /// busybox-static as every tool and this machine's OpenSSH sshd.
    Busybox,
    /// busybox-static and dropbear as the server.
    Dropbear,
}

/// `opmark lab` actions.
#[derive(Debug, Subcommand)]
pub enum LabAction {
    /// Start N disposable sshd targets and write an ssh_config with one alias per target.
    Up {
        /// How many targets.
        #[arg(default_value_t = 1)]
        count: usize,
        /// Where they listen.
        #[arg(long, value_enum, default_value = "loopback")]
        placement: PlacementArg,
        /// With --placement docker: a local image with sshd at /usr/sbin/sshd to use
        /// instead of the lab's own (keys and sshd_config are injected at start).
        #[arg(long, value_name = "IMG", conflicts_with = "kind")]
        image: Option<String>,
        /// With --placement docker: which image the lab builds (once, then cached):
        /// `debian` (debootstrap, about two minutes, needs a Debian mirror), `busybox`
        /// (this machine's sshd and busybox, seconds, no network) or `dropbear`.
        #[arg(long, value_enum, value_name = "KIND")]
        kind: Option<LabKindArg>,
        /// Lab directory (default ${XDG_STATE_HOME:-~/.local/state}/opmark/lab).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Stop the targets and remove the lab directory (docker: containers, network and
    /// marker volumes; the cached image stays unless --purge-image).
    Down {
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Docker labs: also remove the image built from the lab's recipe.
        #[arg(long)]
        purge_image: bool,
    },
    /// Print the targets of a running lab and how to reach them.
    Status {
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// At most this many targets, in target order (default: all).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// Print the `export OPMARK_SSH_CONFIG=...` line that reaches the lab's targets
    /// without -F (`eval "$(opmark lab env)"`).
    Env {
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Silently drop all packets to and from a netns or docker target (no RST, no FIN).
    Cut {
        /// Target alias (e.g. target1).
        target: String,
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Restore a cut target's link.
    Restore {
        /// Target alias.
        target: String,
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Freeze every process of a docker target (docker pause): a hung host.
    Pause {
        /// Target alias.
        target: String,
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Unfreeze a paused docker target.
    Resume {
        /// Target alias.
        target: String,
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Kill every process of a docker target and start it again: markers persist, the
    /// running command does not.
    Crash {
        /// Target alias.
        target: String,
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// As crash, and the target's boot id changes, as after a reboot of the machine.
    Reboot {
        /// Target alias.
        target: String,
        /// Lab directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_with_connection_flags_learns_where_they_stood() {
        let lines = [
            "config x@h -o Port=1 -l bar",
            "probe x@h op -o Port=1 -l bar",
            "output op x@h -o Port=1 -l bar",
            "cancel x@h op -o Port=1 -l bar",
            "gc x@h --older-than 1d -o Port=1 -l bar",
            "doctor x@h -o Port=1 -l bar",
            "locks x@h -o Port=1 -l bar",
            "put f x@h:/tmp/f -o Port=1 -l bar",
            "get x@h:/tmp/f f -o Port=1 -l bar",
            "resolve op --host x@h --as abandoned --note n -o Port=1 -l bar",
            "run x@h y@h -o Port=1 -l bar -- true",
        ];
        let covered: Vec<&str> = lines.iter().filter_map(|l| l.split(' ').next()).collect();
        for sub in command().get_subcommands() {
            if sub.get_arguments().any(|a| a.get_id() == "login") {
                assert!(covered.contains(&sub.get_name()), "{}", sub.get_name());
            }
        }
        for line in lines {
            let words = std::iter::once("opmark").chain(line.split(' '));
            let cli = Cli::from_matches(&command().try_get_matches_from(words).unwrap()).unwrap();
            let mut command = cli.command;
            let at = command.host_args_mut().unwrap().positions;
            assert_eq!(at.destination.after_options, 0, "{line}");
            assert_eq!(at.user.after_options, 1, "{line}");
            assert!(at.destination < at.user, "{line}: {at:?}");
            assert_eq!(at.port, FlagPositions::default().port, "{line}");
        }
    }
}
