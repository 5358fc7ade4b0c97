//! Host resolution: from what the user typed (`[user@]host`, `ssh://[user@]host[:port]`,
//! `-l`, `-p`, `-i`, `-J`, `-o`, `-F`) and the ssh configs (the user's, then the
//! system's) to a fully resolved [`Destination`], the way OpenSSH 9.2 resolves it
//! (`ssh -G` is the reference; `tests/it/ssh_config.rs` compares the two); and back: the
//! [`Route`] an operation took, recorded in the ledger (docs/guarantees.md#host-identity), and
//! [`resolve_route`], which reaches a host again the same way.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::algorithms::{AlgorithmList, Algorithms};
use super::config::{
    expand_path, expand_percent, expand_tilde, home_dir, parse_command_line_option, ConfigError,
    ConfigKind, ConfigOptions, MatchContext, OptionLine, Origin, SshConfig, Tokens,
};
use super::error::{ConnectError, ConnectStage};

/// What the user asked to connect to, before reading the ssh config.
#[derive(Debug, Clone, Default)]
pub struct HostSpec {
    /// An alias from the ssh config, `[user@]host` or `ssh://[user@]host[:port]`.
    pub host: String,
    /// `-p`: overrides the config's `Port`.
    pub port: Option<u16>,
    /// `-i`: tried before the config's `IdentityFile`s.
    pub identities: Vec<PathBuf>,
    /// `-J`: overrides the config's `ProxyJump` (comma-separated hops, or `none`).
    pub jump: Option<String>,
    /// `-F`: the ssh config (default `~/.ssh/config`, which may be absent). With `-F`
    /// the system config is not read, as with ssh; `-F none` reads no file at all.
    pub config_path: Option<PathBuf>,
    /// `-l`: the remote user; wins over `user@` and the config.
    pub user: Option<String>,
    /// `-o Key=Value` options, in order; they win over the config files.
    pub options: Vec<String>,
    /// Where `-l`, `-p`, `-J` and the destination stood among the `-o` options, so that
    /// the first value given wins as in ssh (`-o User=a -l b` is `a`; `-l b -o User=a`
    /// is `b`; `x@h -l b` is `x`).
    pub flag_positions: FlagPositions,
}

/// Where each of `-l`, `-p`, `-J` and the destination stood on the command line. ssh
/// sets each of its options once, from the first value it meets in its arguments (a
/// flag, an `-o`, the destination's `user@` or `:port`), so the order decides which
/// wins. The default, for a caller without a command line (the MCP server, a recorded
/// route), puts the flags before every `-o` and the destination after them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagPositions {
    /// `-l`.
    pub user: ArgPlace,
    /// `-p`.
    pub port: ArgPlace,
    /// `-J`.
    pub jump: ArgPlace,
    /// The host argument (its `user@` and an `ssh://` URI's `:port`).
    pub destination: ArgPlace,
}

impl FlagPositions {
    /// The same places with `n` more options put before all the others (`-4`, `-6`).
    pub fn behind(self, n: usize) -> FlagPositions {
        let behind = |place: ArgPlace| ArgPlace {
            after_options: place.after_options.saturating_add(n),
            ..place
        };
        FlagPositions {
            user: behind(self.user),
            port: behind(self.port),
            jump: behind(self.jump),
            destination: behind(self.destination),
        }
    }
}

impl Default for FlagPositions {
    fn default() -> Self {
        FlagPositions {
            user: ArgPlace::default(),
            port: ArgPlace::default(),
            jump: ArgPlace::default(),
            destination: ArgPlace::LAST,
        }
    }
}

/// One value's place on the command line: how many of [`HostSpec::options`] came
/// before it, then its order among the values standing between the same two options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ArgPlace {
    /// How many `-o` options came before it.
    pub after_options: usize,
    /// Orders it among the values after as many options (clap's argument index).
    pub index: usize,
}

impl ArgPlace {
    /// After every `-o` option and every flag.
    pub const LAST: ArgPlace = ArgPlace {
        after_options: usize::MAX,
        index: usize::MAX,
    };
}

/// The system-wide ssh config read after the user's, unless `-F` is given.
pub const SYSTEM_SSH_CONFIG: &str = "/etc/ssh/ssh_config";
/// Testing aid: read this file instead of [`SYSTEM_SSH_CONFIG`] (relative `Include`s in
/// it resolve in its directory), so tests never touch the real `/etc`.
pub const SYSTEM_SSH_CONFIG_ENV: &str = "OPMARK_SYSTEM_SSH_CONFIG";

/// How unknown host keys are treated (`StrictHostKeyChecking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StrictMode {
    /// Refuse unknown keys (the default).
    Yes,
    /// Ask the person at the terminal about an unknown key and learn it on `yes`; where
    /// nobody can answer (no terminal, BatchMode, `opmark mcp`) it is `Yes`.
    Ask,
    /// Learn an unknown key by appending it; refuse a changed key.
    AcceptNew,
    /// Accept unknown keys without learning them; still refuse a changed key. Only when
    /// the config says `no` explicitly.
    No,
}

impl StrictMode {
    /// The value as `ssh -G` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            StrictMode::Yes => "true",
            StrictMode::Ask => "ask",
            StrictMode::AcceptNew => "accept-new",
            StrictMode::No => "false",
        }
    }
}

/// Which address families a connection may use (`AddressFamily`, `-4`, `-6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AddressFamily {
    /// IPv4 or IPv6.
    #[default]
    Any,
    /// IPv4 only.
    Inet,
    /// IPv6 only.
    Inet6,
}

impl AddressFamily {
    /// True when `addr` may be used.
    pub fn allows(self, addr: &std::net::SocketAddr) -> bool {
        match self {
            AddressFamily::Any => true,
            AddressFamily::Inet => addr.is_ipv4(),
            AddressFamily::Inet6 => addr.is_ipv6(),
        }
    }

    /// The value as `ssh -G` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressFamily::Any => "any",
            AddressFamily::Inet => "inet",
            AddressFamily::Inet6 => "inet6",
        }
    }
}

/// Default `ConnectTimeout` when the config gives none (ssh has none: the kernel's TCP
/// timeout, minutes; an agent needs a bound).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default keepalive interval: with [`DEFAULT_KEEPALIVE_MAX`], a silently dead link is
/// noticed after 2 s × (3 + 1) = 8 s.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// Default number of unanswered keepalives tolerated.
pub const DEFAULT_KEEPALIVE_MAX: usize = 3;
/// OpenSSH 9.2's default identity files, in its order.
pub const DEFAULT_IDENTITY_FILES: [&str; 7] = [
    "id_rsa",
    "id_ecdsa",
    "id_ecdsa_sk",
    "id_ed25519",
    "id_ed25519_sk",
    "id_xmss",
    "id_dsa",
];

/// A resolved destination: everything needed to connect, with no further config lookup.
/// Serializable so that a calling process can hand it to the connection keeper
/// (`ssh::keeper`), which connects with exactly the caller's resolved settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destination {
    /// The host as the user typed it (alias, without `user@` or `ssh://`).
    pub alias: String,
    /// The name or address to connect to (`HostName`, or the alias), lower-cased.
    pub hostname: String,
    /// TCP port.
    pub port: u16,
    /// Remote user.
    pub user: String,
    /// Identity files to try, in order (`-i` first, then `IdentityFile`, else defaults).
    pub identities: Vec<PathBuf>,
    /// Whether identities were given explicitly (missing explicit files are reported).
    pub identities_explicit: bool,
    /// `IdentitiesOnly`: use only agent keys matching an identity file.
    pub identities_only: bool,
    /// The agent socket (`IdentityAgent`, else `$SSH_AUTH_SOCK`); `None` disables it.
    pub agent_socket: Option<PathBuf>,
    /// known_hosts files to read; the first is where `accept-new` learns.
    pub known_hosts: Vec<PathBuf>,
    /// Global known_hosts files, read only.
    pub global_known_hosts: Vec<PathBuf>,
    /// The name used in known_hosts (`HostKeyAlias` or the host name).
    pub host_key_alias: Option<String>,
    /// Hash names learned by `accept-new` (`HashKnownHosts`).
    pub hash_known_hosts: bool,
    /// `StrictHostKeyChecking`.
    pub strict: StrictMode,
    /// Bound on the whole connect (name lookup, TCP, banner, key exchange) of one
    /// connection attempt, and on each authentication round trip.
    pub connect_timeout: Duration,
    /// Keepalive interval; `None` when the config sets `ServerAliveInterval 0`.
    pub keepalive_interval: Option<Duration>,
    /// Unanswered keepalives tolerated before the connection is declared lost.
    pub keepalive_max: usize,
    /// Jump hosts, first hop first; each hop has no jumps of its own (flattened).
    pub jumps: Vec<Destination>,
    /// The jump text as given (`-J`, else `ProxyJump`), to reach the same hops again.
    pub jump_spec: Option<String>,
    /// The ssh config read (`-F`); `None` for the default `~/.ssh/config`.
    pub config_path: Option<PathBuf>,
    /// `display()` text, fixed at resolution.
    display: String,
    /// `CertificateFile`s, expanded, in order.
    pub certificate_files: Vec<PathBuf>,
    /// `AddressFamily` (or `-4`/`-6`).
    pub address_family: AddressFamily,
    /// `ConnectionAttempts`: TCP connects tried (1 s apart), as ssh.
    pub connection_attempts: u32,
    /// `BatchMode`: never prompt.
    pub batch_mode: bool,
    /// `ProxyJump` as written (after `-J`), for display; `None` when unset or `none`.
    pub proxy_jump: Option<String>,
    /// `ProxyCommand` with its `%` tokens expanded; `None` when unset or `none`.
    pub proxy_command: Option<ProxyCommand>,
    /// Options where opmark applies its own default because nothing set them and ssh's
    /// default differs (`connecttimeout`, `serveraliveinterval`, `stricthostkeychecking`).
    /// Not sent to the keeper: it only explains, it changes no connection.
    #[serde(skip)]
    pub opmark_defaults: Vec<&'static str>,
    /// `KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers`, `MACs` as the config chose them
    /// (`None` each: opmark's defaults), for russh's preferred lists.
    #[serde(default)]
    pub algorithms: Algorithms,
}

