//! The ssh_config reader: parses OpenSSH client configuration files (with `Include`,
//! `Host` and `Match`) into blocks, and applies them to one destination in file order
//! with OpenSSH's first-value-wins rule, the way `ssh` 9.2 does in its first pass.
//!
//! Written here rather than borrowed because the published parsers reject global options,
//! lack `Key=Value`, `Include` or leak `Match` bodies into the previous block (docs/findings.md#ssh-config-parsers).
//! What each keyword means to opmark (used, ignored, refused) is the table in
//! [`keyword_role`]; `tests/it/ssh_config.rs` compares the result with `ssh -G`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::pattern::{pattern_list, wildcard_match};

/// A malformed, unreadable or unsupported configuration.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read ssh config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line could not be parsed, or asks for something opmark does not do.
    #[error("{origin}: {message}")]
    Line {
        /// Where.
        origin: Origin,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ConfigError {
    fn at(origin: &Origin, message: impl Into<String>) -> ConfigError {
        ConfigError::Line {
            origin: origin.clone(),
            message: message.into(),
        }
    }
}

/// Where an option value came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file; [`COMMAND_LINE`] for `-o` and the other flags.
    pub path: PathBuf,
    /// 1-based line number (for the command line: the position of the `-o`).
    pub line: usize,
}

/// The pseudo-path of options given on the command line.
pub const COMMAND_LINE: &str = "<command line>";

impl Origin {
    /// The n-th option given on the command line.
    pub fn command_line(n: usize) -> Origin {
        Origin {
            path: PathBuf::from(COMMAND_LINE),
            line: n,
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path == Path::new(COMMAND_LINE) {
            write!(f, "command-line option {}", self.line)
        } else {
            write!(f, "{}:{}", self.path.display(), self.line)
        }
    }
}

/// One option line: lower-cased keyword, its arguments (quotes removed) and the raw text
/// after the keyword (ProxyCommand and friends take the rest of the line verbatim).
#[derive(Debug, Clone)]
pub struct OptionLine {
    /// Lower-cased keyword.
    pub key: String,
    /// Arguments, quotes removed.
    pub args: Vec<String>,
    /// The text after the keyword and its separator.
    pub raw: String,
    /// Where it was written.
    pub origin: Origin,
}

impl OptionLine {
    /// The arguments joined by single spaces.
    pub fn value(&self) -> String {
        self.args.join(" ")
    }
}

/// Which file a config is, for relative `Include`s: a user config (`~/.ssh/config` or
/// `-F`) resolves them under `~/.ssh`, the system config under its own directory
/// (`/etc/ssh`), as OpenSSH does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    /// `~/.ssh/config` or `-F FILE`.
    User,
    /// `/etc/ssh/ssh_config` (or `OPMARK_SYSTEM_SSH_CONFIG`).
    System,
}

