//! Redaction of secrets from any text before opmark stores or prints it.
//!
//! One [`Redactor`] is used by the ledger (on every free-text field, as defence in depth),
//! by `run`/`show`/`classify` output and by error messages. The built-in rules are one
//! table ([`builtin_rules`]), applied in order; each row finds one secret shape and
//! replaces only the secret part with `***`, so the display keeps its shape
//! (`--password=***`, `https://user:***@host`, `Authorization: Bearer ***`,
//! `sshpass -p *** ssh host`). Every row has its own cases in the tests below.
//!
//! Rows are of two kinds: a regex (for shapes that stand on their own, like a header or a
//! URL) and a scanner over shell words (for secrets that only a program's argument
//! conventions reveal: `htpasswd -b FILE USER PASS`, `echo PASS | chpasswd`, here-document
//! bodies). Flags that are secrets only for some programs (`-p` is a password for
//! `sshpass`, `docker login` and `mongo`, a port for `ssh`) are rows that name their
//! programs. Over-redaction is accepted: a display that hides a harmless value is better
//! than a ledger that leaks, but common harmless forms (`ssh -p 22`, `mkdir -p`,
//! `--password-stdin`, `--keyring=PATH`) stay readable.
//!
//! Nothing is compiled up front: compiling the table's regexes took ~2 ms of CPU in every
//! process that redacts anything (every `run`), while most text holds no secret-looking
//! word at all. Each regex row names the literal words every one of its matches holds
//! (`authorization`, `://`, `curl` and `:`), and is compiled and run only on text that
//! holds them, the way the scanners already skip text without their program's name.
//! The check can only skip a regex that could not have matched, so the output is
//! unchanged (tests below check the needles against every case).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use regex::{Captures, Regex};

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// How one row of the table finds secrets.
enum Find {
    /// A regex. When it has groups named `s`, `s2`, `s3`, the one that took part is
    /// masked; otherwise the whole match is. `keep` lets a row keep a match that only
    /// looks like a secret (`--password-stdin`).
    Pattern {
        /// Every match holds, for each group here, one of its words (compared with the
        /// text lowercased, see [`folded`]; so written in lowercase). The regex is
        /// compiled and run only on text that does.
        needles: Needles,
        source: String,
        regex: OnceLock<Regex>,
        keep: Option<fn(&Captures<'_>) -> bool>,
    },
    /// A scanner that returns the byte ranges of the secrets in the text. It runs only on
    /// text that holds one of `needles` (a program name, `<<`): most text holds none, and
    /// a command can be a megabyte long.
    Scan {
        needles: &'static [&'static str],
        scan: Box<Scanner>,
    },
}

/// Groups of words that all must be present (one word of each group).
type Needles = &'static [&'static [&'static str]];

/// Finds the byte ranges of secrets in a text.
type Scanner = dyn Fn(&str) -> Vec<Range<usize>> + Send + Sync;

/// One row of the redaction table: one secret shape.
struct RedactRule {
    /// Short name, for tests and debugging.
    name: &'static str,
    find: Find,
}

impl std::fmt::Debug for RedactRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Finds and masks secrets in text.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// Extra patterns from the policy file, applied after the built-in rules.
    extra: Vec<ExtraPattern>,
}

/// An extra redaction regex (the policy's `redact = [...]`): compiled already, or
/// compiled the first time a text holds one of the literals its matches start with.
/// Cheap to clone: clones share the compiled regex.
#[derive(Debug, Clone)]
pub struct ExtraPattern {
    source: String,
    /// Every match starts with one of these (case-sensitive); `None`: no filter.
    literals: Option<Vec<String>>,
    compiled: Arc<OnceLock<Regex>>,
}

impl ExtraPattern {
    /// A pattern compiled now (no filter: the regex's own prefilter is as quick).
    pub fn compile(source: &str) -> Result<ExtraPattern, regex::Error> {
        Ok(ExtraPattern::from(Regex::new(source)?))
    }