/// How an operation reached its host, as the ledger records it (docs/guarantees.md#host-identity): enough
/// to reach the same machine again without the flags or the config it was reached with
/// today, and nothing secret (paths, never key material).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The alias as typed (without `user@`).
    pub alias: String,
    /// The resolved name or address connected to.
    pub hostname: String,
    /// TCP port.
    pub port: u16,
    /// Remote user.
    pub user: String,
    /// Identity files given explicitly (`-i`, `IdentityFile`); empty for the defaults.
    pub identities: Vec<PathBuf>,
    /// The jump text as given (`-J` or `ProxyJump`), if any.
    pub jump: Option<String>,
    /// The resolved jump hops, `user@host:port`, first hop first (for people).
    pub jumps: Vec<String>,
    /// The ssh config read; `None` for the default `~/.ssh/config`.
    pub config: Option<PathBuf>,
}

impl Route {
    /// One line for people: `user@hostname:port via hop,hop (identity a, b; config F)`.
    pub fn describe(&self) -> String {
        let mut s = format!("{}@{}:{}", self.user, self.hostname, self.port);
        if !self.jumps.is_empty() {
            s.push_str(&format!(" via {}", self.jumps.join(",")));
        }
        let ids: Vec<String> = self
            .identities
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        s.push_str(&format!(
            " (identity {}; config {})",
            if ids.is_empty() {
                "defaults".to_owned()
            } else {
                ids.join(", ")
            },
            self.config
                .as_ref()
                .map_or_else(|| "~/.ssh/config".to_owned(), |c| c.display().to_string())
        ));
        s
    }
}

impl Destination {
    /// The host as the ledger names it: what the user typed, plus `:port` when `-p` was
    /// given (e.g. `target1`, `user@host:2222`); an `ssh://` URI is written that way too.
    pub fn display(&self) -> String {
        self.display.clone()
    }

    /// The time after which a silently dead link is reported, or `None` without keepalives.
    pub fn loss_budget(&self) -> Option<Duration> {
        self.keepalive_interval
            .map(|i| i * (self.keepalive_max as u32 + 1))
    }

    /// The name looked up in known_hosts: `HostKeyAlias` as is (OpenSSH never adds a
    /// port to an alias), else `host` or `[host]:port`.
    pub fn known_hosts_name(&self) -> String {
        match &self.host_key_alias {
            Some(alias) => alias.to_ascii_lowercase(),
            None => super::known_hosts::lookup_name(&self.hostname, self.port),
        }
    }

    /// How this destination is reached, for the ledger.
    pub fn route(&self) -> Route {
        Route {
            alias: self.alias.clone(),
            hostname: self.hostname.clone(),
            port: self.port,
            user: self.user.clone(),
            identities: if self.identities_explicit {
                self.identities.clone()
            } else {
                Vec::new()
            },
            jump: self.jump_spec.clone(),
            jumps: self
                .jumps
                .iter()
                .map(|j| format!("{}@{}:{}", j.user, j.hostname, j.port))
                .collect(),
            config: self.config_path.clone(),
        }
    }

    /// The key identifying one SSH connection: user, address, port and jump path.
    pub fn connection_key(&self) -> String {
        let mut key = format!("{}@{}:{}", self.user, self.hostname, self.port);
        if let Some(p) = &self.proxy_command {
            key.push_str(&format!(" proxy {}", p.command));
        }
        for j in &self.jumps {
            key.push_str(&format!(" via {}@{}:{}", j.user, j.hostname, j.port));
        }
        // A connection negotiated under other algorithm choices is not this one.
        if !self.algorithms.is_default() {
            key.push_str(&format!(" algorithms {:?}", self.algorithms));
        }
        key
    }
}

/// A `ProxyCommand` ready to run: `sh -c` with its stdin/stdout as the SSH transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyCommand {
    /// The command line with `%h %n %p %r %%` expanded.
    pub command: String,
    /// As written in the config (what `ssh -G` prints).
    pub raw: String,
    /// `file:line` of the config line, for errors.
    pub origin: String,
}

/// Maximum ProxyJump recursion (a hop whose own config names further hops).
const MAX_JUMP_DEPTH: usize = 8;

/// The configs to read for `spec`, in order: `-F FILE` alone (as ssh: no system
/// config then), else `~/.ssh/config` then the system config.
pub fn load_configs(spec: &HostSpec) -> Result<SshConfig, ConnectError> {
    let config_err = |e: ConfigError| ConnectError::new(ConnectStage::Config, e.to_string());
    let mut config = SshConfig::default();
    match &spec.config_path {
        Some(p) if p.as_os_str().eq_ignore_ascii_case("none") => {}
        Some(p) => config
            .load_into(p, ConfigKind::User, false)
            .map_err(config_err)?,
        None => {
            if let Some(home) = home_dir() {
                config
                    .load_into(&home.join(".ssh/config"), ConfigKind::User, true)
                    .map_err(config_err)?;
            }
            let system = std::env::var_os(SYSTEM_SSH_CONFIG_ENV)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(SYSTEM_SSH_CONFIG));
            config
                .load_into(&system, ConfigKind::System, true)
                .map_err(config_err)?;
        }
    }
    Ok(config)
}

/// Characters OpenSSH refuses in a host or user name typed on the command line (they
/// can only be a mistake or an injection into `%h`/`%r` of a ProxyCommand or Match exec).
const FORBIDDEN_IN_DESTINATION: &str = "'`\"$\\;&<>|(){}";

/// `c` as an error message shows it: in backticks, or named when it is the backtick.
fn quoted_char(c: char) -> String {
    if c == '`' {
        "a backtick (`)".to_owned()
    } else {
        format!("`{c}`")
    }
}

/// Checks what the user typed as a destination (`alias`, `[user@]host`,
/// `ssh://[user@]host[:port]`) before anything uses it: no spaces, control characters or
/// shell metacharacters, no leading `-`. The error says what is wrong and the fix.
pub fn check_destination(typed: &str) -> Result<(), String> {
    let shown = typed.escape_debug().to_string();
    let problem = if typed.trim().is_empty() {
        Some("it is empty".to_owned())
    } else if typed.starts_with('-') {
        Some("it starts with `-` (it would read as an option)".to_owned())
    } else if typed.chars().any(char::is_whitespace) {
        Some("it contains a space or another blank".to_owned())
    } else if typed.chars().any(char::is_control) {
        Some("it contains a control character".to_owned())
    } else {
        typed
            .chars()
            .find(|c| FORBIDDEN_IN_DESTINATION.contains(*c))
            .map(|c| format!("it contains {}", quoted_char(c)))
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(format!(
            "invalid host \"{shown}\": {problem}; give an ssh_config alias, a host name or an address, \
             as [user@]host or ssh://[user@]host[:port] (no blanks, control characters or any of \
             {FORBIDDEN_IN_DESTINATION}); nothing was sent"
        )),
    }
}

/// Characters OpenSSH's `ssh_valid_ruser` refuses anywhere in a user name.
const FORBIDDEN_IN_USER: &str = "'`\";&<>|(){}";
/// Characters OpenSSH's `ssh_valid_hostname` refuses anywhere in a host name.
const FORBIDDEN_IN_HOST: &str = "'`\"$\\;&<>|(){},";

