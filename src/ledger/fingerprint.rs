//! Fingerprints of an operation's intent: the plain SHA-256 for the host marker and an
//! HMAC-SHA256 under a per-installation key for the local ledger (docs/guarantees.md#vocabulary).
//!
//! The intent is the command string and the stdin digest, not the family (which is
//! policy, not intent). The ledger keeps the keyed form so that a copy of the ledger cannot
//! be used to test guesses of a short secret offline.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::error::LedgerError;

/// File name of the installation key in the old layout, inside the opmark config
/// directory. Only read, to adopt it into a ledger made before the key moved beside it.
pub const LEGACY_KEY_FILE: &str = "installation.key";
const KEY_LEN: usize = 32;

/// What an operation means to do: the command string exactly as it will be run on the
/// host, and the SHA-256 of the stdin that will be forwarded (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent<'a> {
    /// The command string (the words of `run -- CMD...` joined by spaces).
    pub command: &'a str,
    /// SHA-256 of the spooled stdin, or `None` when stdin is not forwarded.
    pub stdin_sha256: Option<[u8; 32]>,
    /// The names of the command's secrets (`--secret`): the intent binds the names, never
    /// the values (docs/trust.md#secrets). Sudo's password is among them but not bound: it
    /// is sudo's credential, never the command's, so it changes how the host lets the
    /// operation in, not what it does.
    pub secret_names: &'a [String],
    /// `--become USER`: the user the command runs as through sudo (another action than
    /// running it as the login user).
    pub become_user: Option<&'a str>,
}

impl Intent<'_> {
    /// The canonical bytes that both fingerprints digest:
    /// `"opmark-intent-v1\n" + len(command) + "\n" + command + "\n" + (hex stdin digest | "no-stdin")`,
    /// then, only with secrets other than sudo's password, `"\nsecrets " + their names
    /// sorted, comma-separated`, and only
    /// with `--become`, `"\nbecome " + USER` (so an intent without either keeps the digest it
    /// always had). The length prefix keeps a
    /// command ending in a newline from colliding with another.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let stdin = match &self.stdin_sha256 {
            Some(d) => hex::encode(d),
            None => "no-stdin".to_owned(),
        };
        let mut out = Vec::with_capacity(self.command.len() + 96);
        out.extend_from_slice(b"opmark-intent-v1\n");
        out.extend_from_slice(self.command.len().to_string().as_bytes());
        out.push(b'\n');
        out.extend_from_slice(self.command.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(stdin.as_bytes());
        // A run refused for want of sudo's password is retried under its op id with it:
        // the same intent.
        let mut names: Vec<&str> = self
            .secret_names
            .iter()
            .map(String::as_str)
            .filter(|n| *n != crate::secret::SUDO_PASSWORD)
            .collect();
        if !names.is_empty() {
            names.sort_unstable();
            out.extend_from_slice(b"\nsecrets ");
            out.extend_from_slice(names.join(",").as_bytes());
        }
        if let Some(user) = self.become_user {
            out.extend_from_slice(b"\nbecome ");
            out.extend_from_slice(user.as_bytes());
        }
        out
    }
}

/// Plain SHA-256 hex of the canonical intent: what the host marker records, so any
/// installation running the same intent recognises it.
pub fn host_fingerprint(intent: &Intent<'_>) -> String {
    hex::encode(Sha256::digest(intent.canonical_bytes()))
}

