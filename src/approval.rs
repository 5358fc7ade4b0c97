//! Signed approvals (docs/trust.md#the-approval-flow): an approval that an agent
//! cannot make for itself. A human signs a statement that binds one held attempt (op id,
//! host, the intent's fingerprint, the family, the marker root where known, an expiry and
//! a nonce) with their SSH key, in OpenSSH's SSHSIG format under the namespace
//! [`NAMESPACE`], so `ssh-keygen -Y verify` checks it with no opmark code. `run --approval`
//! presents it; it counts only when the signature verifies against the `allowed_signers`
//! file the configuration names, the binding matches, it has not expired, and its nonce
//! was never used (the use is recorded with the attempt it lets run).
//!
//! A token is the statement's text followed by the armored signature:
//!
//! ```text
//! opmark-approval v1
//! op: deploy-42
//! host: web1
//! marker_root: -
//! fingerprint: 5c1f...        (the ledger's HMAC of the intent)
//! host_fingerprint: 9a0e...   (the plain SHA-256 the host marker holds, or -)
//! family: destructive
//! expires: 2026-12-05T08:00:00Z
//! nonce: 3f9a...
//! note: rollback approved by the on-call
//! -----BEGIN SSH SIGNATURE-----
//! ...
//! -----END SSH SIGNATURE-----
//! ```
//!
//! The signed message is the statement's lines, each ending in a newline, exactly as
//! written; every field is on its own line and no value may hold a control character, so
//! no field can be smuggled into another.

use std::path::{Path, PathBuf};

use russh::keys::ssh_key::{self, HashAlg, LineEnding, PublicKey, SshSig};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::family::Family;

/// The SSHSIG namespace of an approval: a signature made for anything else (a git commit,
/// a file) never counts as one.
pub const NAMESPACE: &str = "opmark-approval";

/// The first line of every statement.
const HEADER: &str = "opmark-approval v1";

/// The field names, in the one order a statement has them.
const FIELDS: [&str; 9] = [
    "op",
    "host",
    "marker_root",
    "fingerprint",
    "host_fingerprint",
    "family",
    "expires",
    "nonce",
    "note",
];

const PEM_BEGIN: &str = "-----BEGIN SSH SIGNATURE-----";

/// Where signed approvals are required from: set only by whoever controls the machine's
/// configuration, never by a flag of `run`. The system file (root's to write) applies
/// whatever policy or ledger a caller names; the policy's `approvers` applies with that
/// policy.
pub const SYSTEM_APPROVERS: &str = "/etc/opmark/allowed_signers";

/// The `allowed_signers` file that approvals must be signed against, if any: the system
/// file when it exists (it holds whatever `--policy` or ledger a caller names), else the
/// policy's `approvers`. None: approvals are self-service (`--approve NOTE`).
pub fn required(policy: &crate::policy::Policy) -> Option<PathBuf> {
    let system = system_approvers();
    if system.exists() {
        return Some(system);
    }
    policy.approvers().map(Path::to_path_buf)
}

/// Where the system's approvers file is looked for. The tests, which cannot write to
/// /etc in parallel, point it elsewhere; a product build has no such switch.
fn system_approvers() -> PathBuf {
    #[cfg(feature = "test-hooks")]
    if let Some(path) = std::env::var_os("OPMARK_TEST_SYSTEM_APPROVERS") {
        return PathBuf::from(path);
    }
    PathBuf::from(SYSTEM_APPROVERS)
}