/// OpenSSH's `ssh_valid_ruser` (readconf.c, the CVE-2023-51385 fix as this machine's
/// ssh 9.2p1 Debian applies it): no leading `-`, no control character, none of
/// [`FORBIDDEN_IN_USER`], no blank followed by `-`, no `\` at the end. `None` when valid,
/// else what is wrong.
pub fn user_problem(user: &str) -> Option<String> {
    if user.is_empty() {
        return Some("it is empty".into());
    }
    if user.starts_with('-') {
        return Some("it starts with `-`".into());
    }
    let chars: Vec<char> = user.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_control() {
            return Some(format!("it contains the control character {:?}", c));
        }
        if FORBIDDEN_IN_USER.contains(c) {
            return Some(format!("it contains {}", quoted_char(c)));
        }
        if c.is_whitespace() && chars.get(i + 1) == Some(&'-') {
            return Some("it contains a blank followed by `-`".into());
        }
    }
    if user.ends_with('\\') {
        return Some("it ends in `\\`".into());
    }
    None
}

/// OpenSSH's `ssh_valid_hostname`: no leading `-`, no blank or control character, none
/// of [`FORBIDDEN_IN_HOST`]. `None` when valid, else what is wrong.
pub fn host_problem(host: &str) -> Option<String> {
    if host.is_empty() {
        return Some("it is empty".into());
    }
    if host.starts_with('-') {
        return Some("it starts with `-`".into());
    }
    host.chars().find_map(|c| {
        if c.is_whitespace() {
            Some("it contains a blank".to_owned())
        } else if c.is_control() {
            Some(format!("it contains the control character {:?}", c))
        } else if FORBIDDEN_IN_HOST.contains(c) {
            Some(format!("it contains {}", quoted_char(c)))
        } else {
            None
        }
    })
}

/// Refuses a remote user name that fails [`user_problem`], naming where it came from
/// and the rule. Stage `Config`: refused before any ledger record, nothing run.
fn check_user(user: &str, origin: &str) -> Result<(), ConnectError> {
    match user_problem(user) {
        None => Ok(()),
        Some(problem) => Err(ConnectError::new(
            ConnectStage::Config,
            format!(
                "{origin}: remote user name \"{}\" contains invalid characters: {problem}. \
                 As ssh does (\"remote username contains invalid characters\"), a user name \
                 from the command line, a jump or a %-token may not start with `-`, end in \
                 `\\`, hold a control character, a blank followed by `-`, or any of \
                 {FORBIDDEN_IN_USER}; nothing was run or sent",
                user.escape_debug()
            ),
        )),
    }
}

/// Refuses a host name that fails [`host_problem`], naming where it came from and the
/// rule. Stage `Config`, as [`check_user`].
fn check_host(host: &str, origin: &str) -> Result<(), ConnectError> {
    match host_problem(host) {
        None => Ok(()),
        Some(problem) => Err(ConnectError::new(
            ConnectStage::Config,
            format!(
                "{origin}: host name \"{}\" contains invalid characters: {problem}. \
                 As ssh does (\"hostname contains invalid characters\"), a host name from \
                 the command line, a jump or a %-token may not start with `-` or hold a \
                 blank, a control character or any of {FORBIDDEN_IN_HOST}; nothing was run \
                 or sent",
                host.escape_debug()
            ),
        )),
    }
}

/// A port as ssh's `a2port` reads it: a number from 1 to 65535, or a TCP service name
/// from `/etc/services` (`ssh` is 22).
pub fn parse_port(s: &str) -> Option<u16> {
    if let Ok(n) = s.parse::<u16>() {
        return (n > 0).then_some(n);
    }
    if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c == '#') {
        return None;
    }
    let services = std::fs::read_to_string("/etc/services").ok()?;
    services.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let name = words.next()?;
        let (port, proto) = words.next()?.split_once('/')?;
        (proto == "tcp" && (name == s || words.any(|alias| alias == s)))
            .then(|| port.parse::<u16>().ok().filter(|p| *p > 0))
            .flatten()
    })
}

/// Resolves `spec` through the ssh configs. Errors have stage `Config` (a malformed or
/// unsupported config or option) or `Resolve`; either way nothing was sent.
pub fn resolve(spec: &HostSpec) -> Result<Destination, ConnectError> {
    check_destination(&spec.host).map_err(|m| ConnectError::new(ConnectStage::Resolve, m))?;
    let config = load_configs(spec)?;
    let mut dest = resolve_with(&config, spec, 0)?;
    dest.config_path = spec.config_path.clone();
    Ok(dest)
}

/// Reaches a host the way a recorded [`Route`] did: the same config, user, port,
/// identities and jumps, and the recorded address even if the config's `HostName` has
/// changed since. The alias still selects the config's other options (known_hosts files,
/// timeouts); whether it is the same machine is for the host key check to say.
pub fn resolve_route(route: &Route) -> Result<Destination, ConnectError> {
    let spec = HostSpec {
        host: format!("{}@{}", route.user, route.alias),
        port: Some(route.port),
        identities: route.identities.clone(),
        jump: Some(route.jump.clone().unwrap_or_else(|| "none".to_owned())),
        config_path: route.config.clone(),
        user: None,
        options: Vec::new(),
        flag_positions: FlagPositions::default(),
    };
    let mut dest = resolve(&spec)?;
    dest.hostname = route.hostname.clone();
    Ok(dest)
}

/// What the host argument says: user, host, port (`ssh://`) and whether it was a URI.
struct HostArg {
    user: Option<String>,
    host: String,
    port: Option<u16>,
    uri: bool,
}

/// Parses `[user@]host` or `ssh://[user[;params]@]host[:port][/]` as ssh 9.2 does.
fn parse_host_arg(typed: &str) -> Result<HostArg, String> {
    if let Some(rest) = typed.strip_prefix("ssh://") {
        let bad = |why: &str| {
            format!("`{typed}` is not a usable ssh:// destination ({why}); write ssh://[user@]host[:port]")
        };
        let (user, rest) = match rest.split_once('@') {
            Some((info, r)) => {
                // Connection parameters after `;` are ignored, as ssh does.
                let name = info.split(';').next().unwrap_or("");
                if name.is_empty() {
                    return Err(bad("empty user name"));
                }
                (
                    Some(url_decode(name).ok_or_else(|| bad("bad %-escape in the user name"))?),
                    r,
                )
            }
            None => (None, rest),
        };
        let (host, after) = match rest.find([':', '/']) {
            Some(i) => (&rest[..i], Some((&rest[i..i + 1], &rest[i + 1..]))),
            None => (rest, None),
        };
        if host.is_empty() || !valid_domain(host) {
            return Err(bad("the host must be a name or IPv4 address"));
        }
        let mut port = None;
        if let Some((delim, tail)) = after {
            let mut path = tail;
            if delim == ":" {
                let (p, t) = match tail.split_once('/') {
                    Some((p, t)) => (p, t),
                    None => (tail, ""),
                };
                port = Some(
                    p.parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| bad("bad port"))?,
                );
                path = t;
            }
            if !path.is_empty() {
                return Err(bad("a path is not allowed"));
            }
        }
        let host = host.strip_suffix('.').unwrap_or(host).to_string();
        return Ok(HostArg {
            user,
            host,
            port,
            uri: true,
        });
    }
    match typed.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() && !h.is_empty() => Ok(HostArg {
            user: Some(u.to_string()),
            host: h.to_string(),
            port: None,
            uri: false,
        }),
        Some(_) => Err(format!("`{typed}` is not [user@]host")),
        None => Ok(HostArg {
            user: None,
            host: typed.to_string(),
            port: None,
            uri: false,
        }),
    }
}

