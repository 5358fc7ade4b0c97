//! What `opmark put` and `opmark get` share: `HOST:PATH` as scp writes it, the path quoted
//! for the intent's command text (which the shim unquotes; docs/host-protocol.md#files),
//! and the operation a transfer is, as `run` takes it.

use std::path::Path;
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::run::{FleetOptions, RunRequest, Stdin};
use super::HostOptions;
use crate::error::{Error, ErrorKind, Result};
use crate::op_id::OpId;
use crate::operation::WaitScope;
use crate::shim::RunKind;

/// What a transfer was asked besides its files.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// The op id, unchecked; None mints one.
    pub op: Option<String>,
    /// At most this many attempts.
    pub attempts: Option<u32>,
    /// How long to wait for a transfer under way before answering `in_progress`.
    pub wait: Duration,
    /// What `wait` bounds besides connects and probes.
    pub wait_scope: WaitScope,
    /// `--approve NOTE`, for a transfer the policy holds.
    pub approve: Option<String>,
    /// `--approval FILE`'s token text, unchecked.
    pub approval: Option<String>,
    /// Connection options.
    pub options: HostOptions,
    /// `--forks`: with several files, at most this many operations in flight at once.
    pub forks: usize,
    /// `put --become USER`: the files written as USER through sudo on the host.
    pub become_user: Option<String>,
    /// sudo's password for `--become` (`SUDO_PASSWORD`), the one secret a transfer takes.
    pub secrets: Vec<crate::secret::Spec>,
}

impl TransferOptions {
    /// The run a transfer is: `command` of `kind` on `host`, `stdin` forwarded, the host
    /// keeping `output_cap` bytes of its output; no locks, and no secret but sudo's
    /// password for `--become`.
    pub fn run_request(
        self,
        host: &str,
        command: String,
        kind: RunKind,
        stdin: Stdin,
        output_cap: u64,
    ) -> RunRequest {
        RunRequest {
            hosts: vec![host.to_owned()],
            op: self.op,
            class: None,
            stdin,
            timeout: None,
            attempts: self.attempts,
            wait: self.wait,
            wait_scope: self.wait_scope,
            output_cap,
            approve: self.approve,
            approval: self.approval,
            repeats: None,
            amends: None,
            options: self.options,
            fleet: FleetOptions {
                forks: self.forks,
                ..FleetOptions::default()
            },
            secrets: self.secrets,
            become_user: self.become_user,
            locks: Vec::new(),
            lock_wait: Duration::ZERO,
            command: vec![command],
            kind,
            live_output: false,
            tally: None,
            stdout_to: None,
        }
    }
}

/// A file on a host: the host as typed, and the path on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Host alias or [user@]host.
    pub host: String,
    /// The file's path on the host: absolute, or relative to the login directory.
    pub path: String,
}

impl RemoteFile {
    /// `HOST:PATH` (`[v6addr]:PATH` too); `~/` is the login directory. A PATH ending in
    /// `/` (or `~`) is a directory: it takes `name_from`'s file name, and without one it
    /// is refused.
    pub fn parse(text: &str, name_from: Option<&Path>) -> Result<RemoteFile, String> {
        let RemoteFile { host, path } = RemoteFile::split(text)?;
        let mut path = match path.as_str() {
            "~" => String::new(),
            p => p.strip_prefix("~/").unwrap_or(p).to_owned(),
        };
        if path.is_empty() || path.ends_with('/') {
            let name = name_from
                .and_then(|l| l.file_name())
                .and_then(|n| n.to_str());
            let Some(name) = name else {
                return Err(format!(
                    "`{}` names a directory; name the file",
                    crate::text::printable(text)
                ));
            };
            path.push_str(name);
        }
        Ok(RemoteFile { host, path })
    }

    /// `HOST:DIR`, the directory several files go into: `~`, `~/` or `.` is the login
    /// directory (the path is then empty), and a trailing `/` is dropped (`/` stays).
    pub fn parse_dir(text: &str) -> Result<RemoteFile, String> {
        let RemoteFile { host, path } = RemoteFile::split(text)?;
        let path = match path.as_str() {
            "~" | "~/" | "." | "./" => String::new(),
            "/" => "/".to_owned(),
            p => p
                .strip_prefix("~/")
                .unwrap_or(p)
                .trim_end_matches('/')
                .to_owned(),
        };
        Ok(RemoteFile { host, path })
    }