/// Why an approval does not count. Callers branch on the kind (it picks the reason code).
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// Not a token: a field missing, out of order or malformed, no signature block.
    #[error("the approval is malformed: {0}")]
    Malformed(String),
    /// The signature does not verify, or no key of the allowed signers made it.
    #[error("the approval's signature is not valid: {0}")]
    Signature(String),
    /// Made for another operation, host, intent, family or marker root.
    #[error("the approval was made for another {field}: it says {token}, this run is {here}")]
    Mismatch {
        field: &'static str,
        token: String,
        here: String,
    },
    /// Past its expiry.
    #[error("the approval expired at {0}; a human makes a new one with `opmark approve`")]
    Expired(String),
    /// Its nonce was used already.
    #[error("the approval was used already, by attempt {attempt} of op {op}; an approval lets one attempt run")]
    Used { op: String, attempt: String },
    /// The allowed signers file cannot be read or has a line opmark cannot use.
    #[error("{0}")]
    Signers(String),
    /// Signing failed (no key, an encrypted key without an agent, the agent refused).
    #[error("{0}")]
    Signing(String),
}

/// What one approval binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub op_id: String,
    pub host: String,
    /// The marker root id the operation's attempts reached, when known.
    pub marker_root: Option<String>,
    /// The ledger's fingerprint (HMAC) of the intent.
    pub fingerprint: String,
    /// The plain SHA-256 of the intent (what the host marker holds), when the approver
    /// was given it.
    pub host_fingerprint: Option<String>,
    pub family: Family,
    /// Unix seconds.
    pub expires: i64,
    /// 128 random bits, hex.
    pub nonce: String,
    /// Why the human approves, one line.
    pub note: String,
}

impl Statement {
    /// A new statement with a fresh nonce, expiring `ttl_secs` from now.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        op_id: &str,
        host: &str,
        marker_root: Option<&str>,
        fingerprint: &str,
        host_fingerprint: Option<&str>,
        family: Family,
        ttl_secs: i64,
        note: &str,
    ) -> Result<Statement, ApprovalError> {
        let nonce: [u8; 16] = rand::random();
        let statement = Statement {
            op_id: op_id.to_owned(),
            host: host.to_owned(),
            marker_root: marker_root.map(str::to_owned),
            fingerprint: fingerprint.to_owned(),
            host_fingerprint: host_fingerprint.map(str::to_owned),
            family,
            expires: OffsetDateTime::now_utc().unix_timestamp() + ttl_secs,
            nonce: hex::encode(nonce),
            note: note.to_owned(),
        };
        for (name, value) in statement.values() {
            check_value(name, &value)?;
        }
        Ok(statement)
    }

    fn values(&self) -> [(&'static str, String); 9] {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        [
            ("op", self.op_id.clone()),
            ("host", self.host.clone()),
            ("marker_root", opt(&self.marker_root)),
            ("fingerprint", self.fingerprint.clone()),
            ("host_fingerprint", opt(&self.host_fingerprint)),
            ("family", self.family.to_string()),
            ("expires", stamp(self.expires)),
            ("nonce", self.nonce.clone()),
            ("note", self.note.clone()),
        ]
    }

    /// The exact bytes that are signed.
    pub fn text(&self) -> String {
        let mut out = format!("{HEADER}\n");
        for (name, value) in self.values() {
            out.push_str(&format!("{name}: {value}\n"));
        }
        out
    }

    /// The expiry, as written in the statement.
    pub fn expires_at(&self) -> String {
        stamp(self.expires)
    }

    fn parse(text: &str) -> Result<Statement, ApprovalError> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(ApprovalError::Malformed(format!(
                "it does not begin with `{HEADER}`"
            )));
        }
        let mut values = Vec::with_capacity(FIELDS.len());
        for name in FIELDS {
            let line = lines.next().ok_or_else(|| {
                ApprovalError::Malformed(format!("the field `{name}` is missing"))
            })?;
            let value = line
                .strip_prefix(name)
                .and_then(|r| r.strip_prefix(": "))
                .ok_or_else(|| {
                    ApprovalError::Malformed(format!(
                        "expected the field `{name}` here, found {line:?}"
                    ))
                })?;
            check_value(name, value)?;
            values.push(value.to_owned());
        }
        if lines.next().is_some() {
            return Err(ApprovalError::Malformed(
                "text after the `note` field, before the signature".into(),
            ));
        }
        let opt = |v: &str| (v != "-").then(|| v.to_owned());
        let hex_of = |name: &str, v: &str, len: usize| -> Result<(), ApprovalError> {
            if v.len() == len && v.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(())
            } else {
                Err(ApprovalError::Malformed(format!(
                    "`{name}` must be {len} hex digits"
                )))
            }
        };
        hex_of("fingerprint", &values[3], 64)?;
        if values[4] != "-" {
            hex_of("host_fingerprint", &values[4], 64)?;
        }
        hex_of("nonce", &values[7], 32)?;
        let family: Family = values[5]
            .parse()
            .map_err(|_| ApprovalError::Malformed(format!("unknown family {:?}", values[5])))?;
        let expires = OffsetDateTime::parse(&values[6], &Rfc3339)
            .map_err(|e| ApprovalError::Malformed(format!("`expires`: {e}")))?
            .unix_timestamp();
        Ok(Statement {
            op_id: values[0].clone(),
            host: values[1].clone(),
            marker_root: opt(&values[2]),
            fingerprint: values[3].clone(),
            host_fingerprint: opt(&values[4]),
            family,
            expires,
            nonce: values[7].clone(),
            note: values[8].clone(),
        })
    }
}