    /// A pattern compiled when first needed. Only for text known to compile (the
    /// compiled-in policy, whose patterns a unit test compiles); `literals`, when given,
    /// must hold a prefix of every match, as `policy::pattern::leading_literals` reads.
    pub(crate) fn lazy(source: &str, literals: Option<Vec<String>>) -> ExtraPattern {
        ExtraPattern {
            source: source.to_owned(),
            literals,
            compiled: Arc::default(),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The compiled regex (compiling it now if needed).
    pub fn regex(&self) -> &Regex {
        self.compiled.get_or_init(|| {
            Regex::new(&self.source).unwrap_or_else(|e| {
                panic!(
                    "the redaction pattern `{}` does not compile: {e}",
                    self.source
                )
            })
        })
    }

    /// Whether the regex matches somewhere in `text` (the same answer as `Regex::is_match`).
    pub fn is_match(&self, text: &str) -> bool {
        self.may_match(text) && self.regex().is_match(text)
    }

    /// False only when no match is possible in `text`.
    fn may_match(&self, text: &str) -> bool {
        match &self.literals {
            Some(literals) => literals.iter().any(|l| text.contains(l.as_str())),
            None => true,
        }
    }

    #[cfg(test)]
    pub(crate) fn is_compiled(&self) -> bool {
        self.compiled.get().is_some()
    }
}

impl From<Regex> for ExtraPattern {
    fn from(regex: Regex) -> ExtraPattern {
        ExtraPattern {
            source: regex.as_str().to_owned(),
            literals: None,
            compiled: Arc::new(OnceLock::from(regex)),
        }
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::new(&[])
    }
}

/// A value as a shell word: quoted (may hold spaces) or a run of non-separators.
const VALUE: &str = r#"(?:"[^"]*"|'[^']*'|[^\s;&|'"`]+)"#;

/// Any words between a program and the flag a row looks for (lazy, stays within one
/// simple command; quoted words may hold separators).
const ARGS: &str = r#"(?:\s+(?:"[^"]*"|'[^']*'|[^\s;&|'"`]+))*?"#;

/// Where a program name may start: the start of the text, after a separator, after a
/// directory (`/usr/bin/sshpass`), or after a quote (a command quoted in a message).
const AT_PROGRAM: &str = r#"(?:^|[\s;&|(/'"`])"#;

/// The table. Order matters only where rows overlap: a row that keeps more shape
/// (`-passin pass:***`) runs before a broader one that would mask more (`-passin ***`).
fn builtin_rules() -> &'static [RedactRule] {
    static RULES: OnceLock<Vec<RedactRule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let re = |name, needles, pattern: &str, keep| RedactRule {
            name,
            find: Find::Pattern {
                needles,
                source: pattern.to_owned(),
                regex: OnceLock::new(),
                keep,
            },
        };
        let scan = |name, needles, f: fn(&str) -> Vec<Range<usize>>| RedactRule {
            name,
            find: Find::Scan {
                needles,
                scan: Box::new(f),
            },
        };
        // `PROGRAM ... FLAG VALUE`, `FLAGVALUE` or `FLAG=VALUE`, for every such flag.
        let flag_of = |name, spec: FlagSpec| RedactRule {
            name,
            find: Find::Scan {
                needles: spec.programs,
                scan: Box::new(move |text| secret_flag_values(text, &spec)),
            },
        };
        vec![
            // PEM private key blocks, also a truncated one without its END line.
            re(
                "pem-private-key",
                &[&["-----begin "]],
                r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?P<s>.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
                None,
            ),
            // Here-document bodies: often a config file, a password list or SQL with a
            // password in it; no rule can tell which lines matter, so all of it goes.
            scan("heredoc-body", &["<<"], heredoc_bodies),
            // Authorization / Proxy-Authorization headers, with or without a scheme word.
            re(
                "authorization-header",
                &[&["authorization"]],
                r#"(?i)\b(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|digest|token|negotiate|aws4-hmac-sha256)\s+)?(?P<s>[^\s'"]+)"#,
                None,
            ),
            // Cookies are session credentials.
            re(
                "cookie-header",
                &[&["cookie"]],
                r#"(?i)\b(?:set-)?cookie\s*:\s*(?P<s>[^'"\n]+)"#,
                None,
            ),
            // X-Api-Key: ..., X-Auth-Token: ... and similar custom headers.
            re(
                "secret-header",
                &[&["x-"], &["token", "key", "secret", "auth", "password"]],
                r#"(?i)\bx-[a-z0-9-]*(?:token|key|secret|auth|password)[a-z0-9-]*\s*:\s*(?P<s>[^\s'"]+)"#,
                None,
            ),
            // A bare bearer token anywhere.
            re(
                "bearer",
                &[&["bearer"]],
                r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/=-]+)",
                None,
            ),
            // Credentials in URLs: scheme://user:secret@host (the last '@' before the path).
            re(
                "url-credentials",
                &[&["://"], &["@"]],
                r#"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@'"]*:(?P<s>[^\s/'"]+)@"#,
                None,
            ),
            // Query parameters named like secrets: ?token=, &api_key=, &X-Amz-Signature=,
            // Azure SAS `sig=`.
            re(
                "url-query-secret",
                &[&["?", "&"], &["="], &["token", "secret", "pass", "pwd", "key", "sig", "auth", "credential", "session", "sid"]],
                r#"(?i)[?&](?:[a-z0-9_.-]*(?:token|secret|pass|pwd|api[-_]?key|apikey|key|signature|sig|auth|credential|session|sid)[a-z0-9_.-]*)=(?P<s>[^&#\s'"]+)"#,
                None,
            ),
            // openssl's `-passin pass:SECRET` (env:, file:, fd: and stdin name no secret).
            re(
                "openssl-pass-arg",
                &[&["pass:"]],
                r#"(?i)(?:^|[\s;&|(])-(?:pass|passin|passout|kpass|twopass|passphrase)\s+["']?pass:(?P<s>[^\s'"]+)"#,
                None,
            ),
            // `openssl enc -k PASSWORD` (the old, still accepted form).
            flag_of(
                "openssl-k",
                FlagSpec {
                    programs: &["openssl"],
                    flags: &["-k"],
                    ..FlagSpec::default()
                },
            ),
            // --password=x, --password x, --db-pass x, --api-token=x, --client-secret x ...
            re(
                "secret-option",
                &[&["-"], &["pass", "secret", "token", "key", "credential"]],
                &format!(
                    r"(?i)(?:^|[\s;&|(])(?P<opt>--?[a-z0-9_-]*(?:pass|passwd|password|secret|token|api[-_]?key|credential)[a-z0-9_-]*)(?P<sep>=|\s+)(?P<s>{VALUE})"
                ),
                Some(keep_flag_without_value),
            ),
            // mysql-style -pSECRET (the password glued to -p), only after a mysql-family
            // tool: a separate `-p WORD` makes mysql prompt, and WORD is the database.
            re(
                "mysql-p",
                &[&["mysql", "mariadb"], &["-p"]],
                &format!(
                    r#"{AT_PROGRAM}(?:mysql[a-z_-]*|mariadb[a-z_-]*)\b[^;&|\n]*?\s-p(?P<s>'[^']*'|"[^"]*"|[^\s;&|'"`]+)"#
                ),
                None,
            ),
            // sshpass -p SECRET / -pSECRET: only sshpass's own options, before the command
            // it wraps (whose `-p` is a port: `sshpass -f f ssh -p 22 host`).
            flag_of(
                "sshpass-p",
                FlagSpec {
                    programs: &["sshpass"],
                    glued: true,
                    flags: &["-p"],
                    options_first: Some(&["-f", "-d", "-P"]),
                    ..FlagSpec::default()
                },
            ),
            // docker/podman/... login -p SECRET (`docker run -p` is a port).
            flag_of(
                "registry-login-p",
                FlagSpec {
                    programs: &["docker", "podman", "buildah", "skopeo", "nerdctl", "oras", "helm"],
                    verb: Some("login"),
                    glued: true,
                    flags: &["-p"],
                    ..FlagSpec::default()
                },
            ),
            // redis-cli -a SECRET (and its siblings).
            flag_of(
                "redis-cli-a",
                FlagSpec {
                    programs: &["redis-cli", "redis-benchmark", "keydb-cli", "valkey-cli"],
                    flags: &["-a"],
                    ..FlagSpec::default()
                },
            ),
            // mongo shells and tools take the password with -p.
            flag_of(
                "mongo-p",
                FlagSpec {
                    programs: &[
                        "mongo", "mongosh", "mongodump", "mongorestore", "mongoexport",
                        "mongoimport", "mongostat", "mongotop", "mongofiles",
                    ],
                    glued: true,
                    flags: &["-p"],
                    ..FlagSpec::default()
                },
            ),
            // OpenLDAP clients: -w bind password; ldappasswd's -s new and -a old password.
            flag_of(
                "ldap-w",
                FlagSpec {
                    programs: &[
                        "ldapsearch", "ldapadd", "ldapmodify", "ldapdelete", "ldapmodrdn",
                        "ldapcompare", "ldapwhoami", "ldapexop", "ldapurl", "ldappasswd",
                    ],
                    glued: true,
                    flags: &["-w"],
                    ..FlagSpec::default()
                },
            ),
            flag_of(
                "ldappasswd-new-old",
                FlagSpec {
                    programs: &["ldappasswd"],
                    glued: true,
                    flags: &["-s", "-a"],
                    ..FlagSpec::default()
                },
            ),
            // ipmitool -P SECRET.
            flag_of(
                "ipmitool-P",
                FlagSpec {
                    programs: &["ipmitool"],
                    glued: true,
                    flags: &["-P"],
                    ..FlagSpec::default()
                },
            ),
            // curl -u user:SECRET, --user, --proxy-user, -U, combined (-fsSu).
            re(
                "curl-user",
                &[&["curl"], &[":"]],
                &format!(
                    r#"{AT_PROGRAM}curl{ARGS}\s+(?:-[a-zA-Z]*[uU]|--user|--proxy-user)(?:\s+|=)?(?:'[^':]*:(?P<s>[^']*)'|"[^":]*:(?P<s2>[^"]*)"|[^\s:;&|'"`]*:(?P<s3>{VALUE}))"#
                ),
                None,
            ),
            // smbclient -U user%SECRET (Samba's user%password form).
            re(
                "samba-user-percent",
                &[&["smbclient", "rpcclient", "smbcacls", "smbget", "smbtree", "net"], &["%"]],
                &format!(
                    r#"{AT_PROGRAM}(?:smbclient|rpcclient|smbcacls|smbget|smbtree|net){ARGS}\s+(?:-U|--user)(?:\s+|=)?['"]?[^%\s'"]*%(?P<s>[^\s'";&|]+)"#
                ),
                None,
            ),
            // lftp -u user,SECRET.
            re(
                "lftp-user-comma",
                &[&["lftp"], &[","]],
                &format!(r#"{AT_PROGRAM}lftp{ARGS}\s+-u\s+['"]?[^,\s'"]*,(?P<s>[^\s'";&|]+)"#),
                None,
            ),
            // htpasswd -b FILE USER PASSWORD (the password is a positional argument).
            scan("htpasswd-b", &["htpasswd"], htpasswd_batch_password),
            // echo SECRET | chpasswd, printf ... | docker login --password-stdin, and a
            // here-string fed to one of those.
            scan("stdin-fed-secret", &["passwd", "stdin"], stdin_fed_secrets),
            // .netrc lines: machine HOST login USER password SECRET.
            re(
                "netrc-password",
                &[&["login"], &["password"]],
                &format!(r"(?i)\blogin\s+\S+\s+password\s+(?P<s>{VALUE})"),
                None,
            ),
            // NAME=value where the name suggests a secret (env assignments, config lines,
            // bare `password=...` arguments, libpq `password=...`).
            re(
                "secret-assignment",
                &[&["="], &["pass", "secret", "token", "key", "credential", "auth", "_pwd"]],
                &format!(
                    r"(?i)\b(?P<name>(?:[a-z_][a-z0-9_.-]*)?(?:pass|secret|token|key|credential|auth|_pwd\b)[a-z0-9_.-]*)=(?P<s>{VALUE})"
                ),
                Some(keep_assignment_that_names_no_secret),
            ),
            // "password": "x" in JSON-looking text.
            re(
                "json-secret",
                &[&["\""], &[":"], &["pass", "secret", "token", "key", "credential", "auth"]],
                r#"(?i)"[^"]*(?:pass|secret|token|key|credential|auth)[^"]*"\s*:\s*"(?P<s>[^"]*)""#,
                None,
            ),
            // password: x in YAML-looking text (written to a config file by the command).
            re(
                "yaml-secret",
                &[&[":"], &["passw", "secret", "token", "key"]],
                r#"(?i)\b[a-z0-9_.-]*(?:password|passwd|secret|token|api[-_]?key|apikey|private[-_]?key|access[-_]?key)\s*:[ \t]+(?P<s>[^\s'"]+)"#,
                Some(keep_yaml_without_value),
            ),
            // Well-known token shapes: keep the prefix so the kind of token stays visible.
            re(
                "aws-access-key",
                &[&["akia", "asia", "abia", "acca"]],
                r"\b(?:AKIA|ASIA|ABIA|ACCA)(?P<s>[0-9A-Z]{16})\b",
                None,
            ),
            re(
                "github-token",
                &[&["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"]],
                r"\b(?:gh[pousr]_(?P<s>[A-Za-z0-9]{20,})|github_pat_(?P<s2>[A-Za-z0-9_]{20,}))",
                None,
            ),
            re("gitlab-token", &[&["glpat-"]], r"\bglpat-(?P<s>[A-Za-z0-9_-]{20,})", None),
            re("slack-token", &[&["xoxa-", "xoxb-", "xoxp-", "xoxr-"]], r"\bxox[abpr]-(?P<s>[A-Za-z0-9-]{10,})", None),
            re(
                "stripe-key",
                &[&["_live_", "_test_"]],
                r"\b(?:sk|rk)_(?:live|test)_(?P<s>[A-Za-z0-9]{16,})",
                None,
            ),
            re("google-api-key", &[&["aiza"]], r"\bAIza(?P<s>[0-9A-Za-z_-]{35})", None),
            re("npm-token", &[&["npm_"]], r"\bnpm_(?P<s>[A-Za-z0-9]{36})\b", None),
            // A JSON Web Token: header.payload.signature, both first parts base64 of `{"`.
            re(
                "jwt",
                &[&["eyj"], &["."]],
                r"\beyJ[A-Za-z0-9_-]{8,}\.(?P<s>eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+)",
                None,
            ),
        ]
    })
}

