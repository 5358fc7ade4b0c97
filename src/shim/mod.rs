//! The host shim's wire: the embedded script (build.rs assembles it from the parts in
//! `remote-scripts/shim/`), its verbs and their positional parameters ([`VERBS`], the
//! same table as the script's header), the one place that builds the invocation of it
//! (the exec request, all quoting, and the channel data), and its framed replies
//! ([`frames`]). Callers do not use this directly: they go through [`crate::host`], which
//! calls a verb and reads its typed answer.
//!
//! Nothing is installed on a host by hand. Every call's exec request is a one-line stub
//! that any login shell runs as is (sh, bash, dash, ash, zsh, fish, tcsh: single quotes
//! only, no `!`, no newline). The script is shipped once: the host keeps it in its marker
//! root as `shim/<sha256>.sh` (directory 0700, file 0600), and a call normally carries
//! only its hash; the stub runs `sh FILE FILE c=TOKEN VERB ARGS...` if the file hashes to
//! its name, and otherwise runs nothing and answers [`need_line`]. The client then calls
//! again with the script in the channel's data (`sh -c SCRIPT opmark-shim SCRIPT c=TOKEN
//! h=SHA256 VERB ARGS...`), and the shim stores it. So the common call costs no extra
//! round trip, the first call to a host (or one whose copy was damaged) one more exchange,
//! and a copy that fails its hash check is replaced, never run.
//!
//! The verb's input follows in the same data (for `run`: the command, then the stdin), so
//! neither the script nor the command is ever an argument: their size does not matter
//! (one argument is capped at 128 KiB on Linux) and `ps` on the host does not show them.
//! The data is sent right behind the exec request, without waiting for the host. The
//! script gets itself (its file, or its text) as its first argument so that it can start
//! its detached supervisor with the same code.

pub mod frames;

use std::time::Duration;

use crate::family::Family;
use crate::op_id::OpId;
use crate::policy::OnRepeat;

pub use frames::{
    CancelOutcome, ExitFrame, FenceOutcome, Frame, GcAction, GcRemoved, LockHolder, LockWaiter,
    MarkerInfo, MarkerState, OutputStream, ProtocolError, Refusal, RefusalReason, Reply,
    ReplyParser, PROTOCOL_VERSION,
};

/// The shim's source, delivered on the first call to a host and then cached there: one
/// script, the parts in `remote-scripts/shim/` concatenated in name order by build.rs.
pub const SCRIPT: &str = include_str!(concat!(env!("OUT_DIR"), "/shim.sh"));

/// The largest command opmark sends. Not a transport limit (the command travels in the
/// channel's data): the host's shell holds it in memory a few times over, and a script
/// this size belongs in a file sent with `--stdin` (`opmark run HOST --stdin -- sh -s`).
pub const MAX_COMMAND_BYTES: usize = 16 << 20;

/// What the exec request runs. `$1` is the script's SHA-256, `$2` its length in the
/// channel's data or `-` when the data does not carry it, `$3` `c=TOKEN`. It first reads
/// the call token line (a login shell's startup file that read from stdin would shift
/// the data: the line no longer matches, and nothing runs). Without the script in the
/// data it runs the host's cached copy, `<marker root>/shim/<sha256>.sh` (the root found
/// as the shim's `setup_root` finds it), only if that file and its directory are the
/// login user's and the file's content hashes to the name; otherwise it prints
/// [`need_line`] and ends, having run nothing. With the script it reads exactly the
/// script (never past it: the command and stdin follow) and runs it with `h=SHA256` so
/// that the shim fills the cache. The hash costs one process on every call: the command
/// substitution's own fork execs `sha256sum` (`shasum -a 256` where it is missing).
/// Single quotes around it must be enough for every shell (see module doc).
const STUB: &str = concat!(
    "read -r t&&[ \"$t\" = \"$3\" ]||exit 9;",
    "h=$1;f=${OPMARK_ROOT:-${XDG_STATE_HOME:-$HOME/.local/state}/opmark}/shim/$h.sh;",
    "if [ \"$2\" = - ];then ",
    "[ -O \"${f%/*}\" ]&&[ -O \"$f\" ]&&",
    "[ \"$({ command -v sha256sum >/dev/null&&exec sha256sum;exec shasum -a 256;}<\"$f\" 2>/dev/null)\" = \"$h  -\" ]",
    "||{ echo \"opmark-shim need $t\";exit 0;};",
    "shift 3;exec sh \"$f\" \"$f\" \"$t\" \"$@\";fi;",
    "s=$(dd bs=$2 count=1 iflag=fullblock 2>/dev/null)&&shift 3&&",
    "exec sh -c \"$s\" opmark-shim \"$s\" \"$t\" \"h=$h\" \"$@\""
);

/// Lower-case hex SHA-256 of [`SCRIPT`]: the name of the host's cached copy.
pub fn script_sha256() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(SCRIPT.as_bytes()))
    })
}

/// What the stub prints on stdout, instead of running anything, when the host has no
/// good cached copy of the script: the call must be made again with the text.
pub fn need_line(token: &str) -> String {
    format!("opmark-shim need c={token}")
}

