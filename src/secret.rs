//! Secrets given to a command out of band (`run --secret NAME=env:VAR|file:PATH`,
//! docs/trust.md#secrets): each value becomes the environment variable NAME of the
//! command on the host, and travels only inside the channel's data to the shim (the
//! secrets block, docs/host-protocol.md#secrets). It is never an argument (the host's
//! `ps`), never in the marker, the ledger, a fingerprint (the intent binds the names
//! only), a log or a trace. Every value, its lines and its base64 and URL-encoded forms
//! are replaced with `[REDACTED:NAME]` in the command's output by the host's redactor
//! before the output is kept, so that nothing opmark prints, records, replays or returns
//! over MCP can show it (the unit tests hold the forms to a copy of what it does).
//!
//! A value lives in this process's memory only as long as the run that needs it, and its
//! `Debug` form is its name.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use base64::Engine;

/// The largest value opmark sends: an environment variable is one string of at most
/// 128 KiB on Linux (MAX_ARG_STRLEN), and a secret is far smaller.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// The secret that is sudo's password for `--become`: fed to sudo's askpass on the host,
/// never given to the command.
pub const SUDO_PASSWORD: &str = "SUDO_PASSWORD";

/// Names a secret may not take: the ones that decide how the command is found and run
/// (its shell, its search path, its loader), and opmark's own.
const RESERVED: &[&str] = &[
    "PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV", "PS4", "CDPATH", "PWD", "OLDPWD", "USER",
    "LOGNAME", "LC_ALL", "LANG", "TERM",
];

/// Where a secret's value comes from, on the machine running opmark.
#[derive(Clone, PartialEq, Eq)]
pub enum Source {
    /// This process's environment variable.
    Env(String),
    /// A file's content (one trailing newline left out, as `$(cat FILE)` would).
    File(PathBuf),
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(var) => write!(f, "env:{var}"),
            Source::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// `NAME=env:VAR` or `NAME=file:PATH`, checked but not yet read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The command's environment variable.
    pub name: String,
    /// Where the value is read from.
    pub source: Source,
}

/// Why a secret cannot be given: each says what to change. No variant holds a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not `NAME=SOURCE`. The argument is not repeated: it may be a value typed in the
    /// wrong place.
    #[error("--secret takes NAME=env:VAR or NAME=file:PATH ({what}); write it as, for example, --secret DB_PASSWORD=env:DB_PASSWORD")]
    Malformed {
        /// What is missing.
        what: &'static str,
    },
    /// NAME is not an upper-case environment variable name.
    #[error("--secret {name:?}: the name must be an upper-case environment variable name (A-Z or _, then A-Z, digits or _), as the command reads it as $NAME")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// NAME is one opmark or the command's shell relies on.
    #[error("--secret {name}: {name} decides how the command is found or run (or is opmark's own), so it cannot carry a secret; give the secret another name")]
    ReservedName {
        /// The name.
        name: String,
    },
    /// The source is neither `env:` nor `file:`.
    #[error("--secret {name}: unknown source {source_kind:?}; a value comes from env:VAR (this process's environment) or file:PATH (a file's content)")]
    UnknownSource {
        /// The name.
        name: String,
        /// What stood before the colon (or the whole source).
        source_kind: String,
    },
    /// Two secrets of one name.
    #[error("--secret {name} is given twice; give each name once")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// `env:VAR` names a variable that is not set (or not UTF-8).
    #[error("--secret {name}: the environment variable {var} is not set (or not UTF-8) in opmark's environment; export it, or read the value from a file with file:PATH")]
    EnvMissing {
        /// The name.
        name: String,
        /// The variable.
        var: String,
    },
    /// `file:PATH` cannot be read.
    #[error("--secret {name}: cannot read {path}: {why}; check the path and its permissions")]
    FileUnreadable {
        /// The name.
        name: String,
        /// The path.
        path: String,
        /// The system's reason.
        why: String,
    },
    /// The value is empty.
    #[error("--secret {name}: the value is empty; an empty secret hides nothing and redacts nothing. Check its source")]
    Empty {
        /// The name.
        name: String,
    },
    /// The value holds a NUL byte, which no environment variable can.
    #[error("--secret {name}: the value holds a NUL byte, which no environment variable can hold; send binary data as input with --stdin instead")]
    NulByte {
        /// The name.
        name: String,
    },
    /// sudo's password has more than one line.
    #[error("--secret SUDO_PASSWORD: the value has more than one line, and sudo reads one; check its source (a file's one trailing newline is left out already)")]
    MultilinePassword,
    /// The value is larger than [`MAX_VALUE_BYTES`].
    #[error("--secret {name}: the value is {len} bytes, more than the {max} an environment variable should carry; send large data as input with --stdin instead", max = MAX_VALUE_BYTES)]
    TooLarge {
        /// The name.
        name: String,
        /// Its length.
        len: usize,
    },
}