/// `--password-stdin`, `--password-file PATH`, `--ask-pass`, `--no-password` and the like
/// take no secret as their value; neither does openssl's `-passin env:VAR`.
fn keep_flag_without_value(caps: &Captures<'_>) -> bool {
    let opt = caps
        .name("opt")
        .map_or("", |m| m.as_str())
        .to_ascii_lowercase();
    let spaced = caps.name("sep").is_some_and(|m| m.as_str() != "=");
    let value = caps.name("s").map_or("", |m| m.as_str());
    let value = value.trim_matches(['\'', '"']);
    let no_value_flag = opt.ends_with("-stdin")
        || opt.ends_with("-file")
        || opt.ends_with("-fd")
        || opt.ends_with("-env")
        || opt.starts_with("--ask")
        || opt.starts_with("--no-");
    let openssl_source = ["env:", "file:", "fd:"]
        .iter()
        .any(|p| value.starts_with(p))
        || value == "stdin"
        || value == "pass:***";
    (spaced && (no_value_flag || value.starts_with('-'))) || value == MASK || openssl_source
}

/// `KEY_FILE=/path`, `GIT_AUTHOR_NAME=x`, `--keyring=/usr/share/keyrings/x.gpg`,
/// `StrictHostKeyChecking=no`: names that contain a secret-sounding word but name a file,
/// an id, a user or a setting.
fn keep_assignment_that_names_no_secret(caps: &Captures<'_>) -> bool {
    let name = caps
        .name("name")
        .map_or("", |m| m.as_str())
        .to_ascii_lowercase();
    let value = caps.name("s").map_or("", |m| m.as_str());
    const HARMLESS_SUFFIXES: &[&str] = &[
        "file",
        "path",
        "dir",
        "ring",
        "_id",
        "_name",
        "size",
        "_type",
        "_url",
        "_uri",
        "_host",
        "_port",
        "_user",
        "_username",
        "_method",
        "_mode",
        "_len",
        "_length",
        // ssh options: StrictHostKeyChecking=, HostKeyAlias=, PubkeyAuthentication=, ...
        "checking",
        "alias",
        "algorithms",
        "authentication",
        "types",
        "dns",
    ];
    value == MASK || HARMLESS_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// `password: ***` already masked, and YAML keys whose value is on the next lines.
fn keep_yaml_without_value(caps: &Captures<'_>) -> bool {
    caps.name("s").is_some_and(|m| m.as_str() == MASK)
}

/// The ranges of every here-document body (`<<EOF`, `<<-'EOF'`, `<<"EOF"`, several on one
/// line), up to but excluding the line that ends it; a body that is never ended runs to
/// the end of the text. `<<<` here-strings and `1<<2` arithmetic are not here-documents.
fn heredoc_bodies(text: &str) -> Vec<Range<usize>> {
    let line_end = |from: usize| text[from..].find('\n').map_or(text.len(), |i| from + i);
    let mut out = Vec::new();
    let mut line_start = 0;
    while line_start < text.len() {
        let end = line_end(line_start);
        // Bodies follow the line that introduced them, one after the other.
        let mut next = end + 1;
        for (delimiter, strip_tabs) in heredoc_delimiters(&text[line_start..end]) {
            if next > text.len() {
                break;
            }
            let body_start = next;
            let mut cursor = body_start;
            let mut terminator = None;
            while cursor < text.len() {
                let end = line_end(cursor);
                let line = &text[cursor..end];
                let line = if strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    line
                };
                if line == delimiter {
                    terminator = Some((cursor, end));
                    break;
                }
                cursor = end + 1;
            }
            match terminator {
                Some((start, end)) => {
                    // The newline before the delimiter line stays, to keep the shape.
                    if start > body_start {
                        out.push(body_start..start - 1);
                    }
                    next = end + 1;
                }
                None => {
                    out.push(body_start..text.len());
                    next = text.len() + 1;
                }
            }
        }
        line_start = next;
    }
    out
}

/// The here-document delimiters introduced on one line, in order, with whether `<<-`
/// strips leading tabs.
fn heredoc_delimiters(line: &str) -> Vec<(String, bool)> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] != b'<' || bytes[i + 1] != b'<' {
            i += 1;
            continue;
        }
        if bytes.get(i + 2) == Some(&b'<') {
            // A here-string: skip all of `<<<`.
            i += 3;
            continue;
        }
        let mut j = i + 2;
        let strip_tabs = bytes.get(j) == Some(&b'-');
        if strip_tabs {
            j += 1;
        }
        while j < bytes.len() && (bytes[j] == b' ' || bytes[j] == b'\t') {
            j += 1;
        }
        let start = j;
        while j < bytes.len() && !b" \t;&|<>()".contains(&bytes[j]) {
            j += 1;
        }
        let word: String = line[start..j]
            .chars()
            .filter(|c| !matches!(c, '\'' | '"' | '\\'))
            .collect();
        let first = word.chars().next();
        if first.is_some_and(|c| c.is_alphabetic() || c == '_' || c == '!' || c == '@') {
            out.push((word, strip_tabs));
        }
        i = j.max(i + 2);
    }
    out
}

/// One shell word of a simple command: where it is in the text and its text with quotes
/// removed. Redirection operators are words of their own (`>`, `2>>`, `<<<`).
#[derive(Debug, Clone)]
struct ShellWord {
    span: Range<usize>,
    text: String,
}

impl ShellWord {
    fn is_redirection(&self) -> bool {
        self.text
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .starts_with(['<', '>'])
    }
}

/// One simple command and whether its output is piped into the next one.
#[derive(Debug, Default)]
struct SimpleCommand {
    words: Vec<ShellWord>,
    piped: bool,
}