/// OpenSSH `valid_domain`: letters, digits, `.`, `-`, `_`, starting alphanumeric.
fn valid_domain(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

fn url_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn synthetic(key: &str, value: &str, n: usize) -> OptionLine {
    OptionLine {
        key: key.into(),
        args: vec![value.into()],
        raw: value.into(),
        origin: Origin::command_line(n),
    }
}

/// Resolves `spec` with an already read config.
pub fn resolve_with(
    config: &SshConfig,
    spec: &HostSpec,
    depth: usize,
) -> Result<Destination, ConnectError> {
    let fail = |m: String| ConnectError::new(ConnectStage::Resolve, m);
    let config_fail = |m: String| ConnectError::new(ConnectStage::Config, m);
    let typed = spec.host.trim();
    if typed.is_empty() {
        return Err(fail("empty host name; give an alias or [user@]host".into()));
    }
    let arg = parse_host_arg(typed).map_err(fail)?;
    let alias = arg.host.clone();
    if alias.starts_with('-') || alias.contains(char::is_whitespace) {
        return Err(fail(format!("`{alias}` is not a valid host name")));
    }

    // The values of the command line that can reach a shell through %-tokens (a
    // ProxyCommand, Match exec) or a jump are checked first, before any config is read
    // or anything runs, as ssh's main() does (CVE-2023-51385).
    if depth == 0 {
        check_host(&alias, "the destination")?;
        if let Some(u) = &spec.user {
            check_user(u, "-l")?;
        }
        if let Some(u) = &arg.user {
            check_user(
                u,
                if arg.uri {
                    "the ssh:// destination"
                } else {
                    "user@host"
                },
            )?;
        }
        if let Some(j) = &spec.jump {
            check_jump_syntax(j, "-J")?;
        }
    }

    // The command line comes first and wins, as in ssh: the flags, the `-o` options and
    // the user and port of the host argument, the first value given winning among them.
    let mut o = ConfigOptions::default();
    let take = |o: &mut ConfigOptions, line: &OptionLine| {
        o.take(line).map_err(|e| config_fail(e.to_string()))
    };
    let at = spec.flag_positions;
    let mut given: Vec<(ArgPlace, OptionLine)> = Vec::new();
    if let Some(u) = &spec.user {
        given.push((at.user, synthetic("user", u, 0)));
    }
    if let Some(p) = spec.port {
        given.push((at.port, synthetic("port", &p.to_string(), 0)));
    }
    if let Some(j) = &spec.jump {
        given.push((at.jump, synthetic("proxyjump", j, 0)));
    }
    if let Some(u) = &arg.user {
        given.push((at.destination, synthetic("user", u, 0)));
    }
    if let Some(p) = arg.port {
        given.push((at.destination, synthetic("port", &p.to_string(), 0)));
    }
    given.sort_by_key(|(place, _)| *place);
    // ssh refuses a -J after an -o that already said how to reach the host, rather than
    // let the first of them win.
    let take_given = |o: &mut ConfigOptions, line: &OptionLine| {
        let earlier = [("proxyjump", "ProxyJump"), ("proxycommand", "ProxyCommand")]
            .into_iter()
            .find_map(|(key, name)| Some((key, name, o.value(key)?)));
        match earlier {
            Some((key, name, value)) if line.key == "proxyjump" => Err(config_fail(format!(
                "{}: -J cannot follow `{name} {value}` (ssh refuses both); give the jump hosts once, with -J or -o ProxyJump=",
                o.origin(key)
            ))),
            _ => take(o, line),
        }
    };
    let mut given = given.into_iter().peekable();
    for (i, text) in spec.options.iter().enumerate() {
        while let Some((_, line)) = given.next_if(|(place, _)| place.after_options <= i) {
            take_given(&mut o, &line)?;
        }
        let line =
            parse_command_line_option(text, i + 1).map_err(|e| config_fail(e.to_string()))?;
        if super::config::keyword_role(&line.key).is_none() {
            return Err(config_fail(format!(
                "{}: unknown ssh option `{}` in -o",
                line.origin, line.key
            )));
        }
        match line.key.as_str() {
            "user" => check_user(&line.value(), &format!("-o User= ({})", line.origin))?,
            "proxyjump" => {
                check_jump_syntax(&line.value(), &format!("-o ProxyJump= ({})", line.origin))?
            }
            _ => {}
        }
        take(&mut o, &line)?;
    }
    for (_, line) in given {
        take_given(&mut o, &line)?;
    }

    let local_user = local_user()
        .ok_or_else(|| fail("cannot tell the local user name: set USER or use user@host".into()))?;
    let ctx = MatchContext {
        host_arg: alias.clone(),
        local_user: local_user.clone(),
    };
    config
        .apply(&ctx, &mut o)
        .map_err(|e| config_fail(e.to_string()))?;

    if let Some(v) = o.value("canonicalizehostname") {
        if !matches!(v.to_ascii_lowercase().as_str(), "no" | "false") {
            return Err(config_fail(format!(
                "{}: `CanonicalizeHostname {v}` is not supported by opmark (it never canonicalizes host names); set it to no for this host",
                o.origin("canonicalizehostname")
            )));
        }
    }

    let port = match o.value("port") {
        Some(p) => parse_port(&p).ok_or_else(|| {
            config_fail(format!(
                "{}: Port `{p}` is not a port number (1-65535) or a service name in /etc/services",
                o.origin("port")
            ))
        })?,
        None => 22,
    };
    let user = o.value("user").unwrap_or_else(|| local_user.clone());
    let hostname = match o.value("hostname") {
        Some(h) => expand_percent(&h, &[('h', alias.as_str())])
            .map_err(|e| config_fail(format!("{}: HostName: {e}", o.origin("hostname"))))?,
        None => alias.clone(),
    };
    // ssh lower-cases names, not addresses.
    let hostname = if hostname.parse::<std::net::IpAddr>().is_ok() {
        hostname
    } else {
        hostname.to_ascii_lowercase()
    };
    let host_key_alias = o.value("hostkeyalias").map(|a| a.to_ascii_lowercase());
    let tokens = Tokens {
        host: hostname.clone(),
        alias: alias.clone(),
        port,
        remote_user: user.clone(),
        local_user: local_user.clone(),
        key_alias: host_key_alias.clone().unwrap_or_else(|| alias.clone()),
    };
    let expand = |line: &OptionLine, s: &str| {
        expand_path(s, &tokens)
            .map_err(|e| config_fail(format!("{}: {} {e}", line.origin, line.key)))
    };

    let mut identities: Vec<PathBuf> = spec
        .identities
        .iter()
        .map(|p| PathBuf::from(expand_tilde(&p.to_string_lossy())))
        .collect();
    // `IdentityFile none` names no file, and like any IdentityFile it keeps ssh's
    // default files away: alone, it means no key files (the agent's keys still count).
    let mut identities_explicit = !identities.is_empty();
    for line in &o.identity_files {
        identities_explicit = true;
        if line.value().eq_ignore_ascii_case("none") {
            continue;
        }
        identities.push(PathBuf::from(expand(line, &line.value())?));
    }
    if !identities_explicit {
        if let Some(home) = home_dir() {
            for name in DEFAULT_IDENTITY_FILES {
                identities.push(home.join(".ssh").join(name));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    identities.retain(|p| seen.insert(p.clone()));
    let certificate_files = o
        .certificate_files
        .iter()
        .map(|l| expand(l, &l.value()).map(PathBuf::from))
        .collect::<Result<Vec<_>, _>>()?;

    let agent_socket = match o.get("identityagent") {
        Some(l) if l.value() == "none" => None,
        Some(l) if l.value() != "SSH_AUTH_SOCK" => Some(PathBuf::from(expand(l, &l.value())?)),
        _ => std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
    };

    let list = |key: &str| -> Result<Option<Vec<PathBuf>>, ConnectError> {
        let Some(line) = o.get(key) else {
            return Ok(None);
        };
        if line
            .args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case("none"))
        {
            if line.args.len() > 1 {
                return Err(config_fail(format!(
                    "{}: `none` cannot be combined with other files in {key}",
                    line.origin
                )));
            }
            return Ok(Some(Vec::new()));
        }
        line.args
            .iter()
            .map(|f| {
                if key == "globalknownhostsfile" {
                    // ssh expands only `~` in GlobalKnownHostsFile.
                    Ok(PathBuf::from(expand_tilde(f)))
                } else {
                    expand(line, f).map(PathBuf::from)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    };
    let home_ssh = home_dir().map(|h| h.join(".ssh"));
    let known_hosts = list("userknownhostsfile")?.unwrap_or_else(|| {
        home_ssh
            .iter()
            .flat_map(|d| [d.join("known_hosts"), d.join("known_hosts2")])
            .collect()
    });
    let global_known_hosts = list("globalknownhostsfile")?.unwrap_or_else(|| {
        vec![
            PathBuf::from("/etc/ssh/ssh_known_hosts"),
            PathBuf::from("/etc/ssh/ssh_known_hosts2"),
        ]
    });

    let mut opmark_defaults = Vec::new();
    let strict = match o
        .value("stricthostkeychecking")
        .map(|v| v.to_ascii_lowercase())
    {
        None => {
            opmark_defaults.push("stricthostkeychecking");
            StrictMode::Yes
        }
        Some(v) => match v.as_str() {
            "yes" | "true" => StrictMode::Yes,
            // `ask` needs a human; without one it acts as `yes` (docs/guarantees.md#the-command-line-contract, session.rs).
            "ask" => StrictMode::Ask,
            "accept-new" => StrictMode::AcceptNew,
            "no" | "off" | "false" => StrictMode::No,
            other => {
                return Err(config_fail(format!(
                    "{}: StrictHostKeyChecking `{other}` is not yes, ask, accept-new or no",
                    o.origin("stricthostkeychecking")
                )))
            }
        },
    };
    let flag = |key: &str| -> Result<bool, ConnectError> {
        match o.value(key).map(|v| v.to_ascii_lowercase()) {
            None => Ok(false),
            Some(v) if v == "yes" || v == "true" => Ok(true),
            Some(v) if v == "no" || v == "false" => Ok(false),
            Some(v) => Err(config_fail(format!(
                "{}: `{v}` is not yes or no",
                o.origin(key)
            ))),
        }
    };

    let secs = |key: &str| -> Result<Option<u64>, ConnectError> {
        o.value(key)
            .map(|s| {
                parse_config_time(&s).ok_or_else(|| {
                    config_fail(format!(
                        "{}: `{s}` is not a time (e.g. 10, 30s, 2m)",
                        o.origin(key)
                    ))
                })
            })
            .transpose()
    };
    let connect_timeout = match secs("connecttimeout")? {
        Some(0) | None => {
            opmark_defaults.push("connecttimeout");
            DEFAULT_CONNECT_TIMEOUT
        }
        Some(s) => Duration::from_secs(s),
    };
    let keepalive_interval = match secs("serveraliveinterval")? {
        None => {
            opmark_defaults.push("serveraliveinterval");
            Some(DEFAULT_KEEPALIVE_INTERVAL)
        }
        Some(0) => {
            tracing::warn!(
                "{}: ServerAliveInterval 0 disables keepalives; a silently dead link will hang",
                o.origin("serveraliveinterval")
            );
            None
        }
        Some(s) => Some(Duration::from_secs(s)),
    };
    let count = |key: &str| -> Result<Option<u64>, ConnectError> {
        o.value(key)
            .map(|s| {
                s.parse::<u64>()
                    .map_err(|_| config_fail(format!("{}: `{s}` is not a number", o.origin(key))))
            })
            .transpose()
    };
    let keepalive_max = match count("serveralivecountmax")? {
        // OpenSSH counts keepalives sent without answer; russh compares with `>` after
        // sending, so the same number gives the same budget: interval × (max + 1).
        Some(n) => n.max(1) as usize,
        None => DEFAULT_KEEPALIVE_MAX,
    };
    let connection_attempts = match count("connectionattempts")? {
        Some(0) => {
            return Err(config_fail(format!(
                "{}: ConnectionAttempts must be at least 1",
                o.origin("connectionattempts")
            )))
        }
        Some(n) => n.min(u32::MAX as u64) as u32,
        None => 1,
    };
    let address_family = match o.value("addressfamily").map(|v| v.to_ascii_lowercase()) {
        None => AddressFamily::Any,
        Some(v) => match v.as_str() {
            "any" => AddressFamily::Any,
            "inet" => AddressFamily::Inet,
            "inet6" => AddressFamily::Inet6,
            other => {
                return Err(config_fail(format!(
                    "{}: AddressFamily `{other}` is not any, inet or inet6",
                    o.origin("addressfamily")
                )))
            }
        },
    };

    let mut algorithms = Algorithms::default();
    for (key, kind) in [
        ("kexalgorithms", AlgorithmList::Kex),
        ("hostkeyalgorithms", AlgorithmList::HostKey),
        ("ciphers", AlgorithmList::Cipher),
        ("macs", AlgorithmList::Mac),
        ("pubkeyacceptedalgorithms", AlgorithmList::Pubkey),
        ("pubkeyacceptedkeytypes", AlgorithmList::Pubkey),
    ] {
        let Some(line) = o.get(key) else {
            continue;
        };
        let list = super::algorithms::resolve(kind, &line.value())
            .map_err(|e| config_fail(format!("{}: {e}", line.origin)))?;
        match kind {
            AlgorithmList::Kex => algorithms.kex = Some(list),
            AlgorithmList::HostKey => algorithms.host_key = Some(list),
            AlgorithmList::Cipher => algorithms.ciphers = Some(list),
            AlgorithmList::Mac => algorithms.macs = Some(list),
            // Checked only: a list that allows every key opmark offers changes nothing.
            AlgorithmList::Pubkey => {}
        }
    }
    if let Some(line) = o.get("preferredauthentications") {
        super::algorithms::check_preferred_authentications(&line.value())
            .map_err(|e| config_fail(format!("{}: {e}", line.origin)))?;
    }

    let proxy_jump = o
        .value("proxyjump")
        .filter(|t| !t.eq_ignore_ascii_case("none"));
    // `ProxyCommand none` is no proxy; the config layer already made ProxyJump and
    // ProxyCommand exclude each other (first one set wins, as in readconf.c).
    let proxy_command = match o.get("proxycommand") {
        Some(line) if !line.raw.trim().eq_ignore_ascii_case("none") => {
            let port_text = port.to_string();
            // The command runs under `sh -c`: a token value that could end the word it
            // stands in is refused, whatever its source (ssh checks the command-line
            // ones; a config's own literal User or HostName is checked here too).
            let raw = line.raw.trim();
            let at = |t: &str| format!("%{t} in the ProxyCommand at {}", line.origin);
            if has_token(raw, 'h') {
                check_host(&hostname, &at("h"))?;
            }
            if has_token(raw, 'n') {
                check_host(&alias, &at("n"))?;
            }
            if has_token(raw, 'r') {
                check_user(&user, &at("r"))?;
            }
            let command = expand_percent(
                line.raw.trim(),
                &[
                    ('h', hostname.as_str()),
                    ('n', alias.as_str()),
                    ('p', port_text.as_str()),
                    ('r', user.as_str()),
                ],
            )
            .map_err(|e| config_fail(format!("{}: ProxyCommand {e}", line.origin)))?;
            Some(ProxyCommand {
                command,
                raw: line.raw.trim().to_string(),
                origin: line.origin.to_string(),
            })
        }
        _ => None,
    };
    let jump_spec = proxy_jump.clone();
    let mut jumps = Vec::new();
    if let Some(text) = &proxy_jump {
        if depth >= MAX_JUMP_DEPTH {
            return Err(config_fail(format!(
                "ProxyJump chain deeper than {MAX_JUMP_DEPTH} hops at `{alias}` (a loop?)"
            )));
        }
        let origin = match o.get("proxyjump") {
            Some(l) if l.origin == Origin::command_line(0) => "-J".to_owned(),
            Some(l) => format!("ProxyJump at {}", l.origin),
            None => "ProxyJump".to_owned(),
        };
        let port_text = port.to_string();
        // ssh turns a ProxyJump into a ProxyCommand whose %-tokens it expands: %h, %n,
        // %p, %r of the destination (so `ProxyJump admin@%h` jumps through the host
        // itself). Each hop, expanded, then passes ssh's command-line checks whatever
        // file it came from: opmark resolves a hop like a destination typed by hand.
        let tokens = [
            ('h', hostname.as_str()),
            ('n', alias.as_str()),
            ('p', port_text.as_str()),
            ('r', user.as_str()),
        ];
        for (i, hop) in text.split(',').map(str::trim).enumerate() {
            let at = format!("{origin}, hop `{hop}`");
            let h = parse_hop(hop).map_err(|m| config_fail(format!("{origin}: {m}")))?;
            let expand =
                |s: &str| expand_percent(s, &tokens).map_err(|e| config_fail(format!("{at}: {e}")));
            let host = expand(&h.host)?;
            check_host(&host, &at)?;
            let hop_user = h.user.as_deref().map(expand).transpose()?;
            if let Some(u) = &hop_user {
                check_user(u, &at)?;
            }
            let host = match hop_user {
                Some(u) => format!("{u}@{host}"),
                None => host,
            };
            let port = h.port;
            let hop_spec = HostSpec {
                host,
                port,
                identities: Vec::new(),
                // Only the first hop may itself be reached through its own ProxyJump.
                jump: if i == 0 { None } else { Some("none".into()) },
                config_path: None,
                user: None,
                options: Vec::new(),
                flag_positions: FlagPositions::default(),
            };
            let mut hop_dest = resolve_with(config, &hop_spec, depth + 1)?;
            jumps.append(&mut hop_dest.jumps);
            jumps.push(hop_dest);
        }
    }

    let display = if arg.uri {
        let user = arg
            .user
            .as_deref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        // The port connected to (an earlier `-o Port=` wins over the URI's and `-p`).
        match spec.port.or(arg.port) {
            Some(_) => format!("{user}{alias}:{port}"),
            None => format!("{user}{alias}"),
        }
    } else {
        // `:port` when `-p` gave the port; not when an earlier `-o Port=` won over it.
        match spec.port.filter(|p| *p == port) {
            Some(p) => format!("{typed}:{p}"),
            None => typed.to_string(),
        }
    };
    Ok(Destination {
        alias,
        hostname,
        port,
        user,
        identities,
        identities_explicit,
        identities_only: flag("identitiesonly")?,
        agent_socket,
        known_hosts,
        global_known_hosts,
        host_key_alias,
        hash_known_hosts: flag("hashknownhosts")?,
        strict,
        connect_timeout,
        keepalive_interval,
        keepalive_max,
        jumps,
        jump_spec,
        config_path: None,
        display,
        certificate_files,
        address_family,
        connection_attempts,
        batch_mode: flag("batchmode")?,
        proxy_jump,
        proxy_command,
        opmark_defaults,
        algorithms,
    })
}

/// Whether `%t` occurs in `s` as a token (not as part of `%%`).
fn has_token(s: &str, t: char) -> bool {
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some(n) if n == t => return true,
                _ => {}
            }
        }
    }
    false
}

/// An OpenSSH time value: seconds, or a sum of `<n><unit>` with units s, m, h, d, w;
/// `none` is no value (as 0).
fn parse_config_time(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    if s == "none" {
        return Some(0);
    }
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let mut total = 0u64;
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().ok()?;
        digits.clear();
        let mult = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            'w' => 604800,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(mult)?)?;
    }
    if !digits.is_empty() {
        total = total.checked_add(digits.parse().ok()?)?;
    }
    Some(total)
}

/// One ProxyJump hop: `[user@]host[:port]` (IPv6 as `[addr]:port`) or an `ssh://` URI.
struct JumpHop {
    user: Option<String>,
    host: String,
    port: Option<u16>,
}

/// Splits a ProxyJump hop as ssh's `parse_jump` does; the port may be a service name.
fn parse_hop(hop: &str) -> Result<JumpHop, String> {
    if hop.is_empty() {
        return Err("empty ProxyJump hop; write [user@]host[:port][,...]".into());
    }
    if hop.starts_with("ssh://") {
        let a = parse_host_arg(hop)?;
        return Ok(JumpHop {
            user: a.user,
            host: a.host,
            port: a.port,
        });
    }
    let bad = || format!("ProxyJump hop `{hop}` has a bad port; write [user@]host[:port]");
    let (user, rest) = match hop.rsplit_once('@') {
        Some((u, r)) => (Some(u.to_string()), r),
        None => (None, hop),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, after) = inner.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(parse_port(p).ok_or_else(bad)?)),
            None if after.is_empty() => (h, None),
            None => return Err(bad()),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(parse_port(p).ok_or_else(bad)?)),
            None => (rest, None),
        }
    };
    Ok(JumpHop {
        user,
        host: host.to_string(),
        port,
    })
}