/// Default cap on captured output per stream on the host: beyond it, bytes are counted
/// and dropped, and the trailer says how many.
pub const DEFAULT_OUTPUT_CAP: u64 = 8 * 1024 * 1024;

/// Spooled stdin as the shim must verify it before claiming (a connection lost halfway
/// must not start the command on half an input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdinSpec {
    /// Exact byte count the client sends.
    pub len: u64,
    /// Lower-case hex SHA-256 of those bytes.
    pub sha256_hex: String,
}

/// Everything the `run` verb needs.
#[derive(Debug, Clone)]
pub struct RunCall<'a> {
    /// The operation.
    pub op: &'a OpId,
    /// This attempt's id (same charset as op ids).
    pub attempt_id: &'a str,
    /// Plain SHA-256 of the canonical intent (what the host marker records).
    pub host_fingerprint: &'a str,
    /// The command's family, recorded in the claim.
    pub family: Family,
    /// Kill the command's process group after this long.
    pub timeout: Option<Duration>,
    /// Cap per captured stream.
    pub output_cap: u64,
    /// `Some` when stdin is forwarded.
    pub stdin: Option<StdinSpec>,
    /// Whether an interrupted claim may be moved aside and claimed again by this attempt
    /// (policy `rerun`, or an operator's approval).
    pub supersede_interrupted: bool,
    /// What the shim's fingerprint index does with a repetition of this intent under
    /// another op id (docs/host-protocol.md#the-fingerprint-index).
    pub repeat: RepeatCheck<'a>,
    /// The command string, run on the host by the login shell with `-c`, as ssh runs it
    /// (sent in the channel's data, at most [`MAX_COMMAND_BYTES`]).
    pub command: &'a str,
    /// The command's secret environment variables (sent in the channel's data, before
    /// the command; docs/host-protocol.md#secrets).
    pub secrets: &'a crate::secret::Secrets,
    /// `--become USER`: the command runs as USER through sudo (checked by the shim
    /// before the claim; docs/trust.md#become).
    pub become_user: Option<&'a str>,
    /// `--lock`: the host locks the supervisor takes before the command starts, in the
    /// order [`crate::host_lock::HostLock::set`] gives (docs/host-protocol.md#host-locks).
    pub locks: &'a [crate::host_lock::HostLock],
    /// `--lock-wait`: how long the supervisor waits for them (whole seconds on the host).
    pub lock_wait: Duration,
    /// A command, or a file delivered (`opmark put`).
    pub kind: RunKind,
    /// A put resumed: the content's first byte this attempt sends (the host holds the
    /// bytes before it from a cut attempt; docs/host-protocol.md#files). Zero otherwise.
    pub put_from: u64,
}

/// The first word of a put's intent (`opmark-put --mode MODE -- 'PATH'`), which a command
/// may not start with (docs/commands.md#put-files-delivered-once).
pub const PUT_WORD: &str = "opmark-put";

/// The first word of a get's intent (`opmark-get -- 'PATH'`), which a command may not
/// start with either.
pub const GET_WORD: &str = "opmark-get";

/// What a claim does when it starts: run a command, or deliver a file whose content is
/// the stdin (docs/host-protocol.md#files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunKind {
    /// The command text, run by the login shell.
    #[default]
    Command,
    /// `opmark put`: the stdin written to the path the command text names, atomically
    /// and checked by digest, by the shim itself.
    Put,
    /// `opmark get`: the file the command text names sent as the output, its digest on
    /// stderr's first line.
    Get,
}

impl RunKind {
    /// The word on the wire and in the claim.
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Command => "command",
            RunKind::Put => "put",
            RunKind::Get => "get",
        }
    }
}

/// The repetition check a claim asks of the shim's fingerprint index: how far back to
/// look, what the client's policy does with a repetition, and the op ids the run declared
/// it repeats or amends (never counted against it).
#[derive(Debug, Clone, Copy)]
pub struct RepeatCheck<'a> {
    /// How far back (whole seconds on the host); zero looks nowhere (the claim is still
    /// indexed, for later claims that look).
    pub window: Duration,
    /// `allow` (index only), `warn` (a `W` frame, then the claim), `block` (refused).
    pub action: OnRepeat,
    /// `--repeats` / `--amends` op ids.
    pub declared: &'a [String],
}

impl RepeatCheck<'static> {
    /// Indexes the claim and looks for nothing (calls that are not a policy's run).
    pub const OFF: RepeatCheck<'static> = RepeatCheck {
        window: Duration::ZERO,
        action: OnRepeat::Allow,
        declared: &[],
    };
}

/// Where an `output` read starts in a stream's kept copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFrom {
    /// At this byte offset.
    Start(u64),
    /// This many bytes before the end of what is kept now.
    End(u64),
}