/// Whether `user` can be `--become`'s user: a POSIX user name (letters, digits, `.`, `_`,
/// `-`, not starting with `-`), at most 32 bytes. The error says why, with the fix.
pub fn check_become_user(user: &str) -> Result<(), String> {
    let ok = !user.is_empty()
        && user.len() <= 32
        && !user.starts_with('-')
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--become {:?} is not a user name (letters, digits, `.`, `_`, `-`, not starting with `-`, at most 32); name the user the command should run as, or give --become alone for root",
            crate::text::printable(user)
        ))
    }
}

/// Whether `name` is a name a secret may take (see [`SecretError::BadName`],
/// [`SecretError::ReservedName`]). Upper case only: the host shim's variables are all
/// lower case, so a secret can never set one of them where the command starts (which
/// would let a value choose what runs, around the policy); the shim checks the same.
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_');
    if !first_ok
        || !chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        || name.len() > 128
    {
        return Err(SecretError::BadName {
            name: name.to_owned(),
        });
    }
    let upper = name.to_ascii_uppercase();
    if RESERVED.contains(&upper.as_str())
        || upper.starts_with("OPMARK_")
        || upper.starts_with("_OPMARK_")
        || upper.starts_with("LD_")
        || upper.starts_with("LC_")
    {
        return Err(SecretError::ReservedName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl FromStr for Spec {
    type Err = SecretError;

    fn from_str(given: &str) -> Result<Spec, SecretError> {
        let Some((name, source)) = given.split_once('=') else {
            return Err(SecretError::Malformed {
                what: "the argument has no `=`; it is not shown, in case it is the value",
            });
        };
        check_name(name)?;
        let source = match source.split_once(':') {
            Some(("env", var)) if !var.is_empty() => Source::Env(var.to_owned()),
            Some(("file", path)) if !path.is_empty() => Source::File(PathBuf::from(path)),
            Some(("env", _)) => {
                return Err(SecretError::Malformed {
                    what: "env: names no variable",
                })
            }
            Some(("file", _)) => {
                return Err(SecretError::Malformed {
                    what: "file: names no path",
                })
            }
            Some((kind, _)) => {
                return Err(SecretError::UnknownSource {
                    name: name.to_owned(),
                    source_kind: kind.to_owned(),
                })
            }
            None => {
                // Most likely the value itself, typed where its source belongs: never
                // repeat it back.
                return Err(SecretError::UnknownSource {
                    name: name.to_owned(),
                    source_kind: "(no env: or file: prefix; the text after = is not shown)"
                        .to_owned(),
                });
            }
        };
        Ok(Spec {
            name: name.to_owned(),
            source,
        })
    }
}

impl Spec {
    /// Every `--secret` argument, parsed (never by clap, whose error would repeat the
    /// argument: a value typed where its source belongs would be on the screen).
    pub fn parse_all(given: &[String]) -> Result<Vec<Spec>, SecretError> {
        given.iter().map(|g| g.parse()).collect()
    }

    /// Reads the value from its source.
    pub fn read(&self) -> Result<Secret, SecretError> {
        let name = self.name.clone();
        let value = match &self.source {
            Source::Env(var) => std::env::var(var).map_err(|_| SecretError::EnvMissing {
                name: name.clone(),
                var: var.clone(),
            })?,
            Source::File(path) => {
                let mut text =
                    std::fs::read_to_string(path).map_err(|e| SecretError::FileUnreadable {
                        name: name.clone(),
                        path: path.display().to_string(),
                        why: e.to_string(),
                    })?;
                if text.ends_with('\n') {
                    text.pop();
                    if text.ends_with('\r') {
                        text.pop();
                    }
                }
                text
            }
        };
        if value.is_empty() {
            return Err(SecretError::Empty { name });
        }
        if value.contains('\0') {
            return Err(SecretError::NulByte { name });
        }
        if name == SUDO_PASSWORD && value.contains('\n') {
            return Err(SecretError::MultilinePassword);
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(SecretError::TooLarge {
                name,
                len: value.len(),
            });
        }
        Ok(Secret { name, value })
    }
}

/// One secret with its value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    name: String,
    value: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({}: [REDACTED:{}])", self.name, self.name)
    }
}

