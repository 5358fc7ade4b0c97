//! Host resolution: from what the user typed (`[user@]host`, `-p`, `-i`, `-J`, `-F`) and
//! the ssh config to a fully resolved [`Destination`], the way OpenSSH resolves it.

use std::path::PathBuf;
use std::time::Duration;

use super::config::{expand_tilde, expand_tokens, home_dir, SshConfig, Tokens};
use super::{ConnectError, ConnectStage};

/// What the user asked to connect to, before reading the ssh config.
#[derive(Debug, Clone, Default)]
pub struct HostSpec {
    /// An alias from the ssh config or `[user@]host`.
    pub host: String,
    /// `-p`: overrides the config's `Port`.
    pub port: Option<u16>,
    /// `-i`: tried before the config's `IdentityFile`s.
    pub identities: Vec<PathBuf>,
    /// `-J`: overrides the config's `ProxyJump` (comma-separated hops, or `none`).
    pub jump: Option<String>,
    /// `-F`: the ssh config (default `~/.ssh/config`, which may be absent).
    pub config_path: Option<PathBuf>,
}

/// How unknown host keys are treated (`StrictHostKeyChecking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrictMode {
    /// Refuse unknown keys (the default, and what `ask` means without a human).
    Yes,
    /// Learn an unknown key by appending it; refuse a changed key.
    AcceptNew,
    /// Accept unknown keys without learning them; still refuse a changed key. Only when
    /// the config says `no` explicitly.
    No,
}

/// Default `ConnectTimeout` when the config gives none.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default keepalive interval: with [`DEFAULT_KEEPALIVE_MAX`], a silently dead link is
/// noticed after 2 s × (3 + 1) = 8 s.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// Default number of unanswered keepalives tolerated.
pub const DEFAULT_KEEPALIVE_MAX: usize = 3;

/// A resolved destination: everything needed to connect, with no further config lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The host as the user typed it (alias or `[user@]host`).
    pub alias: String,
    /// The name or address to connect to (`HostName`, or the alias).
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
    /// Bound on TCP connect, key exchange and authentication round trips.
    pub connect_timeout: Duration,
    /// Keepalive interval; `None` when the config sets `ServerAliveInterval 0`.
    pub keepalive_interval: Option<Duration>,
    /// Unanswered keepalives tolerated before the connection is declared lost.
    pub keepalive_max: usize,
    /// Jump hosts, first hop first; each hop has no jumps of its own (flattened).
    pub jumps: Vec<Destination>,
    /// `display()` text, fixed at resolution.
    display: String,
}

impl Destination {
    /// The host as the ledger names it: what the user typed, plus `:port` when `-p` was
    /// given (e.g. `target1`, `user@host:2222`).
    pub fn display(&self) -> String {
        self.display.clone()
    }

    /// The time after which a silently dead link is reported, or `None` without keepalives.
    pub fn loss_budget(&self) -> Option<Duration> {
        self.keepalive_interval
            .map(|i| i * (self.keepalive_max as u32 + 1))
    }

    /// The name looked up in known_hosts (`host` or `[host]:port`).
    pub fn known_hosts_name(&self) -> String {
        let host = self.host_key_alias.as_deref().unwrap_or(&self.hostname);
        super::known_hosts::lookup_name(host, self.port)
    }

    /// The key identifying one SSH connection: user, address, port and jump path.
    pub fn connection_key(&self) -> String {
        let mut key = format!("{}@{}:{}", self.user, self.hostname, self.port);
        for j in &self.jumps {
            key.push_str(&format!(" via {}@{}:{}", j.user, j.hostname, j.port));
        }
        key
    }
}

/// Maximum ProxyJump recursion (a hop whose own config names further hops).
const MAX_JUMP_DEPTH: usize = 8;

/// Characters OpenSSH refuses in a host or user name typed on the command line (they
/// can only be a mistake or an injection into `%h`/`%r` of a ProxyCommand or Match exec).
const FORBIDDEN_IN_DESTINATION: &str = "'`\"$\\;&<>|(){}";

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
            .map(|c| format!("it contains `{c}`"))
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

/// Resolves `spec` through the ssh config. Errors have stage `Resolve`: nothing was sent.
pub fn resolve(spec: &HostSpec) -> Result<Destination, ConnectError> {
    check_destination(&spec.host).map_err(|m| ConnectError::new(ConnectStage::Resolve, m))?;
    let (path, missing_ok) = match &spec.config_path {
        Some(p) => (p.clone(), false),
        None => match home_dir() {
            Some(home) => (home.join(".ssh/config"), true),
            None => (PathBuf::from("/nonexistent"), true),
        },
    };
    let config = SshConfig::load(&path, missing_ok)
        .map_err(|e| ConnectError::new(ConnectStage::Resolve, e.to_string()))?;
    resolve_with(&config, spec, 0)
}