/// Splits text into simple commands and words, the way a shell would for what the
/// scanners need: quotes, backslashes, `$(...)`, comments, separators, redirections.
/// Not a parser: a rare construct it gets wrong only costs a missed or an extra mask.
fn simple_commands(text: &str) -> Vec<SimpleCommand> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut commands = Vec::new();
    let mut current = SimpleCommand::default();
    let mut word: Option<ShellWord> = None;
    let end_word = |word: &mut Option<ShellWord>, current: &mut SimpleCommand, at: usize| {
        if let Some(mut w) = word.take() {
            w.span.end = at;
            current.words.push(w);
        }
    };
    let mut i = 0;
    while i < chars.len() {
        let (at, c) = chars[i];
        let next = chars.get(i + 1).map(|&(_, c)| c);
        let start_word = |word: &mut Option<ShellWord>| {
            word.get_or_insert_with(|| ShellWord {
                span: at..at,
                text: String::new(),
            });
        };
        match c {
            ' ' | '\t' => end_word(&mut word, &mut current, at),
            '\n' | ';' | '(' | ')' | '&' | '|' => {
                end_word(&mut word, &mut current, at);
                current.piped = c == '|' && next != Some('|');
                if (c == '&' || c == '|') && next == Some(c) {
                    current.piped = false;
                    i += 1;
                }
                commands.push(std::mem::take(&mut current));
            }
            '#' if word.is_none() => {
                while i < chars.len() && chars[i].1 != '\n' {
                    i += 1;
                }
                continue;
            }
            '\'' => {
                start_word(&mut word);
                i += 1;
                while i < chars.len() && chars[i].1 != '\'' {
                    word.as_mut().expect("started").text.push(chars[i].1);
                    i += 1;
                }
            }
            '"' => {
                start_word(&mut word);
                i += 1;
                while i < chars.len() && chars[i].1 != '"' {
                    if chars[i].1 == '\\' && i + 1 < chars.len() {
                        i += 1;
                    }
                    word.as_mut().expect("started").text.push(chars[i].1);
                    i += 1;
                }
            }
            '\\' => {
                start_word(&mut word);
                if let Some(n) = next {
                    word.as_mut().expect("started").text.push(n);
                    i += 1;
                }
            }
            '$' if next == Some('(') => {
                start_word(&mut word);
                let mut depth = 0usize;
                while i < chars.len() {
                    let ch = chars[i].1;
                    word.as_mut().expect("started").text.push(ch);
                    if ch == '(' {
                        depth += 1;
                    } else if ch == ')' {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    i += 1;
                }
            }
            '<' | '>' => {
                // `2>` keeps its descriptor number; the operator is a word of its own.
                let op_start = match &word {
                    Some(w) if w.text.chars().all(|c| c.is_ascii_digit()) => {
                        let w = word.take().expect("checked");
                        w.span.start
                    }
                    _ => {
                        end_word(&mut word, &mut current, at);
                        at
                    }
                };
                let mut op = String::from(&text[op_start..at]);
                while i < chars.len() && matches!(chars[i].1, '<' | '>' | '&' | '-') {
                    op.push(chars[i].1);
                    i += 1;
                }
                let op_end = chars.get(i).map_or(text.len(), |&(p, _)| p);
                current.words.push(ShellWord {
                    span: op_start..op_end,
                    text: op,
                });
                continue;
            }
            _ => {
                start_word(&mut word);
                word.as_mut().expect("started").text.push(c);
            }
        }
        i += 1;
    }
    end_word(&mut word, &mut current, text.len());
    commands.push(current);
    commands
}

/// The words of a command that are its arguments proper: redirections and their targets
/// left out.
fn arguments(words: &[ShellWord]) -> Vec<&ShellWord> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for w in words {
        if skip_next {
            skip_next = false;
            continue;
        }
        if w.is_redirection() {
            // `>` alone takes the next word as its target; `>file` holds it.
            skip_next = w
                .text
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .chars()
                .all(|c| matches!(c, '<' | '>' | '&' | '-'));
            continue;
        }
        out.push(w);
    }
    out
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// A flag whose value is a secret for some programs only.
#[derive(Default)]
struct FlagSpec {
    /// Program basenames the flag belongs to.
    programs: &'static [&'static str],
    /// A verb that must follow the program (`docker login`).
    verb: Option<&'static str>,
    /// The flags (`-p`); the value is the next word.
    flags: &'static [&'static str],
    /// The program also takes the value glued to the flag (`-pX`, `-p=X`); false where
    /// longer options share the prefix (`openssl -keyform`).
    glued: bool,
    /// The program's own options come before a command it wraps; these of them take a
    /// value. Scanning stops at the first other word (`sshpass -f F ssh -p 22`).
    options_first: Option<&'static [&'static str]>,
}

/// The values of `spec`'s flags in every simple command that runs one of its programs.
fn secret_flag_values(text: &str, spec: &FlagSpec) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for command in simple_commands(text) {
        let args = arguments(&command.words);
        let Some(mut p) = find_program(&args, spec.programs) else {
            continue;
        };
        if let Some(verb) = spec.verb {
            match args[p + 1..].iter().position(|w| w.text == verb) {
                Some(v) => p += 1 + v,
                None => continue,
            }
        }
        let mut k = p + 1;
        while k < args.len() {
            let w = args[k];
            if w.text == "--" {
                break;
            }
            let flag = spec
                .flags
                .iter()
                .find(|f| w.text == **f || (spec.glued && w.text.starts_with(**f)));
            if let Some(flag) = flag {
                let raw = &text[w.span.clone()];
                if w.text.len() == flag.len() {
                    if let Some(value) = args.get(k + 1) {
                        out.push(value.span.clone());
                    }
                    k += 2;
                    continue;
                }
                // Glued: mask what follows the flag (and its `=`) in the word as written.
                let skip = raw
                    .strip_prefix(flag)
                    .map_or(0, |rest| flag.len() + usize::from(rest.starts_with('=')));
                out.push(w.span.start + skip..w.span.end);
            } else if let Some(with_value) = spec.options_first {
                if !w.text.starts_with('-') {
                    break;
                }
                if with_value.contains(&w.text.as_str()) {
                    k += 1;
                }
            }
            k += 1;
        }
    }
    out
}

/// The first word naming one of `programs` (by basename).
fn find_program(words: &[&ShellWord], programs: &[&str]) -> Option<usize> {
    words
        .iter()
        .position(|w| programs.contains(&basename(&w.text)))
}

/// `htpasswd -b[c|n|...] [FILE] USER PASSWORD`: the password is the last positional.
fn htpasswd_batch_password(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for command in simple_commands(text) {
        let args = arguments(&command.words);
        let Some(p) = find_program(&args, &["htpasswd"]) else {
            continue;
        };
        let mut batch = false;
        let mut no_file = false;
        let mut positionals = Vec::new();
        for w in &args[p + 1..] {
            if w.text.len() > 1 && w.text.starts_with('-') {
                batch |= w.text[1..].contains('b');
                no_file |= w.text[1..].contains('n');
            } else {
                positionals.push(*w);
            }
        }
        let wanted = if no_file { 1 } else { 2 };
        if batch && positionals.len() >= 2 {
            let w = positionals
                .get(wanted)
                .unwrap_or(&positionals[positionals.len() - 1]);
            out.push(w.span.clone());
        }
    }
    out
}

/// Does this command read a password or token from its standard input?
fn reads_secret_from_stdin(args: &[&ShellWord]) -> bool {
    if find_program(args, &["chpasswd", "chgpasswd", "passwd"]).is_some() {
        return true;
    }
    if let Some(p) = find_program(args, &["htpasswd"]) {
        if args[p + 1..]
            .iter()
            .any(|w| w.text.starts_with('-') && w.text.contains('i'))
        {
            return true;
        }
    }
    args.iter().any(|w| {
        let t = w.text.to_ascii_lowercase();
        t.starts_with('-')
            && t.ends_with("-stdin")
            && ["pass", "token", "secret", "key"]
                .iter()
                .any(|s| t.contains(s))
    })
}

/// `echo SECRET | chpasswd`, `printf '%s' SECRET | docker login --password-stdin`, and
/// `docker login --password-stdin <<< SECRET`: the words that feed the secret.
fn stdin_fed_secrets(text: &str) -> Vec<Range<usize>> {
    let commands = simple_commands(text);
    let mut out = Vec::new();
    for (i, command) in commands.iter().enumerate() {
        let args = arguments(&command.words);
        if reads_secret_from_stdin(&args) {
            let words = &command.words;
            for (k, w) in words.iter().enumerate() {
                if w.text.ends_with("<<<") {
                    if let Some(target) = words.get(k + 1) {
                        out.push(target.span.clone());
                    }
                }
            }
        }
        let feeds_secret = command.piped
            && commands
                .get(i + 1)
                .is_some_and(|next| reads_secret_from_stdin(&arguments(&next.words)));
        if !feeds_secret {
            continue;
        }
        let Some(p) = find_program(&args, &["echo", "printf"]) else {
            continue;
        };
        let mut options = args[p].text.ends_with("echo");
        for w in &args[p + 1..] {
            if options && w.text.len() > 1 && w.text.starts_with('-') {
                continue;
            }
            options = false;
            out.push(w.span.clone());
        }
    }
    out
}

