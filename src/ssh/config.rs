//! The ssh_config reader: parses OpenSSH client configuration files into blocks and
//! answers "which options apply to this alias", with OpenSSH's first-value-wins rule.
//!
//! Written here rather than borrowed because the published parsers reject global options,
//! lack `Key=Value`, `Include` or leak `Match` bodies into the previous block (FINDINGS).

use std::path::{Path, PathBuf};

use thiserror::Error;

/// A malformed or unreadable configuration file.
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
    /// A line could not be parsed.
    #[error("{path}:{line}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// Where an option value came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file.
    pub path: PathBuf,
    /// 1-based line number.
    pub line: usize,
}

/// One option line: lower-cased keyword and its arguments (quotes removed).
#[derive(Debug, Clone)]
struct OptionLine {
    key: String,
    args: Vec<String>,
    origin: Origin,
}

/// When a block applies: every condition must match (an `Include` inside a `Host` block
/// nests the included file's `Host` patterns inside the outer one).
#[derive(Debug, Clone)]
enum Condition {
    /// A `Host` line's pattern list.
    Host(Vec<String>),
    /// A `Match` block: never applied (unsupported), warned about once at parse time.
    Never,
}

#[derive(Debug, Clone)]
struct Block {
    conditions: Vec<Condition>,
    options: Vec<OptionLine>,
}

/// A parsed ssh_config, with its `Include`s expanded in place.
#[derive(Debug, Clone, Default)]
pub struct SshConfig {
    blocks: Vec<Block>,
}

/// Maximum `Include` nesting, as OpenSSH (`READCONF_MAX_DEPTH`).
const MAX_INCLUDE_DEPTH: usize = 16;

impl SshConfig {
    /// Reads and parses `path`. A missing file gives an empty config only when
    /// `missing_ok` (the default `~/.ssh/config` need not exist; an explicit `-F` must).
    pub fn load(path: &Path, missing_ok: bool) -> Result<SshConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(SshConfig::default())
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let mut config = SshConfig::default();
        config.parse_into(&text, path, &[], 0)?;
        Ok(config)
    }

    /// Parses config text; `path` is used for messages and relative `Include`s.
    pub fn parse(text: &str, path: &Path) -> Result<SshConfig, ConfigError> {
        let mut config = SshConfig::default();
        config.parse_into(text, path, &[], 0)?;
        Ok(config)
    }

    fn parse_into(
        &mut self,
        text: &str,
        path: &Path,
        outer: &[Condition],
        depth: usize,
    ) -> Result<(), ConfigError> {
        let mut current = Block {
            conditions: outer.to_vec(),
            options: Vec::new(),
        };
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let syntax = |message: String| ConfigError::Syntax {
                path: path.to_path_buf(),
                line: line_no,
                message,
            };
            let Some((key, args)) = split_line(raw).map_err(syntax)? else {
                continue;
            };
            let origin = Origin {
                path: path.to_path_buf(),
                line: line_no,
            };
            match key.as_str() {
                "host" => {
                    if args.is_empty() {
                        return Err(syntax("`Host` needs at least one pattern".into()));
                    }
                    self.blocks.push(std::mem::replace(
                        &mut current,
                        Block {
                            conditions: with(outer, Condition::Host(args)),
                            options: Vec::new(),
                        },
                    ));
                }
                "match" => {
                    tracing::warn!(
                        "{}:{line_no}: `Match` blocks are not supported; its options are ignored",
                        path.display()
                    );
                    self.blocks.push(std::mem::replace(
                        &mut current,
                        Block {
                            conditions: with(outer, Condition::Never),
                            options: Vec::new(),
                        },
                    ));
                }
                "include" => {
                    if depth >= MAX_INCLUDE_DEPTH {
                        return Err(syntax(format!(
                            "`Include` nested deeper than {MAX_INCLUDE_DEPTH} levels (a loop?)"
                        )));
                    }
                    // Options after the Include still belong to the enclosing block; the
                    // included file's own `Host` lines must not swallow them.
                    let conditions = current.conditions.clone();
                    self.blocks.push(std::mem::replace(
                        &mut current,
                        Block {
                            conditions: conditions.clone(),
                            options: Vec::new(),
                        },
                    ));
                    for arg in &args {
                        for file in include_files(arg, path) {
                            let text = match std::fs::read_to_string(&file) {
                                Ok(text) => text,
                                // OpenSSH ignores Include patterns that match nothing.
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                                Err(source) => {
                                    return Err(ConfigError::Read { path: file, source })
                                }
                            };
                            self.parse_into(&text, &file, &conditions, depth + 1)?;
                        }
                    }
                }
                _ => current.options.push(OptionLine { key, args, origin }),
            }
        }
        self.blocks.push(current);
        Ok(())
    }

    /// The options that apply to `alias` (the host name as the user typed it).
    pub fn lookup(&self, alias: &str) -> HostOptions {
        let alias = alias.to_ascii_lowercase();
        let mut options = HostOptions::default();
        for block in &self.blocks {
            let applies = block.conditions.iter().all(|c| match c {
                Condition::Host(patterns) => match_pattern_list(&alias, patterns),
                Condition::Never => false,
            });
            if applies {
                for line in &block.options {
                    options.take(line);
                }
            }
        }
        options
    }
}

