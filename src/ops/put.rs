//! Put: a local file delivered to a path on a host as one operation
//! (docs/commands.md#put-files-delivered-once). The content is the operation's stdin; the
//! intent is `opmark-put --mode MODE -- 'PATH'` with that content's digest, so a rerun
//! under the op id replays, other content under it is a `conflict`, and the policy
//! classifies and holds it like any command. The shim delivers it in place of running a
//! command: a temporary file beside PATH, checked by digest, synced, renamed over PATH.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::run::{run, RunAnswer, RunWatch, Stdin};
use super::run_each::{run_each, EachOperation};
use super::transfer::{base_op, file_op, single_quoted, RemoteFile, TransferOptions};
use super::Context;
use crate::error::{Error, ErrorKind, Result};
use crate::op_id::OpId;

/// The first word of a put's intent (the policy's rule for puts matches it).
pub use crate::shim::PUT_WORD;

/// What `opmark put` was asked.
#[derive(Debug, Clone)]
pub struct PutRequest {
    /// The local files (directories too, with `recursive`).
    pub locals: Vec<PathBuf>,
    /// `HOST:PATH`, as typed: the file, or with several files (or `-r`) the directory
    /// they go into.
    pub destination: String,
    /// `--mode`: the files' permission bits on the host (default: each local file's).
    pub mode: Option<u32>,
    /// `-r`: a directory's files, each one operation, its tree made on the host.
    pub recursive: bool,
    /// The op id, attempts, wait, approvals and connection options.
    pub transfer: TransferOptions,
}

/// The intent's command text: the mode and the path, the path in single quotes (the
/// shim unquotes it; docs/host-protocol.md#files); `parents`: the host makes the
/// directories PATH needs.
pub fn intent(mode: u32, path: &str, parents: bool) -> String {
    let parents = if parents { " --parents" } else { "" };
    format!(
        "{PUT_WORD} --mode {mode:04o}{parents} -- {}",
        single_quoted(path)
    )
}

/// What the host did with the content, read from the delivery's own output (a replay
/// reads the original answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Written and renamed into place.
    Written,
    /// The path held this content already: nothing written.
    Unchanged,
}

impl Delivered {
    /// From the delivery's stdout.
    pub fn from_output(stdout: &str) -> Option<Delivered> {
        match stdout.trim_end() {
            "written" => Some(Delivered::Written),
            "unchanged" => Some(Delivered::Unchanged),
            _ => None,
        }
    }

    /// The word said for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivered::Written => "written",
            Delivered::Unchanged => "unchanged",
        }
    }
}

/// One file of a put: where it came from, where it goes, what it is.
#[derive(Debug, Clone)]
pub struct PutFile {
    /// The local file read.
    pub local: PathBuf,
    /// Where it went.
    pub target: RemoteFile,
    /// Its operation's id (with several files, the put's op id and a digest of PATH);
    /// none when the put was refused before it had one (a bad `--op`).
    pub op: Option<OpId>,
    /// The content's size.
    pub bytes: u64,
    /// The content's SHA-256, hex.
    pub sha256: String,
    /// The mode asked for.
    pub mode: u32,
}

/// What `put` read and sent, with the run's answer: one file and a run's answer, or
/// several files and a fleet's answer (one result per file, in the same order).
#[derive(Debug)]
pub struct PutAnswer {
    /// The put's op id: the one file's, or the one the files' ids are made from; none
    /// when the put was refused before it had one (a bad `--op`).
    pub op: Option<OpId>,
    /// The files, in the order they were named and (in a directory) by name.
    pub files: Vec<PutFile>,
    /// The operations' answer, as `run` gives it.
    pub run: RunAnswer,
}

