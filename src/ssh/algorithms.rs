//! The security choices of ssh_config (`KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers`,
//! `MACs`, `PubkeyAcceptedAlgorithms`, `PreferredAuthentications`), resolved the way
//! OpenSSH reads them and honoured through russh's preferred lists, or refused: never
//! dropped. A list may replace opmark's defaults, or start with `+` (append), `-`
//! (remove; wildcards allowed) or `^` (put first), as in ssh. A name OpenSSH does not
//! know is an error, as in ssh; a name OpenSSH knows and russh cannot do is left out,
//! and a list left with nothing opmark can do is refused.

use serde::{Deserialize, Serialize};

use super::pattern::wildcard_match;

/// What the config chose; `None` keeps opmark's default list (the one it offers without
/// a config). Names are in preference order, all of them ones russh implements.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Algorithms {
    /// `KexAlgorithms`.
    pub kex: Option<Vec<String>>,
    /// `HostKeyAlgorithms` (plain and `-cert-v01@openssh.com` names).
    pub host_key: Option<Vec<String>>,
    /// `Ciphers`.
    pub ciphers: Option<Vec<String>>,
    /// `MACs`.
    pub macs: Option<Vec<String>>,
}

impl Algorithms {
    /// True when nothing was chosen (opmark's defaults everywhere).
    pub fn is_default(&self) -> bool {
        *self == Algorithms::default()
    }
}

/// Which list an option sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmList {
    /// `KexAlgorithms`.
    Kex,
    /// `HostKeyAlgorithms`.
    HostKey,
    /// `Ciphers`.
    Cipher,
    /// `MACs`.
    Mac,
    /// `PubkeyAcceptedAlgorithms` (`PubkeyAcceptedKeyTypes`).
    Pubkey,
}

/// `ssh -Q kex` of OpenSSH 9.2 (the names ssh accepts in `KexAlgorithms`).
const SSH_KEX: &[&str] = &[
    "diffie-hellman-group1-sha1",
    "diffie-hellman-group14-sha1",
    "diffie-hellman-group14-sha256",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group18-sha512",
    "diffie-hellman-group-exchange-sha1",
    "diffie-hellman-group-exchange-sha256",
    "ecdh-sha2-nistp256",
    "ecdh-sha2-nistp384",
    "ecdh-sha2-nistp521",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
    // Newer OpenSSH (9.9) and russh know it; accepted so a newer config still works.
    "mlkem768x25519-sha256",
];

/// `ssh -Q cipher`.
const SSH_CIPHERS: &[&str] = &[
    "3des-cbc",
    "aes128-cbc",
    "aes192-cbc",
    "aes256-cbc",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
];

/// `ssh -Q mac`.
const SSH_MACS: &[&str] = &[
    "hmac-sha1",
    "hmac-sha1-96",
    "hmac-sha2-256",
    "hmac-sha2-512",
    "hmac-md5",
    "hmac-md5-96",
    "umac-64@openssh.com",
    "umac-128@openssh.com",
    "hmac-sha1-etm@openssh.com",
    "hmac-sha1-96-etm@openssh.com",
    "hmac-sha2-256-etm@openssh.com",
    "hmac-sha2-512-etm@openssh.com",
    "hmac-md5-etm@openssh.com",
    "hmac-md5-96-etm@openssh.com",
    "umac-64-etm@openssh.com",
    "umac-128-etm@openssh.com",
];

/// `ssh -Q HostKeyAlgorithms` (also `PubkeyAcceptedAlgorithms`).
const SSH_KEYS: &[&str] = &[
    "ssh-ed25519",
    "ssh-ed25519-cert-v01@openssh.com",
    "sk-ssh-ed25519@openssh.com",
    "sk-ssh-ed25519-cert-v01@openssh.com",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp384-cert-v01@openssh.com",
    "ecdsa-sha2-nistp521",
    "ecdsa-sha2-nistp521-cert-v01@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
    "ssh-dss-cert-v01@openssh.com",
    "ssh-rsa",
    "ssh-rsa-cert-v01@openssh.com",
    "rsa-sha2-256",
    "rsa-sha2-256-cert-v01@openssh.com",
    "rsa-sha2-512",
    "rsa-sha2-512-cert-v01@openssh.com",
];