/// Runs `scan` over `text` and over every quoted stretch of it that holds a space: a
/// message that quotes a command (`invalid operation id "sshpass -p X ..."`, ``host
/// `...` ``) hides the command's words inside one quoted word.
fn scan_with_quoted(
    scan: &Scanner,
    needles: &[&str],
    text: &str,
    offset: usize,
    depth: usize,
    out: &mut Vec<Range<usize>>,
) {
    if !needles.iter().any(|n| text.contains(n)) {
        return;
    }
    out.extend(
        scan(text)
            .into_iter()
            .map(|r| r.start + offset..r.end + offset),
    );
    if depth >= 2 {
        return;
    }
    let mut open: Option<(char, usize)> = None;
    for (i, c) in text.char_indices() {
        match open {
            None if matches!(c, '\'' | '"' | '`') => open = Some((c, i)),
            Some((q, start)) if c == q => {
                let inner = &text[start + 1..i];
                if inner.contains(char::is_whitespace) {
                    scan_with_quoted(scan, needles, inner, offset + start + 1, depth + 1, out);
                }
                open = None;
            }
            _ => {}
        }
    }
}

/// Overlapping or touching ranges joined, in order.
fn merged(mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    spans.sort_by_key(|s| s.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match out.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => out.push(span),
        }
    }
    out
}

/// `text` as the needles of [`Find::Pattern`] are looked for in: ASCII letters in
/// lowercase, and the two other characters a case-insensitive regex takes for an ASCII
/// letter (`\u{17F}` for `s`, `\u{212A}` for `k`) as that letter. Borrowed when that changes
/// nothing (most text).
fn folded(text: &str) -> Cow<'_, str> {
    if !text
        .chars()
        .any(|c| c.is_ascii_uppercase() || matches!(c, '\u{17F}' | '\u{212A}'))
    {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                '\u{17F}' => 's',
                '\u{212A}' => 'k',
                c => c.to_ascii_lowercase(),
            })
            .collect(),
    )
}

/// Whether `folded` holds a word of every group of `needles`.
fn holds_needles(needles: Needles, folded: &str) -> bool {
    needles
        .iter()
        .all(|group| group.iter().any(|n| folded.contains(n)))
}

/// Masks every secret `rule` finds in `text`, pushing what it masked onto `found`.
/// `folded` is [`folded`] of the text the first rule saw: masking only ever takes words
/// out, so a needle missing from it is missing from `text` too.
fn apply<'a>(
    rule: &RedactRule,
    text: Cow<'a, str>,
    folded: &str,
    found: &mut Vec<String>,
) -> Cow<'a, str> {
    match &rule.find {
        Find::Pattern {
            needles,
            source,
            regex,
            keep,
        } => {
            if !holds_needles(needles, folded) {
                return text;
            }
            let regex = regex
                .get_or_init(|| Regex::new(source).expect("built-in redaction pattern is valid"));
            apply_regex(regex, *keep, text, found)
        }
        Find::Scan { needles, scan } => {
            let mut spans = Vec::new();
            scan_with_quoted(scan.as_ref(), needles, &text, 0, 0, &mut spans);
            spans.retain(|s| !s.is_empty() && &text[s.clone()] != MASK);
            if spans.is_empty() {
                return text;
            }
            let mut out = String::with_capacity(text.len());
            let mut at = 0;
            for span in merged(spans) {
                let secret = &text[span.clone()];
                found.push(secret.to_owned());
                let unquoted = secret.trim_matches(['\'', '"']);
                if unquoted.len() != secret.len() && !unquoted.is_empty() {
                    found.push(unquoted.to_owned());
                }
                out.push_str(&text[at..span.start]);
                out.push_str(MASK);
                at = span.end;
            }
            out.push_str(&text[at..]);
            Cow::Owned(out)
        }
    }
}

/// Masks every match of `regex` in `text` (its group `s`, `s2` or `s3` when one took
/// part, else the whole match) that `keep` does not keep, pushing what it masked onto
/// `found`.
fn apply_regex<'a>(
    regex: &Regex,
    keep: Option<fn(&Captures<'_>) -> bool>,
    text: Cow<'a, str>,
    found: &mut Vec<String>,
) -> Cow<'a, str> {
    if !regex.is_match(&text) {
        return text;
    }
    let replaced = regex.replace_all(&text, |caps: &Captures<'_>| {
        let whole = caps.get(0).expect("group 0 always matches");
        if keep.is_some_and(|k| k(caps)) {
            return whole.as_str().to_owned();
        }
        let secret = ["s", "s2", "s3"].iter().find_map(|n| caps.name(n));
        match secret {
            Some(s) if !s.as_str().is_empty() && s.as_str() != MASK => {
                found.push(s.as_str().to_owned());
                let start = s.start() - whole.start();
                let end = s.end() - whole.start();
                format!(
                    "{}{MASK}{}",
                    &whole.as_str()[..start],
                    &whole.as_str()[end..]
                )
            }
            Some(_) => whole.as_str().to_owned(),
            None => {
                found.push(whole.as_str().to_owned());
                MASK.to_owned()
            }
        }
    });
    Cow::Owned(replaced.into_owned())
}

impl Redactor {
    /// A redactor with the built-in rules plus `extra` patterns (from the policy). An extra
    /// pattern masks its whole match, or only its group named `s` when it has one.
    pub fn new(extra: &[Regex]) -> Self {
        Redactor {
            extra: extra.iter().cloned().map(ExtraPattern::from).collect(),
        }
    }

    /// [`Redactor::new`] with the policy's patterns, which may not be compiled yet
    /// ([`crate::policy::Policy::redact_patterns`]).
    pub fn with_patterns(extra: &[ExtraPattern]) -> Self {
        Redactor {
            extra: extra.to_vec(),
        }
    }

