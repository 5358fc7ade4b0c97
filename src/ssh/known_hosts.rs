//! Host key verification against OpenSSH known_hosts files: plain, hashed (`|1|`),
//! `[host]:port`, comma lists with wildcards and negation, several keys per host,
//! `@revoked`, host certificates signed by an `@cert-authority` key; learning a key for
//! `accept-new`.
//!
//! Written here because russh's `check_known_hosts_path` reads tab-separated lines as
//! unknown, ignores `@revoked`, treats a second key of one type as a change and aborts on
//! one bad line (docs/findings.md#russh-known-hosts-gaps).

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::{Certificate, HashAlg, PublicKey};
use russh::keys::Algorithm;

/// One usable known_hosts entry.
#[derive(Debug, Clone)]
struct KnownHost {
    marker: Marker,
    hosts: HostField,
    key: PublicKey,
    path: PathBuf,
    line: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    None,
    Revoked,
    CertAuthority,
}

#[derive(Debug, Clone)]
enum HostField {
    /// `|1|salt|hash`: HMAC-SHA1 of the lookup name keyed by the salt.
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
    /// Comma-separated patterns, possibly negated.
    Patterns(Vec<String>),
}

/// Where an expected key is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The known_hosts file.
    pub path: PathBuf,
    /// 1-based line number.
    pub line: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.path.display(), self.line)
    }
}

/// The answer for one presented host key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// A non-revoked entry for this host holds exactly this key.
    Trusted(Location),
    /// The key is marked `@revoked`.
    Revoked(Location),
    /// The host is known with a key of this type, and it is a different key.
    Changed {
        /// The first entry of the same key type.
        expected: Location,
    },
    /// Nothing of this key type is known for the host. `others` lists entries of other
    /// types (a server that suddenly offers only a different type is suspicious).
    Unknown {
        /// Entries for this host with other key types.
        others: Vec<Location>,
    },
}

/// The answer for one presented host certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertCheck {
    /// Signed by a CA an `@cert-authority` line trusts for this host, and valid now.
    Trusted(Location),
    /// The CA key, or the host key inside the certificate, is marked `@revoked`.
    Revoked(Location),
    /// A trusted CA signed it, but it is not acceptable; the text says why.
    Invalid(String),
    /// No `@cert-authority` line for this host holds the certificate's signing key
    /// (ssh then checks the plain key inside it).
    NoAuthority,
}

/// The known_hosts files for one destination, parsed.
#[derive(Debug, Clone, Default)]
pub struct KnownHosts {
    entries: Vec<KnownHost>,
    /// Lines skipped as malformed, for diagnostics (`file:line: why`).
    pub skipped: Vec<String>,
}

/// The name looked up in known_hosts: `host` on port 22, `[host]:port` otherwise.
pub fn lookup_name(host: &str, port: u16) -> String {
    let host = host.to_ascii_lowercase();
    if port == 22 {
        host
    } else {
        format!("[{host}]:{port}")
    }
}

/// `SHA256:base64` as OpenSSH prints it.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

impl KnownHosts {
    /// Reads every file that exists; missing files are fine (as OpenSSH), unreadable
    /// lines are skipped with a tracing warning.
    pub fn load(files: &[PathBuf]) -> KnownHosts {
        let mut kh = KnownHosts::default();
        for path in files {
            match std::fs::read_to_string(path) {
                Ok(text) => kh.add_text(&text, path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot read known_hosts {}: {e}", path.display()),
            }
        }
        for s in &kh.skipped {
            tracing::warn!("known_hosts line skipped: {s}");
        }
        kh
    }

    /// Parses known_hosts text as if read from `path`.
    pub fn add_text(&mut self, text: &str, path: &Path) {
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            match parse_line(raw) {
                Ok(None) => {}
                Ok(Some((marker, hosts, key))) => self.entries.push(KnownHost {
                    marker,
                    hosts,
                    key,
                    path: path.to_path_buf(),
                    line,
                }),
                Err(why) => self
                    .skipped
                    .push(format!("{}:{line}: {why}", path.display())),
            }
        }
    }