/// Resolves `spec` with an already parsed config.
pub fn resolve_with(
    config: &SshConfig,
    spec: &HostSpec,
    depth: usize,
) -> Result<Destination, ConnectError> {
    let fail = |m: String| ConnectError::new(ConnectStage::Resolve, m);
    let typed = spec.host.trim();
    if typed.is_empty() {
        return Err(fail("empty host name; give an alias or [user@]host".into()));
    }
    let (cli_user, alias) = match typed.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() && !h.is_empty() => (Some(u.to_string()), h.to_string()),
        Some(_) => return Err(fail(format!("`{typed}` is not [user@]host"))),
        None => (None, typed.to_string()),
    };
    if alias.starts_with('-') || alias.contains(char::is_whitespace) {
        return Err(fail(format!("`{alias}` is not a valid host name")));
    }
    let o = config.lookup(&alias);
    if o.proxy_command.as_deref().is_some_and(|c| c != "none") {
        return Err(fail(format!(
            "ProxyCommand ({}) is not supported; use ProxyJump",
            o.origin("proxycommand")
        )));
    }
    let local_user = local_user();
    let port = match spec.port {
        Some(p) => p,
        None => match &o.port {
            Some(p) => p.parse().map_err(|_| {
                fail(format!(
                    "{}: Port `{p}` is not a port number",
                    o.origin("port")
                ))
            })?,
            None => 22,
        },
    };
    let user = cli_user
        .or_else(|| o.user.clone())
        .or_else(|| local_user.clone())
        .ok_or_else(|| fail("cannot tell the local user name: set USER or use user@host".into()))?;
    let mut tokens = Tokens {
        host: alias.clone(),
        alias: alias.clone(),
        port,
        remote_user: user.clone(),
        local_user: local_user.unwrap_or_default(),
    };
    let hostname = match &o.hostname {
        Some(h) => {
            expand_tokens(h, &tokens).map_err(|e| fail(format!("{}: {e}", o.origin("hostname"))))?
        }
        None => alias.clone(),
    };
    tokens.host = hostname.clone();
    let expand = |s: &str, key: &str| {
        expand_tokens(s, &tokens).map_err(|e| fail(format!("{}: {e}", o.origin(key))))
    };

    let mut identities: Vec<PathBuf> = spec
        .identities
        .iter()
        .map(|p| PathBuf::from(expand_tilde(&p.to_string_lossy())))
        .collect();
    for f in &o.identity_files {
        identities.push(PathBuf::from(expand(f, "identityfile")?));
    }
    let identities_explicit = !identities.is_empty();
    if identities.is_empty() {
        if let Some(home) = home_dir() {
            for name in ["id_rsa", "id_ecdsa", "id_ed25519"] {
                identities.push(home.join(".ssh").join(name));
            }
        }
    }
    identities.dedup();

    let agent_socket = match o.identity_agent.as_deref() {
        Some("none") => None,
        Some("SSH_AUTH_SOCK") | None => std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        Some(p) => Some(PathBuf::from(expand(p, "identityagent")?)),
    };

    let files = |list: &Option<Vec<String>>, key: &str, defaults: Vec<PathBuf>| match list {
        None => Ok(defaults),
        Some(l) if l.iter().any(|f| f == "none") => Ok(Vec::new()),
        Some(l) => l
            .iter()
            .map(|f| expand(f, key).map(PathBuf::from))
            .collect(),
    };
    let home_ssh = home_dir().map(|h| h.join(".ssh"));
    let known_hosts = files(
        &o.user_known_hosts,
        "userknownhostsfile",
        home_ssh
            .iter()
            .flat_map(|d| [d.join("known_hosts"), d.join("known_hosts2")])
            .collect(),
    )?;
    let global_known_hosts = files(
        &o.global_known_hosts,
        "globalknownhostsfile",
        vec![
            PathBuf::from("/etc/ssh/ssh_known_hosts"),
            PathBuf::from("/etc/ssh/ssh_known_hosts2"),
        ],
    )?;

    let strict = match o
        .strict_host_key_checking
        .as_deref()
        .map(str::to_ascii_lowercase)
    {
        None => StrictMode::Yes,
        Some(v) => match v.as_str() {
            "yes" | "ask" | "true" => StrictMode::Yes,
            "accept-new" => StrictMode::AcceptNew,
            "no" | "off" | "false" => StrictMode::No,
            other => {
                return Err(fail(format!(
                    "{}: StrictHostKeyChecking `{other}` is not yes, accept-new or no",
                    o.origin("stricthostkeychecking")
                )))
            }
        },
    };
    let yes_no = |v: &Option<String>| v.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("yes"));

    let secs = |v: &Option<String>, key: &str| -> Result<Option<u64>, ConnectError> {
        v.as_deref()
            .map(|s| {
                s.parse::<u64>().map_err(|_| {
                    fail(format!(
                        "{}: `{s}` is not a number of seconds",
                        o.origin(key)
                    ))
                })
            })
            .transpose()
    };
    let connect_timeout = match secs(&o.connect_timeout, "connecttimeout")? {
        Some(0) | None => DEFAULT_CONNECT_TIMEOUT,
        Some(s) => Duration::from_secs(s),
    };
    let keepalive_interval = match secs(&o.server_alive_interval, "serveraliveinterval")? {
        None => Some(DEFAULT_KEEPALIVE_INTERVAL),
        Some(0) => {
            tracing::warn!(
                "{}: ServerAliveInterval 0 disables keepalives; a silently dead link will hang",
                o.origin("serveraliveinterval")
            );
            None
        }
        Some(s) => Some(Duration::from_secs(s)),
    };
    let keepalive_max = match secs(&o.server_alive_count_max, "serveralivecountmax")? {
        // OpenSSH counts keepalives sent without answer; russh compares with `>` after
        // sending, so the same number gives the same budget: interval × (max + 1).
        Some(n) => n.max(1) as usize,
        None => DEFAULT_KEEPALIVE_MAX,
    };

    let jump_text = spec.jump.clone().or_else(|| o.proxy_jump.clone());
    let mut jumps = Vec::new();
    if let Some(text) = jump_text.filter(|t| t != "none") {
        if depth >= MAX_JUMP_DEPTH {
            return Err(fail(format!(
                "ProxyJump chain deeper than {MAX_JUMP_DEPTH} hops at `{alias}` (a loop?)"
            )));
        }
        for (i, hop) in text.split(',').map(str::trim).enumerate() {
            let (host, port) = split_hop(hop).map_err(fail)?;
            let hop_spec = HostSpec {
                host,
                port,
                identities: Vec::new(),
                // Only the first hop may itself be reached through its own ProxyJump.
                jump: if i == 0 { None } else { Some("none".into()) },
                config_path: None,
            };
            let mut hop_dest = resolve_with(config, &hop_spec, depth + 1)?;
            jumps.append(&mut hop_dest.jumps);
            jumps.push(hop_dest);
        }
    }

    let display = match spec.port {
        Some(p) => format!("{typed}:{p}"),
        None => typed.to_string(),
    };
    Ok(Destination {
        alias,
        hostname,
        port,
        user,
        identities,
        identities_explicit,
        identities_only: yes_no(&o.identities_only),
        agent_socket,
        known_hosts,
        global_known_hosts,
        host_key_alias: o.host_key_alias.clone(),
        hash_known_hosts: yes_no(&o.hash_known_hosts),
        strict,
        connect_timeout,
        keepalive_interval,
        keepalive_max,
        jumps,
        display,
    })
}