/// One `Match` criterion.
#[derive(Debug, Clone)]
struct Criterion {
    negate: bool,
    kind: CriterionKind,
    arg: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CriterionKind {
    All,
    Canonical,
    Host,
    OriginalHost,
    User,
    LocalUser,
    Exec,
}

/// When a block applies. Stored once and referred to by index, so that a condition
/// shared by the blocks of an included file is evaluated once, at its own line, as
/// OpenSSH does (re-evaluating `Match user` after an included `User` would differ).
#[derive(Debug, Clone)]
enum Condition {
    /// A `Host` line's patterns.
    Host(Vec<String>),
    /// A `Match` line's criteria, all of which must hold.
    Match(Vec<Criterion>, Origin),
}

#[derive(Debug, Clone)]
struct Block {
    conditions: Vec<usize>,
    lines: Vec<OptionLine>,
}

/// A parsed ssh_config, with its `Include`s expanded in place.
#[derive(Debug, Clone, Default)]
pub struct SshConfig {
    conditions: Vec<Condition>,
    blocks: Vec<Block>,
}

/// Maximum `Include` nesting, as OpenSSH (`READCONF_MAX_DEPTH`).
const MAX_INCLUDE_DEPTH: usize = 16;

/// What a keyword means to opmark. Every keyword OpenSSH 9.2 (with Debian's GSSAPI
/// patch) knows is listed; anything else is an error, as in `ssh`, unless `IgnoreUnknown`
/// names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Resolved and used by opmark.
    Used,
    /// Does not change where or how the connection is made (or opmark's behaviour is
    /// already the stricter one): accepted and ignored.
    Ignored,
    /// Would change where or how the connection is made and opmark does not do it: an
    /// error naming the option and its line when set (to anything but the harmless
    /// values in [`harmless_value`]).
    Refused(&'static str),
    /// Structure (`Host`, `Match`, `Include`, `IgnoreUnknown`).
    Structure,
}

/// The keyword table. Keep it in one place: this is what "never silently ignored" means.
pub fn keyword_role(key: &str) -> Option<Role> {
    use Role::*;
    Some(match key {
        // Resolved by opmark (see destination.rs).
        "hostname" | "port" | "user" | "identityfile" | "identityfile2" | "identitiesonly"
        | "identityagent" | "certificatefile" | "userknownhostsfile" | "globalknownhostsfile"
        | "hostkeyalias" | "stricthostkeychecking" | "hashknownhosts" | "connecttimeout"
        | "serveraliveinterval" | "serveralivecountmax" | "proxyjump" | "batchmode"
        | "addressfamily" | "connectionattempts" | "proxycommand" | "canonicalizehostname" => {
            Used
        }
        "host" | "match" | "include" | "ignoreunknown" => Structure,
        // Would change where or how opmark connects, or what runs; not built.
        "bindaddress" => Refused("opmark cannot bind the local address of its connection"),
        "bindinterface" => Refused("opmark cannot bind its connection to an interface"),
        "hostbasedauthentication" => Refused("opmark does not do host-based authentication"),
        "tunnel" => Refused("opmark does not forward tun/tap devices"),
        "remotecommand" => Refused("opmark runs its own command; a RemoteCommand would replace it"),
        "sessiontype" => Refused("opmark always runs a command session"),
        "pubkeyauthentication" => Refused("opmark authenticates only with public keys"),
        "pkcs11provider" | "smartcarddevice" => Refused("opmark cannot use PKCS#11 keys"),
        "securitykeyprovider" => Refused("opmark cannot use a security key middleware"),
        "knownhostscommand" => Refused("opmark does not run a KnownHostsCommand to find host keys"),
        "proxyusefdpass" => Refused("opmark uses the ProxyCommand's stdin and stdout as the connection; it cannot take a file descriptor passed by the proxy"),
        "revokedhostkeys" => Refused("opmark does not read a RevokedHostKeys file; put revoked keys in known_hosts as @revoked lines"),
        // Accepted, no effect on where or how opmark connects.
        "addkeystoagent" | "canonicalizefallbacklocal" | "canonicalizemaxdots" | "checkhostip"
        | "clearallforwardings" | "compression" | "controlmaster" | "controlpath"
        | "controlpersist" | "dynamicforward" | "enableescapecommandline" | "enablesshkeysign"
        | "escapechar" | "exitonforwardfailure" | "fingerprinthash"
        | "forkafterauthentication" | "forwardagent" | "forwardx11" | "forwardx11timeout"
        | "forwardx11trusted" | "gatewayports" | "ipqos" | "kbdinteractiveauthentication"
        | "kbdinteractivedevices" | "challengeresponseauthentication" | "skeyauthentication"
        | "tisauthentication" | "dsaauthentication" | "localcommand" | "localforward"
        | "loglevel" | "logverbose" | "nohostauthenticationforlocalhost"
        | "numberofpasswordprompts" | "passwordauthentication" | "permitlocalcommand"
        | "permitremoteopen" | "protocol" | "rekeylimit"
        | "remoteforward" | "requesttty" | "requiredrsasize"
        // Canonicalisation itself (CanonicalizeHostname) is refused unless off; with it
        // off these have no effect in ssh either.
        | "canonicaldomains" | "canonicalizepermittedcnames"
        // opmark sends no environment variables, SendEnv's or SetEnv's: the command gets
        // the environment the host's login gives it, as under ssh to a server whose
        // AcceptEnv takes none of them (docs/ssh-config.md#ssh-configuration).
        | "sendenv" | "setenv"
        | "stdinnull" | "streamlocalbindmask" | "streamlocalbindunlink" | "syslogfacility"
        | "tcpkeepalive" | "keepalive" | "tunneldevice" | "updatehostkeys" | "verifyhostkeydns"
        | "visualhostkey" | "xauthlocation" => Ignored,
        // The security choices, honoured through russh's preferred lists or refused
        // (src/ssh/algorithms.rs): never dropped.
        "ciphers" | "macs" | "kexalgorithms" | "hostkeyalgorithms" | "pubkeyacceptedalgorithms"
        | "pubkeyacceptedkeytypes" | "preferredauthentications" => Used,
        // Host-based authentication is refused above, so its algorithm lists choose
        // nothing. CASignatureAlgorithms is accepted and not applied (docs/ssh-config.md#ssh-configuration).
        "casignaturealgorithms" | "hostbasedacceptedalgorithms" | "hostbasedkeytypes" => {
            Ignored
        }
        // GSSAPI (Debian's patch adds the kex ones; Debian's own ssh_config sets
        // GSSAPIAuthentication yes): an extra authentication method ssh may try.
        "gssapiauthentication" | "gssapidelegatecredentials" | "gssapikeyexchange"
        | "gssapiclientidentity" | "gssapiserveridentity" | "gssapirenewalforcesrekey"
        | "gssapitrustdns" | "gssapikexalgorithms" => Ignored,
        // Deprecated or unsupported in OpenSSH itself: it ignores them too.
        "cipher" | "fallbacktorsh" | "globalknownhostsfile2" | "rhostsauthentication"
        | "userknownhostsfile2" | "useroaming" | "usersh" | "useprivilegedport"
        | "afstokenpassing" | "kerberosauthentication" | "kerberostgtpassing"
        | "rsaauthentication" | "rhostsrsaauthentication" | "compressionlevel" => Ignored,
        _ => return None,
    })
}

/// Values of a refused keyword that ask for nothing opmark lacks (OpenSSH's defaults).
fn harmless_value(key: &str, value: &str) -> bool {
    let v = value.to_ascii_lowercase();
    match key {
        "hostbasedauthentication" | "tunnel" | "proxyusefdpass" => {
            matches!(v.as_str(), "no" | "false")
        }
        "pubkeyauthentication" => matches!(v.as_str(), "yes" | "true" | "unbound" | "host-bound"),
        "remotecommand" | "pkcs11provider" | "smartcarddevice" | "knownhostscommand"
        | "revokedhostkeys" => v == "none",
        "sessiontype" => v == "default",
        "securitykeyprovider" => v == "internal",
        _ => false,
    }
}

/// Keywords that take exactly one argument in OpenSSH (extra words are an error there).
fn single_valued(key: &str) -> bool {
    matches!(
        key,
        "hostname"
            | "port"
            | "user"
            | "identityfile"
            | "identityfile2"
            | "certificatefile"
            | "identitiesonly"
            | "identityagent"
            | "stricthostkeychecking"
            | "hashknownhosts"
            | "hostkeyalias"
            | "connecttimeout"
            | "serveraliveinterval"
            | "serveralivecountmax"
            | "batchmode"
            | "addressfamily"
            | "connectionattempts"
            | "canonicalizehostname"
    )
}

impl SshConfig {
    /// Reads and parses `path`. A missing file gives an empty config only when
    /// `missing_ok` (the default `~/.ssh/config` need not exist; an explicit `-F` must).
    pub fn load(path: &Path, kind: ConfigKind, missing_ok: bool) -> Result<SshConfig, ConfigError> {
        let mut config = SshConfig::default();
        config.load_into(path, kind, missing_ok)?;
        Ok(config)
    }

    /// Appends the blocks of `path` after those already read (OpenSSH reads the user's
    /// config, then the system's, into one first-value-wins pass).
    pub fn load_into(
        &mut self,
        path: &Path,
        kind: ConfigKind,
        missing_ok: bool,
    ) -> Result<(), ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let base = include_base(path, kind);
        self.parse_into(&text, path, &base, &[], 0)
    }

    /// Parses config text as a user config; `path` is used for messages.
    pub fn parse(text: &str, path: &Path) -> Result<SshConfig, ConfigError> {
        let mut config = SshConfig::default();
        let base = include_base(path, ConfigKind::User);
        config.parse_into(text, path, &base, &[], 0)?;
        Ok(config)
    }