    fn entries_for<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a KnownHost> + 'a {
        self.entries
            .iter()
            .filter(move |e| e.marker == Marker::None && e.hosts.matches(name))
    }

    /// Checks `key` presented by the host known as `name` (see [`lookup_name`]).
    pub fn check(&self, name: &str, key: &PublicKey) -> KeyCheck {
        // A revoked key is refused for every host, as OpenSSH does.
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.marker == Marker::Revoked && e.key.key_data() == key.key_data())
        {
            return KeyCheck::Revoked(e.location());
        }
        let mut same_type = None;
        let mut others = Vec::new();
        for e in self.entries_for(name) {
            if e.key.key_data() == key.key_data() {
                return KeyCheck::Trusted(e.location());
            }
            if e.key.algorithm() == key.algorithm() {
                same_type.get_or_insert_with(|| e.location());
            } else {
                others.push(e.location());
            }
        }
        match same_type {
            Some(expected) => KeyCheck::Changed { expected },
            None => KeyCheck::Unknown { others },
        }
    }

    /// True when some `@cert-authority` line applies to `name`: only then is it worth
    /// asking the host for a certificate.
    pub fn has_authority_for(&self, name: &str) -> bool {
        self.entries
            .iter()
            .any(|e| e.marker == Marker::CertAuthority && e.hosts.matches(name))
    }

    /// Checks a host certificate presented by the host known as `name` (see
    /// [`lookup_name`]) whose certificate must name `principal` (`HostKeyAlias`, else
    /// the host name, as OpenSSH's `check_host_cert`), at Unix time `now`.
    pub fn check_certificate(
        &self,
        name: &str,
        principal: &str,
        cert: &Certificate,
        now: u64,
    ) -> CertCheck {
        let revoked = |key: &russh::keys::ssh_key::public::KeyData| {
            self.entries
                .iter()
                .find(|e| e.marker == Marker::Revoked && e.key.key_data() == key)
        };
        // Revocation wins over any trust: the CA itself, or the host key it certified.
        if let Some(e) = revoked(cert.signature_key()).or_else(|| revoked(cert.public_key())) {
            return CertCheck::Revoked(e.location());
        }
        let Some(ca) = self.entries.iter().find(|e| {
            e.marker == Marker::CertAuthority
                && e.key.key_data() == cert.signature_key()
                && e.hosts.matches(name)
        }) else {
            return CertCheck::NoAuthority;
        };
        let at = ca.location();
        if cert.cert_type() != CertType::Host {
            return CertCheck::Invalid(format!(
                "it is a user certificate, not a host certificate (CA trusted at {at})"
            ));
        }
        let ca_fp = ca.key.fingerprint(HashAlg::Sha256);
        if cert.validate_at(now, [&ca_fp]).is_err() {
            let why = if now < cert.valid_after() {
                "it is not valid yet"
            } else if now >= cert.valid_before() {
                "it has expired"
            } else {
                "its signature does not verify"
            };
            return CertCheck::Invalid(format!("{why} (CA trusted at {at})"));
        }
        let principals = cert.valid_principals();
        if !principals.is_empty() && !principals.iter().any(|p| p == principal) {
            return CertCheck::Invalid(format!(
                "it names principals {} but not `{principal}` (CA trusted at {at})",
                principals.join(",")
            ));
        }
        if !cert.critical_options().is_empty() {
            return CertCheck::Invalid(format!(
                "it carries critical options, which host certificates must not (CA trusted at {at})"
            ));
        }
        CertCheck::Trusted(at)
    }

    /// Host-key algorithms to prefer for `name`: the types known for it first (so a host
    /// known only by its RSA key negotiates RSA, as OpenSSH does), then the rest.
    pub fn preferred_algorithms(&self, name: &str, defaults: &[Algorithm]) -> Vec<Algorithm> {
        let known: Vec<Algorithm> = self.entries_for(name).map(|e| e.key.algorithm()).collect();
        let is_known = |a: &Algorithm| {
            known.iter().any(|k| match (k, a) {
                (Algorithm::Rsa { .. }, Algorithm::Rsa { .. }) => true,
                (k, a) => k == a,
            })
        };
        let mut out: Vec<Algorithm> = defaults.iter().filter(|a| is_known(a)).cloned().collect();
        out.extend(defaults.iter().filter(|a| !is_known(a)).cloned());
        out
    }
}

impl KnownHost {
    fn location(&self) -> Location {
        Location {
            path: self.path.clone(),
            line: self.line,
        }
    }
}

impl HostField {
    fn matches(&self, name: &str) -> bool {
        match self {
            HostField::Hashed { salt, hash } => hmac_sha1(salt, name.as_bytes()) == *hash,
            HostField::Patterns(patterns) => super::pattern::match_pattern_list(name, patterns),
        }
    }
}

fn hmac_sha1(key: &[u8], data: &[u8]) -> Vec<u8> {
    // ring is already linked for russh's crypto; its legacy HMAC-SHA1 is exactly the
    // construction OpenSSH uses for hashed known_hosts names.
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, key);
    ring::hmac::sign(&key, data).as_ref().to_vec()
}

type Parsed = (Marker, HostField, PublicKey);