    fn redact_into<'a>(&self, text: &'a str, found: &mut Vec<String>) -> Cow<'a, str> {
        let folded = folded(text);
        let mut out = Cow::Borrowed(text);
        for rule in builtin_rules() {
            out = apply(rule, out, &folded, found);
        }
        for pattern in &self.extra {
            if pattern.may_match(&out) {
                out = apply_regex(pattern.regex(), None, out, found);
            }
        }
        out
    }

    /// `text` with every secret masked; borrowed when nothing needed masking.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redact_into(text, &mut Vec::new())
    }

    /// Convenience: the redacted text as an owned `String`.
    pub fn redact_owned(&self, text: &str) -> String {
        self.redact(text).into_owned()
    }

    /// `part` (a piece of `whole`, such as one simple command of it) redacted, also masking
    /// what only the whole reveals as a secret: in `echo pw | chpasswd` the part `echo pw`
    /// alone looks harmless.
    pub fn redact_part(&self, whole: &str, part: &str) -> String {
        let mut secrets = Vec::new();
        let _ = self.redact_into(whole, &mut secrets);
        let mut out = self.redact_owned(part);
        secrets.retain(|s| !s.is_empty() && s != MASK);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        for secret in secrets {
            if out.contains(&secret) {
                out = out.replace(&secret, MASK);
            }
        }
        out
    }

    /// The names of the built-in rules, in the order they are applied.
    pub fn builtin_rule_names() -> Vec<&'static str> {
        builtin_rules().iter().map(|r| r.name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> String {
        Redactor::default().redact(text).into_owned()
    }

    /// The redaction table's cases: (row exercised, input, expected display). `-` marks a
    /// negative case: ordinary commands that must come out unchanged. Every row of
    /// [`builtin_rules`] has at least one case (checked below).
    const CASES: &[(&str, &str, &str)] = &[
        ("sshpass-p", "sshpass -p S3cret ssh -p 2222 host", "sshpass -p *** ssh -p 2222 host"),
        ("sshpass-p", "sshpass -pS3cret ssh host", "sshpass -p*** ssh host"),
        ("sshpass-p", "sudo /usr/bin/sshpass -e -p 'S3 cret' scp f h:", "sudo /usr/bin/sshpass -e -p *** scp f h:"),
        ("-", "sshpass -f ~/.pw ssh -p 22 host", "sshpass -f ~/.pw ssh -p 22 host"),
        ("registry-login-p", "docker login -u bob -p S3cret registry.example.com", "docker login -u bob -p *** registry.example.com"),
        ("registry-login-p", "podman login -p=S3cret quay.io", "podman login -p=*** quay.io"),
        ("-", "docker run -p 8080:80 nginx", "docker run -p 8080:80 nginx"),
        ("secret-assignment", "MYSQL_PWD=S3cret mysql -u root db", "MYSQL_PWD=*** mysql -u root db"),
        ("-", "cd /srv && OLDPWD=/x PWD=/srv ls", "cd /srv && OLDPWD=/x PWD=/srv ls"),
        ("curl-user", "curl -u admin:S3cret https://api.example.com", "curl -u admin:*** https://api.example.com"),
        ("curl-user", "curl --user admin:S3cret https://x", "curl --user admin:*** https://x"),
        ("curl-user", "curl -fsSu 'admin:S3 cret' https://x", "curl -fsSu 'admin:***' https://x"),
        ("curl-user", "curl --proxy-user=bob:S3cret http://x", "curl --proxy-user=bob:*** http://x"),
        ("-", "curl -u admin https://x", "curl -u admin https://x"),
        ("url-query-secret", "curl 'https://x.example/?token=S3cret&page=2'", "curl 'https://x.example/?token=***&page=2'"),
        ("url-query-secret", "wget https://s3.example/o?X-Amz-Signature=S3cret&X-Amz-Credential=K", "wget https://s3.example/o?X-Amz-Signature=***&X-Amz-Credential=***"),
        ("-", "curl 'https://x.example/search?q=rust&page=2'", "curl 'https://x.example/search?q=rust&page=2'"),
        ("redis-cli-a", "redis-cli -h cache -a S3cret get k", "redis-cli -h cache -a *** get k"),
        ("secret-option", "redis-cli --pass S3cret ping", "redis-cli --pass *** ping"),
        ("-", "redis-cli --askpass get k", "redis-cli --askpass get k"),
        ("heredoc-body", "mysql <<EOF\nSET PASSWORD FOR 'app'@'%' = 'S3cret';\nEOF", "mysql <<EOF\n***\nEOF"),
        ("heredoc-body", "cat > /etc/app.env <<-'END'\n\tpass=S3cret\n\tEND\necho done", "cat > /etc/app.env <<-'END'\n***\n\tEND\necho done"),
        ("heredoc-body", "chpasswd <<EOF\nroot:S3cret", "chpasswd <<EOF\n***"),
        ("heredoc-body", "a <<A; b <<\"B\"\nS3cret1\nA\nS3cret2\nB\nls", "a <<A; b <<\"B\"\n***\nA\n***\nB\nls"),
        ("-", "echo $((1<<4)) && cat <<< hello", "echo $((1<<4)) && cat <<< hello"),
        ("secret-assignment", "./configure password=S3cret", "./configure password=***"),
        ("secret-assignment", "PASSWORD=S3cret ./deploy.sh", "PASSWORD=*** ./deploy.sh"),
        ("secret-assignment", "app pass=S3cret user=bob", "app pass=*** user=bob"),
        ("secret-assignment", "psql 'host=db password=S3cret dbname=app'", "psql 'host=db password=*** dbname=app'"),
        ("secret-assignment", "PGPASSWORD=S3cret psql -h db", "PGPASSWORD=*** psql -h db"),
        ("secret-assignment", "AWS_SECRET_ACCESS_KEY=S3cret aws s3 ls", "AWS_SECRET_ACCESS_KEY=*** aws s3 ls"),
        ("secret-assignment", "GITHUB_TOKEN=S3cret gh pr list", "GITHUB_TOKEN=*** gh pr list"),
        ("-", "GIT_AUTHOR_NAME=Bob gpg --keyring=/usr/share/keyrings/x.gpg -k", "GIT_AUTHOR_NAME=Bob gpg --keyring=/usr/share/keyrings/x.gpg -k"),
        ("-", "ssh -o StrictHostKeyChecking=accept-new -o HostKeyAlias=web -o PubkeyAuthentication=yes h", "ssh -o StrictHostKeyChecking=accept-new -o HostKeyAlias=web -o PubkeyAuthentication=yes h"),
        ("secret-option", "tool --password S3cret run", "tool --password *** run"),
        ("secret-option", "deploy --token=S3cret", "deploy --token=***"),
        ("secret-option", "client --api-key S3cret", "client --api-key ***"),
        ("-", "docker login --password-stdin -u bob", "docker login --password-stdin -u bob"),
        ("-", "ansible-playbook --vault-password-file ~/.vp --ask-become-pass site.yml", "ansible-playbook --vault-password-file ~/.vp --ask-become-pass site.yml"),
        ("mysql-p", "mysql -u root -pS3cret db", "mysql -u root -p*** db"),
        ("-", "mysql -u root -p appdb", "mysql -u root -p appdb"),
        ("authorization-header", "curl -H 'Authorization: Basic YWRtaW46UzNjcmV0' https://x", "curl -H 'Authorization: Basic ***' https://x"),
        ("secret-header", "curl -H 'X-Api-Key: S3cret' https://x", "curl -H 'X-Api-Key: ***' https://x"),
        ("cookie-header", "curl -H 'Cookie: session=S3cret; theme=dark' https://x", "curl -H 'Cookie: ***' https://x"),
        ("bearer", "token is bearer S3cret.x", "token is bearer ***"),
        ("htpasswd-b", "htpasswd -b /etc/nginx/.htpasswd bob S3cret", "htpasswd -b /etc/nginx/.htpasswd bob ***"),
        ("htpasswd-b", "htpasswd -nbB bob S3cret > /tmp/h", "htpasswd -nbB bob *** > /tmp/h"),
        ("-", "htpasswd -c /etc/nginx/.htpasswd bob", "htpasswd -c /etc/nginx/.htpasswd bob"),
        ("openssl-pass-arg", "openssl rsa -in k.pem -passin pass:S3cret -out k2.pem", "openssl rsa -in k.pem -passin pass:*** -out k2.pem"),
        ("-", "openssl rsa -in k.pem -passin env:KEYPASS -out k2.pem", "openssl rsa -in k.pem -passin env:KEYPASS -out k2.pem"),
        ("-", "openssl req -new -keyform PEM -key k.pem -out r.csr", "openssl req -new -keyform PEM -key k.pem -out r.csr"),
        ("openssl-k", "openssl enc -aes-256-cbc -k S3cret -in f", "openssl enc -aes-256-cbc -k *** -in f"),
        ("pem-private-key", "printf '%s' '-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----' > id", "printf '%s' '-----BEGIN OPENSSH PRIVATE KEY-----***-----END OPENSSH PRIVATE KEY-----' > id"),
        ("url-credentials", "git clone https://bob:S3cret@example.com/r.git", "git clone https://bob:***@example.com/r.git"),
        ("url-credentials", "redis-cli -u redis://:S3cret@cache:6379 ping", "redis-cli -u redis://:***@cache:6379 ping"),
        ("url-credentials", "mongosh mongodb+srv://app:S3cret@c0.example.net/db", "mongosh mongodb+srv://app:***@c0.example.net/db"),
        ("mongo-p", "mongo -u admin -p S3cret --authenticationDatabase admin", "mongo -u admin -p *** --authenticationDatabase admin"),
        ("ldap-w", "ldapsearch -x -D cn=admin,dc=ex -w S3cret -b dc=ex", "ldapsearch -x -D cn=admin,dc=ex -w *** -b dc=ex"),
        ("ldappasswd-new-old", "ldappasswd -x -D cn=admin -w Adm1n -a 0ld -s S3cret uid=bob", "ldappasswd -x -D cn=admin -w *** -a *** -s *** uid=bob"),
        ("ipmitool-P", "ipmitool -I lanplus -H bmc -U admin -P S3cret power status", "ipmitool -I lanplus -H bmc -U admin -P *** power status"),
        ("samba-user-percent", "smbclient //fs/share -U bob%S3cret -c ls", "smbclient //fs/share -U bob%*** -c ls"),
        ("lftp-user-comma", "lftp -u bob,S3cret sftp://host", "lftp -u bob,*** sftp://host"),
        ("stdin-fed-secret", "echo 'root:S3cret' | chpasswd", "echo *** | chpasswd"),
        ("stdin-fed-secret", "printf '%s' S3cret | docker login -u bob --password-stdin reg", "printf *** *** | docker login -u bob --password-stdin reg"),
        ("stdin-fed-secret", "docker login -u bob --password-stdin <<< S3cret", "docker login -u bob --password-stdin <<< ***"),
        ("-", "echo hello | grep -a h && ps -u root && ls -p /etc", "echo hello | grep -a h && ps -u root && ls -p /etc"),
        ("netrc-password", "echo 'machine api.example.com login bob password S3cret' >> ~/.netrc", "echo 'machine api.example.com login bob password ***' >> ~/.netrc"),
        ("json-secret", "curl -d '{\"password\": \"S3cret\"}' https://x", "curl -d '{\"password\": \"***\"}' https://x"),
        ("yaml-secret", "echo 'db_password: S3cret' >> config.yml", "echo 'db_password: ***' >> config.yml"),
        ("aws-access-key", "aws s3 ls # AKIAIOSFODNN7EXAMPLE", "aws s3 ls # AKIA***"),
        ("github-token", "gh auth login ghp_abcdefghijklmnopqrstuvwxyz0123456789", "gh auth login ghp_***"),
        ("gitlab-token", "glpat-abcdefghij0123456789", "glpat-***"),
        ("slack-token", "xoxb-1234567890-abcdef", "xoxb-***"),
        ("stripe-key", "curl -u sk_live_abcdefghijklmnop1234: https://api.stripe.com", "curl -u sk_live_***: https://api.stripe.com"),
        ("google-api-key", "export MAPS=AIzaSyA1234567890abcdefghijklmnopqrstuv", "export MAPS=AIza***"),
        ("npm-token", "npm_abcdefghijklmnopqrstuvwxyz0123456789", "npm_***"),
        ("jwt", "echo eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl", "echo eyJhbGciOiJIUzI1NiJ9.***"),
        ("-", "ssh -p 2222 admin@host uptime && mkdir -pv /srv/x", "ssh -p 2222 admin@host uptime && mkdir -pv /srv/x"),
        ("-", "systemctl restart nginx; journalctl -u nginx --since today", "systemctl restart nginx; journalctl -u nginx --since today"),
    ];

    #[test]
    fn redaction_table_masks_each_secret_form_and_leaves_ordinary_commands_alone() {
        let mut failures = Vec::new();
        for (row, input, expected) in CASES {
            let got = r(input);
            if got != *expected {
                failures.push(format!(
                    "[{row}] {input:?}\n   got {got:?}\n  want {expected:?}"
                ));
            }
            if *row != "-" && got.contains("S3cret") {
                failures.push(format!("[{row}] {input:?} still holds the secret: {got:?}"));
            }
            assert_eq!(r(&got), got, "redaction is idempotent for {input:?}");
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(CASES.len() >= 40, "the table has {} cases", CASES.len());
    }

    #[test]
    fn every_row_of_the_redaction_table_has_a_case() {
        let covered: Vec<&str> = CASES.iter().map(|(row, _, _)| *row).collect();
        let missing: Vec<&str> = Redactor::builtin_rule_names()
            .into_iter()
            .filter(|name| !covered.contains(name))
            .collect();
        assert!(missing.is_empty(), "rows without a case: {missing:?}");
        for row in covered {
            assert!(
                row == "-" || Redactor::builtin_rule_names().contains(&row),
                "case names an unknown row {row}"
            );
        }
    }

    #[test]
    fn a_part_of_a_command_is_masked_with_what_the_whole_reveals() {
        let red = Redactor::default();
        let whole = "echo 'root:S3cret' | chpasswd";
        assert_eq!(red.redact_part(whole, "echo 'root:S3cret'"), "echo ***");
        assert_eq!(red.redact_part(whole, "chpasswd"), "chpasswd");
    }

    #[test]
    fn long_password_option_with_equals_keeps_shape() {
        assert_eq!(
            r("mysql --password=hunter2 -e 'select 1'"),
            "mysql --password=*** -e 'select 1'"
        );
    }

    #[test]
    fn long_password_option_with_space_keeps_shape() {
        assert_eq!(r("tool --password hunter2 go"), "tool --password *** go");
        assert_eq!(
            r("deploy --api-token=abc123 --db-pass 's3 cret'"),
            "deploy --api-token=*** --db-pass ***"
        );
    }

    #[test]
    fn password_stdin_flag_is_not_a_value() {
        assert_eq!(
            r("docker login --password-stdin -u bob"),
            "docker login --password-stdin -u bob"
        );
    }

    #[test]
    fn mysql_glued_p_is_masked_but_mkdir_p_is_not() {
        assert_eq!(r("mysql -u root -pS3cretPw db"), "mysql -u root -p*** db");
        assert_eq!(
            r("/usr/bin/mysqldump -pS3cretPw db > x"),
            "/usr/bin/mysqldump -p*** db > x"
        );
        assert_eq!(r("mkdir -pv /srv/x"), "mkdir -pv /srv/x");
    }

    #[test]
    fn secret_env_assignments_are_masked() {
        for name in [
            "DB_PASSWORD",
            "MY_SECRET",
            "GITHUB_TOKEN",
            "aws_secret_access_key",
            "API_KEY",
            "GOOGLE_CREDENTIALS",
            "BASIC_AUTH",
        ] {
            assert_eq!(
                r(&format!("{name}=v4lue ./run.sh")),
                format!("{name}=*** ./run.sh"),
                "{name}"
            );
        }
        assert_eq!(
            r("export PGPASSWORD=\"a b\"; psql"),
            "export PGPASSWORD=***; psql"
        );
        assert_eq!(r("LANG=C ls"), "LANG=C ls");
    }

    #[test]
    fn authorization_and_bearer_headers_are_masked() {
        assert_eq!(
            r("curl -H 'Authorization: Bearer eyJhbGciOi.x.y' https://api"),
            "curl -H 'Authorization: Bearer ***' https://api"
        );
        assert_eq!(
            r("curl -H \"authorization: Basic dXNlcjpwYXNz\""),
            "curl -H \"authorization: Basic ***\""
        );
        assert_eq!(r("token is bearer abc.def"), "token is bearer ***");
        assert_eq!(
            r("curl -H 'X-Api-Key: k3y' x"),
            "curl -H 'X-Api-Key: ***' x"
        );
    }

    #[test]
    fn url_credentials_keep_the_user() {
        assert_eq!(
            r("git clone https://bob:pa55@example.com/repo.git"),
            "git clone https://bob:***@example.com/repo.git"
        );
        assert_eq!(
            r("psql postgres://app:p@ss@db:5432/x"),
            "psql postgres://app:***@db:5432/x"
        );
        assert_eq!(
            r("curl https://example.com/a:b"),
            "curl https://example.com/a:b"
        );
    }

    #[test]
    fn token_shapes_keep_their_prefix() {
        assert_eq!(r("AKIAIOSFODNN7EXAMPLE"), "AKIA***");
        assert_eq!(r("ghp_abcdefghijklmnopqrstuvwxyz0123456789"), "ghp_***");
        assert_eq!(r("gho_abcdefghijklmnopqrstuv"), "gho_***");
        assert_eq!(
            r("github_pat_11ABCDEFG0123456789_abcdefghijklmnop"),
            "github_pat_***"
        );
        assert_eq!(r("glpat-abcdefghij0123456789"), "glpat-***");
        for p in ["xoxa", "xoxb", "xoxp", "xoxr"] {
            assert_eq!(r(&format!("{p}-1234567890-abcdef")), format!("{p}-***"));
        }
    }

    #[test]
    fn pem_private_key_block_is_masked_whole() {
        let pem = "key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAA\n-----END OPENSSH PRIVATE KEY-----\nend";
        assert_eq!(
            r(pem),
            "key:\n-----BEGIN OPENSSH PRIVATE KEY-----***-----END OPENSSH PRIVATE KEY-----\nend"
        );
        let truncated = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow";
        assert_eq!(r(truncated), "-----BEGIN RSA PRIVATE KEY-----***");
    }

    #[test]
    fn policy_patterns_mask_whole_match_or_named_group() {
        let extra = [
            Regex::new(r"corp-[0-9]{6}").unwrap(),
            Regex::new(r"pin:(?P<s>[0-9]+)").unwrap(),
        ];
        let red = Redactor::new(&extra);
        assert_eq!(
            red.redact("use corp-123456 with pin:9999"),
            "use *** with pin:***"
        );
    }

    /// Every built-in regex, with its row's needles.
    fn pattern_rows() -> Vec<(&'static str, Needles, Regex)> {
        builtin_rules()
            .iter()
            .filter_map(|rule| match &rule.find {
                Find::Pattern {
                    needles, source, ..
                } => Some((rule.name, *needles, Regex::new(source).unwrap())),
                Find::Scan { .. } => None,
            })
            .collect()
    }

    #[test]
    fn every_builtin_regex_compiles_and_has_lowercase_needles() {
        let rows = pattern_rows();
        assert!(rows.len() > 20);
        for (name, needles, _) in rows {
            assert!(!needles.is_empty(), "{name}");
            for word in needles.iter().flat_map(|g| g.iter()) {
                assert!(
                    !word.is_empty() && *word == word.to_ascii_lowercase() && !word.contains('*'),
                    "{name}: {word:?}"
                );
            }
        }
    }

    #[test]
    fn needles_never_skip_a_regex_that_matches() {
        // The cases' texts, and each in upper case and with the two non-ASCII letters a
        // case-insensitive regex takes for `s` and `k`.
        let mut texts: Vec<String> = Vec::new();
        for (_, input, expected) in CASES {
            for t in [*input, *expected] {
                texts.push(t.to_string());
                texts.push(t.to_uppercase());
                texts.push(t.replace('s', "\u{17F}").replace('k', "\u{212A}"));
                texts.push(t.replace('S', "\u{17F}").replace('K', "\u{212A}"));
            }
        }
        let mut matched = 0;
        for (name, needles, regex) in pattern_rows() {
            for t in &texts {
                if regex.is_match(t) {
                    matched += 1;
                    assert!(
                        holds_needles(needles, &folded(t)),
                        "{name} matches {t:?} but its needles {needles:?} are missing"
                    );
                }
            }
        }
        assert!(matched > 100, "{matched}");
    }

    #[test]
    fn folding_covers_every_letter_a_case_insensitive_regex_takes_for_ascii() {
        let letter = Regex::new("(?i)^[a-z]$").unwrap();
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let text = c.to_string();
            if letter.is_match(&text) {
                let f = folded(&text);
                assert!(
                    f.len() == 1 && f.as_bytes()[0].is_ascii_lowercase(),
                    "{c:?} folds to {f:?}"
                );
                assert!(Regex::new(&format!("(?i)^{f}$")).unwrap().is_match(&text));
            }
        }
    }

    #[test]
    fn ordinary_commands_reach_no_regex() {
        for text in [
            "true",
            "systemctl restart nginx",
            "apt-get install -y nginx && df -h",
            "ls -la /srv/www; uptime",
            "journalctl -u nginx --since today",
        ] {
            let reached: Vec<&str> = pattern_rows()
                .into_iter()
                .filter(|(_, needles, _)| holds_needles(needles, &folded(text)))
                .map(|(name, _, _)| name)
                .collect();
            assert!(reached.is_empty(), "{text:?} reaches {reached:?}");
        }
    }

    /// The table run with every regex row reached, as before the needles: a folded text
    /// that holds every needle.
    fn redact_unfiltered(text: &str) -> String {
        let all_needles: String = builtin_rules()
            .iter()
            .filter_map(|rule| match &rule.find {
                Find::Pattern { needles, .. } => Some(needles.iter().flat_map(|g| g.iter())),
                Find::Scan { .. } => None,
            })
            .flatten()
            .map(|n| format!("{n} "))
            .collect();
        let mut out = Cow::Borrowed(text);
        for rule in builtin_rules() {
            out = apply(rule, out, &all_needles, &mut Vec::new());
        }
        out.into_owned()
    }

    /// The cases' inputs and secret-looking fragments, in any case, glued by shell
    /// punctuation.
    fn secretish_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let mut words: Vec<&str> = CASES.iter().map(|(_, input, _)| *input).collect();
        words.extend([
            "curl",
            "-u",
            "admin:",
            "S3cret",
            "https://",
            "bob:",
            "@host",
            "?token=",
            "&sig=",
            "Authorization:",
            "Bearer",
            "cookie:",
            "X-Api-Key:",
            "--password",
            "--db-pass=",
            "PASSWORD=",
            "api_key=",
            "\"pass\":",
            "secret:",
            "login",
            "password",
            "mysql",
            "-pS3cret",
            "smbclient",
            "-U",
            "bob%",
            "lftp",
            "bob,",
            "-passin",
            "pass:",
            "AKIAIOSFODNN7EXAMPLE",
            "glpat-",
            "npm_",
            "\u{17F}ecret=",
            "to\u{212A}en:",
            "x",
        ]);
        let word = prop::sample::select(words);
        let glue = prop::sample::select(vec![" ", "", "'", "\"", " | ", "; ", "\n", "="]);
        let case = prop::sample::select(vec![0u8, 1, 2]);
        prop::collection::vec((word, glue, case), 0..8).prop_map(|parts| {
            parts
                .into_iter()
                .map(|(w, g, case)| {
                    let w = match case {
                        0 => w.to_string(),
                        1 => w.to_uppercase(),
                        _ => w.replace('s', "\u{17F}").replace('k', "\u{212A}"),
                    };
                    format!("{w}{g}")
                })
                .collect()
        })
    }

    proptest::proptest! {
        #[test]
        fn needles_change_no_output(text in secretish_text()) {
            proptest::prop_assert_eq!(r(&text), redact_unfiltered(&text));
        }
    }

    #[test]
    fn a_lazy_extra_pattern_compiles_only_for_text_with_its_literals() {
        let lazy = ExtraPattern::lazy(r"corp-[0-9]{6}", Some(vec!["corp-".into()]));
        let red = Redactor::with_patterns(std::slice::from_ref(&lazy));
        assert_eq!(
            red.redact("systemctl restart nginx"),
            "systemctl restart nginx"
        );
        assert!(!lazy.is_compiled());
        assert_eq!(red.redact("use corp-123456 now"), "use *** now");
        assert!(lazy.is_compiled());
        let unfiltered = ExtraPattern::lazy(r"pin:(?P<s>[0-9]+)", None);
        assert!(unfiltered.is_match("pin:42"));
        assert!(!unfiltered.is_match("pin:"));
    }

    #[test]
    fn text_without_secrets_is_borrowed_unchanged() {
        let text = "systemctl restart nginx && df -h";
        assert!(matches!(Redactor::default().redact(text), Cow::Borrowed(_)));
    }

    #[test]
    fn text_the_shell_parser_refuses_is_still_redacted() {
        // Why redaction keeps its own word scanner instead of the policy's brush-parser
        // (docs/ledger.md#redaction): it must mask text that is no complete program.
        for (text, shown) in [
            ("sshpass -p 'secret ssh host", "sshpass -p ***"),
            ("curl -H 'Authorization: Bearer abc123def456", "Bearer ***"),
        ] {
            let options = brush_parser::ParserOptions::default();
            assert!(
                brush_parser::Parser::new(text.as_bytes(), &options)
                    .parse_program()
                    .is_err(),
                "the parser takes {text:?}: the reason for a scanner of our own is gone"
            );
            let out = r(text);
            assert!(out.contains(shown), "{text:?} -> {out:?}");
            assert!(
                !out.contains("secret ") && !out.contains("abc123"),
                "{out:?}"
            );
        }
    }

    #[test]
    fn redaction_is_idempotent() {
        let once = r("X_TOKEN=abc --password=p https://u:p@h AKIAIOSFODNN7EXAMPLE");
        assert_eq!(r(&once), once);
    }
}