fn check_value(name: &str, value: &str) -> Result<(), ApprovalError> {
    if value.is_empty() {
        return Err(ApprovalError::Malformed(format!("`{name}` is empty")));
    }
    if value.chars().any(char::is_control) {
        return Err(ApprovalError::Malformed(format!(
            "`{name}` holds a control character (a newline, say); it must be one line"
        )));
    }
    Ok(())
}

fn stamp(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| unix.to_string())
}

/// A statement and its signature, as handed from the human to the run.
#[derive(Debug, Clone)]
pub struct Token {
    pub statement: Statement,
    /// The exact signed bytes.
    signed: String,
    signature: SshSig,
}

impl Token {
    /// Reads a token as `opmark approve` wrote it.
    pub fn parse(text: &str) -> Result<Token, ApprovalError> {
        let text = text.trim_start_matches('\u{feff}');
        let at = text.find(PEM_BEGIN).ok_or_else(|| {
            ApprovalError::Malformed(format!("no `{PEM_BEGIN}` block after the statement"))
        })?;
        let (signed, pem) = text.split_at(at);
        let statement = Statement::parse(signed)?;
        // Exactly the canonical text: a statement that would print differently (a CR, a
        // trailing space) is not the one that was signed the way opmark signs.
        if signed != statement.text() {
            return Err(ApprovalError::Malformed(
                "the statement is not in its canonical form (line endings, spacing)".into(),
            ));
        }
        let signature = SshSig::from_pem(pem.trim())
            .map_err(|e| ApprovalError::Malformed(format!("the signature block: {e}")))?;
        Ok(Token {
            statement,
            signed: signed.to_owned(),
            signature,
        })
    }

    /// The token as a file holds it.
    pub fn to_text(&self) -> Result<String, ApprovalError> {
        let pem = self
            .signature
            .to_pem(LineEnding::LF)
            .map_err(|e| ApprovalError::Signing(format!("encoding the signature: {e}")))?;
        Ok(format!("{}{}", self.signed, pem.trim_end()) + "\n")
    }

    /// The public key that made the signature (whether it verifies or not).
    pub fn key_fingerprint(&self) -> String {
        PublicKey::from(self.signature.public_key().clone())
            .fingerprint(HashAlg::Sha256)
            .to_string()
    }
}

/// Who signed an approval that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The allowed signers line's first principal.
    pub principal: String,
    /// `SHA256:...` of the signing key.
    pub key: String,
}

/// One usable line of an `allowed_signers` file.
#[derive(Debug, Clone)]
struct AllowedSigner {
    principals: Vec<String>,
    namespaces: Option<Vec<String>>,
    valid_after: Option<i64>,
    valid_before: Option<i64>,
    key: PublicKey,
    line: usize,
}