/// Parses one line. `Ok(None)` for blank/comment lines.
fn parse_line(raw: &str) -> Result<Option<Parsed>, String> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut fields = line.split_whitespace();
    let mut first = fields.next().unwrap_or_default();
    let mut marker = Marker::None;
    if let Some(m) = first.strip_prefix('@') {
        marker = match m {
            "revoked" => Marker::Revoked,
            "cert-authority" => Marker::CertAuthority,
            other => return Err(format!("unknown marker `@{other}`")),
        };
        first = fields.next().ok_or("marker without host list")?;
    }
    let hosts = if let Some(rest) = first.strip_prefix("|1|") {
        let (salt, hash) = rest.split_once('|').ok_or("malformed hashed host")?;
        let salt = BASE64
            .decode(salt)
            .map_err(|_| "bad base64 in hashed host salt")?;
        let hash = BASE64
            .decode(hash)
            .map_err(|_| "bad base64 in hashed host hash")?;
        if hash.len() != 20 {
            return Err("hashed host is not an HMAC-SHA1".into());
        }
        HostField::Hashed { salt, hash }
    } else {
        HostField::Patterns(vec![first.to_string()])
    };
    let key_type = fields.next().ok_or("missing key type")?;
    let blob = fields.next().ok_or("missing key data")?;
    let key = PublicKey::from_openssh(&format!("{key_type} {blob}"))
        .map_err(|e| format!("unreadable {key_type} key: {e}"))?;
    Ok(Some((marker, hosts, key)))
}