/// The secrets of one run, read and checked, in the order given.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    secrets: Vec<Secret>,
    /// Their names, in the order given.
    names: Vec<String>,
    /// Every text to redact with the name it stands for, longest first.
    forms: Vec<(String, String)>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.names).finish()
    }
}

/// What a call without secrets carries.
static NONE: Secrets = Secrets {
    secrets: Vec::new(),
    names: Vec::new(),
    forms: Vec::new(),
};

impl Secrets {
    /// No secrets, for a call that has none.
    pub fn none() -> &'static Secrets {
        &NONE
    }

    /// Reads every spec's value; refuses a name given twice.
    pub fn read(specs: &[Spec]) -> Result<Secrets, SecretError> {
        let mut secrets: Vec<Secret> = Vec::with_capacity(specs.len());
        for spec in specs {
            if secrets.iter().any(|s| s.name == spec.name) {
                return Err(SecretError::Duplicate {
                    name: spec.name.clone(),
                });
            }
            secrets.push(spec.read()?);
        }
        Ok(Secrets::from_secrets(secrets))
    }

    fn from_secrets(secrets: Vec<Secret>) -> Secrets {
        let mut forms: Vec<(String, String)> = Vec::new();
        for secret in &secrets {
            for form in forms_of(&secret.value) {
                if !forms.iter().any(|(f, _)| *f == form) {
                    forms.push((form, secret.name.clone()));
                }
            }
        }
        forms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        let names = secrets.iter().map(|s| s.name.clone()).collect();
        Secrets {
            secrets,
            names,
            forms,
        }
    }

    /// Whether sudo's password ([`SUDO_PASSWORD`]) is among them.
    pub fn has_sudo_password(&self) -> bool {
        self.names.iter().any(|n| n == SUDO_PASSWORD)
    }

    /// The names, in the order given (what the intent binds and the ledger records).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The `SECRETS` argument of the shim's `run` verb: `-`, or `e:NAME:LINES` per
    /// secret (`p:` for sudo's password) and `r:NAME:1` per form to redact
    /// (docs/host-protocol.md#secrets). Names and counts only.
    pub fn wire_list(&self) -> String {
        if self.secrets.is_empty() {
            return "-".to_owned();
        }
        let mut entries: Vec<String> = self
            .secrets
            .iter()
            .map(|s| {
                let kind = if s.name == SUDO_PASSWORD { "p" } else { "e" };
                format!("{kind}:{}:{}", s.name, s.value.split('\n').count())
            })
            .collect();
        entries.extend(self.forms.iter().map(|(_, name)| format!("r:{name}:1")));
        entries.join(",")
    }

    /// The secrets block the shim reads from the channel's data before the command: each
    /// entry of [`Secrets::wire_list`]'s lines, each line ending in a newline.
    pub fn wire_block(&self) -> Vec<u8> {
        let mut block = Vec::new();
        for secret in &self.secrets {
            for line in secret.value.split('\n') {
                block.extend_from_slice(line.as_bytes());
                block.push(b'\n');
            }
        }
        for (form, _) in &self.forms {
            block.extend_from_slice(form.as_bytes());
            block.push(b'\n');
        }
        block
    }
}