/// One call of the shim.
#[derive(Debug, Clone)]
pub enum Verb<'a> {
    /// Claim and run.
    Run(RunCall<'a>),
    /// Report the marker's state without changing it.
    Probe(&'a OpId),
    /// Stream a running (or finished) operation's output from byte offsets until it exits.
    Attach {
        /// The operation.
        op: &'a OpId,
        /// Stdout bytes the caller already has.
        out_offset: u64,
        /// Stderr bytes the caller already has.
        err_offset: u64,
    },
    /// Read a range of a stream's kept copy as it is now, without waiting for more.
    Output {
        /// The operation.
        op: &'a OpId,
        /// Which stream.
        stream: OutputStream,
        /// Where the range starts.
        from: OutputFrom,
        /// At most this many bytes.
        len: u64,
    },
    /// The earlier claim of an intent under another op id that a claim would meet in
    /// the host's fingerprint index, read only (a plan before acting).
    Repeats {
        /// The operation that would claim.
        op: &'a OpId,
        /// The plain intent fingerprint.
        fingerprint: &'a str,
        /// How far back a repetition counts (zero: nowhere).
        window: Duration,
        /// Op ids the run declares it repeats (`--repeats`, `--amends`).
        declared: &'a [String],
    },
    /// Tombstone the op id so it can never be claimed. `force` also fences an
    /// interrupted claim (an operator's not-applied decision).
    Fence {
        /// The operation.
        op: &'a OpId,
        /// Fence even an interrupted, started claim.
        force: bool,
    },
    /// Move an interrupted claim aside (kept for audit) so it can be claimed again.
    Supersede {
        /// The operation.
        op: &'a OpId,
        /// The attempt that will claim next.
        by_attempt: &'a str,
    },
    /// Collect completed or fenced markers older than `older_than` down to tombstones;
    /// remove tombstones older than `tombstones_older_than` (kept when `None`).
    Gc {
        /// Retention of the output.
        older_than: Duration,
        /// Report only.
        dry_run: bool,
        /// Retention of the tombstones: `None` keeps them all (docs/host-protocol.md#tombstones).
        tombstones_older_than: Option<Duration>,
    },
    /// Facts about the marker root for `opmark doctor`.
    Doctor,
    /// The host locks held and waited for (`opmark locks`), read only.
    Locks,
    /// Stop the operation for good (`opmark cancel`): TERM the running command's session,
    /// KILL after `grace`, wait for the exit record; fence an absent, unstarted or
    /// interrupted one.
    Cancel {
        /// The operation.
        op: &'a OpId,
        /// Time between TERM and KILL (sent in milliseconds; the shim waits in tenths).
        grace: Duration,
    },
}

/// The verbs and their positional parameters, in the order the shim's `verb_*` functions
/// take them: the one definition of the call's arguments. The shim has the same table in
/// its header (`#   verb: NAME PARAM...` in `remote-scripts/shim/00-header.sh`), and a
/// unit test holds the two, and the shim's argument count checks, equal.
pub const VERBS: &[(&str, &[&str])] = &[
    (
        "run",
        &[
            "OP",
            "ATTEMPT",
            "FP",
            "FAMILY",
            "TIMEOUT_S",
            "CAP_BYTES",
            "STDIN_BYTES",
            "STDIN_SHA256",
            "SUPERSEDE",
            "REPEAT_S",
            "REPEAT_ACTION",
            "DECLARED",
            "SECRETS",
            "BECOME",
            "LOCKS",
            "LOCK_WAIT_S",
            "KIND",
            "CMD_BYTES",
        ],
    ),
    ("probe", &["OP"]),
    ("attach", &["OP", "OUT_OFFSET", "ERR_OFFSET"]),
    ("output", &["OP", "STREAM", "FROM", "LEN"]),
    ("repeats", &["OP", "FP", "REPEAT_S", "DECLARED"]),
    ("fence", &["OP", "FORCE"]),
    ("supersede", &["OP", "BY_ATTEMPT"]),
    ("gc", &["AGE_S", "DRY_RUN", "TOMB_AGE_S"]),
    ("doctor", &[]),
    ("cancel", &["OP", "GRACE_MS"]),
    ("locks", &[]),
    // The resident host session: requests come on its stdin (see [`Request`]), never as
    // a `Verb` of their own.
    ("serve", &[]),
];

impl Verb<'_> {
    /// The verb's name, as the shim's dispatcher knows it.
    pub fn name(&self) -> &'static str {
        match self {
            Verb::Run(_) => "run",
            Verb::Probe(_) => "probe",
            Verb::Attach { .. } => "attach",
            Verb::Output { .. } => "output",
            Verb::Repeats { .. } => "repeats",
            Verb::Fence { .. } => "fence",
            Verb::Supersede { .. } => "supersede",
            Verb::Gc { .. } => "gc",
            Verb::Doctor => "doctor",
            Verb::Cancel { .. } => "cancel",
            Verb::Locks => "locks",
        }
    }

    /// Each parameter's value, by its name in [`VERBS`].
    fn values(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_owned();
        match self {
            Verb::Run(r) => vec![
                ("OP", r.op.to_string()),
                ("ATTEMPT", r.attempt_id.into()),
                ("FP", r.host_fingerprint.into()),
                ("FAMILY", r.family.as_str().into()),
                (
                    "TIMEOUT_S",
                    r.timeout.map_or(0, |t| t.as_secs().max(1)).to_string(),
                ),
                ("CAP_BYTES", r.output_cap.to_string()),
                (
                    "STDIN_BYTES",
                    r.stdin.as_ref().map_or("-".into(), |s| s.len.to_string()),
                ),
                (
                    "STDIN_SHA256",
                    r.stdin
                        .as_ref()
                        .map_or("-".into(), |s| s.sha256_hex.clone()),
                ),
                ("SUPERSEDE", flag(r.supersede_interrupted)),
                ("REPEAT_S", r.repeat.window.as_secs().to_string()),
                ("REPEAT_ACTION", r.repeat.action.as_str().into()),
                (
                    "DECLARED",
                    if r.repeat.declared.is_empty() {
                        "-".into()
                    } else {
                        r.repeat.declared.join(",")
                    },
                ),
                ("SECRETS", r.secrets.wire_list()),
                ("BECOME", r.become_user.unwrap_or("-").to_owned()),
                ("LOCKS", crate::host_lock::HostLock::wire_list(r.locks)),
                // Rounded up: a wait asked for is never cut short.
                (
                    "LOCK_WAIT_S",
                    (r.lock_wait.as_secs() + u64::from(r.lock_wait.subsec_nanos() > 0)).to_string(),
                ),
                (
                    "KIND",
                    match r.put_from {
                        0 => r.kind.as_str().into(),
                        from => format!("{}:{from}", r.kind.as_str()),
                    },
                ),
                ("CMD_BYTES", r.command.len().to_string()),
            ],
            Verb::Probe(op) => vec![("OP", op.to_string())],
            Verb::Attach {
                op,
                out_offset,
                err_offset,
            } => vec![
                ("OP", op.to_string()),
                ("OUT_OFFSET", out_offset.to_string()),
                ("ERR_OFFSET", err_offset.to_string()),
            ],
            Verb::Output {
                op,
                stream,
                from,
                len,
            } => vec![
                ("OP", op.to_string()),
                ("STREAM", stream.as_str().into()),
                (
                    "FROM",
                    match from {
                        OutputFrom::Start(at) => at.to_string(),
                        OutputFrom::End(n) => format!("-{n}"),
                    },
                ),
                ("LEN", len.to_string()),
            ],
            Verb::Repeats {
                op,
                fingerprint,
                window,
                declared,
            } => vec![
                ("OP", op.to_string()),
                ("FP", (*fingerprint).to_owned()),
                ("REPEAT_S", window.as_secs().to_string()),
                (
                    "DECLARED",
                    if declared.is_empty() {
                        "-".into()
                    } else {
                        declared.join(",")
                    },
                ),
            ],
            Verb::Fence { op, force } => vec![("OP", op.to_string()), ("FORCE", flag(*force))],
            Verb::Supersede { op, by_attempt } => {
                vec![("OP", op.to_string()), ("BY_ATTEMPT", (*by_attempt).into())]
            }
            Verb::Gc {
                older_than,
                dry_run,
                tombstones_older_than,
            } => vec![
                ("AGE_S", older_than.as_secs().to_string()),
                ("DRY_RUN", flag(*dry_run)),
                (
                    "TOMB_AGE_S",
                    tombstones_older_than.map_or("-".into(), |t| t.as_secs().to_string()),
                ),
            ],
            Verb::Doctor | Verb::Locks => Vec::new(),
            Verb::Cancel { op, grace } => vec![
                ("OP", op.to_string()),
                ("GRACE_MS", grace.as_millis().to_string()),
            ],
        }
    }

    /// The verb's name and arguments, in the order [`VERBS`] gives. Every one is made of
    /// `[A-Za-z0-9._:=-]` (ids, digests, numbers), so the stub's login shell, whatever it
    /// is, passes them through unchanged.
    pub fn args(&self) -> Vec<String> {
        let name = self.name();
        let params = VERBS
            .iter()
            .find(|(verb, _)| *verb == name)
            .map(|(_, params)| *params)
            .unwrap_or_default();
        let mut values = self.values();
        assert_eq!(
            values.len(),
            params.len(),
            "verb {name}: its values and the VERBS table disagree (opmark bug)"
        );
        let mut args = Vec::with_capacity(params.len() + 1);
        args.push(name.to_owned());
        for param in params {
            let at = values
                .iter()
                .position(|(p, _)| p == param)
                .unwrap_or_else(|| panic!("verb {name} gives no {param} (opmark bug)"));
            args.push(values.swap_remove(at).1);
        }
        args
    }
}