fn with(outer: &[Condition], c: Condition) -> Vec<Condition> {
    let mut v = outer.to_vec();
    v.push(c);
    v
}

/// Files named by one `Include` argument: `~` expanded, relative to `~/.ssh` (as OpenSSH
/// does for user configs) or to the including file's directory when there is no HOME,
/// with `*`/`?` wildcards in the last path component.
fn include_files(arg: &str, including: &Path) -> Vec<PathBuf> {
    let expanded = expand_tilde(arg);
    let path = PathBuf::from(&expanded);
    let path = if path.is_absolute() {
        path
    } else if let Some(home) = home_dir() {
        home.join(".ssh").join(path)
    } else {
        including.parent().unwrap_or(Path::new(".")).join(path)
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?']) {
        return vec![path];
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| wildcard_match(&name, &e.file_name().to_string_lossy()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Splits one config line into a lower-cased keyword and its arguments. `None` for blank
/// lines and comments. Accepts `Key Value`, `Key=Value`, `Key = Value`, double quotes.
fn split_line(raw: &str) -> Result<Option<(String, Vec<String>)>, String> {
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
    let args = split_args(rest)?;
    Ok(Some((key, args)))
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

/// OpenSSH `match_pattern_list` for `Host` lines and known_hosts host lists: true when
/// some positive pattern matches and no negated (`!`) pattern does. `name` must already
/// be lower-case; patterns are compared case-insensitively.
pub fn match_pattern_list(name: &str, patterns: &[String]) -> bool {
    let mut matched = false;
    for pattern in patterns {
        for p in pattern.split(',').filter(|p| !p.is_empty()) {
            let (negated, p) = match p.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, p),
            };
            if wildcard_match(&p.to_ascii_lowercase(), name) {
                if negated {
                    return false;
                }
                matched = true;
            }
        }
    }
    matched
}

/// Glob match with `*` (any run) and `?` (one character), nothing else special.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with single backtrack point: linear in practice, no recursion.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The options that apply to one host, first value winning, as OpenSSH reads them.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// `HostName`, unexpanded.
    pub hostname: Option<String>,
    /// `Port`.
    pub port: Option<String>,
    /// `User`.
    pub user: Option<String>,
    /// Every `IdentityFile`, in order (these accumulate in OpenSSH).
    pub identity_files: Vec<String>,
    /// `IdentitiesOnly`.
    pub identities_only: Option<String>,
    /// `IdentityAgent`.
    pub identity_agent: Option<String>,
    /// `UserKnownHostsFile` (may list several files).
    pub user_known_hosts: Option<Vec<String>>,
    /// `GlobalKnownHostsFile`.
    pub global_known_hosts: Option<Vec<String>>,
    /// `StrictHostKeyChecking`.
    pub strict_host_key_checking: Option<String>,
    /// `HashKnownHosts`.
    pub hash_known_hosts: Option<String>,
    /// `HostKeyAlias`.
    pub host_key_alias: Option<String>,
    /// `ConnectTimeout` in seconds.
    pub connect_timeout: Option<String>,
    /// `ServerAliveInterval` in seconds.
    pub server_alive_interval: Option<String>,
    /// `ServerAliveCountMax`.
    pub server_alive_count_max: Option<String>,
    /// `ProxyJump`, unsplit.
    pub proxy_jump: Option<String>,
    /// `ProxyCommand`: not supported; kept so that resolution can refuse clearly.
    pub proxy_command: Option<String>,
    /// Where each recorded option came from, for error messages.
    pub origins: Vec<(String, Origin)>,
}

impl HostOptions {
    fn take(&mut self, line: &OptionLine) {
        fn first(slot: &mut Option<String>, line: &OptionLine) -> bool {
            if slot.is_none() {
                *slot = Some(line.args.join(" "));
                return true;
            }
            false
        }
        fn first_list(slot: &mut Option<Vec<String>>, line: &OptionLine) -> bool {
            if slot.is_none() {
                *slot = Some(line.args.clone());
                return true;
            }
            false
        }
        let recorded = match line.key.as_str() {
            "hostname" => first(&mut self.hostname, line),
            "port" => first(&mut self.port, line),
            "user" => first(&mut self.user, line),
            "identityfile" => {
                self.identity_files.extend(line.args.iter().cloned());
                true
            }
            "identitiesonly" => first(&mut self.identities_only, line),
            "identityagent" => first(&mut self.identity_agent, line),
            "userknownhostsfile" => first_list(&mut self.user_known_hosts, line),
            "globalknownhostsfile" => first_list(&mut self.global_known_hosts, line),
            "stricthostkeychecking" => first(&mut self.strict_host_key_checking, line),
            "hashknownhosts" => first(&mut self.hash_known_hosts, line),
            "hostkeyalias" => first(&mut self.host_key_alias, line),
            "connecttimeout" => first(&mut self.connect_timeout, line),
            "serveraliveinterval" => first(&mut self.server_alive_interval, line),
            "serveralivecountmax" => first(&mut self.server_alive_count_max, line),
            "proxyjump" => first(&mut self.proxy_jump, line),
            "proxycommand" => first(&mut self.proxy_command, line),
            _ => false,
        };
        if recorded {
            self.origins.push((line.key.clone(), line.origin.clone()));
        }
    }

    /// Where option `key` (lower-case) was set, as `file:line`, for messages.
    pub fn origin(&self, key: &str) -> String {
        self.origins
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, o)| format!("{}:{}", o.path.display(), o.line))
            .unwrap_or_else(|| "the command line".into())
    }
}