    fn parse_into(
        &mut self,
        text: &str,
        path: &Path,
        include_base: &Path,
        outer: &[usize],
        depth: usize,
    ) -> Result<(), ConfigError> {
        let mut current = Block {
            conditions: outer.to_vec(),
            lines: Vec::new(),
        };
        for (index, raw) in text.lines().enumerate() {
            let origin = Origin {
                path: path.to_path_buf(),
                line: index + 1,
            };
            let Some(line) = split_line(raw, &origin)? else {
                continue;
            };
            match line.key.as_str() {
                "host" => {
                    if line.args.is_empty() {
                        return Err(ConfigError::at(
                            &origin,
                            "`Host` needs at least one pattern",
                        ));
                    }
                    let c = self.condition(Condition::Host(line.args));
                    self.blocks.push(std::mem::replace(
                        &mut current,
                        Block {
                            conditions: with(outer, c),
                            lines: Vec::new(),
                        },
                    ));
                }
                "match" => {
                    let criteria = parse_match(&line.args, &origin)?;
                    let c = self.condition(Condition::Match(criteria, origin));
                    self.blocks.push(std::mem::replace(
                        &mut current,
                        Block {
                            conditions: with(outer, c),
                            lines: Vec::new(),
                        },
                    ));
                }
                "include" => {
                    if line.args.is_empty() {
                        return Err(ConfigError::at(&origin, "`Include` needs a file name"));
                    }
                    if depth >= MAX_INCLUDE_DEPTH {
                        return Err(ConfigError::at(
                            &origin,
                            format!(
                                "`Include` nested deeper than {MAX_INCLUDE_DEPTH} levels (a loop?)"
                            ),
                        ));
                    }
                    // Options after the Include still belong to the enclosing block; the
                    // included file's own `Host` lines must not swallow them.
                    let conditions = current.conditions.clone();
                    self.blocks.push(std::mem::replace(
                        &mut current,
                        Block {
                            conditions: conditions.clone(),
                            lines: Vec::new(),
                        },
                    ));
                    for arg in &line.args {
                        for file in include_files(arg, include_base) {
                            let text = match std::fs::read_to_string(&file) {
                                Ok(text) => text,
                                // OpenSSH ignores Include patterns that match nothing.
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                                Err(source) => {
                                    return Err(ConfigError::Read { path: file, source })
                                }
                            };
                            self.parse_into(&text, &file, include_base, &conditions, depth + 1)?;
                        }
                    }
                }
                key => {
                    if line.args.is_empty() && keyword_role(key).is_some() {
                        return Err(ConfigError::at(&origin, format!("`{key}` needs a value")));
                    }
                    if single_valued(key) && line.args.len() > 1 {
                        return Err(ConfigError::at(
                            &origin,
                            format!("`{key}` takes one value; quote a value that contains spaces"),
                        ));
                    }
                    current.lines.push(line)
                }
            }
        }
        self.blocks.push(current);
        Ok(())
    }

    fn condition(&mut self, c: Condition) -> usize {
        self.conditions.push(c);
        self.conditions.len() - 1
    }

    /// Applies every block to `options` in file order, as OpenSSH's first pass does:
    /// a block's `Host`/`Match` is evaluated when its line is reached, against the
    /// options known at that point (so `Match host` sees a `HostName` set above it).
    pub fn apply(
        &self,
        ctx: &MatchContext,
        options: &mut ConfigOptions,
    ) -> Result<(), ConfigError> {
        let mut evaluated: Vec<Option<bool>> = vec![None; self.conditions.len()];
        for block in &self.blocks {
            let mut active = true;
            // Outer conditions first, stopping at the first false one: a `Match exec`
            // inside an Include of a block that does not apply is not run (ssh runs it
            // and ignores the answer; only the side effect differs).
            for &c in &block.conditions {
                let result = match evaluated[c] {
                    Some(r) => r,
                    None => {
                        let r = match &self.conditions[c] {
                            Condition::Host(patterns) => host_line_matches(&ctx.host_arg, patterns),
                            Condition::Match(criteria, origin) => {
                                eval_match(criteria, origin, ctx, options)?
                            }
                        };
                        evaluated[c] = Some(r);
                        r
                    }
                };
                if !result {
                    active = false;
                    break;
                }
            }
            for line in &block.lines {
                // Unknown keywords are errors even in blocks that do not apply (as ssh).
                options.check_known(line)?;
                if active {
                    options.take(line)?;
                }
            }
        }
        Ok(())
    }
}

fn with(outer: &[usize], c: usize) -> Vec<usize> {
    let mut v = outer.to_vec();
    v.push(c);
    v
}

/// Where relative `Include`s of a file resolve.
fn include_base(path: &Path, kind: ConfigKind) -> PathBuf {
    match kind {
        ConfigKind::User => home_dir()
            .map(|h| h.join(".ssh"))
            .unwrap_or_else(|| path.parent().unwrap_or(Path::new(".")).to_path_buf()),
        ConfigKind::System => path.parent().unwrap_or(Path::new("/etc/ssh")).to_path_buf(),
    }
}

/// Parses a `Match` line's criteria as OpenSSH 9.2's `match_cfg_line` accepts them.
fn parse_match(args: &[String], origin: &Origin) -> Result<Vec<Criterion>, ConfigError> {
    if args.is_empty() {
        return Err(ConfigError::at(
            origin,
            "`Match` needs at least one criterion",
        ));
    }
    let mut criteria = Vec::new();
    let mut attributes = 0;
    let mut i = 0;
    while i < args.len() {
        // `criterion=argument` is `criterion argument` (OpenSSH's own regress tests
        // write `Match host=b`).
        let (word, inline) = match args[i].split_once('=') {
            Some((w, a)) => (w.to_string(), Some(a.to_string())),
            None => (args[i].clone(), None),
        };
        let word = &word;
        let (negate, name) = match word.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, word.as_str()),
        };
        let kind = match name.to_ascii_lowercase().as_str() {
            "all" => {
                if attributes > 1 || i + 1 < args.len() {
                    return Err(ConfigError::at(
                        origin,
                        format!("`Match {word}` cannot be combined with other Match criteria"),
                    ));
                }
                criteria.push(Criterion {
                    negate,
                    kind: CriterionKind::All,
                    arg: String::new(),
                });
                return Ok(criteria);
            }
            "canonical" => {
                attributes += 1;
                criteria.push(Criterion {
                    negate,
                    kind: CriterionKind::Canonical,
                    arg: String::new(),
                });
                i += 1;
                continue;
            }
            "final" => {
                return Err(ConfigError::at(
                    origin,
                    "`Match final` (a second configuration pass after canonicalisation) is not supported by opmark; use `Match host` or `Host` instead",
                ))
            }
            "host" => CriterionKind::Host,
            "originalhost" => CriterionKind::OriginalHost,
            "user" => CriterionKind::User,
            "localuser" => CriterionKind::LocalUser,
            "exec" => CriterionKind::Exec,
            "localnetwork" => {
                return Err(ConfigError::at(
                    origin,
                    "`Match localnetwork` is not supported by opmark; use `Match exec` or `Host`",
                ))
            }
            _ => {
                return Err(ConfigError::at(
                    origin,
                    format!("unsupported Match criterion `{name}`; opmark knows all, canonical, host, originalhost, user, localuser and exec"),
                ))
            }
        };
        attributes += 1;
        let (arg, used) = match inline {
            Some(a) => (Some(a), 1),
            None => (args.get(i + 1).cloned(), 2),
        };
        let Some(arg) = arg.filter(|a| !a.is_empty()) else {
            return Err(ConfigError::at(
                origin,
                format!("`Match {name}` needs an argument"),
            ));
        };
        criteria.push(Criterion { negate, kind, arg });
        i += used;
    }
    Ok(criteria)
}