/// Quotes one word for a POSIX shell: single quotes, with `'` written as `'\''`.
/// The only quoting function in opmark.
pub fn quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

impl Verb<'_> {
    /// The verb's input, which the shim reads from the channel's data right after the
    /// script: the command for `run`, nothing otherwise.
    pub fn input(&self) -> &[u8] {
        match self {
            Verb::Run(r) => r.command.as_bytes(),
            _ => &[],
        }
    }

    /// The secrets block that precedes the input (`run` with secrets only): values, so
    /// never logged.
    fn secrets_block(&self) -> Vec<u8> {
        match self {
            Verb::Run(r) => r.secrets.wire_block(),
            _ => Vec::new(),
        }
    }
}

/// A command opmark refuses to send, with the limit it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvocationError {
    /// The command is longer than [`MAX_COMMAND_BYTES`].
    #[error("the command is {len} bytes; opmark sends at most {max} bytes ({mib} MiB) of command text. Put the script in a file and send it as input instead: `opmark run HOST --stdin -- sh -s < script.sh`", max = MAX_COMMAND_BYTES, mib = MAX_COMMAND_BYTES >> 20)]
    CommandTooLarge {
        /// The command's length in bytes.
        len: usize,
    },
    /// The command is empty (the shim would have nothing to run).
    #[error("the command is empty; give the command to run after `--`")]
    EmptyCommand,
    /// The command holds a NUL byte, which no shell command can (`sh -c` stops there).
    #[error("the command contains a NUL byte at byte {at}, which no shell command can hold; remove it, or send binary data as input with `--stdin`")]
    NulByte {
        /// Where the first NUL is, in bytes from the start.
        at: usize,
    },
}