/// What opmark offers without a config, in its order (session.rs gives russh these).
pub const DEFAULT_KEX: &[&str] = &[
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "ecdh-sha2-nistp256",
    "ecdh-sha2-nistp384",
    "ecdh-sha2-nistp521",
    "mlkem768x25519-sha256",
    "diffie-hellman-group14-sha256",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group-exchange-sha256",
];
/// opmark's default ciphers (russh's), in order.
pub const DEFAULT_CIPHERS: &[&str] = &[
    "chacha20-poly1305@openssh.com",
    "aes256-gcm@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
];
/// opmark's default MACs (russh's safe set), in order.
pub const DEFAULT_MACS: &[&str] = &[
    "hmac-sha2-512-etm@openssh.com",
    "hmac-sha2-256-etm@openssh.com",
    "hmac-sha2-512",
    "hmac-sha2-256",
];
/// Host key algorithms opmark asks for by default, plain; each may also be asked for as
/// a certificate (`-cert-v01@openssh.com`). Not `ssh-rsa` (SHA-1 signatures): ssh 9.2
/// leaves it out of its defaults too.
pub const DEFAULT_HOST_KEYS: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
];
/// Host key algorithms russh verifies: the defaults, and `ssh-rsa` when a config asks
/// for it (`HostKeyAlgorithms +ssh-rsa`, as with ssh).
const SUPPORTED_HOST_KEYS: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
    "ssh-rsa",
];
/// The key algorithms opmark may offer for user authentication (its keys, the agent's,
/// and certificates of them); a `PubkeyAcceptedAlgorithms` must allow all of them.
const OFFERED_USER_KEYS: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
];

const CERT_SUFFIX: &str = "-cert-v01@openssh.com";

fn known(kind: AlgorithmList) -> &'static [&'static str] {
    match kind {
        AlgorithmList::Kex => SSH_KEX,
        AlgorithmList::Cipher => SSH_CIPHERS,
        AlgorithmList::Mac => SSH_MACS,
        AlgorithmList::HostKey | AlgorithmList::Pubkey => SSH_KEYS,
    }
}

fn defaults(kind: AlgorithmList) -> Vec<String> {
    let list: &[&str] = match kind {
        AlgorithmList::Kex => DEFAULT_KEX,
        AlgorithmList::Cipher => DEFAULT_CIPHERS,
        AlgorithmList::Mac => DEFAULT_MACS,
        AlgorithmList::HostKey => return certificates_then_plain(DEFAULT_HOST_KEYS),
        AlgorithmList::Pubkey => return certificates_then_plain(OFFERED_USER_KEYS),
    };
    list.iter().map(|s| s.to_string()).collect()
}

/// Each key type's certificate form first, then the plain types, as ssh orders them.
fn certificates_then_plain(keys: &[&str]) -> Vec<String> {
    keys.iter()
        .map(|k| format!("{k}{CERT_SUFFIX}"))
        .chain(keys.iter().map(|k| k.to_string()))
        .collect()
}

/// Whether russh can do `name` (a name ssh knows).
fn supported(kind: AlgorithmList, name: &str) -> bool {
    match kind {
        AlgorithmList::Kex => {
            (DEFAULT_KEX.contains(&name)
                || matches!(
                    name,
                    "diffie-hellman-group1-sha1"
                        | "diffie-hellman-group14-sha1"
                        | "diffie-hellman-group18-sha512"
                        | "diffie-hellman-group-exchange-sha1"
                ))
                && russh::kex::Name::try_from(name).is_ok()
        }
        AlgorithmList::Cipher => {
            name != "none" && name != "clear" && russh::cipher::Name::try_from(name).is_ok()
        }
        AlgorithmList::Mac => name != "none" && russh::mac::Name::try_from(name).is_ok(),
        AlgorithmList::HostKey | AlgorithmList::Pubkey => {
            SUPPORTED_HOST_KEYS.contains(&name.strip_suffix(CERT_SUFFIX).unwrap_or(name))
        }
    }
}