/// HMAC-SHA256 hex of the canonical intent under this installation's key: what the
/// ledger records.
pub fn ledger_fingerprint(intent: &Intent<'_>, key: &InstallationKey) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key.bytes).expect("HMAC accepts any key length");
    mac.update(&intent.canonical_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The per-installation secret (32 random bytes) that keys ledger fingerprints, the
/// ledger's event chain and its head. It belongs to one ledger and is kept beside it.
#[derive(Clone)]
pub struct InstallationKey {
    bytes: [u8; KEY_LEN],
    path: PathBuf,
}

impl std::fmt::Debug for InstallationKey {
    // Never print the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallationKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// `${XDG_CONFIG_HOME:-~/.config}/opmark`; `None` without any home (see
/// [`super::home_dir`]).
pub fn default_config_dir() -> Option<PathBuf> {
    match crate::paths::absolute_env("XDG_CONFIG_HOME") {
        Some(dir) => Some(dir.join("opmark")),
        None => Some(crate::paths::home_dir()?.join(".config").join("opmark")),
    }
}

impl InstallationKey {
    /// Reads the key at `path` (32 bytes). A missing file is an [`LedgerError::Io`] whose
    /// source is `NotFound`, so callers can tell "absent" from "damaged".
    /// A key file that group or others may read or write is refused, as ssh refuses such
    /// a private key: whoever reads it can recompute the ledger's chain.
    pub fn load(path: &Path) -> Result<Self, LedgerError> {
        read_key(path, true)
    }

    /// Reads the old layout's key at `path` to copy it beside its ledger (whose copy is
    /// 0600 and checked from then on), whatever its mode.
    pub(crate) fn load_for_adoption(path: &Path) -> Result<Self, LedgerError> {
        read_key(path, false)
    }

    /// Writes a NEW random key at `path` (file 0600, missing directories 0700); refuses to
    /// replace an existing file, since that key may be the only one that opens a ledger.
    pub fn generate(path: &Path) -> Result<Self, LedgerError> {
        let bytes: [u8; KEY_LEN] = rand::random();
        publish(path, &bytes)?;
        Ok(InstallationKey {
            bytes,
            path: path.to_path_buf(),
        })
    }

    /// The key at `path`, or a new one written there if none exists yet. Safe when several
    /// opmark processes create the same fresh ledger at once: the key is published with an
    /// exclusive link, so every process ends up with the same key.
    pub fn load_or_generate(path: &Path) -> Result<Self, LedgerError> {
        match read_key(path, true) {
            Err(LedgerError::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            other => return other,
        }
        match InstallationKey::generate(path) {
            Err(LedgerError::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                read_key(path, true)
            }
            other => other,
        }
    }

    /// Copies this key to `path` (0600, never replacing a file there) and returns the copy.
    pub fn copy_to(&self, path: &Path) -> Result<Self, LedgerError> {
        publish(path, &self.bytes)?;
        Ok(InstallationKey {
            bytes: self.bytes,
            path: path.to_path_buf(),
        })
    }

    /// Where the key was read from or written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// HMAC-SHA256 hex of `parts` (each length-prefixed, after a domain tag) under this key.
    /// The ledger uses it for its check value, its event chain and its chain head.
    pub fn mac(&self, domain: &str, parts: &[&[u8]]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC accepts any key length");
        mac.update(domain.as_bytes());
        mac.update(b"\n");
        for part in parts {
            mac.update(part.len().to_string().as_bytes());
            mac.update(b":");
            mac.update(part);
            mac.update(b"\n");
        }
        hex::encode(mac.finalize().into_bytes())
    }

    /// The HMAC keyed with this key, before any input: a long walk (`audit verify`)
    /// clones it per event instead of keying once per event.
    pub(crate) fn hmac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC accepts any key length")
    }

    /// The value the ledger stores to recognise its key without holding it.
    pub fn check_value(&self) -> String {
        self.mac("opmark-key-check", &[])
    }
}

/// Where the old layout kept the key, apart from the ledger: `${XDG_CONFIG_HOME:-~/.config}/opmark/installation.key`.
pub fn legacy_key_path() -> Option<PathBuf> {
    Some(default_config_dir()?.join(LEGACY_KEY_FILE))
}

/// Publishes `bytes` at `path` atomically and exclusively: written to a temp file,
/// fsynced, then hard-linked (which fails if `path` exists), then the directory fsynced.
fn publish(path: &Path, bytes: &[u8; KEY_LEN]) -> Result<(), LedgerError> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    create_private_dir(&dir)?;
    let name = path
        .file_name()
        .map_or_else(|| "key".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{name}.{}.{:08x}.tmp",
        std::process::id(),
        rand::random::<u32>()
    ));
    let io = |source| LedgerError::Io {
        what: format!("create the installation key {}", path.display()),
        source,
    };
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        let written = f.write_all(bytes).and_then(|()| f.sync_all());
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io(e));
        }
    }
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    linked.map_err(io)?;
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn read_key(path: &Path, private: bool) -> Result<InstallationKey, LedgerError> {
    let mut f = fs::File::open(path).map_err(|source| LedgerError::Io {
        what: format!("read the installation key {}", path.display()),
        source,
    })?;
    if private {
        // The mode of the file opened, not of whatever the path names a moment later.
        let mode = f
            .metadata()
            .map_err(|source| LedgerError::Io {
                what: format!("read the installation key {}", path.display()),
                source,
            })?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the installation key {} is open to group or others (mode {:04o}): whoever reads it can rewrite the ledger's history undetected. Make it private with `chmod 600 {}` (and, if others may have read it, treat the ledger's chain as unproven); nothing was done",
                    path.display(),
                    mode & 0o7777,
                    path.display()
                ),
            });
        }
    }
    let mut buf = Vec::with_capacity(KEY_LEN + 1);
    Read::by_ref(&mut f)
        .take(KEY_LEN as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|source| LedgerError::Io {
            what: format!("read the installation key {}", path.display()),
            source,
        })?;
    let bytes: [u8; KEY_LEN] = buf.as_slice().try_into().map_err(|_| LedgerError::Invalid {
        message: format!(
            "the installation key {} is not {KEY_LEN} bytes long; it may be damaged. Restore it from a backup (a new key cannot open a ledger made with the old one)",
            path.display()
        ),
    })?;
    Ok(InstallationKey {
        bytes,
        path: path.to_path_buf(),
    })
}