/// What `Match` criteria are tested against, besides the options read so far.
#[derive(Debug, Clone, Default)]
pub struct MatchContext {
    /// The host as given on the command line, after `user@` (OpenSSH's `host_arg`).
    pub host_arg: String,
    /// The local user name (`%u`, `Match localuser`, the default remote user).
    pub local_user: String,
}

/// `Host` line semantics: each word is one pattern, matched case-sensitively against
/// the host as typed; any matching negated pattern makes the block inapplicable.
fn host_line_matches(host: &str, patterns: &[String]) -> bool {
    let mut matched = false;
    for p in patterns {
        let (negated, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p.as_str()),
        };
        if wildcard_match(p, host) {
            if negated {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// Evaluates one `Match` line like `match_cfg_line` in OpenSSH 9.2's first pass.
fn eval_match(
    criteria: &[Criterion],
    origin: &Origin,
    ctx: &MatchContext,
    o: &ConfigOptions,
) -> Result<bool, ConfigError> {
    // The host as known so far: a HostName seen above, with %h expanded.
    let host = match o.value("hostname") {
        Some(h) => expand_percent(&h, &[('h', ctx.host_arg.as_str())])
            .map_err(|e| ConfigError::at(origin, format!("in HostName: {e}")))?,
        None => ctx.host_arg.clone(),
    };
    let ruser = o.value("user").unwrap_or_else(|| ctx.local_user.clone());
    let mut result = true;
    for c in criteria {
        let matched = match c.kind {
            CriterionKind::All => {
                if result {
                    result = !c.negate;
                }
                continue;
            }
            // opmark makes one pass and never canonicalises (CanonicalizeHostname is
            // refused, `Match final` too), so this is OpenSSH's first-pass answer.
            CriterionKind::Canonical => false,
            CriterionKind::Host => pattern_list(&host.to_ascii_lowercase(), &c.arg, true) == 1,
            CriterionKind::OriginalHost => {
                pattern_list(&ctx.host_arg.to_ascii_lowercase(), &c.arg, true) == 1
            }
            CriterionKind::User => pattern_list(&ruser, &c.arg, false) == 1,
            CriterionKind::LocalUser => pattern_list(&ctx.local_user, &c.arg, false) == 1,
            CriterionKind::Exec => {
                if !result {
                    // OpenSSH skips the command once an earlier criterion failed.
                    continue;
                }
                let port = o.value("port").unwrap_or_else(|| "22".into());
                let this_host = local_hostname();
                let short = this_host.split('.').next().unwrap_or("").to_string();
                let keyalias = o.value("hostkeyalias").unwrap_or_else(|| host.clone());
                let home = home_dir()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                let uid = current_uid().to_string();
                let hash = connection_hash(&this_host, &host, &port, &ruser);
                let cmd = expand_percent(
                    &c.arg,
                    &[
                        ('C', hash.as_str()),
                        ('L', short.as_str()),
                        ('d', home.as_str()),
                        ('h', host.as_str()),
                        ('k', keyalias.as_str()),
                        ('l', this_host.as_str()),
                        ('n', ctx.host_arg.as_str()),
                        ('p', port.as_str()),
                        ('r', ruser.as_str()),
                        ('u', ctx.local_user.as_str()),
                        ('i', uid.as_str()),
                    ],
                )
                .map_err(|e| ConfigError::at(origin, format!("in Match exec: {e}")))?;
                run_match_exec(&cmd).map_err(|e| ConfigError::at(origin, e))?
            }
        };
        if matched == c.negate {
            result = false;
        }
    }
    Ok(result)
}

/// Runs a `Match exec` command as OpenSSH does: `$SHELL -c CMD` (else `/bin/sh`),
/// stdin and stdout on /dev/null, stderr inherited. True when it exits 0.
fn run_match_exec(cmd: &str) -> Result<bool, String> {
    let shell = std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into());
    let status = std::process::Command::new(&shell)
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| {
            format!(
                "Match exec: cannot run `{cmd}` with {}: {e}",
                Path::new(&shell).display()
            )
        })?;
    match status.code() {
        Some(code) => Ok(code == 0),
        None => Err(format!("Match exec `{cmd}` was killed by a signal")),
    }
}

/// OpenSSH's `%C`: hex SHA-1 of local host name, remote host, port and remote user.
pub fn connection_hash(this_host: &str, host: &str, port: &str, user: &str) -> String {
    let data = format!("{this_host}{host}{port}{user}");
    let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, data.as_bytes());
    hex::encode(d.as_ref())
}