/// Checks what cannot be sent, before anything is.
pub fn check_command(command: &str) -> Result<(), InvocationError> {
    if command.is_empty() {
        return Err(InvocationError::EmptyCommand);
    }
    if command.len() > MAX_COMMAND_BYTES {
        return Err(InvocationError::CommandTooLarge { len: command.len() });
    }
    if let Some(at) = command.bytes().position(|b| b == 0) {
        return Err(InvocationError::NulByte { at });
    }
    Ok(())
}

/// One call of the shim over SSH: what the exec request says, what the channel's data
/// carries, and the token the shim's header must echo.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The exec request: `exec sh -c '<stub>' opmark <script sha256> <script length or
    /// -> c=<token> VERB ARGS...`, well under 1 KiB whatever the command.
    pub exec: String,
    /// The channel's data, then EOF: `c=<token>` and a newline, the script (unless the
    /// call runs the cached one), the verb's input (the command), the stdin.
    pub data: Vec<u8>,
    /// 128 random bits in hex, fresh per call. Text the login shell printed before the
    /// shim (even a copy of an old header) never carries it.
    pub token: String,
}

impl Invocation {
    /// The invocation of `verb` carrying the script, with `stdin` (already spooled) after
    /// its input. The host keeps the script for later [`Invocation::cached`] calls.
    pub fn new(verb: &Verb, stdin: Option<&[u8]>) -> Invocation {
        Invocation::build(verb, stdin, true, None)
    }

    /// [`Invocation::new`] for an operation whose attempts reached the marker root
    /// `root` (docs/guarantees.md#evidence-identity): the shim refuses (`root_changed`) before acting when its root's
    /// id is another; `None` is [`Invocation::new`].
    pub fn new_expecting(verb: &Verb, stdin: Option<&[u8]>, root: Option<&str>) -> Invocation {
        Invocation::build(verb, stdin, true, root)
    }

    /// [`Invocation::cached`], expecting the marker root `root` (see
    /// [`Invocation::new_expecting`]).
    pub fn cached_expecting(verb: &Verb, stdin: Option<&[u8]>, root: Option<&str>) -> Invocation {
        Invocation::build(verb, stdin, false, root)
    }

    /// The invocation of `verb` that runs the host's cached script: the data carries only
    /// the token line, the verb's input and `stdin`. When the host lacks the script the
    /// reply is [`need_line`] and nothing ran; call again with [`Invocation::new`].
    pub fn cached(verb: &Verb, stdin: Option<&[u8]>) -> Invocation {
        Invocation::build(verb, stdin, false, None)
    }

    /// Whether a call that ended without the shim's header was the stub asking for the
    /// script (`stdout` is what the host printed before any header). The request may
    /// share its line with a startup file's banner printed without a newline
    /// (`printf Welcome`): it ends the line, and its token is this call's own.
    pub fn asked_for_script(&self, stdout: &[u8]) -> bool {
        let need = need_line(&self.token);
        stdout
            .split(|&b| b == b'\n')
            .any(|line| line.trim_ascii_end().ends_with(need.as_bytes()))
    }

    fn build(
        verb: &Verb,
        stdin: Option<&[u8]>,
        with_script: bool,
        root: Option<&str>,
    ) -> Invocation {
        let token = format!("{:032x}", rand::random::<u128>());
        let script: &[u8] = if with_script { SCRIPT.as_bytes() } else { b"" };
        let len = if with_script {
            SCRIPT.len().to_string()
        } else {
            "-".to_owned()
        };
        let mut exec = format!(
            "exec sh -c '{STUB}' opmark {} {len} c={token}",
            script_sha256()
        );
        // Between the token and the verb, as the shim reads it (hex only: anything else
        // is sent as `bad`, which no root's id is, so the shim refuses).
        if let Some(root) = root {
            exec.push_str(&format!(" r={}", root_word(root)));
        }
        for arg in verb.args() {
            exec.push(' ');
            exec.push_str(&quote(&arg));
        }
        let input = verb.input();
        let secrets = verb.secrets_block();
        let stdin = stdin.unwrap_or_default();
        let mut data = Vec::with_capacity(
            token.len() + 3 + script.len() + secrets.len() + input.len() + stdin.len(),
        );
        data.extend_from_slice(b"c=");
        data.extend_from_slice(token.as_bytes());
        data.push(b'\n');
        data.extend_from_slice(script);
        data.extend_from_slice(&secrets);
        data.extend_from_slice(input);
        data.extend_from_slice(stdin);
        Invocation { exec, data, token }
    }
}