/// Checks a jump list given on the command line (`-J`, `-o ProxyJump=`) before anything
/// else, as ssh's strict `parse_jump` does: every hop's host and user.
fn check_jump_syntax(text: &str, origin: &str) -> Result<(), ConnectError> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(());
    }
    for hop in text.split(',').map(str::trim) {
        let h = parse_hop(hop)
            .map_err(|m| ConnectError::new(ConnectStage::Config, format!("{origin}: {m}")))?;
        check_host(&h.host, &format!("{origin}, jump host"))?;
        if let Some(u) = &h.user {
            check_user(u, &format!("{origin}, jump user"))?;
        }
    }
    Ok(())
}

/// The local user name: `$USER`, `$LOGNAME`, else the passwd entry of our uid (services
/// and containers often run without either variable).
fn local_user() -> Option<String> {
    if let Some(u) = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
    {
        return Some(u);
    }
    let uid = super::config::current_uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)? == uid).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(text: &str) -> SshConfig {
        SshConfig::parse(text, Path::new("cfg")).unwrap()
    }

    fn spec(host: &str) -> HostSpec {
        HostSpec {
            host: host.into(),
            ..HostSpec::default()
        }
    }

    #[test]
    fn a_typed_destination_with_a_blank_a_leading_dash_or_a_shell_character_is_refused_naming_it() {
        for ok in [
            "web1",
            "alice@web1",
            "ssh://alice@web1:2222",
            "10.0.0.1",
            "web-1.example_org",
        ] {
            assert_eq!(check_destination(ok), Ok(()), "{ok}");
        }
        for (bad, problem) in [
            ("", "it is empty"),
            ("  ", "it is empty"),
            ("-oProxyCommand=x", "starts with `-`"),
            ("web 1", "a space or another blank"),
            ("web\t1", "a space or another blank"),
            ("web\u{7}1", "a control character"),
            ("web1;reboot", "contains `;`"),
            ("h$(id)", "contains `$`"),
            ("a|b", "contains `|`"),
            ("a`b`", "contains a backtick (`);"),
            ("a'b", "contains `'`"),
            ("a&b", "contains `&`"),
            ("a>b", "contains `>`"),
            ("a\\b", "contains `\\`"),
        ] {
            let err = check_destination(bad).expect_err(bad);
            assert!(err.contains(problem), "{bad:?}: {err}");
            assert!(err.ends_with("nothing was sent"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_uri_host_is_a_domain_as_openssh_reads_one() {
        for ok in ["web1", "web-1.example_org", "10.0.0.1", "a"] {
            assert!(valid_domain(ok), "{ok}");
        }
        // A leading character that is not a letter or digit, an empty label, and any
        // character outside letters, digits, `.`, `-` and `_`.
        for bad in ["", "-a", ".a", "_a", "a..b", "a b", "a%b", "a:b", "a@b"] {
            assert!(!valid_domain(bad), "{bad}");
        }
    }

    #[test]
    fn a_percent_token_counts_only_when_its_percent_is_not_escaped() {
        assert!(has_token("ssh -W %h:%p jump", 'h'));
        assert!(has_token("%%%h", 'h'), "an escaped percent, then the token");
        assert!(!has_token("%%h", 'h'), "`%%` is a literal percent");
        assert!(!has_token("ssh -W %n:%p jump", 'h'));
        assert!(!has_token("no tokens", 'h'));
        assert!(!has_token("ends with %", 'h'));
    }

    #[test]
    fn alias_resolves_hostname_port_user_identities_and_known_hosts() {
        let c = cfg("Host t1\n HostName 127.0.0.1\n Port 2201\n User alice\n \
                     IdentityFile /keys/%h-%r\n IdentityFile /keys/second\n \
                     UserKnownHostsFile /kh/a /kh/b\n StrictHostKeyChecking accept-new\n \
                     ConnectTimeout 3\n ServerAliveInterval 1\n ServerAliveCountMax 2\n");
        let d = resolve_with(&c, &spec("t1"), 0).unwrap();
        assert_eq!(
            (d.hostname.as_str(), d.port, d.user.as_str()),
            ("127.0.0.1", 2201, "alice")
        );
        assert_eq!(
            d.identities,
            vec![
                PathBuf::from("/keys/127.0.0.1-alice"),
                PathBuf::from("/keys/second")
            ]
        );
        assert_eq!(
            d.known_hosts,
            vec![PathBuf::from("/kh/a"), PathBuf::from("/kh/b")]
        );
        assert_eq!(d.strict, StrictMode::AcceptNew);
        assert_eq!(d.connect_timeout, Duration::from_secs(3));
        assert_eq!(d.loss_budget(), Some(Duration::from_secs(3)));
        assert_eq!(d.display(), "t1");
        assert_eq!(d.known_hosts_name(), "[127.0.0.1]:2201");
    }

    #[test]
    fn command_line_overrides_config() {
        let c = cfg("Host t1\n User alice\n Port 2201\n IdentityFile /k/cfg\n");
        let s = HostSpec {
            host: "bob@t1".into(),
            port: Some(2300),
            identities: vec!["/k/cli".into()],
            ..HostSpec::default()
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("bob", 2300));
        assert_eq!(
            d.identities,
            vec![PathBuf::from("/k/cli"), PathBuf::from("/k/cfg")]
        );
        assert_eq!(d.display(), "bob@t1:2300");
    }

    #[test]
    fn defaults_are_strict_with_bounded_loss_detection() {
        let d = resolve_with(&cfg(""), &spec("u@somehost"), 0).unwrap();
        assert_eq!(d.strict, StrictMode::Yes);
        assert_eq!(d.port, 22);
        assert_eq!(d.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert!(d.loss_budget().unwrap() <= Duration::from_secs(10));
    }

    #[test]
    fn proxy_jump_hops_resolve_through_config_in_order() {
        let c = cfg("Host bastion\n HostName 10.0.0.1\n Port 2200\n User b\n\
                     Host inner\n HostName 10.0.0.2\n ProxyJump bastion,j2@hop2:2022\n");
        let d = resolve_with(&c, &spec("inner"), 0).unwrap();
        let hops: Vec<(String, u16, String)> = d
            .jumps
            .iter()
            .map(|j| (j.hostname.clone(), j.port, j.user.clone()))
            .collect();
        assert_eq!(
            hops,
            vec![
                ("10.0.0.1".into(), 2200, "b".into()),
                ("hop2".into(), 2022, "j2".into())
            ]
        );
        // -J none disables the config's ProxyJump.
        let s = HostSpec {
            jump: Some("none".into()),
            ..spec("inner")
        };
        assert!(resolve_with(&c, &s, 0).unwrap().jumps.is_empty());
    }

    #[test]
    fn jump_loop_is_refused_not_followed_forever() {
        let c = cfg("Host a\n ProxyJump b\nHost b\n ProxyJump a\n");
        let e = resolve_with(&c, &spec("a"), 0).unwrap_err();
        assert_eq!(e.stage, ConnectStage::Config);
        assert!(e.message.contains("loop"), "{}", e.message);
    }

    #[test]
    fn bad_values_name_file_and_line() {
        let c = cfg("Host a\n Port nosuchservice\n");
        let e = resolve_with(&c, &spec("a"), 0).unwrap_err();
        assert!(
            e.message
                .starts_with("cfg:2: Port `nosuchservice` is not a port number"),
            "{}",
            e.message
        );
        // A service name is a port, as in ssh.
        let c = cfg("Host a\n Port ssh\n");
        assert_eq!(resolve_with(&c, &spec("a"), 0).unwrap().port, 22);
        let c = cfg("Host a\n StrictHostKeyChecking maybe\n");
        assert!(resolve_with(&c, &spec("a"), 0)
            .unwrap_err()
            .message
            .contains("cfg:2"));
    }

    #[test]
    fn a_recorded_route_reaches_the_same_machine_after_the_config_changed() {
        let dir = std::env::temp_dir().join(format!("opmark-route-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("config");
        std::fs::write(
            &cfg,
            "Host inner\n HostName 10.0.0.2\n IdentityFile /k/cfg\n ProxyJump b@bastion:2200\n",
        )
        .unwrap();
        let spec = HostSpec {
            host: "alice@inner".into(),
            port: Some(2222),
            identities: vec!["/k/cli".into()],
            config_path: Some(cfg.clone()),
            ..HostSpec::default()
        };
        let route = resolve(&spec).unwrap().route();
        assert_eq!(
            (
                route.alias.as_str(),
                route.hostname.as_str(),
                route.port,
                route.user.as_str()
            ),
            ("inner", "10.0.0.2", 2222, "alice")
        );
        assert_eq!(
            route.identities,
            vec![PathBuf::from("/k/cli"), PathBuf::from("/k/cfg")]
        );
        assert_eq!(route.jumps, vec!["b@bastion:2200".to_owned()]);
        assert_eq!(route.config.as_deref(), Some(cfg.as_path()));

        // The alias now points elsewhere, without a jump: the route still goes the old way.
        std::fs::write(&cfg, "Host inner\n HostName 10.9.9.9\n Port 22\n").unwrap();
        let again = resolve_route(&route).unwrap();
        assert_eq!(again.route(), route);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn none_disables_known_hosts_files() {
        let c = cfg("UserKnownHostsFile none\nGlobalKnownHostsFile none\n");
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        assert!(d.known_hosts.is_empty() && d.global_known_hosts.is_empty());
    }

    #[test]
    fn host_key_alias_is_looked_up_without_port_wrapping() {
        let c = cfg("Host a\n HostName 10.0.0.9\n Port 2222\n HostKeyAlias Web-Alias\n");
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        assert_eq!(d.known_hosts_name(), "web-alias");
        assert_eq!(d.host_key_alias.as_deref(), Some("web-alias"));
    }

    #[test]
    fn ssh_uri_destinations_split_user_host_and_port() {
        let d = resolve_with(&cfg(""), &spec("ssh://bob@h.example:2222"), 0).unwrap();
        assert_eq!(
            (d.user.as_str(), d.hostname.as_str(), d.port),
            ("bob", "h.example", 2222)
        );
        assert_eq!(d.display(), "bob@h.example:2222");
        let d = resolve_with(&cfg(""), &spec("ssh://u;fingerprint=x@H/"), 0).unwrap();
        assert_eq!(
            (d.user.as_str(), d.hostname.as_str(), d.port),
            ("u", "h", 22)
        );
        for bad in [
            "ssh://u@h:22/path",
            "ssh://[::1]:22",
            "ssh://@h",
            "ssh://h:0",
        ] {
            let e = resolve_with(&cfg(""), &spec(bad), 0).unwrap_err();
            assert_eq!(e.stage, ConnectStage::Resolve, "{bad}");
            assert!(e.message.contains(bad), "{}", e.message);
        }
    }

    #[test]
    fn command_line_wins_over_uri_and_config_in_ssh_order() {
        let c = cfg("Host h\n User cfg\n Port 1\n");
        // -l beats the URI's user; -o User beats it too; -p and -o Port beat the URI port.
        let s = HostSpec {
            user: Some("carol".into()),
            port: Some(5),
            ..spec("ssh://bob@h:2222")
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("carol", 5));
        let s = HostSpec {
            options: vec!["User=dave".into(), "Port 7".into()],
            ..spec("ssh://bob@h:2222")
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("dave", 7));
        let d = resolve_with(&c, &spec("h"), 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("cfg", 1));
    }

    #[test]
    fn bad_or_unsupported_command_line_options_are_config_errors() {
        for (opt, word) in [
            ("Frobnicate=1", "frobnicate"),
            ("RemoteCommand=ls", "remotecommand"),
            ("BindAddress=10.0.0.1", "bindaddress"),
            ("Match all", "match"),
        ] {
            let s = HostSpec {
                options: vec![opt.into()],
                ..spec("h")
            };
            let e = resolve_with(&cfg(""), &s, 0).unwrap_err();
            assert_eq!(e.stage, ConnectStage::Config, "{opt}");
            assert!(
                e.message.contains(word) && e.message.contains("command-line option 1"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn proxy_command_expands_tokens_and_canonicalization_is_refused() {
        let c = cfg("Host a\n HostName real.a\n Port 2200\n User u\n \
                     ProxyCommand nc -q0 %h %p %r %n %%\n\
                     Host b\n CanonicalizeHostname yes\nHost n\n ProxyCommand none\n");
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        let pc = d.proxy_command.expect("ProxyCommand resolved");
        assert_eq!(pc.command, "nc -q0 real.a 2200 u a %");
        assert_eq!(pc.raw, "nc -q0 %h %p %r %n %%");
        assert!(pc.origin.starts_with("cfg:5"), "{}", pc.origin);
        assert_eq!(resolve_with(&c, &spec("n"), 0).unwrap().proxy_command, None);
        let e = resolve_with(&c, &spec("b"), 0).unwrap_err();
        assert_eq!(e.stage, ConnectStage::Config);
        assert!(
            e.message.starts_with("cfg:7:") && e.message.contains("CanonicalizeHostname"),
            "{}",
            e.message
        );
    }

    #[test]
    fn env_vars_and_tokens_expand_per_option() {
        let (var, dir) = crate::ssh::test_env::a_set_variable_holding_a_path();
        let c = cfg(&format!(
            "Host a\n HostName A.Example\n User r\n \
             IdentityFile ${{{var}}}/id_%r_%n\n \
             UserKnownHostsFile ${{{var}}}/kh_%h_%p\n \
             CertificateFile /c/%h-cert.pub\n IdentityAgent /a/%r.sock\n"
        ));
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        assert_eq!(d.hostname, "a.example");
        assert_eq!(d.identities, vec![PathBuf::from(format!("{dir}/id_r_a"))]);
        assert_eq!(
            d.known_hosts,
            vec![PathBuf::from(format!("{dir}/kh_a.example_22"))]
        );
        assert_eq!(
            d.certificate_files,
            vec![PathBuf::from("/c/a.example-cert.pub")]
        );
        assert_eq!(d.agent_socket, Some(PathBuf::from("/a/r.sock")));
        // HostName takes only %h; an unset variable is an error naming it.
        let c = cfg("Host a\n HostName %p.x\nHost b\n IdentityFile ${OPMARK_DEST_UNSET}/k\n");
        assert!(resolve_with(&c, &spec("a"), 0)
            .unwrap_err()
            .message
            .contains("%p"));
        let e = resolve_with(&c, &spec("b"), 0).unwrap_err();
        assert!(
            e.message.starts_with("cfg:4:") && e.message.contains("OPMARK_DEST_UNSET"),
            "{}",
            e.message
        );
    }

    #[test]
    fn system_config_is_read_after_the_user_config_unless_f_is_given() {
        let dir = std::env::temp_dir().join(format!("opmark-dest-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("conf.d")).unwrap();
        std::fs::write(
            dir.join("ssh_config"),
            "Include conf.d/*.conf\nHost *\n User sysuser\n Port 2\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("conf.d/10-alias.conf"),
            "Host sysalias\n HostName 10.1.1.1\n Port 2201\n",
        )
        .unwrap();
        std::fs::write(dir.join("user_config"), "Host *\n Port 1\n").unwrap();
        let mut config = SshConfig::default();
        config
            .load_into(&dir.join("user_config"), ConfigKind::User, false)
            .unwrap();
        config
            .load_into(&dir.join("ssh_config"), ConfigKind::System, false)
            .unwrap();
        let d = resolve_with(&config, &spec("sysalias"), 0).unwrap();
        assert_eq!(
            (d.hostname.as_str(), d.port, d.user.as_str()),
            ("10.1.1.1", 1, "sysuser")
        );
        // With -F, only that file.
        let s = HostSpec {
            config_path: Some(dir.join("user_config")),
            ..spec("sysalias")
        };
        let c = load_configs(&s).unwrap();
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.hostname.as_str(), d.port), ("sysalias", 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shell_metacharacters_in_command_line_users_and_jumps_are_refused_as_ssh_does() {
        let c = cfg("Host *\n ProxyCommand sh -c ': %r; exec nc %h %p'\n");
        let cases: Vec<(HostSpec, &str)> = vec![
            (
                HostSpec {
                    user: Some("a|id>/tmp/x".into()),
                    ..spec("h")
                },
                "-l",
            ),
            (
                HostSpec {
                    user: Some("a$(touch /tmp/x)".into()),
                    ..spec("h")
                },
                "-l",
            ),
            (
                HostSpec {
                    options: vec!["User=b`touch${IFS}/tmp/x`".into()],
                    ..spec("h")
                },
                "-o User=",
            ),
            (spec("a;b@h"), "user@host"),
            (spec("ssh://a%7Cb@h"), "ssh://"),
            (
                HostSpec {
                    jump: Some("j|id>/tmp/x".into()),
                    ..spec("h")
                },
                "-J",
            ),
            (
                HostSpec {
                    jump: Some("u$(x)@j".into()),
                    ..spec("h")
                },
                "-J",
            ),
            (
                HostSpec {
                    jump: Some("ok,k;x".into()),
                    ..spec("h")
                },
                "-J",
            ),
            (
                HostSpec {
                    user: Some("a\u{1}".into()),
                    ..spec("h")
                },
                "-l",
            ),
            (
                HostSpec {
                    user: Some("-oProxyCommand=x".into()),
                    ..spec("h")
                },
                "-l",
            ),
            (
                HostSpec {
                    user: Some("a -b".into()),
                    ..spec("h")
                },
                "-l",
            ),
            (spec("h,x"), "the destination"),
        ];
        for (s, origin) in cases {
            let e = resolve_with(&c, &s, 0).unwrap_err();
            assert_eq!(e.stage, ConnectStage::Config, "{s:?}");
            assert!(
                e.message.contains(origin) && e.message.contains("contains invalid characters"),
                "{s:?}: {}",
                e.message
            );
        }
        // What ssh accepts, opmark accepts: `$` alone and blanks in a user name.
        for user in ["a$b", "first last", "dom\\user"] {
            let s = HostSpec {
                user: Some(user.into()),
                ..spec("h")
            };
            assert_eq!(resolve_with(&c, &s, 0).unwrap().user, user);
        }
    }

    #[test]
    fn jump_values_are_checked_after_token_expansion_whatever_their_origin() {
        // Tokens in a ProxyJump expand as ssh's implicit ProxyCommand expands them.
        let c = cfg("Host t\n HostName 10.0.0.7\n User tu\n ProxyJump admin@%h:2022,%r@j2\n");
        let d = resolve_with(&c, &spec("t"), 0).unwrap();
        let hops: Vec<String> = d
            .jumps
            .iter()
            .map(|j| format!("{}@{}:{}", j.user, j.hostname, j.port))
            .collect();
        assert_eq!(hops, vec!["admin@10.0.0.7:2022", "tu@j2:22"]);
        // A config's own literal User is not checked (ssh trusts it) until a token puts it
        // into a jump or a ProxyCommand.
        let c = cfg("Host t\n User a;b\nHost u\n User a;b\n ProxyJump %r@j\n\
                     Host v\n User a;b\n ProxyCommand nc %h %p %r\nHost w\n ProxyJump j;x\n\
                     Host x\n ProxyJump j$(id)\n");
        assert_eq!(resolve_with(&c, &spec("t"), 0).unwrap().user, "a;b");
        for (host, needle) in [
            ("u", "ProxyJump at cfg:5"),
            ("v", "%r in the ProxyCommand at cfg:8"),
            ("w", "ProxyJump at cfg:10"),
            ("x", "ProxyJump at cfg:12"),
        ] {
            let e = resolve_with(&c, &spec(host), 0).unwrap_err();
            assert_eq!(e.stage, ConnectStage::Config);
            assert!(e.message.contains(needle), "{host}: {}", e.message);
        }
    }

    #[test]
    fn the_first_value_given_wins_between_flags_and_o_options_as_in_ssh() {
        let c = cfg("");
        let s = HostSpec {
            user: Some("bar".into()),
            port: Some(2230),
            options: vec!["User=foo".into(), "Port=2229".into()],
            flag_positions: FlagPositions {
                user: ArgPlace {
                    after_options: 1,
                    index: 3,
                },
                port: ArgPlace {
                    after_options: 2,
                    index: 5,
                },
                ..FlagPositions::default()
            },
            ..spec("h")
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("foo", 2229));
        let s = HostSpec {
            flag_positions: FlagPositions::default(),
            ..s
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("bar", 2230));
    }

    #[test]
    fn a_jump_flag_after_an_option_that_chose_the_route_is_refused_as_in_ssh() {
        let c = cfg("");
        for option in ["ProxyJump=j1", "ProxyCommand=nc %h %p", "ProxyJump=none"] {
            let s = HostSpec {
                jump: Some("j2".into()),
                options: vec![option.into()],
                flag_positions: FlagPositions {
                    jump: ArgPlace {
                        after_options: 1,
                        index: 4,
                    },
                    ..FlagPositions::default()
                },
                ..spec("h")
            };
            let e = resolve_with(&c, &s, 0).unwrap_err();
            assert_eq!(e.stage, ConnectStage::Config, "{option}");
            assert!(e.message.contains("-J cannot follow"), "{}", e.message);
            // -J first: it wins and the option is ignored, as in ssh.
            let s = HostSpec {
                flag_positions: FlagPositions::default(),
                ..s
            };
            let d = resolve_with(&c, &s, 0).unwrap();
            assert_eq!(d.proxy_jump.as_deref(), Some("j2"), "{option}");
        }
    }

    #[test]
    fn the_destination_wins_over_the_flags_and_options_given_after_it_as_in_ssh() {
        let c = cfg("");
        let place = |after_options, index| ArgPlace {
            after_options,
            index,
        };
        // ssh://x@h:2231 -l bar -o Port=2229 -p 2230
        let s = HostSpec {
            user: Some("bar".into()),
            port: Some(2230),
            options: vec!["Port=2229".into()],
            flag_positions: FlagPositions {
                user: place(0, 2),
                port: place(1, 6),
                jump: ArgPlace::default(),
                destination: place(0, 1),
            },
            ..spec("ssh://x@h:2231")
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("x", 2231));
        // -l bar ssh://x@h:2231: the flag first.
        let s = HostSpec {
            options: Vec::new(),
            flag_positions: FlagPositions {
                user: place(0, 1),
                destination: place(0, 2),
                ..FlagPositions::default()
            },
            ..s
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("bar", 2230));
        // Without a command line the flags win, as they always did.
        let s = HostSpec {
            flag_positions: FlagPositions::default(),
            ..s
        };
        let d = resolve_with(&c, &s, 0).unwrap();
        assert_eq!((d.user.as_str(), d.port), ("bar", 2230));
    }

    #[test]
    fn identity_file_none_means_no_key_files_not_a_file_named_none() {
        let d = resolve_with(&cfg("IdentityFile none\n"), &spec("h"), 0).unwrap();
        assert!(
            d.identities.is_empty() && d.identities_explicit,
            "{:?}",
            d.identities
        );
        let d = resolve_with(
            &cfg("IdentityFile none\nIdentityFile /k/a\n"),
            &spec("h"),
            0,
        )
        .unwrap();
        assert_eq!(d.identities, vec![PathBuf::from("/k/a")]);
    }

    #[test]
    fn algorithm_options_are_resolved_or_refused_with_their_line() {
        let c = cfg("Host a\n HostKeyAlgorithms ssh-ed25519\n Ciphers -aes*\n\
                     Host b\n KexAlgorithms -nope*\nHost c\n MACs umac-64@openssh.com\n\
                     Host d\n PreferredAuthentications password\nHost e\n PubkeyAcceptedAlgorithms ssh-ed25519\n");
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        assert_eq!(d.algorithms.host_key, Some(vec!["ssh-ed25519".to_string()]));
        assert_eq!(
            d.algorithms.ciphers,
            Some(vec!["chacha20-poly1305@openssh.com".to_string()])
        );
        // `-` takes patterns, not names: nothing to refuse.
        assert!(resolve_with(&c, &spec("b"), 0)
            .unwrap()
            .algorithms
            .kex
            .is_some());
        // An unknown name: refused wherever it is written.
        let bad = cfg("Host other\n KexAlgorithms nope\n");
        let e = resolve_with(&bad, &spec("a"), 0).unwrap_err();
        assert!(e.message.starts_with("cfg:2:"), "{}", e.message);
        for (host, line) in [("c", "cfg:7:"), ("d", "cfg:9:"), ("e", "cfg:11:")] {
            let e = resolve_with(&c, &spec(host), 0).unwrap_err();
            assert_eq!(e.stage, ConnectStage::Config, "{host}");
            assert!(e.message.starts_with(line), "{host}: {}", e.message);
        }
    }

    #[test]
    fn connect_timeout_attempts_and_family_resolve() {
        let c = cfg("Host a\n ConnectTimeout 1m\n ConnectionAttempts 3\n AddressFamily inet6\n BatchMode yes\n");
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        assert_eq!(d.connect_timeout, Duration::from_secs(60));
        assert_eq!(
            (d.connection_attempts, d.address_family, d.batch_mode),
            (3, AddressFamily::Inet6, true)
        );
        assert!(!d.opmark_defaults.contains(&"connecttimeout"));
        let d = resolve_with(&cfg(""), &spec("a"), 0).unwrap();
        assert!(d.opmark_defaults.contains(&"connecttimeout"));
    }
}