    /// The host and the path as typed, each checked as present and printable.
    fn split(text: &str) -> Result<RemoteFile, String> {
        let split = if let Some(rest) = text.strip_prefix('[') {
            rest.find("]:").map(|i| (&rest[..i], &rest[i + 2..]))
        } else {
            text.split_once(':')
        };
        let Some((host, path)) = split else {
            return Err(format!(
                "`{}` names no path on a host; write HOST:PATH (e.g. web1:/etc/app.conf)",
                crate::text::printable(text)
            ));
        };
        if host.is_empty() {
            return Err(format!(
                "`{}` names no host; write HOST:PATH",
                crate::text::printable(text)
            ));
        }
        if path.is_empty() {
            return Err(format!(
                "`{}` names no path on {}; write {}:PATH",
                crate::text::printable(text),
                crate::text::printable(host),
                crate::text::printable(host)
            ));
        }
        if path.chars().any(char::is_control) {
            return Err(
                "the path on the host holds a control character (a newline, say); name the file without it"
                    .into(),
            );
        }
        Ok(RemoteFile {
            host: host.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// The longest op id that leaves room for a file's suffix (`:` and 12 hex digits).
const BASE_OP_MAX: usize = 128 - 13;

/// The op id of a transfer of several files (`--op`, checked, else minted: then `true`),
/// which each file's op id is made from ([`file_op`]).
pub fn base_op(given: Option<&str>) -> Result<(OpId, bool)> {
    let (base, minted) = match given {
        Some(text) => (
            OpId::parse(text).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?,
            false,
        ),
        None => (OpId::mint(), true),
    };
    if base.as_str().len() > BASE_OP_MAX {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("the op id of a transfer of several files is at most {BASE_OP_MAX} characters (each file's is it, `:` and 12 more); nothing was sent"),
        ));
    }
    Ok((base, minted))
}

/// The op id of the file at `path` on the host, in a transfer of several files under
/// `base`: the same file (by its path on the host) has the same id in every rerun,
/// whatever else the set gained or lost.
pub fn file_op(base: &OpId, path: &str) -> OpId {
    let digest = hex::encode(Sha256::digest(path.as_bytes()));
    OpId::parse(&format!("{base}:{}", &digest[..12])).expect("a checked base and hex digits")
}

/// `text` in single quotes for a POSIX shell (`'\''` for a quote).
pub fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Result<RemoteFile, String> {
        RemoteFile::parse(text, Some(Path::new("/tmp/app.conf")))
    }

    #[test]
    fn a_destination_is_host_colon_path_as_scp_writes_it() {
        assert_eq!(
            target("web1:/etc/app.conf").unwrap(),
            RemoteFile {
                host: "web1".into(),
                path: "/etc/app.conf".into()
            }
        );
        assert_eq!(target("root@web1:/etc/").unwrap().path, "/etc/app.conf");
        assert_eq!(target("web1:~/x").unwrap().path, "x");
        assert_eq!(target("web1:~").unwrap().path, "app.conf");
        assert_eq!(target("[::1]:/a:b").unwrap().host, "::1");
        assert_eq!(target("[::1]:/a:b").unwrap().path, "/a:b");
    }

    #[test]
    fn a_destination_without_host_or_path_is_refused_with_the_form() {
        for (bad, says) in [
            ("web1", "HOST:PATH"),
            (":/etc/x", "no host"),
            ("web1:", "no path"),
            ("web1:/etc/a\nb", "control character"),
        ] {
            let e = target(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_directory_for_several_files_is_the_path_without_its_trailing_slash() {
        for (text, path) in [
            ("web1:/srv/site/", "/srv/site"),
            ("web1:/srv/site", "/srv/site"),
            ("web1:/", "/"),
            ("web1:~", ""),
            ("web1:~/", ""),
            ("web1:.", ""),
            ("web1:~/www", "www"),
        ] {
            assert_eq!(RemoteFile::parse_dir(text).unwrap().path, path, "{text}");
        }
        assert!(RemoteFile::parse_dir("web1").is_err());
    }

    #[test]
    fn a_directory_without_a_name_to_take_is_refused() {
        let e = RemoteFile::parse("web1:/etc/", None).unwrap_err();
        assert!(e.contains("names a directory"), "{e}");
    }
}