/// The texts a value can show up as in output: itself (when one line), each of its
/// lines (a key file's), its base64 (standard and URL-safe, without the padding, which
/// only ends it) and its URL encoding (percent, and form with `+` for spaces).
fn forms_of(value: &str) -> Vec<String> {
    let mut forms = Vec::new();
    let mut push = |form: String| {
        if !form.is_empty() && !forms.contains(&form) {
            forms.push(form);
        }
    };
    if value.contains('\n') {
        for line in value.split('\n') {
            push(line.trim_end_matches('\r').to_owned());
        }
    } else {
        push(value.to_owned());
    }
    // Base64 of the value wherever it starts in what is encoded (`echo "$V" | base64`
    // adds a newline; `user:$V` for Basic auth puts it at an offset): the groups made of
    // its bytes alone, at each of the three alignments. The one or two characters at
    // either end that mix in a neighbour's bits are left, and say little.
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        push(engine.encode(value));
        for offset in 0..3usize {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(value.as_bytes());
            let encoded = engine.encode(&padded);
            let whole_groups = padded.len() / 3 * 4;
            let start = if offset == 0 { 0 } else { 4 };
            if whole_groups >= start + 4 {
                push(encoded[start..whole_groups].to_owned());
            }
        }
    }
    push(percent_encode(value, false));
    push(percent_encode(value, true));
    forms
}