/// The approvers: an OpenSSH `allowed_signers` file (`ssh-keygen(1)`, ALLOWED SIGNERS).
#[derive(Debug, Clone)]
pub struct AllowedSigners {
    pub path: PathBuf,
    entries: Vec<AllowedSigner>,
}

impl AllowedSigners {
    /// Reads and checks the file; a line opmark cannot use is an error naming it.
    pub fn load(path: &Path) -> Result<AllowedSigners, ApprovalError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ApprovalError::Signers(format!(
                "the approvers file {} cannot be read: {e}",
                path.display()
            ))
        })?;
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad =
                |why: String| ApprovalError::Signers(format!("{}:{n}: {why}", path.display()));
            let mut words = split_words(line).into_iter();
            let principals = words.next().ok_or_else(|| bad("no principals".into()))?;
            let mut next = words.next().ok_or_else(|| bad("no key".into()))?;
            let mut entry_options = Vec::new();
            if !next.starts_with("ssh-") && !next.starts_with("ecdsa-") && !next.starts_with("sk-")
            {
                entry_options = split_options(&next);
                next = words
                    .next()
                    .ok_or_else(|| bad("no key after the options".into()))?;
            }
            let blob = words
                .next()
                .ok_or_else(|| bad("no key data after the key type".into()))?;
            let key = PublicKey::from_openssh(&format!("{next} {blob}"))
                .map_err(|e| bad(format!("the key does not parse: {e}")))?;
            let mut entry = AllowedSigner {
                principals: principals
                    .split(',')
                    .map(|p| p.trim_matches('"').to_owned())
                    .collect(),
                namespaces: None,
                valid_after: None,
                valid_before: None,
                key,
                line: n,
            };
            for opt in entry_options {
                let (name, value) = match opt.split_once('=') {
                    Some((name, value)) => (
                        name.to_ascii_lowercase(),
                        Some(value.trim_matches('"').to_owned()),
                    ),
                    None => (opt.to_ascii_lowercase(), None),
                };
                match (name.as_str(), value) {
                    ("cert-authority", _) => return Err(bad(
                        "`cert-authority` lines (signatures by certificates) are not supported \
                             for approvals; list each approver's own key"
                            .into(),
                    )),
                    ("namespaces", Some(v)) => {
                        entry.namespaces = Some(v.split(',').map(str::to_owned).collect())
                    }
                    ("valid-after", Some(v)) => {
                        entry.valid_after = Some(signer_time(&v).map_err(bad)?)
                    }
                    ("valid-before", Some(v)) => {
                        entry.valid_before = Some(signer_time(&v).map_err(bad)?)
                    }
                    (other, _) => return Err(bad(format!("unknown option `{other}`"))),
                }
            }
            entries.push(entry);
        }
        Ok(AllowedSigners {
            path: path.to_owned(),
            entries,
        })
    }

    /// The signer of `token`, if its signature verifies under the approval namespace and
    /// a line of this file lists its key for that namespace, valid now.
    pub fn verify(&self, token: &Token) -> Result<Signer, ApprovalError> {
        let signed_by = PublicKey::from(token.signature.public_key().clone());
        let fp = signed_by.fingerprint(HashAlg::Sha256).to_string();
        if token.signature.namespace() != NAMESPACE {
            return Err(ApprovalError::Signature(format!(
                "it was made for the namespace {:?}, not {NAMESPACE:?}",
                token.signature.namespace()
            )));
        }
        signed_by
            .verify(NAMESPACE, token.signed.as_bytes(), &token.signature)
            .map_err(|e| {
                ApprovalError::Signature(format!(
                    "the statement does not match its signature by {fp} ({e}): it was changed after signing"
                ))
            })?;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let entry = self
            .entries
            .iter()
            .filter(|e| e.key.key_data() == signed_by.key_data())
            .find(|e| {
                e.namespaces
                    .as_ref()
                    .is_none_or(|ns| ns.iter().any(|n| n == NAMESPACE))
                    && e.valid_after.is_none_or(|t| now >= t)
                    && e.valid_before.is_none_or(|t| now < t)
            })
            .ok_or_else(|| {
                ApprovalError::Signature(format!(
                    "the key {fp} that signed it is not an approver in {} (for the namespace \
                     {NAMESPACE}, now)",
                    self.path.display()
                ))
            })?;
        let _ = entry.line;
        Ok(Signer {
            principal: entry.principals[0].clone(),
            key: fp,
        })
    }

    /// Whether `key` is listed (for choosing which of an agent's keys signs).
    pub fn lists(&self, key: &PublicKey) -> bool {
        self.entries
            .iter()
            .any(|e| e.key.key_data() == key.key_data())
    }
}