/// Splits a ProxyJump hop `[user@]host[:port]` (IPv6 as `[addr]:port`).
fn split_hop(hop: &str) -> Result<(String, Option<u16>), String> {
    if hop.is_empty() {
        return Err("empty ProxyJump hop; write [user@]host[:port][,...]".into());
    }
    let bad = || format!("ProxyJump hop `{hop}` has a bad port; write [user@]host[:port]");
    let (user, rest) = match hop.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, hop),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, after) = inner.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p.parse().map_err(|_| bad())?)),
            None if after.is_empty() => (h, None),
            None => return Err(bad()),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(p.parse().map_err(|_| bad())?)),
            None => (rest, None),
        }
    };
    let host = match user {
        Some(u) => format!("{u}@{host}"),
        None => host.to_string(),
    };
    Ok((host, port))
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
        assert_eq!(e.stage, ConnectStage::Resolve);
        assert!(e.message.contains("loop"), "{}", e.message);
    }

    #[test]
    fn bad_values_name_file_and_line() {
        let c = cfg("Host a\n Port http\n");
        let e = resolve_with(&c, &spec("a"), 0).unwrap_err();
        assert_eq!(e.message, "cfg:2: Port `http` is not a port number");
        let c = cfg("Host a\n StrictHostKeyChecking maybe\n");
        assert!(resolve_with(&c, &spec("a"), 0)
            .unwrap_err()
            .message
            .contains("cfg:2"));
    }

    #[test]
    fn none_disables_known_hosts_files() {
        let c = cfg("UserKnownHostsFile none\nGlobalKnownHostsFile none\n");
        let d = resolve_with(&c, &spec("a"), 0).unwrap();
        assert!(d.known_hosts.is_empty() && d.global_known_hosts.is_empty());
    }
}