/// Creates `dir` (and parents) with mode 0700 when missing.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), LedgerError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| LedgerError::Io {
            what: format!("create the directory {}", dir.display()),
            source,
        })?;
    // The umask may have narrowed the mode further, never widened it; make it exact.
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "opmark-fp-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn secret_names_are_bound_and_their_order_is_not() {
        let plain = Intent {
            command: "deploy",
            stdin_sha256: None,
            secret_names: &[],
            become_user: None,
        };
        let ab = ["A".to_owned(), "B".to_owned()];
        let ba = ["B".to_owned(), "A".to_owned()];
        let a = ["A".to_owned()];
        let with = |names| {
            host_fingerprint(&Intent {
                secret_names: names,
                become_user: None,
                ..plain
            })
        };
        assert_ne!(with(&a), host_fingerprint(&plain));
        assert_ne!(with(&a), with(&ab));
        assert_eq!(with(&ab), with(&ba));
        // Without secrets the canonical bytes are the ones every earlier version made.
        assert!(!String::from_utf8_lossy(&plain.canonical_bytes()).contains("secrets"));
    }

    #[test]
    fn canonical_bytes_follow_the_documented_layout() {
        let i = Intent {
            command: "echo hi",
            stdin_sha256: None,
            secret_names: &[],
            become_user: None,
        };
        assert_eq!(
            i.canonical_bytes(),
            b"opmark-intent-v1\n7\necho hi\nno-stdin"
        );
        let digest: [u8; 32] = Sha256::digest(b"data").into();
        let j = Intent {
            command: "cat",
            stdin_sha256: Some(digest),
            secret_names: &[],
            become_user: None,
        };
        assert_eq!(
            j.canonical_bytes(),
            format!("opmark-intent-v1\n3\ncat\n{}", hex::encode(digest)).into_bytes()
        );
    }

    #[test]
    fn host_fingerprint_is_plain_sha256_of_the_canonical_intent() {
        let i = Intent {
            command: "echo hi",
            stdin_sha256: None,
            secret_names: &[],
            become_user: None,
        };
        assert_eq!(
            host_fingerprint(&i),
            hex::encode(Sha256::digest(b"opmark-intent-v1\n7\necho hi\nno-stdin"))
        );
    }

    #[test]
    fn fingerprint_differs_by_command_and_stdin_only() {
        let a = Intent {
            command: "echo hi",
            stdin_sha256: None,
            secret_names: &[],
            become_user: None,
        };
        let b = Intent {
            command: "echo hi ",
            stdin_sha256: None,
            secret_names: &[],
            become_user: None,
        };
        let c = Intent {
            command: "echo hi",
            stdin_sha256: Some([0; 32]),
            secret_names: &[],
            become_user: None,
        };
        assert_ne!(host_fingerprint(&a), host_fingerprint(&b));
        assert_ne!(host_fingerprint(&a), host_fingerprint(&c));
        assert_eq!(host_fingerprint(&a), host_fingerprint(&a.clone()));
    }

    #[test]
    fn sudos_password_is_no_part_of_the_intent_and_the_commands_secrets_are() {
        let with = |names: &[String], user: Option<&str>| {
            host_fingerprint(&Intent {
                command: "systemctl restart app",
                stdin_sha256: None,
                secret_names: names,
                become_user: user,
            })
        };
        let pw = crate::secret::SUDO_PASSWORD.to_owned();
        // A run refused for want of the password, retried with it: one intent.
        assert_eq!(
            with(&[], Some("root")),
            with(std::slice::from_ref(&pw), Some("root"))
        );
        assert_eq!(
            with(&["TOKEN".into()], Some("root")),
            with(&["TOKEN".into(), pw], Some("root"))
        );
        // A secret the command reads, or another user, is another intent.
        assert_ne!(
            with(&[], Some("root")),
            with(&["TOKEN".into()], Some("root"))
        );
        assert_ne!(with(&[], Some("root")), with(&[], Some("app")));
    }

    #[test]
    fn ledger_fingerprint_is_keyed_stable_and_differs_from_plain_digest() {
        let dir = scratch("keyed");
        let key = InstallationKey::load_or_generate(&dir.join("k")).unwrap();
        let i = Intent {
            command: "rm -rf /srv/old",
            stdin_sha256: None,
            secret_names: &[],
            become_user: None,
        };
        let keyed = ledger_fingerprint(&i, &key);
        assert_eq!(keyed.len(), 64);
        assert_ne!(keyed, host_fingerprint(&i));
        assert_eq!(keyed, ledger_fingerprint(&i, &key));
        // Reloading the key from disk gives the same fingerprint.
        let again = InstallationKey::load_or_generate(&dir.join("k")).unwrap();
        assert_eq!(keyed, ledger_fingerprint(&i, &again));
        // Another installation (another key) gives another fingerprint.
        let other_dir = scratch("keyed-other");
        let other = InstallationKey::load_or_generate(&other_dir.join("k")).unwrap();
        assert_ne!(keyed, ledger_fingerprint(&i, &other));
        let _ = fs::remove_dir_all(&dir);
        let _ = fs::remove_dir_all(&other_dir);
    }

    #[test]
    fn installation_key_file_is_0600_in_a_0700_dir_and_32_bytes() {
        let dir = scratch("mode").join("nested");
        let key = InstallationKey::load_or_generate(&dir.join("k")).unwrap();
        let meta = fs::metadata(key.path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 32);
        let dmeta = fs::metadata(&dir).unwrap();
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        assert!(!format!("{key:?}").contains(&hex::encode(key.bytes)));
        let _ = fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn damaged_key_file_is_a_clear_error() {
        let dir = scratch("damaged");
        create_private_dir(&dir).unwrap();
        fs::write(dir.join("k"), b"short").unwrap();
        // Private, so that the length (not the mode, refused first) is what is wrong.
        fs::set_permissions(dir.join("k"), fs::Permissions::from_mode(0o600)).unwrap();
        let err = InstallationKey::load_or_generate(&dir.join("k")).unwrap_err();
        assert!(err.to_string().contains("not 32 bytes"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn generate_refuses_to_overwrite_an_existing_key() {
        let dir = scratch("overwrite");
        let first = InstallationKey::generate(&dir.join("k")).unwrap();
        let err = InstallationKey::generate(&dir.join("k")).unwrap_err();
        assert!(err.to_string().contains("File exists"), "{err}");
        let again = InstallationKey::load(&dir.join("k")).unwrap();
        assert_eq!(first.check_value(), again.check_value());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_first_use_agrees_on_one_key() {
        let dir = scratch("race");
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    InstallationKey::load_or_generate(&dir.join("k"))
                        .unwrap()
                        .bytes
                })
            })
            .collect();
        let keys: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
        let _ = fs::remove_dir_all(&dir);
    }
}