/// The local host name (`%l`), as `gethostname(2)` gives it (the kernel's UTS name,
/// read from /proc: no unsafe libc call).
pub fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Files named by one `Include` argument: `~` expanded, relative to `base`, with `*`,
/// `?` wildcards in any path component, sorted (as glob(3)).
fn include_files(arg: &str, base: &Path) -> Vec<PathBuf> {
    let expanded = expand_tilde(arg);
    let path = PathBuf::from(&expanded);
    let path = if path.is_absolute() {
        path
    } else {
        base.join(path)
    };
    let mut found = vec![PathBuf::from("/")];
    for comp in path.components().skip(1) {
        let name = comp.as_os_str().to_string_lossy().into_owned();
        let mut next = Vec::new();
        for dir in &found {
            if name.contains(['*', '?']) {
                let mut matches: Vec<PathBuf> = std::fs::read_dir(dir)
                    .map(|entries| {
                        entries
                            .filter_map(|e| e.ok())
                            .filter(|e| {
                                let n = e.file_name().to_string_lossy().into_owned();
                                // glob(3) does not match hidden files with a wildcard.
                                !n.starts_with('.') && wildcard_match(&name, &n)
                            })
                            .map(|e| e.path())
                            .collect()
                    })
                    .unwrap_or_default();
                matches.sort();
                next.extend(matches);
            } else {
                next.push(dir.join(&name));
            }
        }
        found = next;
    }
    found
}

/// Splits one config line into an [`OptionLine`]. `None` for blank lines and comments.
/// Accepts `Key Value`, `Key=Value`, `Key = Value`, double quotes.
fn split_line(raw: &str, origin: &Origin) -> Result<Option<OptionLine>, ConfigError> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let key_end = line
        .find(|c: char| c.is_whitespace() || c == '=')
        .unwrap_or(line.len());
    let key = line[..key_end].to_ascii_lowercase();
    let mut rest = line[key_end..].trim_start();
    // At most one `=` separates the keyword from its value, as in OpenSSH.
    if let Some(stripped) = rest.strip_prefix('=') {
        rest = stripped.trim_start();
    }
    let args = split_args(rest).map_err(|m| ConfigError::at(origin, m))?;
    Ok(Some(OptionLine {
        key,
        args,
        raw: rest.to_string(),
        origin: origin.clone(),
    }))
}

/// Parses one `-o` option (`Key=Value` or `Key Value`) given on the command line.
pub fn parse_command_line_option(text: &str, n: usize) -> Result<OptionLine, ConfigError> {
    let origin = Origin::command_line(n);
    let Some(line) = split_line(text, &origin)? else {
        return Err(ConfigError::at(&origin, "`-o` needs Key=Value"));
    };
    if matches!(line.key.as_str(), "host" | "match" | "include") {
        return Err(ConfigError::at(
            &origin,
            format!(
                "`{}` is not allowed in -o; put it in an ssh config file",
                line.key
            ),
        ));
    }
    if line.args.is_empty() {
        return Err(ConfigError::at(
            &origin,
            format!("`-o {text}` has no value; write -o Key=Value"),
        ));
    }
    if single_valued(&line.key) && line.args.len() > 1 {
        return Err(ConfigError::at(
            &origin,
            format!(
                "`{}` takes one value; quote a value that contains spaces",
                line.key
            ),
        ));
    }
    Ok(line)
}

/// Splits arguments on whitespace, honouring double quotes; a `#` starting a word begins
/// a trailing comment.
fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        if first == '#' {
            break;
        }
        let mut word = String::new();
        let mut quoted = false;
        while let Some(&c) = chars.peek() {
            if c == '"' {
                quoted = !quoted;
                chars.next();
                continue;
            }
            if c.is_whitespace() && !quoted {
                break;
            }
            word.push(c);
            chars.next();
        }
        if quoted {
            return Err("unbalanced double quote; close the quote or remove it".into());
        }
        args.push(word);
    }
    Ok(args)
}

/// The options that apply to one destination, first value winning, as OpenSSH reads
/// them (command line first, then the user's config, then the system's).
#[derive(Debug, Clone, Default)]
pub struct ConfigOptions {
    /// First line of each single-valued keyword.
    first: HashMap<String, OptionLine>,
    /// Every `IdentityFile`, in order, duplicates dropped (these accumulate).
    pub identity_files: Vec<OptionLine>,
    /// Every `CertificateFile`, in order (these accumulate).
    pub certificate_files: Vec<OptionLine>,
}

impl ConfigOptions {
    /// Refuses a keyword OpenSSH would refuse, unless `IgnoreUnknown` (as known so far)
    /// names it.
    fn check_known(&self, line: &OptionLine) -> Result<(), ConfigError> {
        if keyword_role(&line.key).is_some() {
            // ssh refuses an unknown algorithm name on any line it reads.
            return super::algorithms::check_names(&line.key, &line.value())
                .map_err(|e| ConfigError::at(&line.origin, e));
        }
        if let Some(ignore) = self.first.get("ignoreunknown") {
            if pattern_list(&line.key, &ignore.value(), true) == 1 {
                return Ok(());
            }
        }
        Err(ConfigError::at(
            &line.origin,
            format!(
                "unknown ssh_config option `{}` (OpenSSH refuses it too); fix the spelling or list it in IgnoreUnknown",
                line.key
            ),
        ))
    }

    /// Records `line` unless an earlier value won; refuses an option opmark cannot
    /// honour.
    pub fn take(&mut self, line: &OptionLine) -> Result<(), ConfigError> {
        if let Some(Role::Refused(why)) = keyword_role(&line.key) {
            let value = line.value();
            if !harmless_value(&line.key, &value) && !self.first.contains_key(&line.key) {
                return Err(ConfigError::at(
                    &line.origin,
                    format!(
                        "`{} {value}` is not supported: {why}; remove it for this host or use ssh",
                        line.key
                    ),
                ));
            }
        }
        match line.key.as_str() {
            "identityfile" | "identityfile2" => {
                if !self.identity_files.iter().any(|l| l.args == line.args) {
                    self.identity_files.push(line.clone());
                }
            }
            "certificatefile" => self.certificate_files.push(line.clone()),
            // ProxyJump and ProxyCommand exclude each other, first one winning
            // (readconf.c: a ProxyJump sets ProxyCommand to none).
            "proxyjump" => {
                if !self.first.contains_key("proxycommand") && !self.first.contains_key("proxyjump")
                {
                    if !line.value().eq_ignore_ascii_case("none") {
                        let mut none = line.clone();
                        none.key = "proxycommand".into();
                        none.args = vec!["none".into()];
                        none.raw = "none".into();
                        self.first.insert("proxycommand".into(), none);
                    }
                    self.first.insert("proxyjump".into(), line.clone());
                }
            }
            "proxycommand" => {
                if !self.first.contains_key("proxyjump") {
                    self.first
                        .entry(line.key.clone())
                        .or_insert_with(|| line.clone());
                }
            }
            _ => {
                self.first
                    .entry(line.key.clone())
                    .or_insert_with(|| line.clone());
            }
        }
        Ok(())
    }