/// `YYYYMMDD[HHMM[SS]]` (UTC with a trailing `Z`, else local; taken as UTC here), as
/// allowed_signers writes times.
fn signer_time(v: &str) -> Result<i64, String> {
    let digits = v.trim_end_matches(['Z', 'z']);
    if !(digits.len() == 8 || digits.len() == 12 || digits.len() == 14)
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(format!("the time {v:?} is not YYYYMMDD[HHMM[SS]]"));
    }
    let n = |a: usize, b: usize| {
        digits
            .get(a..b)
            .map_or(0, |s| s.parse::<u32>().unwrap_or(0))
    };
    let date = time::Date::from_calendar_date(
        n(0, 4) as i32,
        time::Month::try_from(n(4, 6) as u8).map_err(|e| e.to_string())?,
        n(6, 8) as u8,
    )
    .map_err(|e| e.to_string())?;
    let t = time::Time::from_hms(n(8, 10) as u8, n(10, 12) as u8, n(12, 14) as u8)
        .map_err(|e| e.to_string())?;
    Ok(date.with_time(t).assume_utc().unix_timestamp())
}

/// Splits on spaces outside double quotes.
fn split_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ' ' | '\t' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Splits an options field on commas outside double quotes.
fn split_options(field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in field.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Signs `statement` with the private key file `path` (unencrypted; an encrypted key is
/// used through ssh-agent instead).
pub fn sign_with_file(statement: &Statement, path: &Path) -> Result<Token, ApprovalError> {
    let private = ssh_key::PrivateKey::read_openssh_file(path).map_err(|e| {
        ApprovalError::Signing(format!("the key {} cannot be read: {e}", path.display()))
    })?;
    if private.is_encrypted() {
        return Err(ApprovalError::Signing(format!(
            "the key {} is encrypted: add it to ssh-agent (`ssh-add {}`) and run again without -i, \
             or with -i naming its .pub",
            path.display(),
            path.display()
        )));
    }
    let text = statement.text();
    let signature = private
        .sign(NAMESPACE, HashAlg::Sha512, text.as_bytes())
        .map_err(|e| ApprovalError::Signing(format!("signing failed: {e}")))?;
    Ok(Token {
        statement: statement.clone(),
        signed: text,
        signature,
    })
}

/// Signs `statement` through the ssh-agent at `socket` with `key` (one of its keys).
pub async fn sign_with_agent(
    statement: &Statement,
    socket: &Path,
    key: &PublicKey,
) -> Result<Token, ApprovalError> {
    let mut agent = russh::keys::agent::client::AgentClient::connect_uds(socket)
        .await
        .map_err(|e| ApprovalError::Signing(format!("ssh-agent at {}: {e}", socket.display())))?;
    let text = statement.text();
    let data = SshSig::signed_data(NAMESPACE, HashAlg::Sha512, text.as_bytes())
        .map_err(|e| ApprovalError::Signing(format!("preparing the signature: {e}")))?;
    // RSA keys sign with rsa-sha2-512, as ssh-keygen -Y sign does.
    let hash = matches!(key.algorithm(), ssh_key::Algorithm::Rsa { .. }).then_some(HashAlg::Sha512);
    let signature = agent
        .sign_request_signature(key, hash, &data)
        .await
        .map_err(|e| ApprovalError::Signing(format!("ssh-agent refused to sign: {e}")))?;
    let signature = SshSig::new(
        key.key_data().clone(),
        NAMESPACE,
        HashAlg::Sha512,
        signature,
    )
    .map_err(|e| ApprovalError::Signing(format!("assembling the signature: {e}")))?;
    Ok(Token {
        statement: statement.clone(),
        signed: text,
        signature,
    })
}

/// The keys an ssh-agent holds.
pub async fn agent_keys(socket: &Path) -> Result<Vec<(PublicKey, String)>, ApprovalError> {
    let mut agent = russh::keys::agent::client::AgentClient::connect_uds(socket)
        .await
        .map_err(|e| ApprovalError::Signing(format!("ssh-agent at {}: {e}", socket.display())))?;
    let ids = agent
        .request_identities()
        .await
        .map_err(|e| ApprovalError::Signing(format!("ssh-agent at {}: {e}", socket.display())))?;
    Ok(ids
        .into_iter()
        .filter_map(|id| match id {
            russh::keys::agent::AgentIdentity::PublicKey { key, comment } => Some((key, comment)),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement() -> Statement {
        Statement::new(
            "deploy-42",
            "web1",
            None,
            &"a".repeat(64),
            Some(&"b".repeat(64)),
            Family::Destructive,
            3600,
            "rollback, approved by the on-call",
        )
        .unwrap()
    }

    #[test]
    fn a_statement_reads_back_as_written_and_its_text_is_canonical() {
        let s = statement();
        let text = s.text();
        assert_eq!(Statement::parse(&text).unwrap(), s);
        assert!(text.starts_with("opmark-approval v1\nop: deploy-42\nhost: web1\nmarker_root: -\n"));
        assert_eq!(text.lines().count(), 10);
    }

    #[test]
    fn a_value_with_a_newline_cannot_carry_another_field() {
        let e = Statement::new(
            "deploy-42",
            "web1",
            None,
            &"a".repeat(64),
            None,
            Family::Destructive,
            60,
            "fine\nfamily: read-only",
        )
        .unwrap_err();
        assert!(e.to_string().contains("control character"), "{e}");
    }

    #[test]
    fn fields_out_of_order_missing_or_malformed_are_refused_naming_the_field() {
        let text = statement().text();
        let swapped = text.replacen("op: deploy-42\nhost: web1", "host: web1\nop: deploy-42", 1);
        assert!(Statement::parse(&swapped)
            .unwrap_err()
            .to_string()
            .contains("`op`"));
        let short_nonce = text.replace(&statement().nonce, "abc");
        let e =
            Statement::parse(&text.replace(&text.lines().nth(8).unwrap().to_owned(), "nonce: abc"))
                .unwrap_err();
        assert!(e.to_string().contains("nonce"), "{e} {short_nonce}");
        assert!(Statement::parse("hello\n").is_err());
        assert!(Token::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("BEGIN SSH SIGNATURE"));
    }

    #[test]
    fn allowed_signers_times_options_and_unsupported_lines() {
        assert_eq!(signer_time("20261205").unwrap(), 1_796_428_800);
        assert!(signer_time("2026-12-05").is_err());
        assert_eq!(
            split_options(r#"namespaces="git,opmark-approval",valid-after="20260101""#),
            vec![
                r#"namespaces="git,opmark-approval""#,
                r#"valid-after="20260101""#
            ]
        );
        let dir = std::env::temp_dir().join(format!("opmark-signers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("allowed_signers");
        std::fs::write(
            &file,
            "alice@example.com cert-authority ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOqk2WrS4B4UPnJnPZPG5ZpqmSZ9MrPzw4v1jChlQ0Hz\n",
        )
        .unwrap();
        let e = AllowedSigners::load(&file).unwrap_err().to_string();
        assert!(e.contains(":1: `cert-authority`"), "{e}");
        std::fs::write(&file, "alice@example.com ssh-ed25519 !!!\n").unwrap();
        assert!(AllowedSigners::load(&file)
            .unwrap_err()
            .to_string()
            .contains(":1:"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
