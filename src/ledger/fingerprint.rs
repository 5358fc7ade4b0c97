//! Fingerprints of an operation's intent: the plain SHA-256 for the host marker and an
//! HMAC-SHA256 under a per-installation key for the local ledger (SPEC section 1).
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

use super::LedgerError;

/// File name of the installation key inside the opmark config directory.
pub const KEY_FILE: &str = "installation.key";
const KEY_LEN: usize = 32;

/// What an operation means to do: the command string exactly as it will be run on the
/// host, and the SHA-256 of the stdin that will be forwarded (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent<'a> {
    /// The command string (the words of `run -- CMD...` joined by spaces).
    pub command: &'a str,
    /// SHA-256 of the spooled stdin, or `None` when stdin is not forwarded.
    pub stdin_sha256: Option<[u8; 32]>,
}

impl Intent<'_> {
    /// The canonical bytes that both fingerprints digest:
    /// `"opmark-intent-v1\n" + len(command) + "\n" + command + "\n" + (hex stdin digest | "no-stdin")`.
    /// The length prefix keeps a command ending in a newline from colliding with another.
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

/// The per-installation secret (32 random bytes) that keys ledger fingerprints.
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

/// `${XDG_CONFIG_HOME:-~/.config}/opmark`.
pub fn default_config_dir() -> PathBuf {
    match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("opmark"),
        None => home_dir().join(".config").join("opmark"),
    }
}

pub(crate) fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

impl InstallationKey {
    /// Loads `<config_dir>/installation.key` (default dir: [`default_config_dir`]), creating
    /// it on first use: 32 random bytes, file 0600 in a 0700 directory. Safe when several
    /// opmark processes start at once: the key is published with an exclusive link, so
    /// every process ends up with the same key.
    pub fn load_or_create(config_dir: Option<&Path>) -> Result<Self, LedgerError> {
        let dir = config_dir.map_or_else(default_config_dir, Path::to_path_buf);
        let path = dir.join(KEY_FILE);
        match read_key(&path) {
            Ok(key) => return Ok(key),
            Err(LedgerError::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        create_private_dir(&dir)?;
        let tmp = dir.join(format!(
            ".{KEY_FILE}.{}.{:08x}.tmp",
            std::process::id(),
            rand::random::<u32>()
        ));
        let bytes: [u8; KEY_LEN] = rand::random();
        let io = |source| LedgerError::Io {
            what: format!("create the installation key {}", path.display()),
            source,
        };
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io)?;
            f.write_all(&bytes).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        // hard_link fails if the key exists: whoever linked first wins, the rest read it.
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                if let Ok(d) = fs::File::open(&dir) {
                    let _ = d.sync_all();
                }
                Ok(InstallationKey { bytes, path })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_key(&path),
            Err(e) => Err(io(e)),
        }
    }

    /// Where the key lives.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_key(path: &Path) -> Result<InstallationKey, LedgerError> {
    let mut f = fs::File::open(path).map_err(|source| LedgerError::Io {
        what: format!("read the installation key {}", path.display()),
        source,
    })?;
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
            "the installation key {} is not {KEY_LEN} bytes long; it may be damaged. Restore it from a backup, or move it aside to create a new one (fingerprints already in the ledger will then no longer match new ones)",
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
    fn canonical_bytes_follow_the_documented_layout() {
        let i = Intent {
            command: "echo hi",
            stdin_sha256: None,
        };
        assert_eq!(
            i.canonical_bytes(),
            b"opmark-intent-v1\n7\necho hi\nno-stdin"
        );
        let digest: [u8; 32] = Sha256::digest(b"data").into();
        let j = Intent {
            command: "cat",
            stdin_sha256: Some(digest),
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
        };
        let b = Intent {
            command: "echo hi ",
            stdin_sha256: None,
        };
        let c = Intent {
            command: "echo hi",
            stdin_sha256: Some([0; 32]),
        };
        assert_ne!(host_fingerprint(&a), host_fingerprint(&b));
        assert_ne!(host_fingerprint(&a), host_fingerprint(&c));
        assert_eq!(host_fingerprint(&a), host_fingerprint(&a.clone()));
    }

    #[test]
    fn ledger_fingerprint_is_keyed_stable_and_differs_from_plain_digest() {
        let dir = scratch("keyed");
        let key = InstallationKey::load_or_create(Some(&dir)).unwrap();
        let i = Intent {
            command: "rm -rf /srv/old",
            stdin_sha256: None,
        };
        let keyed = ledger_fingerprint(&i, &key);
        assert_eq!(keyed.len(), 64);
        assert_ne!(keyed, host_fingerprint(&i));
        assert_eq!(keyed, ledger_fingerprint(&i, &key));
        // Reloading the key from disk gives the same fingerprint.
        let again = InstallationKey::load_or_create(Some(&dir)).unwrap();
        assert_eq!(keyed, ledger_fingerprint(&i, &again));
        // Another installation (another key) gives another fingerprint.
        let other_dir = scratch("keyed-other");
        let other = InstallationKey::load_or_create(Some(&other_dir)).unwrap();
        assert_ne!(keyed, ledger_fingerprint(&i, &other));
        let _ = fs::remove_dir_all(&dir);
        let _ = fs::remove_dir_all(&other_dir);
    }

    #[test]
    fn installation_key_file_is_0600_in_a_0700_dir_and_32_bytes() {
        let dir = scratch("mode").join("nested");
        let key = InstallationKey::load_or_create(Some(&dir)).unwrap();
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
        fs::write(dir.join(KEY_FILE), b"short").unwrap();
        let err = InstallationKey::load_or_create(Some(&dir)).unwrap_err();
        assert!(err.to_string().contains("not 32 bytes"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_first_use_agrees_on_one_key() {
        let dir = scratch("race");
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    InstallationKey::load_or_create(Some(&dir)).unwrap().bytes
                })
            })
            .collect();
        let keys: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
        let _ = fs::remove_dir_all(&dir);
    }
}