/// Delivers the files, each as one operation.
pub fn put(ctx: &Context, req: PutRequest, watch: &mut dyn RunWatch) -> Result<PutAnswer> {
    if req.locals.is_empty() {
        return Err(invalid(
            "no local file named; write opmark put LOCAL... HOST:PATH; nothing was sent".into(),
        ));
    }
    if let Some(m) = req.mode.filter(|m| *m > 0o7777) {
        return Err(invalid(format!(
            "--mode {m:o} is not a file mode; give octal permission bits such as 644 or 0755; nothing was sent"
        )));
    }
    let single = match req.locals.as_slice() {
        [one] => !std::fs::metadata(one).is_ok_and(|m| m.is_dir()),
        _ => false,
    };
    if single {
        return put_one(ctx, req, watch);
    }
    let (base, minted) = base_op(req.transfer.op.as_deref())?;
    let dir = RemoteFile::parse_dir(&req.destination)
        .map_err(|why| invalid(format!("{why}; nothing was sent")))?;
    let found = local_files(&req.locals, req.recursive)?;
    let mut files = Vec::with_capacity(found.len());
    let mut each = Vec::with_capacity(found.len());
    let mut seen = std::collections::BTreeMap::new();
    for (local, rel) in found {
        let path = if dir.path.is_empty() {
            rel.clone()
        } else {
            format!("{}/{rel}", dir.path.trim_end_matches('/'))
        };
        if let Some(first) = seen.insert(path.clone(), local.clone()) {
            return Err(invalid(format!(
                "{} and {} would both be {}:{path}; put them in separate runs; nothing was sent",
                first.display(),
                local.display(),
                dir.host
            )));
        }
        // Only the digest now: each file is read again when its delivery starts (and
        // refused if it changed meanwhile), so only the files in flight are in memory.
        let (sha256, bytes, mode) = digest_file(&local, req.mode)?;
        let op = file_op(&base, &path);
        each.push(EachOperation {
            op: op.clone(),
            command: intent(mode, &path, req.recursive),
            stdin_from: Some(crate::operation::StdinFile {
                path: local.clone(),
                sha256,
            }),
            stdout_to: None,
        });
        files.push(PutFile {
            local,
            target: RemoteFile {
                host: dir.host.clone(),
                path,
            },
            op: Some(op),
            bytes,
            sha256: hex::encode(sha256),
            mode,
        });
    }
    if minted {
        watch.minted(&base);
    }
    let mut transfer = req.transfer;
    transfer.op = None;
    let request = transfer.run_request(
        &dir.host,
        String::new(),
        crate::shim::RunKind::Put,
        Stdin::None,
        DELIVERY_OUTPUT,
    );
    let run = run_each(ctx, request, &base, each, watch)?;
    Ok(PutAnswer {
        op: Some(base),
        files,
        run,
    })
}

/// What the host keeps of a delivery's output: it says one word.
const DELIVERY_OUTPUT: u64 = 64 * 1024;

/// One file to one path: a run's answer.
fn put_one(ctx: &Context, req: PutRequest, watch: &mut dyn RunWatch) -> Result<PutAnswer> {
    let local = req.locals[0].clone();
    let target = RemoteFile::parse(&req.destination, Some(&local))
        .map_err(|why| invalid(format!("{why}; nothing was sent")))?;
    let (content, mode) = read_file(&local, req.mode)?;
    let digest: [u8; 32] = Sha256::digest(&content).into();
    let sha256 = hex::encode(digest);
    let bytes = content.len() as u64;
    let request = req.transfer.run_request(
        &target.host,
        intent(mode, &target.path, false),
        crate::shim::RunKind::Put,
        Stdin::Digested {
            bytes: content,
            sha256: digest,
        },
        DELIVERY_OUTPUT,
    );
    let run = run(ctx, request, watch)?;
    let op = match &run {
        RunAnswer::One { report, .. } => OpId::parse(&report.op_id).ok(),
        RunAnswer::Early(early) => early.op_id.as_deref().and_then(|o| OpId::parse(o).ok()),
        RunAnswer::Fleet { .. } => None,
    };
    Ok(PutAnswer {
        op: op.clone(),
        files: vec![PutFile {
            local,
            op,
            target,
            bytes,
            sha256,
            mode,
        }],
        run,
    })
}

/// A file's SHA-256, its size and the mode it gets, read in pieces.
fn digest_file(local: &Path, mode: Option<u32>) -> Result<([u8; 32], u64, u32)> {
    use std::io::Read as _;
    let mode = file_mode(local, mode)?;
    let cannot = |e: std::io::Error| {
        Error::new(
            ErrorKind::LocalIo,
            format!("cannot read {}: {e}; nothing was sent", local.display()),
        )
    };
    let mut file = std::fs::File::open(local).map_err(cannot)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(cannot)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((hash.finalize().into(), bytes, mode))
}

/// A file's content and the mode it gets (`mode`, else its own permission bits).
fn read_file(local: &Path, mode: Option<u32>) -> Result<(Vec<u8>, u32)> {
    let mode = file_mode(local, mode)?;
    let content = std::fs::read(local).map_err(|e| {
        Error::new(
            ErrorKind::LocalIo,
            format!("cannot read {}: {e}; nothing was sent", local.display()),
        )
    })?;
    Ok((content, mode))
}

/// The mode a regular file gets (`mode`, else its own permission bits); anything but
/// a regular file is refused, naming what it is.
fn file_mode(local: &Path, mode: Option<u32>) -> Result<u32> {
    let meta = std::fs::metadata(local).map_err(|e| {
        invalid(format!(
            "cannot read {}: {e}; nothing was sent",
            local.display()
        ))
    })?;
    if meta.is_dir() {
        return Err(invalid(format!(
            "{} is a directory; give -r to put its files (one operation each); nothing was sent",
            local.display()
        )));
    }
    if !meta.is_file() {
        return Err(invalid(format!(
            "{} is not a regular file (a device, a pipe or a socket); put takes files; nothing was sent",
            local.display()
        )));
    }
    Ok(mode
        .unwrap_or_else(|| std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777))
}