/// The lists opmark offers for `chosen` (its defaults where nothing was chosen), as
/// comma-separated names in `ssh -G`'s order of keys: kex, host keys, ciphers, MACs.
/// Host keys without a choice are the defaults before known_hosts reorders them.
pub fn offered(chosen: &Algorithms) -> [String; 4] {
    let or = |list: &Option<Vec<String>>, kind: AlgorithmList| {
        list.clone().unwrap_or_else(|| defaults(kind)).join(",")
    };
    [
        or(&chosen.kex, AlgorithmList::Kex),
        or(&chosen.host_key, AlgorithmList::HostKey),
        or(&chosen.ciphers, AlgorithmList::Cipher),
        or(&chosen.macs, AlgorithmList::Mac),
    ]
}

/// The option's name as ssh_config spells it.
pub fn option_name(kind: AlgorithmList) -> &'static str {
    match kind {
        AlgorithmList::Kex => "KexAlgorithms",
        AlgorithmList::HostKey => "HostKeyAlgorithms",
        AlgorithmList::Cipher => "Ciphers",
        AlgorithmList::Mac => "MACs",
        AlgorithmList::Pubkey => "PubkeyAcceptedAlgorithms",
    }
}

/// The list `value` asks for, as ssh's `kex_assemble_names` builds it from the default
/// (before narrowing to what russh can do). An unknown name is an error, as in ssh.
fn assemble(kind: AlgorithmList, value: &str) -> Result<Vec<String>, String> {
    let value = value.trim();
    let name = option_name(kind);
    let (op, list) = match value.chars().next() {
        Some(c @ ('+' | '-' | '^')) => (Some(c), &value[1..]),
        _ => (None, value),
    };
    let items: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if items.is_empty() {
        return Err(format!("{name} `{value}` names no algorithm"));
    }
    if op != Some('-') {
        if let Some(bad) = items.iter().find(|i| !known(kind).contains(&i.as_str())) {
            return Err(format!(
                "{name}: unknown algorithm `{bad}` (ssh refuses it too: `ssh -Q {}` lists the names); fix the spelling",
                match kind {
                    AlgorithmList::Kex => "kex",
                    AlgorithmList::Cipher => "cipher",
                    AlgorithmList::Mac => "mac",
                    AlgorithmList::HostKey => "HostKeyAlgorithms",
                    AlgorithmList::Pubkey => "PubkeyAcceptedAlgorithms",
                }
            ));
        }
    }
    let default = defaults(kind);
    Ok(match op {
        Some('+') => {
            let mut out = default;
            for i in items {
                if !out.contains(&i) {
                    out.push(i);
                }
            }
            out
        }
        Some('-') => default
            .into_iter()
            .filter(|d| !items.iter().any(|p| wildcard_match(p, d)))
            .collect(),
        Some('^') => {
            let mut out = items.clone();
            out.extend(default.into_iter().filter(|d| !items.contains(d)));
            out
        }
        _ => items,
    })
}

/// Checks the names of a list option as ssh does when it reads the line, whether or not
/// the line applies to the host: an unknown name is an error.
pub fn check_names(key: &str, value: &str) -> Result<(), String> {
    let kind = match key {
        "kexalgorithms" => AlgorithmList::Kex,
        "hostkeyalgorithms" => AlgorithmList::HostKey,
        "ciphers" => AlgorithmList::Cipher,
        "macs" => AlgorithmList::Mac,
        "pubkeyacceptedalgorithms" | "pubkeyacceptedkeytypes" => AlgorithmList::Pubkey,
        _ => return Ok(()),
    };
    assemble(kind, value).map(|_| ())
}

