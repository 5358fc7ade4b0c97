//! Put: a local file delivered to a path on a host as one operation
//! (docs/commands.md#put-files-delivered-once). The content is the operation's stdin; the
//! intent is `opmark-put --mode MODE -- 'PATH'` with that content's digest, so a rerun
//! under the op id replays, other content under it is a `conflict`, and the policy
//! classifies and holds it like any command. The shim delivers it in place of running a
//! command: a temporary file beside PATH, checked by digest, synced, renamed over PATH.

use std::path::PathBuf;

use sha2::{Digest as _, Sha256};

use super::run::{run, RunAnswer, RunWatch, Stdin};
use super::transfer::{single_quoted, RemoteFile, TransferOptions};
use super::Context;
use crate::error::{Error, ErrorKind, Result};

/// The first word of a put's intent (the policy's rule for puts matches it).
pub use crate::shim::PUT_WORD;

/// What `opmark put` was asked.
#[derive(Debug, Clone)]
pub struct PutRequest {
    /// The local file.
    pub local: PathBuf,
    /// `HOST:PATH`, as typed.
    pub destination: String,
    /// `--mode`: the file's permission bits on the host (default: the local file's).
    pub mode: Option<u32>,
    /// The op id, attempts, wait, approvals and connection options.
    pub transfer: TransferOptions,
}

/// The intent's command text: the mode and the path, the path in single quotes (the
/// shim unquotes it; docs/host-protocol.md#files).
pub fn intent(mode: u32, path: &str) -> String {
    format!("{PUT_WORD} --mode {mode:04o} -- {}", single_quoted(path))
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

/// What `put` read and sent, with the run's answer.
#[derive(Debug)]
pub struct PutAnswer {
    /// Where it went.
    pub target: RemoteFile,
    /// The content's size.
    pub bytes: u64,
    /// The content's SHA-256, hex.
    pub sha256: String,
    /// The mode asked for.
    pub mode: u32,
    /// The operation's answer, as `run` gives it.
    pub run: RunAnswer,
}

/// Delivers `req.local` to its destination as one operation.
pub fn put(ctx: &Context, req: PutRequest, watch: &mut dyn RunWatch) -> Result<PutAnswer> {
    let target = RemoteFile::parse(&req.destination, Some(&req.local))
        .map_err(|why| invalid(format!("{why}; nothing was sent")))?;
    let meta = std::fs::metadata(&req.local).map_err(|e| {
        invalid(format!(
            "cannot read {}: {e}; nothing was sent",
            req.local.display()
        ))
    })?;
    if meta.is_dir() {
        return Err(invalid(format!(
            "{} is a directory; put takes files (one operation each); nothing was sent",
            req.local.display()
        )));
    }
    let mode = match req.mode {
        Some(m) if m > 0o7777 => {
            return Err(invalid(format!(
                "--mode {m:o} is not a file mode; give octal permission bits such as 644 or 0755; nothing was sent"
            )))
        }
        Some(m) => m,
        None => std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
    };
    let content = std::fs::read(&req.local).map_err(|e| {
        Error::new(
            ErrorKind::LocalIo,
            format!("cannot read {}: {e}; nothing was sent", req.local.display()),
        )
    })?;
    let sha256 = hex::encode(Sha256::digest(&content));
    let bytes = content.len() as u64;
    let request = req.transfer.run_request(
        &target.host,
        intent(mode, &target.path),
        crate::shim::RunKind::Put,
        Stdin::Given(content),
        // The delivery says one word; nothing else is kept.
        64 * 1024,
    );
    let run = run(ctx, request, watch)?;
    Ok(PutAnswer {
        target,
        bytes,
        sha256,
        mode,
        run,
    })
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
            intent(0o644, "/srv/it's here"),
            r"opmark-put --mode 0644 -- '/srv/it'\''s here'"
        );
        assert_eq!(intent(0o4755, "x"), "opmark-put --mode 4755 -- 'x'");
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