/// The files named, each with the path it takes under the destination directory: a
/// file its own name; with `recursive`, a directory's files (by name, at every depth)
/// under the directory's name (`DIR/.`, `.` or `..`: its files directly).
/// Symbolic links are followed, as scp follows them; a directory met twice (a link
/// loop) is refused, and so is anything that is no file or directory.
fn local_files(locals: &[PathBuf], recursive: bool) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for local in locals {
        let meta = std::fs::metadata(local).map_err(|e| {
            invalid(format!(
                "cannot read {}: {e}; nothing was sent",
                local.display()
            ))
        })?;
        // `DIR/.` (and `.`) names a directory's files, not the directory: Path drops
        // the trailing `.`, so the text says it.
        let contents = {
            use std::os::unix::ffi::OsStrExt as _;
            let text = local.as_os_str().as_bytes();
            text == b"." || text.ends_with(b"/.")
        };
        let name = local
            .file_name()
            .filter(|_| !contents)
            .map(|n| remote_name(n, local))
            .transpose()?;
        if meta.is_dir() {
            if !recursive {
                return Err(invalid(format!(
                    "{} is a directory; give -r to put its files (one operation each); nothing was sent",
                    local.display()
                )));
            }
            let mut visited = std::collections::BTreeSet::new();
            walk(local, name.unwrap_or_default(), &mut visited, &mut out)?;
        } else {
            let Some(name) = name else {
                return Err(invalid(format!(
                    "{} names no file; nothing was sent",
                    local.display()
                )));
            };
            out.push((local.clone(), name));
        }
    }
    if out.is_empty() {
        return Err(invalid(
            "no files under the directories named (put sends files; empty directories are not made); nothing was sent"
                .into(),
        ));
    }
    Ok(out)
}

/// A local name as a path component on the host: text without control characters.
fn remote_name(name: &std::ffi::OsStr, local: &Path) -> Result<String> {
    match name.to_str() {
        Some(n) if !n.chars().any(char::is_control) => Ok(n.to_owned()),
        _ => Err(invalid(format!(
            "{} has a name that is not text or holds a control character; rename it or leave it out; nothing was sent",
            crate::text::printable(&local.display().to_string())
        ))),
    }
}

fn walk(
    dir: &Path,
    prefix: String,
    visited: &mut std::collections::BTreeSet<PathBuf>,
    out: &mut Vec<(PathBuf, String)>,
) -> Result<()> {
    let unreadable = |e: std::io::Error| {
        invalid(format!(
            "cannot read the directory {}: {e}; nothing was sent",
            dir.display()
        ))
    };
    let real = std::fs::canonicalize(dir).map_err(unreadable)?;
    if !visited.insert(real.clone()) {
        return Err(invalid(format!(
            "{} leads back to a directory already being put (a symbolic link loop); nothing was sent",
            dir.display()
        )));
    }
    let mut entries = std::fs::read_dir(dir)
        .map_err(unreadable)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(unreadable)?;
    entries.sort();
    for path in entries {
        let name = remote_name(path.file_name().unwrap_or_default(), &path)?;
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let meta = std::fs::metadata(&path).map_err(|e| {
            invalid(format!(
                "cannot read {}: {e}; nothing was sent",
                path.display()
            ))
        })?;
        if meta.is_dir() {
            walk(&path, rel, visited, out)?;
        } else if meta.is_file() {
            out.push((path, rel));
        } else {
            return Err(invalid(format!(
                "{} is not a regular file (a device, a pipe or a socket); put takes files; leave it out; nothing was sent",
                path.display()
            )));
        }
    }
    // Only the directories on the way down make a loop: one reached again by another
    // way (two links to it) is put twice, under both names.
    visited.remove(&real);
    Ok(())
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_intent_quotes_the_path_so_the_shim_reads_it_back_whole() {
        assert_eq!(
            intent(0o644, "/srv/it's here", false),
            r"opmark-put --mode 0644 -- '/srv/it'\''s here'"
        );
        assert_eq!(intent(0o4755, "x", false), "opmark-put --mode 4755 -- 'x'");
        assert_eq!(
            intent(0o600, "a/b", true),
            "opmark-put --mode 0600 --parents -- 'a/b'"
        );
    }

    #[test]
    fn the_delivery_says_written_or_unchanged() {
        assert_eq!(
            Delivered::from_output("written\n"),
            Some(Delivered::Written)
        );
        assert_eq!(
            Delivered::from_output("unchanged\n"),
            Some(Delivered::Unchanged)
        );
        assert_eq!(Delivered::from_output(""), None);
    }
}