/// Resolves one list option to the names opmark will offer, in order; an error says
/// what is wrong (the caller adds the file and line).
pub fn resolve(kind: AlgorithmList, value: &str) -> Result<Vec<String>, String> {
    let wanted = assemble(kind, value)?;
    let name = option_name(kind);
    if kind == AlgorithmList::Pubkey {
        // opmark cannot narrow which of its keys it offers: honour a list that allows
        // all it may offer, refuse one that would exclude some.
        let missing: Vec<String> = defaults(AlgorithmList::Pubkey)
            .into_iter()
            .filter(|k| !wanted.contains(k))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{name} `{value}` leaves out {}, and opmark cannot restrict which key types it offers; remove it for this host or use ssh",
                missing.join(", ")
            ));
        }
        return Ok(wanted);
    }
    let usable: Vec<String> = wanted
        .iter()
        .filter(|n| supported(kind, n))
        .cloned()
        .collect();
    if usable.is_empty() {
        let mut can: Vec<&str> = known(kind)
            .iter()
            .copied()
            .filter(|n| supported(kind, n))
            .collect();
        can.dedup();
        return Err(format!(
            "{name} `{value}` leaves nothing opmark can use (it can do {}); add one of those or use ssh",
            can.join(",")
        ));
    }
    Ok(usable)
}

/// `PreferredAuthentications`: opmark authenticates with public keys only, so the list
/// must include `publickey`; the other methods are ones opmark never tries anyway.
pub fn check_preferred_authentications(value: &str) -> Result<(), String> {
    if value.split(',').any(|m| m.trim() == "publickey") {
        Ok(())
    } else {
        Err(format!(
            "PreferredAuthentications `{value}` leaves out publickey, the only method opmark has; add publickey or use ssh"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_list_replaces_the_defaults_and_keeps_its_order() {
        assert_eq!(
            resolve(AlgorithmList::HostKey, "ssh-ed25519").unwrap(),
            vec!["ssh-ed25519"]
        );
        assert_eq!(
            resolve(
                AlgorithmList::Cipher,
                "aes128-ctr,chacha20-poly1305@openssh.com"
            )
            .unwrap(),
            vec!["aes128-ctr", "chacha20-poly1305@openssh.com"]
        );
    }

    #[test]
    fn plus_minus_and_caret_work_on_opmarks_defaults_as_in_ssh() {
        let v = resolve(AlgorithmList::Mac, "+hmac-sha1").unwrap();
        assert_eq!(v.last().map(String::as_str), Some("hmac-sha1"));
        let v = resolve(AlgorithmList::Cipher, "-aes*").unwrap();
        assert_eq!(v, vec!["chacha20-poly1305@openssh.com"]);
        let v = resolve(AlgorithmList::Kex, "^ecdh-sha2-nistp256").unwrap();
        assert_eq!(v[0], "ecdh-sha2-nistp256");
        assert_eq!(v.iter().filter(|n| *n == "ecdh-sha2-nistp256").count(), 1);
    }

    #[test]
    fn unknown_names_are_errors_and_unusable_lists_are_refused() {
        assert!(resolve(AlgorithmList::Cipher, "foo")
            .unwrap_err()
            .contains("unknown algorithm `foo`"));
        assert!(resolve(AlgorithmList::HostKey, "ssh-foo").is_err());
        // Known to ssh, not to russh: nothing left.
        let e = resolve(AlgorithmList::Mac, "umac-64@openssh.com").unwrap_err();
        assert!(e.contains("leaves nothing"), "{e}");
        // Known to ssh, partly usable: the usable ones, in order.
        assert_eq!(
            resolve(
                AlgorithmList::Kex,
                "sntrup761x25519-sha512@openssh.com,curve25519-sha256"
            )
            .unwrap(),
            vec!["curve25519-sha256"]
        );
    }

    #[test]
    fn pubkey_lists_must_allow_every_key_opmark_offers() {
        resolve(AlgorithmList::Pubkey, "+ssh-rsa").unwrap();
        let e = resolve(AlgorithmList::Pubkey, "ssh-ed25519").unwrap_err();
        assert!(e.contains("rsa-sha2-256"), "{e}");
        check_preferred_authentications("gssapi-with-mic,publickey,password").unwrap();
        assert!(check_preferred_authentications("password").is_err());
    }
}