impl Invocation {
    /// The exec request that starts a resident host session (the shim's `serve` verb,
    /// docs/host-protocol.md#the-resident-session): the stub as for any call, the data
    /// only the token line (and the script when `with_script`), and no EOF after it: the
    /// channel stays open for [`Request`]s.
    pub fn serve(with_script: bool) -> Invocation {
        let token = format!("{:032x}", rand::random::<u128>());
        let (len, script) = if with_script {
            (SCRIPT.len().to_string(), SCRIPT.as_bytes())
        } else {
            ("-".to_owned(), &b""[..])
        };
        let exec = format!(
            "exec sh -c '{STUB}' opmark {} {len} c={token} serve",
            script_sha256()
        );
        let mut data = Vec::with_capacity(token.len() + 3 + script.len());
        data.extend_from_slice(b"c=");
        data.extend_from_slice(token.as_bytes());
        data.push(b'\n');
        data.extend_from_slice(script);
        Invocation { exec, data, token }
    }
}

/// One request to a resident host session: the line `q c=<token> [r=<root>] VERB
/// ARGS...`, then the verb's input as a call of its own carries it, except that it is
/// read by count, never to EOF: for `run`, the secrets block, the command, one newline (the resident reads
/// it line-wise with the shell's builtin), then exactly `STDIN_BYTES` of stdin. The reply
/// is the verb's usual frames under this request's own token, then the end frame `Z`.
#[derive(Debug, Clone)]
pub struct Request {
    /// The line and the data, sent in one write.
    pub bytes: Vec<u8>,
    /// 128 random bits in hex, fresh per request (the reply's header echoes it).
    pub token: String,
}

impl Request {
    /// The request for `verb`, with `stdin` (already spooled) after its input, for an
    /// operation whose attempts reached marker root `root` when `Some` (the resident
    /// checks it before the verb acts, as a call of its own does).
    pub fn new(verb: &Verb, stdin: Option<&[u8]>, root: Option<&str>) -> Request {
        let token = format!("{:032x}", rand::random::<u128>());
        let mut line = format!("q c={token}");
        if let Some(root) = root {
            line.push_str(&format!(" r={}", root_word(root)));
        }
        for arg in verb.args() {
            line.push(' ');
            line.push_str(&arg);
        }
        line.push('\n');
        let input = verb.input();
        let stdin = stdin.unwrap_or_default();
        let mut bytes = Vec::with_capacity(line.len() + input.len() + 1 + stdin.len());
        bytes.extend_from_slice(line.as_bytes());
        if let Verb::Run(_) = verb {
            bytes.extend_from_slice(&verb.secrets_block());
            bytes.extend_from_slice(input);
            bytes.push(b'\n');
            bytes.extend_from_slice(stdin);
        }
        Request { bytes, token }
    }
}

/// A marker root id as the shim reads it: hex only, anything else `bad` (which no root's
/// id is, so the shim refuses).
fn root_word(root: &str) -> String {
    if !root.is_empty() && root.chars().all(|c| c.is_ascii_hexdigit()) {
        root.to_ascii_lowercase()
    } else {
        "bad".to_owned()
    }
}

/// The same call run locally by `shell`, for the tests (feature `test-hooks`):
/// `shell -c SCRIPT opmark-shim SCRIPT VERB ARGS...`, with [`local_data`] on its stdin.
#[cfg(any(test, feature = "test-hooks"))]
pub fn local_args(verb: &Verb) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "-c".into(),
        SCRIPT.into(),
        "opmark-shim".into(),
        SCRIPT.into(),
    ];
    args.extend(verb.args().into_iter().map(std::ffi::OsString::from));
    args
}

/// What a local call's stdin must carry: the verb's input, then the stdin.
#[cfg(any(test, feature = "test-hooks"))]
pub fn local_data(verb: &Verb, stdin: &[u8]) -> Vec<u8> {
    let mut data = verb.secrets_block();
    data.extend_from_slice(verb.input());
    data.extend_from_slice(stdin);
    data
}