/// `$HOME`, if set.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Expands a leading `~` or `~/` to `$HOME`.
pub fn expand_tilde(s: &str) -> String {
    if s == "~" || s.starts_with("~/") {
        if let Some(home) = home_dir() {
            return format!("{}{}", home.display(), &s[1..]);
        }
    }
    s.to_string()
}

/// Values for `%` tokens in `IdentityFile`, `UserKnownHostsFile`, `HostName`.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// `%h`: the remote host name (after `HostName`).
    pub host: String,
    /// `%n`: the alias as typed.
    pub alias: String,
    /// `%p`: the port.
    pub port: u16,
    /// `%r`: the remote user.
    pub remote_user: String,
    /// `%u`: the local user.
    pub local_user: String,
}

/// Expands `~` and the `%` tokens `%% %d %h %n %p %r %u %i`. An unknown token is an
/// error naming it (OpenSSH refuses those too).
pub fn expand_tokens(s: &str, t: &Tokens) -> Result<String, String> {
    let s = expand_tilde(s);
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('d') => out.push_str(&home_dir().unwrap_or_default().to_string_lossy()),
            Some('h') => out.push_str(&t.host),
            Some('n') => out.push_str(&t.alias),
            Some('p') => out.push_str(&t.port.to_string()),
            Some('r') => out.push_str(&t.remote_user),
            Some('u') => out.push_str(&t.local_user),
            Some('i') => out.push_str(&current_uid().to_string()),
            Some(other) => return Err(format!("unsupported token `%{other}` in `{s}`")),
            None => {
                return Err(format!(
                    "`%` at the end of `{s}`; write `%%` for a percent sign"
                ))
            }
        }
    }
    Ok(out)
}