/// RFC 3986 percent-encoding of everything but the unreserved characters; `form` writes
/// a space as `+` (application/x-www-form-urlencoded).
fn percent_encode(value: &str, form: bool) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b' ' if form => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::borrow::Cow;

    /// What the host's redactor (`remote-scripts/shim/36-redact-become.sh::redactor`) does
    /// to output, for the forms the client computes: every form of every value replaced by
    /// `[REDACTED:NAME]`, longest form first.
    impl Secrets {
        fn redact<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
            let mut out: Cow<'a, [u8]> = Cow::Borrowed(bytes);
            for (form, name) in &self.forms {
                let needle = form.as_bytes();
                if find(&out, needle).is_none() {
                    continue;
                }
                let mark = format!("[REDACTED:{name}]");
                let mut next = Vec::with_capacity(out.len());
                let mut rest: &[u8] = &out;
                while let Some(at) = find(rest, needle) {
                    next.extend_from_slice(&rest[..at]);
                    next.extend_from_slice(mark.as_bytes());
                    rest = &rest[at + needle.len()..];
                }
                next.extend_from_slice(rest);
                out = Cow::Owned(next);
            }
            out
        }

        /// `redact` for text.
        fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
            match self.redact(text.as_bytes()) {
                Cow::Borrowed(_) => Cow::Borrowed(text),
                Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
            }
        }
    }

    fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        if needle.is_empty() || needle.len() > haystack.len() {
            return None;
        }
        haystack.windows(needle.len()).position(|w| w == needle)
    }

    fn secrets(pairs: &[(&str, &str)]) -> Secrets {
        Secrets::from_secrets(
            pairs
                .iter()
                .map(|(n, v)| Secret {
                    name: (*n).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
        )
    }

    #[test]
    fn a_spec_names_its_source_and_never_repeats_a_value_typed_in_its_place() {
        assert_eq!(
            "TOKEN=env:MY_TOKEN".parse::<Spec>().unwrap(),
            Spec {
                name: "TOKEN".into(),
                source: Source::Env("MY_TOKEN".into())
            }
        );
        assert_eq!(
            "KEY=file:/etc/k:x".parse::<Spec>().unwrap().source,
            Source::File("/etc/k:x".into())
        );
        let err = "TOKEN=hunter2".parse::<Spec>().unwrap_err();
        assert!(matches!(err, SecretError::UnknownSource { .. }));
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = "TOKEN=vault:hunter2".parse::<Spec>().unwrap_err();
        assert!(
            err.to_string().contains("unknown source \"vault\""),
            "{err}"
        );
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = "hunter2".parse::<Spec>().unwrap_err();
        assert!(matches!(err, SecretError::Malformed { .. }));
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(matches!(
            "TOKEN=env:".parse::<Spec>(),
            Err(SecretError::Malformed { .. })
        ));
    }

    #[test]
    fn a_name_is_an_environment_variable_name_the_command_can_own() {
        for good in ["TOKEN", "_X", "DB_PASSWORD2", "SUDO_PASSWORD"] {
            check_name(good).unwrap();
        }
        // Lower case could name one of the shim's own variables (`m`, `sv_shell`).
        for bad in [
            "", "2FA", "MY-TOKEN", "A B", "a$b", "é", "m", "sv_shell", "Token",
        ] {
            assert!(
                matches!(check_name(bad), Err(SecretError::BadName { .. })),
                "{bad}"
            );
        }
        for reserved in [
            "PATH",
            "LC_ALL",
            "IFS",
            "OPMARK_ROOT",
            "_OPMARK_S_X",
            "LD_PRELOAD",
        ] {
            assert!(
                matches!(check_name(reserved), Err(SecretError::ReservedName { .. })),
                "{reserved}"
            );
        }
    }

    #[test]
    fn the_wire_carries_names_and_line_counts_in_the_list_and_values_only_in_the_block() {
        let s = secrets(&[("A", "one"), ("B", "x\ny\n")]);
        let list = s.wire_list();
        assert!(list.starts_with("e:A:1,e:B:3,"), "{list}");
        assert!(!list.contains("one"), "{list}");
        assert!(list.split(',').all(|e| e
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_:".contains(c))));
        let block = String::from_utf8(s.wire_block()).unwrap();
        assert!(block.starts_with("one\nx\ny\n\n"), "{block:?}");
        assert_eq!(
            block.lines().count(),
            list.split(',')
                .map(|e| e.rsplit(':').next().unwrap().parse::<usize>().unwrap())
                .sum::<usize>()
        );
        assert_eq!(Secrets::default().wire_list(), "-");
        assert!(Secrets::default().wire_block().is_empty());
    }

    #[test]
    fn redaction_replaces_the_value_its_lines_and_its_encoded_forms() {
        let s = secrets(&[("TOKEN", "s3cr3t value/+")]);
        let b64 = base64::engine::general_purpose::STANDARD.encode("s3cr3t value/+");
        let text = format!("a s3cr3t value/+ b {b64} c s3cr3t%20value%2F%2B d s3cr3t+value%2F%2B");
        let out = s.redact_str(&text);
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(!out.contains(b64.trim_end_matches('=')), "{out}");
        assert_eq!(out.matches("[REDACTED:TOKEN]").count(), 4, "{out}");
        let key = secrets(&[("KEY", "-----BEGIN-----\nAAAAbbbb\n-----END-----")]);
        let out = key.redact_str("cat: AAAAbbbb\n");
        assert_eq!(out, "cat: [REDACTED:KEY]\n");
        assert!(matches!(s.redact(b"nothing here"), Cow::Borrowed(_)));
        // As `echo "$V" | base64` and a Basic credential `user:$V` carry it.
        let b64 = base64::engine::general_purpose::STANDARD;
        for wrapped in [
            "s3cr3t value/+\n".to_owned(),
            "bob:s3cr3t value/+".to_owned(),
            "ab:s3cr3t value/+".to_owned(),
        ] {
            let encoded = b64.encode(&wrapped);
            let out = s.redact_str(&encoded);
            assert!(
                out.contains("[REDACTED:TOKEN]"),
                "{wrapped:?}: {encoded} -> {out}"
            );
            let left = out.replace("[REDACTED:TOKEN]", "");
            assert!(left.trim_end_matches('=').len() <= 8, "{wrapped:?}: {out}");
        }
    }

    #[test]
    fn sudos_password_goes_to_sudo_not_to_the_command_and_is_one_line() {
        let s = secrets(&[("SUDO_PASSWORD", "pw"), ("A", "v")]);
        assert!(s.has_sudo_password());
        assert!(
            s.wire_list().starts_with("p:SUDO_PASSWORD:1,e:A:1,"),
            "{}",
            s.wire_list()
        );
        let dir = std::env::temp_dir().join(format!("opmark-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "one\ntwo\n").unwrap();
        let spec: Spec = format!("SUDO_PASSWORD=file:{}", file.display())
            .parse()
            .unwrap();
        assert_eq!(spec.read(), Err(SecretError::MultilinePassword));
        std::fs::write(&file, "one\n").unwrap();
        assert!(
            spec.read().is_ok(),
            "a file's one trailing newline is left out"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn become_takes_a_user_name_and_nothing_a_shell_or_sudo_would_read_otherwise() {
        for good in ["root", "deploy", "svc-app", "a.b_c", "u1"] {
            check_become_user(good).unwrap();
        }
        for bad in ["", "-u", "a b", "x;y", "$(id)", "a/b", &"x".repeat(33)] {
            assert!(check_become_user(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_shows_names_never_values() {
        let s = secrets(&[("TOKEN", "hunter2")]);
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{:?}", s.secrets[0]).contains("hunter2"));
    }
}