    /// The winning line of a keyword.
    pub fn get(&self, key: &str) -> Option<&OptionLine> {
        self.first.get(key)
    }

    /// The winning value of a keyword, arguments joined by spaces.
    pub fn value(&self, key: &str) -> Option<String> {
        self.first.get(key).map(OptionLine::value)
    }

    /// Where the winning value of `key` came from, for messages.
    pub fn origin(&self, key: &str) -> String {
        self.first
            .get(key)
            .map(|l| l.origin.to_string())
            .unwrap_or_else(|| "the command line".into())
    }
}

/// `$HOME`, if set.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Expands a leading `~`, `~/` (to `$HOME`) or `~user/` (to that user's home).
pub fn expand_tilde(s: &str) -> String {
    if s == "~" || s.starts_with("~/") {
        if let Some(home) = home_dir() {
            return format!("{}{}", home.display(), &s[1..]);
        }
    } else if let Some(rest) = s.strip_prefix('~') {
        let (name, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if let Some(home) = passwd_home(name) {
            return format!("{home}{tail}");
        }
    }
    s.to_string()
}

fn passwd_home(user: &str) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 5 && f[0] == user).then(|| f[5].to_string())
    })
}

/// `%` expansion with exactly the tokens given (OpenSSH allows a different set per
/// keyword); an unknown token or a trailing `%` is an error naming it, as in ssh.
pub fn expand_percent(s: &str, tokens: &[(char, &str)]) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(t) => match tokens.iter().find(|(k, _)| *k == t) {
                Some((_, v)) => out.push_str(v),
                None => return Err(format!("unknown token `%{t}` in `{s}`")),
            },
            None => {
                return Err(format!(
                    "`%` at the end of `{s}`; write `%%` for a percent sign"
                ))
            }
        }
    }
    Ok(out)
}

