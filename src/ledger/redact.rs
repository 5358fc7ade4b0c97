//! Redaction of secrets from any text before opmark stores or prints it.
//!
//! One [`Redactor`] is used by the ledger (on every free-text field, as defence in depth),
//! by `run`/`show` output and by error messages. Each built-in rule finds one secret shape
//! and replaces only the secret part with `***`, so the display keeps its shape
//! (`--password=***`, `https://user:***@host`, `Authorization: Bearer ***`). Over-redaction
//! is accepted: a display that hides a harmless value is better than a ledger that leaks.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::{Captures, Regex};

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// One secret shape: the regex, and which part of a match is the secret.
#[derive(Debug)]
struct Rule {
    /// Short name, for tests and debugging.
    name: &'static str,
    /// The pattern. When it has a group named `s`, only that group is masked; otherwise the
    /// whole match is.
    regex: Regex,
    /// Lets a rule keep a match that only looks like a secret (e.g. `--password-stdin`).
    keep: Option<fn(&Captures<'_>) -> bool>,
}

/// Finds and masks secrets in text.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// Extra patterns from the policy file, applied after the built-in rules.
    extra: Vec<Regex>,
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::new(&[])
    }
}

fn builtin_rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let rule = |name, pattern: &str, keep| Rule {
            name,
            regex: Regex::new(pattern).expect("built-in redaction pattern is valid"),
            keep,
        };
        // A value as a shell word: quoted (may hold spaces) or a run of non-separators.
        const VALUE: &str = r#"(?:"[^"]*"|'[^']*'|[^\s;&|'"`]+)"#;
        vec![
            // PEM private key blocks, also a truncated one without its END line.
            rule(
                "pem-private-key",
                r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?P<s>.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
                None,
            ),
            // Authorization / Proxy-Authorization headers, with or without a scheme word.
            rule(
                "authorization-header",
                r#"(?i)\b(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|digest|token|negotiate|aws4-hmac-sha256)\s+)?(?P<s>[^\s'"]+)"#,
                None,
            ),
            // X-Api-Key: ..., X-Auth-Token: ... and similar custom headers.
            rule(
                "secret-header",
                r#"(?i)\bx-[a-z0-9-]*(?:token|key|secret|auth|password)[a-z0-9-]*\s*:\s*(?P<s>[^\s'"]+)"#,
                None,
            ),
            // A bare bearer token anywhere.
            rule(
                "bearer",
                r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/=-]+)",
                None,
            ),
            // Credentials in URLs: scheme://user:secret@host (the last '@' before the path).
            rule(
                "url-credentials",
                r#"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@'"]*:(?P<s>[^\s/'"]+)@"#,
                None,
            ),
            // --password=x, --password x, --db-pass x, --api-token=x, --client-secret x ...
            rule(
                "secret-option",
                &format!(
                    r"(?i)(?:^|[\s;&|(])(?P<opt>--?[a-z0-9_-]*(?:pass|passwd|password|secret|token|api[-_]?key|credential)[a-z0-9_-]*)(?P<sep>=|\s+)(?P<s>{VALUE})"
                ),
                Some(keep_flag_without_value),
            ),
            // mysql-style -pSECRET (the password glued to -p), only after a mysql-family tool.
            rule(
                "mysql-p",
                r"(?:^|[\s;&|(/])(?:mysql[a-z_-]*|mariadb[a-z_-]*)\b[^;&|\n]*?\s-p(?P<s>[^\s;&|]+)",
                None,
            ),
            // NAME=value where the name suggests a secret (env assignments, config lines).
            rule(
                "secret-assignment",
                &format!(
                    r"(?i)\b[a-z_][a-z0-9_.-]*(?:pass|secret|token|key|credential|auth)[a-z0-9_.-]*=(?P<s>{VALUE})"
                ),
                None,
            ),
            // "password": "x" in JSON-looking text.
            rule(
                "json-secret",
                r#"(?i)"[^"]*(?:pass|secret|token|key|credential|auth)[^"]*"\s*:\s*"(?P<s>[^"]*)""#,
                None,
            ),
            // Well-known token shapes: keep the prefix so the kind of token stays visible.
            rule(
                "aws-access-key",
                r"\b(?:AKIA|ASIA|ABIA|ACCA)(?P<s>[0-9A-Z]{16})\b",
                None,
            ),
            rule(
                "github-token",
                r"\b(?:gh[pousr]_(?P<s>[A-Za-z0-9]{20,})|github_pat_(?P<s2>[A-Za-z0-9_]{20,}))",
                None,
            ),
            rule("gitlab-token", r"\bglpat-(?P<s>[A-Za-z0-9_-]{20,})", None),
            rule("slack-token", r"\bxox[abpr]-(?P<s>[A-Za-z0-9-]{10,})", None),
        ]
    })
}

/// `--password-stdin`, `--password-file PATH` and the like take no secret as their value.
fn keep_flag_without_value(caps: &Captures<'_>) -> bool {
    let opt = caps
        .name("opt")
        .map_or("", |m| m.as_str())
        .to_ascii_lowercase();
    let spaced = caps.name("sep").is_some_and(|m| m.as_str() != "=");
    let value = caps.name("s").map_or("", |m| m.as_str());
    (spaced && (opt.ends_with("-stdin") || opt.ends_with("-file") || value.starts_with('-')))
        || value == MASK
}

/// Masks the secret part of every match of `regex` in `text`.
fn apply<'a>(
    regex: &Regex,
    keep: Option<fn(&Captures<'_>) -> bool>,
    text: Cow<'a, str>,
) -> Cow<'a, str> {
    if !regex.is_match(&text) {
        return text;
    }
    let replaced = regex.replace_all(&text, |caps: &Captures<'_>| {
        let whole = caps.get(0).expect("group 0 always matches");
        if keep.is_some_and(|k| k(caps)) {
            return whole.as_str().to_owned();
        }
        let secret = caps.name("s").or_else(|| caps.name("s2"));
        match secret {
            Some(s) if !s.as_str().is_empty() => {
                let start = s.start() - whole.start();
                let end = s.end() - whole.start();
                format!(
                    "{}{MASK}{}",
                    &whole.as_str()[..start],
                    &whole.as_str()[end..]
                )
            }
            Some(_) => whole.as_str().to_owned(),
            None => MASK.to_owned(),
        }
    });
    Cow::Owned(replaced.into_owned())
}

impl Redactor {
    /// A redactor with the built-in rules plus `extra` patterns (from the policy). An extra
    /// pattern masks its whole match, or only its group named `s` when it has one.
    pub fn new(extra: &[Regex]) -> Self {
        Redactor {
            extra: extra.to_vec(),
        }
    }

    /// `text` with every secret masked; borrowed when nothing needed masking.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for rule in builtin_rules() {
            out = apply(&rule.regex, rule.keep, out);
        }
        for regex in &self.extra {
            out = apply(regex, None, out);
        }
        out
    }

    /// Convenience: the redacted text as an owned `String`.
    pub fn redact_owned(&self, text: &str) -> String {
        self.redact(text).into_owned()
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

    #[test]
    fn text_without_secrets_is_borrowed_unchanged() {
        let text = "systemctl restart nginx && df -h";
        assert!(matches!(Redactor::default().redact(text), Cow::Borrowed(_)));
    }

    #[test]
    fn redaction_is_idempotent() {
        let once = r("X_TOKEN=abc --password=p https://u:p@h AKIAIOSFODNN7EXAMPLE");
        assert_eq!(r(&once), once);
    }
}