/// Appends a line for `name` to `path` (creating it and its directory, mode 0600/0700),
/// hashed when `hash` is set, as OpenSSH's `accept-new` does.
pub fn learn(path: &Path, name: &str, key: &PublicKey, hash: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let host = if hash {
        let salt: [u8; 20] = rand::random();
        format!(
            "|1|{}|{}",
            BASE64.encode(salt),
            BASE64.encode(hmac_sha1(&salt, name.as_bytes()))
        )
    } else {
        name.to_string()
    };
    let key_text = key
        .to_openssh()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // to_openssh includes the comment; known_hosts needs only type and blob.
    let mut parts = key_text.split_whitespace();
    let line = format!(
        "{host} {} {}\n",
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default()
    );
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    // If the file lacks a final newline, do not glue our line onto its last one.
    let len = file.metadata()?.len();
    if len > 0 {
        let text = std::fs::read(path)?;
        if text.last() != Some(&b'\n') {
            file.write_all(b"\n")?;
        }
    }
    file.write_all(line.as_bytes())?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED1: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ";
    const ED2: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA6rWI3G1sz07DnfFlrouTcysQlj2P+jpNSOEWD9OJ3X";

    fn key(s: &str) -> PublicKey {
        PublicKey::from_openssh(s).unwrap()
    }

    fn kh(text: &str) -> KnownHosts {
        let mut k = KnownHosts::default();
        k.add_text(text, Path::new("kh"));
        k
    }

    fn loc(line: usize) -> Location {
        Location {
            path: "kh".into(),
            line,
        }
    }

    #[test]
    fn plain_entry_with_tab_separator_is_trusted() {
        let k = kh(&format!("host1,10.0.0.1\t{}\n", ED1.replace(' ', "\t")));
        assert_eq!(k.check("host1", &key(ED1)), KeyCheck::Trusted(loc(1)));
        assert_eq!(k.check("10.0.0.1", &key(ED1)), KeyCheck::Trusted(loc(1)));
        assert_eq!(
            k.check("host2", &key(ED1)),
            KeyCheck::Unknown { others: vec![] }
        );
    }

    #[test]
    fn hashed_entry_matches_only_its_name() {
        let salt = [7u8; 20];
        let name = lookup_name("target1", 2222);
        let line = format!(
            "|1|{}|{} {ED1}\n",
            BASE64.encode(salt),
            BASE64.encode(hmac_sha1(&salt, name.as_bytes()))
        );
        let k = kh(&line);
        assert_eq!(
            k.check("[target1]:2222", &key(ED1)),
            KeyCheck::Trusted(loc(1))
        );
        assert!(matches!(
            k.check("target1", &key(ED1)),
            KeyCheck::Unknown { .. }
        ));
    }

    #[test]
    fn hashed_entries_written_by_ssh_keygen_match() {
        // `ssh-keygen -H` (OpenSSH 9.2) output for `example.com` and `[example.com]:2222`.
        let text = format!(
            "|1|Dv6tEcoPBfoRs3WYnitPZ+CUHx8=|mTZFOVmGQXxskHDI6YJalp9NISk= {ED1}\n\
             |1|i351omG4L4wz/QmZtBCYkybUDc4=|B6+zpQwi3GHcFFY700EUnNNLMqw= {ED1}\n"
        );
        let k = kh(&text);
        assert_eq!(k.check("example.com", &key(ED1)), KeyCheck::Trusted(loc(1)));
        assert_eq!(
            k.check(&lookup_name("Example.COM", 2222), &key(ED1)),
            KeyCheck::Trusted(loc(2))
        );
        assert!(matches!(
            k.check("example.org", &key(ED1)),
            KeyCheck::Unknown { .. }
        ));
    }

    #[test]
    fn port_form_does_not_match_default_port() {
        let k = kh(&format!("[h]:2200 {ED1}\n"));
        assert_eq!(
            k.check(&lookup_name("h", 2200), &key(ED1)),
            KeyCheck::Trusted(loc(1))
        );
        assert!(matches!(
            k.check(&lookup_name("h", 22), &key(ED1)),
            KeyCheck::Unknown { .. }
        ));
    }

    #[test]
    fn changed_key_names_file_and_line_of_expected() {
        let k = kh(&format!("# comment\nother {ED1}\nh {ED1}\n"));
        assert_eq!(
            k.check("h", &key(ED2)),
            KeyCheck::Changed { expected: loc(3) }
        );
    }

    #[test]
    fn two_keys_of_one_type_are_both_accepted() {
        let k = kh(&format!("h {ED1}\nh {ED2}\n"));
        assert_eq!(k.check("h", &key(ED2)), KeyCheck::Trusted(loc(2)));
    }

    #[test]
    fn revoked_key_is_refused_even_when_also_listed() {
        let k = kh(&format!("h {ED1}\n@revoked * {ED1}\n"));
        assert_eq!(k.check("h", &key(ED1)), KeyCheck::Revoked(loc(2)));
    }

    #[test]
    fn cert_authority_key_is_never_trusted_as_a_plain_host_key() {
        let k = kh(&format!("@cert-authority *.lab,!evil.lab {ED1}\n"));
        assert_eq!(
            k.check("a.lab", &key(ED1)),
            KeyCheck::Unknown { others: vec![] }
        );
        assert!(k.has_authority_for("a.lab"));
        assert!(!k.has_authority_for("evil.lab"));
        assert!(!k.has_authority_for("a.example"));
        assert!(k.skipped.is_empty(), "{:?}", k.skipped);
    }

    #[test]
    fn bad_lines_are_skipped_not_fatal() {
        let k = kh(&format!(
            "garbage\nh ssh-ed25519 !!!notbase64\n@weird h {ED2}\nh {ED1}\n"
        ));
        assert_eq!(k.skipped.len(), 3, "{:?}", k.skipped);
        assert_eq!(k.check("h", &key(ED1)), KeyCheck::Trusted(loc(4)));
    }

    #[test]
    fn wildcard_and_negation_patterns() {
        let k = kh(&format!("*.lab,!evil.lab {ED1}\n"));
        assert!(matches!(k.check("a.lab", &key(ED1)), KeyCheck::Trusted(_)));
        assert!(matches!(
            k.check("evil.lab", &key(ED1)),
            KeyCheck::Unknown { .. }
        ));
    }

    #[test]
    fn known_types_are_preferred_first() {
        let rsa = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDDJoKClx6eAzQx8iDdbRsivAJ8hdYfmWcrEbx1lsGnk3bnBvFo6dRo21vFS1ySsZCwYsZE9aIIpKv0WKm8NEgcYs/S6QfwMsHbuWuBD0nrwYdASqpgA4sjWq71CCtL2RPUgSOijbPhsENhmftZ1sDcXx7Ac/gfE6VEEOEsmSifbQ==";
        let k = kh(&format!("h {rsa}\n"));
        let prefs = k.preferred_algorithms("h", &russh::Preferred::DEFAULT.key);
        assert!(prefs[0].clone().is_rsa(), "{prefs:?}");
        assert_eq!(prefs.len(), russh::Preferred::DEFAULT.key.len());
    }

    #[test]
    fn learned_line_is_found_again_hashed_or_plain() {
        let dir = std::env::temp_dir().join(format!("opmark-kh-{}", std::process::id()));
        let path = dir.join("sub/known_hosts");
        learn(&path, "[h]:2222", &key(ED1), true).unwrap();
        learn(&path, "plain", &key(ED2), false).unwrap();
        let k = KnownHosts::load(std::slice::from_ref(&path));
        assert!(k.skipped.is_empty());
        assert!(matches!(
            k.check("[h]:2222", &key(ED1)),
            KeyCheck::Trusted(_)
        ));
        assert!(matches!(k.check("plain", &key(ED2)), KeyCheck::Trusted(_)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
