//! Lab directory and file helpers: every file the lab writes holds keys or a config
//! sshd checks, so each gets its mode set, and each failure names its path; and the
//! tail of a log, which error messages quote.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::error::LabError;

/// Removes a lab directory's files (for `lab down` and stale labs).
pub fn remove_lab_dir(dir: &Path) -> Result<(), LabError> {
    std::fs::remove_dir_all(dir).or_else(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Ok(())
        } else {
            Err(LabError::Io {
                path: dir.to_path_buf(),
                source: e,
            })
        }
    })
}

pub(super) fn remove_contents(dir: &Path) -> Result<(), LabError> {
    let entries = std::fs::read_dir(dir).map_err(|source| LabError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let res = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        res.map_err(|source| LabError::Io { path, source })?;
    }
    Ok(())
}

pub(super) fn mkdir(path: &Path, mode: u32) -> Result<(), LabError> {
    std::fs::create_dir_all(path)
        .and_then(|_| {
            if mode != 0o755 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            } else {
                Ok(())
            }
        })
        .map_err(|source| LabError::Io {
            path: path.to_path_buf(),
            source,
        })
}

pub(super) fn read(path: &Path) -> Result<String, LabError> {
    std::fs::read_to_string(path).map_err(|source| LabError::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(super) fn write(path: &Path, text: &str, mode: u32) -> Result<(), LabError> {
    std::fs::write(path, text)
        .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(|source| LabError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// The last `lines` lines of a log, for error messages.
pub(crate) fn log_tail(log: &Path, lines: usize) -> String {
    match std::fs::read_to_string(log) {
        Ok(t) => {
            let all: Vec<&str> = t.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(no log: {e})"),
    }
}