/// The real uid of this process (the owner of `/proc/self`).
pub fn current_uid() -> u32 {
    // /proc/self is enough on Linux and avoids unsafe libc calls.
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> SshConfig {
        SshConfig::parse(text, Path::new("test_config")).unwrap()
    }

    #[test]
    fn first_value_wins_across_matching_blocks() {
        let c = parse(
            "Host web1\n  HostName 10.0.0.1\n  Port 2201\n\
             Host web*\n  HostName wrong\n  User deploy\n  Port 9\n\
             Host *\n  User nobody\n",
        );
        let o = c.lookup("web1");
        assert_eq!(o.hostname.as_deref(), Some("10.0.0.1"));
        assert_eq!(o.port.as_deref(), Some("2201"));
        assert_eq!(o.user.as_deref(), Some("deploy"));
        let o = c.lookup("db");
        assert_eq!(o.hostname, None);
        assert_eq!(o.user.as_deref(), Some("nobody"));
    }

    #[test]
    fn global_options_before_first_host_apply_to_every_host() {
        let c = parse("User early\nConnectTimeout=3\n\nHost a\n  User late\n");
        let o = c.lookup("a");
        assert_eq!(o.user.as_deref(), Some("early"));
        assert_eq!(o.connect_timeout.as_deref(), Some("3"));
    }

    #[test]
    fn equals_forms_and_case_insensitive_keywords() {
        let c = parse("Host a\n hostname=h1\n PORT = 22022\n User= bob\n IdentityFile \"/k ey\"\n");
        let o = c.lookup("A");
        assert_eq!(o.hostname.as_deref(), Some("h1"));
        assert_eq!(o.port.as_deref(), Some("22022"));
        assert_eq!(o.user.as_deref(), Some("bob"));
        assert_eq!(o.identity_files, vec!["/k ey".to_string()]);
    }

    #[test]
    fn wildcards_and_negation_in_host_patterns() {
        let c = parse("Host *.lab !bad.lab web?\n  User x\n");
        assert_eq!(c.lookup("good.lab").user.as_deref(), Some("x"));
        assert_eq!(c.lookup("bad.lab").user, None);
        assert_eq!(c.lookup("web1").user.as_deref(), Some("x"));
        assert_eq!(c.lookup("web12").user, None);
        // A Host line with only a negation matches nothing (as OpenSSH).
        let c = parse("Host !a\n  User y\n");
        assert_eq!(c.lookup("b").user, None);
    }

    #[test]
    fn identity_files_accumulate_in_order() {
        let c = parse("Host a\n IdentityFile ~/k1\nHost *\n IdentityFile /k2\n");
        assert_eq!(c.lookup("a").identity_files, vec!["~/k1", "/k2"]);
    }

    #[test]
    fn match_block_is_skipped_and_does_not_leak_into_previous_host() {
        let c =
            parse("Host a\n User ua\nMatch exec true\n User leaked\n Port 1\nHost b\n User ub\n");
        assert_eq!(c.lookup("a").user.as_deref(), Some("ua"));
        assert_eq!(c.lookup("a").port, None);
        assert_eq!(c.lookup("b").user.as_deref(), Some("ub"));
    }

    #[test]
    fn comments_and_blank_lines_are_ignored() {
        let c = parse("# top\n\nHost a # trailing\n  # inside\n  User u # note\n");
        assert_eq!(c.lookup("a").user.as_deref(), Some("u"));
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
    fn include_is_expanded_in_place_inside_host_block() {
        let dir = std::env::temp_dir().join(format!("opmark-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inc = dir.join("inc.conf");
        std::fs::write(&inc, "Port 2222\nHost x\n User fromx\n").unwrap();
        let text = format!("Host a x\n Include {}\n User after\n", inc.display());
        let c = parse(&text);
        assert_eq!(c.lookup("a").port.as_deref(), Some("2222"));
        assert_eq!(c.lookup("a").user.as_deref(), Some("after"));
        assert_eq!(c.lookup("x").user.as_deref(), Some("fromx"));
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
    fn tokens_expand_and_unknown_tokens_are_refused() {
        let t = Tokens {
            host: "h.example".into(),
            alias: "h".into(),
            port: 2200,
            remote_user: "r".into(),
            local_user: "l".into(),
        };
        assert_eq!(
            expand_tokens("/k/%h-%p-%r-%u-%n-%%", &t).unwrap(),
            "/k/h.example-2200-r-l-h-%"
        );
        assert!(expand_tokens("%z", &t).unwrap_err().contains("%z"));
    }
}