/// `${VAR}` expansion from the environment; an unset variable is an error (as ssh).
pub fn expand_env(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unterminated `${{` in `{s}`"));
        };
        let name = &after[..end];
        match std::env::var(name) {
            Ok(v) => out.push_str(&v),
            Err(_) => {
                return Err(format!(
                    "environment variable `${{{name}}}` in `{s}` is not set"
                ))
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Values for the `%` tokens of the path-like keywords (IdentityFile, CertificateFile,
/// UserKnownHostsFile, IdentityAgent, ControlPath): `%% %C %d %h %i %k %L %l %n %p %r %u`.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// `%h`: the remote host name (after `HostName`).
    pub host: String,
    /// `%n`: the host as given on the command line.
    pub alias: String,
    /// `%p`: the port.
    pub port: u16,
    /// `%r`: the remote user.
    pub remote_user: String,
    /// `%u`: the local user.
    pub local_user: String,
    /// `%k`: `HostKeyAlias` if set, else the host as given.
    pub key_alias: String,
}

/// Expands `~`, then `${VAR}`, then the `%` tokens, in OpenSSH's order for the
/// path-like keywords.
pub fn expand_path(s: &str, t: &Tokens) -> Result<String, String> {
    let s = expand_env(&expand_tilde(s))?;
    let this_host = local_hostname();
    let short = this_host.split('.').next().unwrap_or("").to_string();
    let port = t.port.to_string();
    let home = home_dir()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let uid = current_uid().to_string();
    let hash = connection_hash(&this_host, &t.host, &port, &t.remote_user);
    expand_percent(
        &s,
        &[
            ('C', hash.as_str()),
            ('d', home.as_str()),
            ('h', t.host.as_str()),
            ('i', uid.as_str()),
            ('k', t.key_alias.as_str()),
            ('L', short.as_str()),
            ('l', this_host.as_str()),
            ('n', t.alias.as_str()),
            ('p', port.as_str()),
            ('r', t.remote_user.as_str()),
            ('u', t.local_user.as_str()),
        ],
    )
}

/// The real uid of this process (ssh's `%i`, `Match localuser`); getuid cannot fail.
pub fn current_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> SshConfig {
        SshConfig::parse(text, Path::new("test_config")).unwrap()
    }

    fn lookup_as(c: &SshConfig, host: &str, local_user: &str) -> ConfigOptions {
        let ctx = MatchContext {
            host_arg: host.into(),
            local_user: local_user.into(),
        };
        let mut o = ConfigOptions::default();
        c.apply(&ctx, &mut o).unwrap();
        o
    }

    fn lookup(c: &SshConfig, host: &str) -> ConfigOptions {
        lookup_as(c, host, "me")
    }

    fn v(o: &ConfigOptions, key: &str) -> Option<String> {
        o.value(key)
    }

    #[test]
    fn first_value_wins_across_matching_blocks() {
        let c = parse(
            "Host web1\n  HostName 10.0.0.1\n  Port 2201\n\
             Host web*\n  HostName wrong\n  User deploy\n  Port 9\n\
             Host *\n  User nobody\n",
        );
        let o = lookup(&c, "web1");
        assert_eq!(v(&o, "hostname").as_deref(), Some("10.0.0.1"));
        assert_eq!(v(&o, "port").as_deref(), Some("2201"));
        assert_eq!(v(&o, "user").as_deref(), Some("deploy"));
        let o = lookup(&c, "db");
        assert_eq!(v(&o, "hostname"), None);
        assert_eq!(v(&o, "user").as_deref(), Some("nobody"));
    }

    #[test]
    fn global_options_before_first_host_apply_to_every_host() {
        let c = parse("User early\nConnectTimeout=3\n\nHost a\n  User late\n");
        let o = lookup(&c, "a");
        assert_eq!(v(&o, "user").as_deref(), Some("early"));
        assert_eq!(v(&o, "connecttimeout").as_deref(), Some("3"));
    }

    #[test]
    fn equals_forms_and_case_insensitive_keywords() {
        let c = parse("Host a\n hostname=h1\n PORT = 22022\n User= bob\n IdentityFile \"/k ey\"\n");
        let o = lookup(&c, "a");
        assert_eq!(v(&o, "hostname").as_deref(), Some("h1"));
        assert_eq!(v(&o, "port").as_deref(), Some("22022"));
        assert_eq!(v(&o, "user").as_deref(), Some("bob"));
        assert_eq!(o.identity_files[0].args, vec!["/k ey".to_string()]);
    }

    #[test]
    fn host_patterns_are_case_sensitive_words_as_in_openssh() {
        let c = parse("Host Web\n Port 1\nHost a,b\n Port 2\n");
        assert_eq!(v(&lookup(&c, "Web"), "port").as_deref(), Some("1"));
        assert_eq!(v(&lookup(&c, "web"), "port"), None);
        // A comma is part of a Host pattern, not a separator.
        assert_eq!(v(&lookup(&c, "a"), "port"), None);
    }

    #[test]
    fn wildcards_and_negation_in_host_patterns() {
        let c = parse("Host *.lab !bad.lab web?\n  User x\n");
        assert_eq!(v(&lookup(&c, "good.lab"), "user").as_deref(), Some("x"));
        assert_eq!(v(&lookup(&c, "bad.lab"), "user"), None);
        assert_eq!(v(&lookup(&c, "web1"), "user").as_deref(), Some("x"));
        assert_eq!(v(&lookup(&c, "web12"), "user"), None);
        // A Host line with only a negation matches nothing (as OpenSSH).
        let c = parse("Host !a\n  User y\n");
        assert_eq!(v(&lookup(&c, "b"), "user"), None);
    }

    #[test]
    fn identity_files_accumulate_in_order_without_duplicates() {
        let c =
            parse("Host a\n IdentityFile ~/k1\nHost *\n IdentityFile /k2\n IdentityFile ~/k1\n");
        let files: Vec<String> = lookup(&c, "a")
            .identity_files
            .iter()
            .map(|l| l.value())
            .collect();
        assert_eq!(files, vec!["~/k1", "/k2"]);
    }

    #[test]
    fn match_originalhost_applies_and_does_not_leak_into_previous_host() {
        let c = parse(
            "Host a\n User ua\nMatch originalhost m2\n User um\n Port 2201\nHost b\n User ub\n",
        );
        let o = lookup(&c, "a");
        assert_eq!(
            (v(&o, "user").as_deref(), v(&o, "port")),
            (Some("ua"), None)
        );
        let o = lookup(&c, "m2");
        assert_eq!(v(&o, "port").as_deref(), Some("2201"));
        assert_eq!(v(&lookup(&c, "b"), "user").as_deref(), Some("ub"));
    }

    #[test]
    fn match_host_sees_the_hostname_set_above_it_but_not_below() {
        let c = parse("Host x\n HostName Real.%h.Example\nMatch host real.x.example\n User m1\n");
        assert_eq!(v(&lookup(&c, "x"), "user").as_deref(), Some("m1"));
        let c = parse("Match host real.example\n User m1\nHost x\n HostName real.example\n");
        assert_eq!(v(&lookup(&c, "x"), "user"), None);
    }

    #[test]
    fn match_user_sees_the_user_so_far_and_localuser_the_local_one() {
        let c = parse(
            "Host a\n User bob\nMatch user bob\n Port 9\nMatch localuser alice,!root\n Port 8\n",
        );
        assert_eq!(v(&lookup(&c, "a"), "port").as_deref(), Some("9"));
        assert_eq!(
            v(&lookup_as(&c, "b", "alice"), "port").as_deref(),
            Some("8")
        );
        assert_eq!(v(&lookup_as(&c, "b", "root"), "port"), None);
    }

    #[test]
    fn match_key_equals_value_is_the_same_as_key_space_value() {
        let c = parse("Match host=b\n User mb\nMatch !host=b user=mb\n Port 2\nMatch exec=\"test %h = c\"\n Port 3\n");
        assert_eq!(v(&lookup(&c, "b"), "user").as_deref(), Some("mb"));
        assert_eq!(v(&lookup(&c, "b"), "port"), None);
        assert_eq!(v(&lookup(&c, "c"), "port").as_deref(), Some("3"));
        // An `=` inside an argument is part of it.
        let c = parse("Match exec \"test x=x\"\n Port 4\n");
        assert_eq!(v(&lookup(&c, "q"), "port").as_deref(), Some("4"));
    }

    #[test]
    fn match_criteria_combine_with_and_and_negation() {
        let c = parse("Match host a* !user root\n Port 7\n");
        assert_eq!(v(&lookup_as(&c, "ab", "me"), "port").as_deref(), Some("7"));
        assert_eq!(v(&lookup_as(&c, "ab", "root"), "port"), None);
        assert_eq!(v(&lookup_as(&c, "b", "me"), "port"), None);
    }

    #[test]
    fn match_exec_runs_the_command_with_tokens_expanded() {
        let c = parse("Match exec \"test %h = x\"\n Port 9\nMatch !exec false\n User u\n");
        assert_eq!(v(&lookup(&c, "x"), "port").as_deref(), Some("9"));
        assert_eq!(v(&lookup(&c, "y"), "port"), None);
        assert_eq!(v(&lookup(&c, "y"), "user").as_deref(), Some("u"));
        // An earlier failed criterion skips the command.
        let c = parse("Match host nope exec \"exit 3\"\n Port 9\n");
        assert_eq!(v(&lookup(&c, "x"), "port"), None);
    }

    #[test]
    fn match_all_and_canonical_follow_the_first_pass() {
        let c = parse("Match canonical\n Port 1\nMatch !canonical\n User nc\nMatch all\n Port 2\n");
        let o = lookup(&c, "x");
        assert_eq!(
            (v(&o, "port").as_deref(), v(&o, "user").as_deref()),
            (Some("2"), Some("nc"))
        );
        let e = SshConfig::parse("Match all host x\n", Path::new("cfg")).unwrap_err();
        assert!(e.to_string().starts_with("cfg:1:"), "{e}");
    }

    #[test]
    fn unsupported_match_criteria_name_criterion_file_and_line() {
        for (text, word) in [
            ("Host a\nMatch final\n Port 1\n", "final"),
            ("\nMatch localnetwork 10.0.0.0/8\n", "localnetwork"),
            ("\nMatch tagged x\n", "tagged"),
        ] {
            let e = SshConfig::parse(text, Path::new("cfg"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("cfg:2:") && e.contains(word), "{e}");
        }
        let e = SshConfig::parse("Match host\n", Path::new("cfg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs an argument"), "{e}");
    }

    #[test]
    fn refused_options_name_the_option_and_line_and_harmless_values_pass() {
        let c = SshConfig::parse(
            "Host a\n Tunnel no\n BindAddress 10.0.0.1\n",
            Path::new("cfg"),
        )
        .unwrap();
        let mut o = ConfigOptions::default();
        let ctx = MatchContext {
            host_arg: "a".into(),
            local_user: "me".into(),
        };
        let e = c.apply(&ctx, &mut o).unwrap_err().to_string();
        assert!(e.starts_with("cfg:3:") && e.contains("bindaddress"), "{e}");
        // Only where it applies.
        let ctx = MatchContext {
            host_arg: "b".into(),
            local_user: "me".into(),
        };
        c.apply(&ctx, &mut ConfigOptions::default()).unwrap();
        // A proxy passing a file descriptor would hand opmark a connection it cannot use.
        let c = SshConfig::parse(
            "Host b\n ProxyUseFdpass no\nHost a\n ProxyUseFdpass yes\n",
            Path::new("cfg"),
        )
        .unwrap();
        let ctx = MatchContext {
            host_arg: "a".into(),
            local_user: "me".into(),
        };
        let e = c
            .apply(&ctx, &mut ConfigOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cfg:4:") && e.contains("proxyusefdpass"),
            "{e}"
        );
        let ctx = MatchContext {
            host_arg: "b".into(),
            local_user: "me".into(),
        };
        c.apply(&ctx, &mut ConfigOptions::default()).unwrap();
        // Options that do not change where or how: no error.
        let c = parse("ForwardAgent no\nLogLevel QUIET\nCompression yes\nSendEnv LANG\nGSSAPIAuthentication yes\n");
        lookup(&c, "a");
    }

    #[test]
    fn unknown_algorithm_names_are_errors_even_where_the_block_does_not_apply() {
        let c = parse("Host other\n Ciphers nonesuch\n");
        let ctx = MatchContext {
            host_arg: "a".into(),
            local_user: "me".into(),
        };
        let e = c
            .apply(&ctx, &mut ConfigOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("test_config:2:") && e.contains("nonesuch"),
            "{e}"
        );
    }

    #[test]
    fn unknown_options_are_errors_unless_ignore_unknown_names_them() {
        let c = parse("Host b\n Frobnicate yes\n");
        let ctx = MatchContext {
            host_arg: "a".into(),
            local_user: "me".into(),
        };
        let e = c
            .apply(&ctx, &mut ConfigOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("frobnicate") && e.contains("test_config:2"),
            "{e}"
        );
        let c = parse("IgnoreUnknown frob*\nHost b\n Frobnicate yes\n");
        c.apply(&ctx, &mut ConfigOptions::default()).unwrap();
    }

    #[test]
    fn proxy_jump_and_proxy_command_exclude_each_other_first_wins() {
        let c = parse("Host a\n ProxyJump j\n ProxyCommand nc %h %p\n");
        let o = lookup(&c, "a");
        assert_eq!(v(&o, "proxycommand").as_deref(), Some("none"));
        let c = parse("Host a\n ProxyCommand nc %h %p\n ProxyJump j\n");
        let o = lookup(&c, "a");
        assert_eq!(v(&o, "proxyjump"), None);
    }

    #[test]
    fn comments_and_blank_lines_are_ignored() {
        let c = parse("# top\n\nHost a # trailing\n  # inside\n  User u # note\n");
        assert_eq!(v(&lookup(&c, "a"), "user").as_deref(), Some("u"));
    }

    #[test]
    fn unbalanced_quote_names_file_and_line() {
        let e = SshConfig::parse("Host a\n  User \"x\n", Path::new("cfg")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cfg:2: unbalanced double quote; close the quote or remove it"
        );
    }

    #[test]
    fn include_is_expanded_in_place_inside_host_block_with_globs() {
        let dir = std::env::temp_dir().join(format!("opmark-cfg-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("d1")).unwrap();
        std::fs::write(dir.join("d1/inc.conf"), "Port 2222\nHost x\n User fromx\n").unwrap();
        std::fs::write(dir.join("d1/other.txt"), "Port 1\n").unwrap();
        let text = format!(
            "Host a x\n Include {}/d*/*.conf\n User after\n",
            dir.display()
        );
        let c = parse(&text);
        assert_eq!(v(&lookup(&c, "a"), "port").as_deref(), Some("2222"));
        assert_eq!(v(&lookup(&c, "a"), "user").as_deref(), Some("after"));
        assert_eq!(v(&lookup(&c, "x"), "user").as_deref(), Some("fromx"));
        // A system config resolves relative includes in its own directory.
        std::fs::write(dir.join("sys"), "Include d1/inc.conf\n").unwrap();
        let c = SshConfig::load(&dir.join("sys"), ConfigKind::System, false).unwrap();
        assert_eq!(v(&lookup(&c, "q"), "port").as_deref(), Some("2222"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wildcard_matcher_handles_stars_and_questions() {
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a*b*c", "axxbyyc"));
        assert!(!wildcard_match("a*b*c", "axxbyy"));
        assert!(wildcard_match("1?.0.0.*", "10.0.0.255"));
        assert!(!wildcard_match("?", ""));
    }

    #[test]
    fn tokens_and_env_expand_and_unknown_ones_are_refused() {
        let t = Tokens {
            host: "h.example".into(),
            alias: "h".into(),
            port: 2200,
            remote_user: "r".into(),
            local_user: "l".into(),
            key_alias: "ka".into(),
        };
        assert_eq!(
            expand_path("/k/%h-%p-%r-%u-%n-%k-%%", &t).unwrap(),
            "/k/h.example-2200-r-l-h-ka-%"
        );
        assert_eq!(expand_path("/k/%C", &t).unwrap().len(), 3 + 40);
        assert!(expand_path("%z", &t).unwrap_err().contains("%z"));
        let (var, value) = crate::ssh::test_env::a_set_variable_holding_a_path();
        assert_eq!(
            expand_env(&format!("/a/${{{var}}}/b")).unwrap(),
            format!("/a/{value}/b")
        );
        assert!(expand_env("/a/${OPMARK_CFG_UNSET_VAR}")
            .unwrap_err()
            .contains("OPMARK_CFG_UNSET_VAR"));
    }

    #[test]
    fn command_line_options_accept_both_forms_and_refuse_blocks() {
        assert_eq!(
            parse_command_line_option("User=bob", 1).unwrap().value(),
            "bob"
        );
        assert_eq!(
            parse_command_line_option("Port 2222", 1).unwrap().value(),
            "2222"
        );
        let e = parse_command_line_option("Match all", 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("command-line option 2"), "{e}");
    }
}