/// A `std::process::Command` running the shim locally under `shell`, with the
/// supervisor and the command run by the same shell (`OPMARK_SH`). Feed it
/// [`local_data`] on stdin.
#[cfg(any(test, feature = "test-hooks"))]
pub fn local_command(shell: &std::path::Path, verb: &Verb) -> std::process::Command {
    let mut cmd = std::process::Command::new(shell);
    cmd.args(local_args(verb)).env("OPMARK_SH", shell);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_survives_every_awkward_character() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
        // Round trip through a real shell.
        let nasty = "a'b\"c$d`e\\f\ng h;i|j&k*";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote(nasty)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), nasty);
    }

    #[test]
    fn run_args_carry_every_field_in_order() {
        let op = OpId::parse("deploy-1").unwrap();
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &"ab".repeat(32),
            family: Family::Convergent,
            timeout: Some(Duration::from_millis(1500)),
            output_cap: 1024,
            stdin: Some(StdinSpec {
                len: 3,
                sha256_hex: "cd".repeat(32),
            }),
            supersede_interrupted: true,
            repeat: RepeatCheck::OFF,
            command: "echo 'hi'",
            secrets: crate::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: Duration::ZERO,
            kind: RunKind::Command,
            put_from: 0,
        });
        let args = verb.args();
        assert_eq!(args[0], "run");
        assert_eq!(args[4], "convergent");
        assert_eq!(args[5], "1");
        assert_eq!(args[7], "3");
        assert_eq!(args[9], "1");
        assert_eq!(args[10], "0", "no repetition window");
        assert_eq!(args[11], "allow");
        assert_eq!(args[12], "-", "nothing declared");
        assert_eq!(args[13], "-", "no secrets");
        assert_eq!(args[14], "-", "no --become");
        assert_eq!(args[15], "-", "no --lock");
        assert_eq!(args[16], "0", "no --lock-wait");
        assert_eq!(args[17], "command", "a command, not a put");
        assert_eq!(args[18], "9", "the command's length; the command is data");
        assert_eq!(args.len(), 19);
        assert_eq!(verb.input(), b"echo 'hi'");
    }

    #[test]
    fn run_args_carry_the_locks_in_name_order_and_the_wait_rounded_up() {
        let op = OpId::parse("deploy-3").unwrap();
        let asked: Vec<crate::host_lock::HostLock> = ["dpkg", "apt:2"]
            .iter()
            .map(|l| crate::host_lock::HostLock::parse(l).unwrap())
            .collect();
        let locks = crate::host_lock::HostLock::set(&asked).unwrap();
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &"ab".repeat(32),
            family: Family::Destructive,
            timeout: None,
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: RepeatCheck::OFF,
            command: "apt-get -y upgrade",
            secrets: crate::secret::Secrets::none(),
            become_user: None,
            locks: &locks,
            lock_wait: Duration::from_millis(2500),
            kind: RunKind::Command,
            put_from: 0,
        });
        let args = verb.args();
        assert_eq!(args[15], "apt:2,dpkg:1");
        assert_eq!(args[16], "3", "a wait asked for is never cut short");
    }

    #[test]
    fn run_args_carry_the_repetition_check() {
        let op = OpId::parse("deploy-2").unwrap();
        let declared = ["deploy-1".to_owned(), "fix-0".to_owned()];
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &"ab".repeat(32),
            family: Family::Destructive,
            timeout: None,
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: RepeatCheck {
                window: Duration::from_secs(86_400),
                action: OnRepeat::Block,
                declared: &declared,
            },
            command: "rm -f x",
            secrets: crate::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: Duration::ZERO,
            kind: RunKind::Command,
            put_from: 0,
        });
        let args = verb.args();
        assert_eq!(args[10..13], ["86400", "block", "deploy-1,fix-0"]);
    }

    #[test]
    fn the_exec_request_is_one_plain_line_whatever_the_command() {
        let op = OpId::parse("deploy:1.a-b").unwrap();
        let command = format!("echo '{}' !x \\ \n", "y".repeat(1 << 20));
        let fp = "ab".repeat(32);
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "at-0123456789abcdef",
            host_fingerprint: &fp,
            family: Family::AppendOnly,
            timeout: Some(Duration::from_secs(5)),
            output_cap: DEFAULT_OUTPUT_CAP,
            stdin: Some(StdinSpec {
                len: 2,
                sha256_hex: "cd".repeat(32),
            }),
            supersede_interrupted: false,
            repeat: RepeatCheck::OFF,
            command: &command,
            secrets: crate::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: Duration::ZERO,
            kind: RunKind::Command,
            put_from: 0,
        });
        let call = Invocation::new(&verb, Some(b"in"));
        let cached = Invocation::cached(&verb, Some(b"in"));
        for exec in [&call.exec, &cached.exec] {
            assert!(exec.len() < 1024, "{exec}");
            // What fish and tcsh need to take single quotes literally: no newline, no
            // backslash, no history `!`, and quotes only as delimiters.
            assert!(!exec.contains(['\n', '\\', '!']), "{exec}");
        }
        let cached_head = format!("c={}\n", cached.token);
        assert_eq!(
            cached.data,
            [cached_head.as_bytes(), command.as_bytes(), b"in"].concat(),
            "a cached call sends no script"
        );
        assert!(!STUB.contains('\''));
        for arg in verb.args() {
            assert!(
                arg.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._:=-".contains(c)),
                "{arg}"
            );
        }
        let head = format!("c={}\n", call.token);
        assert!(call.data.starts_with(head.as_bytes()));
        let rest = &call.data[head.len()..];
        assert!(rest.starts_with(SCRIPT.as_bytes()));
        assert!(rest[SCRIPT.len()..].starts_with(command.as_bytes()));
        assert!(rest.ends_with(b"in"));
        assert_eq!(call.token.len(), 32);
        assert_ne!(call.token, Invocation::new(&verb, None).token);
    }

    #[test]
    fn the_verb_table_is_the_shims_and_its_version_is_the_clients() {
        let shim_table: Vec<Vec<&str>> = SCRIPT
            .lines()
            .filter_map(|l| l.strip_prefix("#   verb: "))
            .map(|l| l.split(' ').collect())
            .collect();
        let ours: Vec<Vec<&str>> = VERBS
            .iter()
            .map(|(name, params)| {
                std::iter::once(*name)
                    .chain(params.iter().copied())
                    .collect()
            })
            .collect();
        assert_eq!(shim_table, ours, "shim.sh's verb table and VERBS differ");
        for (name, params) in VERBS {
            // Each verb's function checks its argument count against the table.
            let body = SCRIPT
                .split_once(&format!("\nverb_{name}() {{\n"))
                .unwrap_or_else(|| panic!("shim.sh has no verb_{name}"))
                .1;
            let first = body.lines().next().unwrap_or_default();
            if params.is_empty() {
                assert!(!first.contains("\"$#\""), "{name}: {first}");
            } else {
                let check = format!("[ \"$#\" -eq {} ]", params.len());
                assert!(
                    first.contains(&check),
                    "verb_{name} checks `{first}`, not {check}"
                );
            }
            // And the dispatcher knows it.
            assert!(
                SCRIPT.contains(&format!("\n{name}) verb_{name} \"$@\" ;;"))
                    || SCRIPT.contains(&format!("\t{name}) verb_{name} \"$@\" ;;")),
                "{name}"
            );
        }
        assert!(
            SCRIPT.contains(&format!("\nOPMARK_SHIM_VERSION={PROTOCOL_VERSION}\n")),
            "the shim's hello must carry the client's protocol version"
        );
        // Every variant's arguments come out in the table's order and number.
        let op = OpId::parse("o").unwrap();
        let verbs = [
            Verb::Probe(&op),
            Verb::Attach {
                op: &op,
                out_offset: 1,
                err_offset: 2,
            },
            Verb::Fence {
                op: &op,
                force: true,
            },
            Verb::Supersede {
                op: &op,
                by_attempt: "a",
            },
            Verb::Gc {
                older_than: Duration::from_secs(60),
                dry_run: false,
                tombstones_older_than: None,
            },
            Verb::Doctor,
            Verb::Cancel {
                op: &op,
                grace: Duration::from_millis(1500),
            },
        ];
        for verb in &verbs {
            let args = verb.args();
            let params = VERBS.iter().find(|(n, _)| *n == args[0]).unwrap().1;
            assert_eq!(args.len(), params.len() + 1, "{args:?}");
        }
        assert_eq!(verbs[1].args(), ["attach", "o", "1", "2"]);
        assert_eq!(verbs[6].args(), ["cancel", "o", "1500"]);
        assert_eq!(verbs[4].args(), ["gc", "60", "0", "-"]);
    }

    #[test]
    fn a_call_for_an_operation_with_attempts_names_its_marker_root_before_the_verb() {
        let op = OpId::parse("o").unwrap();
        let root = "0123456789abcdef0123456789ABCDEF";
        let verb = Verb::Probe(&op);
        for call in [
            Invocation::cached_expecting(&verb, None, Some(root)),
            Invocation::new_expecting(&verb, None, Some(root)),
        ] {
            assert!(
                call.exec.ends_with(&format!(
                    " c={} r=0123456789abcdef0123456789abcdef 'probe' 'o'",
                    call.token
                )),
                "{}",
                call.exec
            );
        }
        // Anything but hex is sent as a word no root's id is: the shim refuses.
        let odd = Invocation::cached_expecting(&verb, None, Some("x y"));
        assert!(odd.exec.contains(" r=bad 'probe'"), "{}", odd.exec);
        assert!(!Invocation::cached(&verb, None).exec.contains(" r="));
        // The shim reads it between c=/h= and the verb, and checks it in setup_root.
        assert!(SCRIPT.contains("\nr=*)\n\texpect_root=${1#r=}\n"));
        assert!(SCRIPT.contains(
            "refuse \"root_changed expected=$expect_root found=${rid:-none} root=$root\""
        ));
    }

    #[test]
    fn the_cached_copy_is_the_script_byte_for_byte_as_the_shim_writes_it() {
        // The shim receives its text through `$(...)`, which drops trailing newlines, and
        // writes it back with one: the hash names that file only if the script ends so.
        assert!(SCRIPT.ends_with('\n') && !SCRIPT.ends_with("\n\n"));
        assert_eq!(script_sha256().len(), 64);
        let call = Invocation::cached(&Verb::Doctor, None);
        let need = format!("noise\n{}\n", need_line(&call.token));
        assert!(call.asked_for_script(need.as_bytes()));
        let after_banner = format!("Welcome{}\n", need_line(&call.token));
        assert!(call.asked_for_script(after_banner.as_bytes()));
        let other = Invocation::cached(&Verb::Doctor, None);
        assert!(!call.asked_for_script(need_line(&other.token).as_bytes()));
    }

    #[test]
    fn commands_beyond_the_limit_or_empty_are_refused_before_sending() {
        assert_eq!(check_command(""), Err(InvocationError::EmptyCommand));
        assert!(check_command(&"x".repeat(MAX_COMMAND_BYTES)).is_ok());
        let too_big = check_command(&"x".repeat(MAX_COMMAND_BYTES + 1)).unwrap_err();
        let message = too_big.to_string();
        assert!(
            message.contains("16 MiB") && message.contains("--stdin"),
            "{message}"
        );
        let nul = check_command("printf 'a\0b'").unwrap_err();
        assert_eq!(nul, InvocationError::NulByte { at: 9 });
        assert!(nul.to_string().contains("NUL byte at byte 9"), "{nul}");
    }
}
