//! Get: a file on a host read into a local file as one operation
//! (docs/commands.md#get-files-read-back-whole). The intent is `opmark-get -- 'PATH'`,
//! read-only by the shipped policy; the shim copies PATH into the marker, says its digest
//! on stderr's first line and sends the copy as the output, which the host keeps for a
//! replay. Here the bytes go to a partial copy beside LOCAL as they arrive (named by the
//! op id), are checked against that digest, synced and renamed into place: LOCAL holds
//! the old file or the whole new one. A read cut before the end keeps its partial copy,
//! and a rerun under the op id asks the host's copy for the bytes after it; the digest
//! over the whole is what decides, so a partial copy that is not the host's bytes is
//! removed and read again, never renamed into place.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::run::{run, RunAnswer, RunWatch, Stdin};
use super::run_each::{run_each, EachOperation};
use super::transfer::{base_op, file_op, single_quoted, RemoteFile, TransferOptions};
use super::Context;
use crate::error::ErrorKind;
use crate::error::{Error, Result};
use crate::shim::GET_WORD;
use crate::vocab::Verdict;

/// The host keeps a get's whole output for a replay: a file's size, not the usual cap.
const KEEP_ON_HOST: u64 = 1 << 40;

/// What `opmark get` was asked.
#[derive(Debug, Clone)]
pub struct GetRequest {
    /// `HOST:PATH`s, as typed (several: one host, each file one operation).
    pub sources: Vec<String>,
    /// The local file (an existing directory takes the remote file's name); with several
    /// sources, the existing directory they go into.
    pub local: PathBuf,
    /// `-r`: the one source is a directory whose regular files are read, at every depth.
    pub recursive: bool,
    /// The op id, attempts, wait, approvals and connection options.
    pub transfer: TransferOptions,
}

/// One file of a get: where from, where to, what was read.
#[derive(Debug, Clone)]
pub struct GotFile {
    /// Where it came from.
    pub source: RemoteFile,
    /// Where it went.
    pub local: PathBuf,
    /// The file as the host read it: (SHA-256 hex, bytes), when it was read.
    pub read: Option<(String, u64)>,
    /// LOCAL holds the content now (checked by its digest).
    pub saved: bool,
}

/// What `get` read and where it put it, with the run's answer: one file and a run's
/// answer, or several and a fleet's (one result per file, in the same order).
#[derive(Debug)]
pub struct GetAnswer {
    /// The op id the files' ids are made from, with several files.
    pub op: Option<crate::op_id::OpId>,
    /// The files, in the order named.
    pub files: Vec<GotFile>,
    /// The operations' answer, as `run` gives it (stdout emptied: the content is in
    /// LOCAL, not in a document).
    pub run: RunAnswer,
    /// `get -r` that read no file: `run` is then its listing's answer.
    pub listed: Option<DirListing>,
}

/// A `get -r` whose listing was all there was to answer: it failed, or found no file.
#[derive(Debug)]
pub struct DirListing {
    /// `HOST:DIR`.
    pub place: String,
    /// What was done when the directory holds no regular file (`None`: the listing failed).
    pub empty: Option<String>,
}

/// The intent's command text (docs/host-protocol.md#files).
pub fn intent(path: &str) -> String {
    format!("{GET_WORD} -- {}", single_quoted(path))
}

/// The listing of `get -r` (docs/commands.md#several-files-and-directories): the regular
/// files under `dir`, at every depth, as `./REL` names ended by NUL bytes. Links are not
/// followed (a link's target is read when named itself), as `put -r` makes no links.
pub fn listing(dir: &str) -> String {
    let find = "find . -type f -print0";
    if dir.is_empty() {
        return find.to_owned();
    }
    // A directory whose name starts with `-` is no option to `cd`.
    let dir = if dir.starts_with('-') {
        format!("./{dir}")
    } else {
        dir.to_owned()
    };
    format!("cd {} && {find}", single_quoted(&dir))
}

/// Reads the remote files into `req.local`, each as one operation.
pub fn get(ctx: &Context, req: GetRequest, watch: &mut dyn RunWatch) -> Result<GetAnswer> {
    if req.recursive {
        return get_tree(ctx, req, watch);
    }
    match req.sources.as_slice() {
        [] => Err(invalid(
            "no file on a host named; write opmark get HOST:PATH... LOCAL; nothing was sent".into(),
        )),
        [one] => {
            let one = one.clone();
            get_one(ctx, req, &one, watch)
        }
        _ => get_several(ctx, req, watch),
    }
}

/// One file: a run's answer.
fn get_one(
    ctx: &Context,
    req: GetRequest,
    text: &str,
    watch: &mut dyn RunWatch,
) -> Result<GetAnswer> {
    let source =
        RemoteFile::parse(text, None).map_err(|why| invalid(format!("{why}; nothing was sent")))?;
    let local = if req.local.is_dir() {
        req.local.join(remote_file_name(&source)?)
    } else {
        req.local.clone()
    };
    let dir = directory_of(&local)?;
    // The op id is known before the run: the partial copy here is named by it.
    let (op, minted) = match req.transfer.op.as_deref() {
        Some(text) => (
            crate::op_id::OpId::parse(text)
                .map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?,
            false,
        ),
        None => (crate::op_id::OpId::mint(), true),
    };
    if minted {
        watch.minted(&op);
    }
    let partial = partial_path(&local, &dir, op.as_str());
    let mut transfer = req.transfer;
    transfer.op = Some(op.to_string());
    let mut request = transfer.run_request(
        &source.host,
        intent(&source.path),
        crate::shim::RunKind::Get,
        Stdin::None,
        KEEP_ON_HOST,
    );
    request.stdout_to = Some(partial.clone());
    let mut run = match run(ctx, request, watch) {
        Ok(run) => run,
        Err(e) => {
            drop_if_empty(&partial);
            return Err(e);
        }
    };
    let mut file = GotFile {
        source,
        local,
        read: None,
        saved: false,
    };
    match &mut run {
        RunAnswer::One { report, .. } => keep(report, &mut file, &partial, watch)?,
        _ => drop_if_empty(&partial),
    }
    Ok(GetAnswer {
        op: None,
        files: vec![file],
        run,
        listed: None,
    })
}

/// Several files of one host into the directory LOCAL, each one operation.
fn get_several(ctx: &Context, req: GetRequest, watch: &mut dyn RunWatch) -> Result<GetAnswer> {
    if !req.local.is_dir() {
        return Err(invalid(format!(
            "{} is no directory here: several files go into an existing directory; create it first. Nothing was sent",
            req.local.display()
        )));
    }
    let (base, minted) = base_op(req.transfer.op.as_deref())?;
    let mut files: Vec<GotFile> = Vec::with_capacity(req.sources.len());
    let mut each = Vec::with_capacity(req.sources.len());
    for text in &req.sources {
        let source = RemoteFile::parse(text, None)
            .map_err(|why| invalid(format!("{why}; nothing was sent")))?;
        if let Some(first) = files.first().filter(|f| f.source.host != source.host) {
            return Err(invalid(format!(
                "the files come from {} and {}: a get of several files reads from one host; run one get per host. Nothing was sent",
                first.source.host, source.host
            )));
        }
        let local = req.local.join(remote_file_name(&source)?);
        if let Some(other) = files.iter().find(|f| f.local == local) {
            return Err(invalid(format!(
                "{}:{} and {} would both be {}; get them in separate runs. Nothing was sent",
                source.host,
                other.source.path,
                source.path,
                local.display()
            )));
        }
        let op = file_op(&base, &source.path);
        each.push(EachOperation {
            stdout_to: Some(partial_path(&local, &req.local, op.as_str())),
            op,
            command: intent(&source.path),
            stdin_from: None,
        });
        files.push(GotFile {
            source,
            local,
            read: None,
            saved: false,
        });
    }
    if minted {
        watch.minted(&base);
    }
    read_each(ctx, req.transfer, base, files, each, watch)
}

/// Reads `files` (one host's), each the operation `each` names, and keeps each that was
/// read in its LOCAL: a fleet's answer, one result per file.
fn read_each(
    ctx: &Context,
    mut transfer: TransferOptions,
    base: crate::op_id::OpId,
    mut files: Vec<GotFile>,
    each: Vec<EachOperation>,
    watch: &mut dyn RunWatch,
) -> Result<GetAnswer> {
    let host = files[0].source.host.clone();
    transfer.op = None;
    let request = transfer.run_request(
        &host,
        String::new(),
        crate::shim::RunKind::Get,
        Stdin::None,
        KEEP_ON_HOST,
    );
    let partials: Vec<PathBuf> = each.iter().filter_map(|e| e.stdout_to.clone()).collect();
    let run = run_each(ctx, request, &base, each, watch);
    let mut run = match run {
        Ok(run) => run,
        Err(e) => {
            partials.iter().for_each(|p| drop_if_empty(p));
            return Err(e);
        }
    };
    if let RunAnswer::Fleet { results, .. } = &mut run {
        for ((file, result), partial) in files.iter_mut().zip(results.iter_mut()).zip(&partials) {
            match &mut result.outcome {
                Ok(report) => {
                    if let Err(e) = keep(report, file, partial, watch) {
                        // One file not kept is that file's answer, not the others' end.
                        result.outcome = Err(e);
                    }
                }
                Err(_) => drop_if_empty(partial),
            }
        }
    }
    Ok(GetAnswer {
        op: Some(base),
        files,
        run,
        listed: None,
    })
}

/// `get -r HOST:DIR LOCAL`: the listing first, as an operation of its own (`BASE:list`,
/// read-only: a rerun under the same op id replays it, so it reads the same set of files
/// whatever the directory gained since), then each file listed as in a get of several.
fn get_tree(ctx: &Context, req: GetRequest, watch: &mut dyn RunWatch) -> Result<GetAnswer> {
    let [text] = req.sources.as_slice() else {
        return Err(invalid(
            "get -r reads one directory a run: name one HOST:DIR and a LOCAL; nothing was sent"
                .into(),
        ));
    };
    let dir =
        RemoteFile::parse_dir(text).map_err(|why| invalid(format!("{why}; nothing was sent")))?;
    // `DIR/.` (and the login directory itself): its files go into LOCAL directly.
    let (path, contents) = match dir.path.strip_suffix("/.") {
        Some(p) => (p.to_owned(), true),
        None => (dir.path.clone(), dir.path.is_empty()),
    };
    // Where the files go depends on the arguments alone, never on what exists here, so
    // a rerun under the op id lands where the first run did (as `put -r` on the host).
    if !req.local.is_dir() {
        return Err(invalid(format!(
            "{} is no directory here: get -r reads into an existing directory (DIR under its name, DIR/. directly); create it first. Nothing was sent",
            req.local.display()
        )));
    }
    let root = if contents {
        req.local.clone()
    } else {
        let name = Path::new(&path).file_name().ok_or_else(|| {
            invalid(format!(
                "{} has no name to make under {}; write {}:{}/. to read its files into {} directly. Nothing was sent",
                dir.path,
                req.local.display(),
                dir.host,
                path.trim_end_matches('/'),
                req.local.display()
            ))
        })?;
        req.local.join(name)
    };
    let (base, minted) = base_op(req.transfer.op.as_deref())?;
    if minted {
        watch.minted(&base);
    }
    let place = format!("{}:{}", dir.host, dir.path);
    let mut lister = req.transfer.clone();
    lister.op = Some(format!("{base}:list"));
    let request = lister.run_request(
        &dir.host,
        listing(&path),
        crate::shim::RunKind::Command,
        Stdin::None,
        KEEP_ON_HOST,
    );
    let listed = run(ctx, request, watch)?;
    let names = match &listed {
        RunAnswer::One { report, .. }
            if matches!(report.verdict, Verdict::Completed | Verdict::Replayed)
                && report.exit_code == Some(0) =>
        {
            let mut raw = Vec::new();
            report
                .stdout
                .write_raw(&mut raw)
                .map_err(|e| Error::new(ErrorKind::LocalIo, format!("reading the listing: {e}")))?;
            listed_names(&raw, &place)?
        }
        _ => {
            return Ok(GetAnswer {
                op: Some(base),
                files: Vec::new(),
                run: listed,
                listed: Some(DirListing { place, empty: None }),
            })
        }
    };
    let made = |d: &Path| {
        std::fs::create_dir_all(d).map_err(|e| {
            Error::new(
                ErrorKind::LocalIo,
                format!(
                    "cannot make the directory {} here ({e}); nothing was read but the listing (op {base}:list): fix it and rerun with --op {base}",
                    d.display()
                ),
            )
        })
    };
    if names.is_empty() {
        made(&root)?;
        return Ok(GetAnswer {
            op: Some(base),
            files: Vec::new(),
            run: listed,
            listed: Some(DirListing {
                empty: Some(format!(
                    "{place} holds no regular file; {} is there, nothing was read",
                    root.display()
                )),
                place,
            }),
        });
    }
    let mut files = Vec::with_capacity(names.len());
    let mut each = Vec::with_capacity(names.len());
    for rel in names {
        let remote = match path.as_str() {
            "" => rel.clone(),
            p if p.ends_with('/') => format!("{p}{rel}"),
            p => format!("{p}/{rel}"),
        };
        let local = root.join(&rel);
        if let Some(parent) = local.parent() {
            made(parent)?;
        }
        let op = file_op(&base, &remote);
        each.push(EachOperation {
            stdout_to: Some(partial_path(
                &local,
                local.parent().unwrap_or(&root),
                op.as_str(),
            )),
            op,
            command: intent(&remote),
            stdin_from: None,
        });
        files.push(GotFile {
            source: RemoteFile {
                host: dir.host.clone(),
                path: remote,
            },
            local,
            read: None,
            saved: false,
        });
    }
    read_each(ctx, req.transfer, base, files, each, watch)
}

/// The names a listing gave (`./REL` ended by NUL), as relative paths, sorted. A name
/// that would land outside LOCAL (`..`, an absolute path, an empty part) or is not
/// UTF-8 refuses the whole get: a host's listing is not trusted to choose local paths.
fn listed_names(raw: &[u8], place: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for name in raw.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let bad = |why: &str| {
            invalid(format!(
                "the listing of {place} named `{}`, {why}; nothing was read but the listing",
                crate::text::printable(&String::from_utf8_lossy(name))
            ))
        };
        let text = std::str::from_utf8(name)
            .map_err(|_| bad("which is not UTF-8 (opmark names files by text)"))?;
        let rel = text
            .strip_prefix("./")
            .ok_or_else(|| bad("which is not under the directory"))?;
        if rel
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        {
            return Err(bad("which would land outside the directory"));
        }
        names.push(rel.to_owned());
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// The remote file's name, for a LOCAL that is a directory.
fn remote_file_name(source: &RemoteFile) -> Result<&std::ffi::OsStr> {
    Path::new(&source.path).file_name().ok_or_else(|| {
        invalid(format!(
            "{} has no file name; name the local file",
            source.path
        ))
    })
}

/// The directory LOCAL is written in, which must exist.
fn directory_of(local: &Path) -> Result<PathBuf> {
    let dir = match local.parent() {
        Some(d) if d.as_os_str().is_empty() => Path::new("."),
        Some(d) => d,
        None => Path::new("/"),
    };
    if !dir.is_dir() {
        return Err(invalid(format!(
            "no directory {} here to write {} into; create it first. Nothing was sent",
            dir.display(),
            local.display()
        )));
    }
    Ok(dir.to_path_buf())
}

/// The partial copy of `local`'s read under `op`: beside it, hidden, named by the op id
/// so that a rerun under it finds what an earlier invocation received. A name that would
/// pass NAME_MAX (255 bytes: a long LOCAL with a long op id, which failed with "File name
/// too long") is named by a digest of both instead, as stable across reruns.
fn partial_path(local: &Path, dir: &Path, op: &str) -> PathBuf {
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let full = format!(".{name}.opmark-{op}");
    if full.len() <= 255 {
        return dir.join(full);
    }
    let digest = hex::encode(Sha256::digest(format!("{name}\0{op}")));
    dir.join(format!(".opmark-{}.part", &digest[..32]))
}

/// Settles a read: one that ended well goes from its partial copy to `file.local` and is
/// said in `file`; one the host answered otherwise (no such file) leaves nothing here;
/// one not settled (the link lost, the budget spent, a signal) keeps what arrived for a
/// rerun under the op id to go on from. The report keeps no content (it is in LOCAL; a
/// document carries what happened, not the file).
fn keep(
    report: &mut crate::operation::RunReport,
    file: &mut GotFile,
    partial: &Path,
    watch: &mut dyn RunWatch,
) -> Result<()> {
    report.stdout = Default::default();
    let settled = matches!(report.verdict, Verdict::Completed | Verdict::Replayed);
    if !settled {
        match std::fs::metadata(partial).map(|m| m.len()) {
            Ok(0) => drop_if_empty(partial),
            Ok(held) => watch.note(&format!(
                "{held} bytes of {}:{} are here in {}: the same get with --op {} reads only the rest",
                file.source.host,
                file.source.path,
                partial.display(),
                report.op_id
            )),
            Err(_) => {}
        }
        return Ok(());
    }
    file.read = digest_said(&report.stderr.lossy_string());
    match (&file.read, report.exit_code) {
        (Some((sha256, bytes)), Some(0)) => {
            save(partial, &file.local, sha256, *bytes)?;
            file.saved = true;
        }
        _ => {
            let _ = std::fs::remove_file(partial);
        }
    }
    Ok(())
}

/// Removes a partial copy that holds nothing (made for a read that sent nothing).
fn drop_if_empty(partial: &Path) {
    if std::fs::metadata(partial).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(partial);
    }
}

/// The digest and size the host said on stderr's first line.
fn digest_said(stderr: &str) -> Option<(String, u64)> {
    let line = stderr.lines().next()?.strip_prefix("opmark-get: ")?;
    let mut sha = None;
    let mut bytes = None;
    for field in line.split(' ') {
        match field.split_once('=') {
            Some(("sha256", v)) if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
                sha = Some(v.to_owned());
            }
            Some(("bytes", v)) => bytes = v.parse().ok(),
            _ => {}
        }
    }
    Some((sha?, bytes?))
}

/// Checks the partial copy against what the host said, syncs it and renames it into
/// place (and syncs the directory): never a partial file at LOCAL. A copy that is not
/// the host's bytes is removed, so the next rerun reads the file whole.
fn save(partial: &Path, local: &Path, sha256: &str, bytes: u64) -> Result<()> {
    use std::io::Read as _;
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        let _ = std::fs::remove_file(partial);
        Error::new(
            ErrorKind::LocalIo,
            format!(
                "cannot {what} {} ({e}); {} is unchanged. The host keeps the file's copy: rerun with the same op id to read it again",
                partial.display(),
                local.display()
            ),
        )
    };
    let mut file = std::fs::File::open(partial).map_err(|e| failed("read", &e))?;
    let mut hash = Sha256::new();
    let mut len = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|e| failed("read", &e))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        len += n as u64;
    }
    let got = hex::encode(hash.finalize());
    if got != sha256 || len != bytes {
        return Err(failed(
            "keep",
            &format!(
                "it holds {len} bytes of SHA-256 {got}, the host read {bytes} bytes of {sha256}"
            ),
        ));
    }
    file.sync_all().map_err(|e| failed("sync", &e))?;
    std::fs::rename(partial, local).map_err(|e| failed("rename", &e))?;
    let dir = local.parent().filter(|d| !d.as_os_str().is_empty());
    if let Ok(d) = std::fs::File::open(dir.unwrap_or(Path::new("."))) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_comes_from_the_first_stderr_line_only() {
        let sha = "a".repeat(64);
        assert_eq!(
            digest_said(&format!("opmark-get: sha256={sha} bytes=12\n")),
            Some((sha.clone(), 12))
        );
        assert_eq!(
            digest_said(&format!("noise\nopmark-get: sha256={sha} bytes=1\n")),
            None
        );
        assert_eq!(digest_said("opmark-get: sha256=xyz bytes=1\n"), None);
        assert_eq!(digest_said(""), None);
    }

    #[test]
    fn a_partial_copy_name_stays_within_name_max_and_is_the_same_for_a_rerun() {
        let dir = Path::new("/d");
        let short = partial_path(Path::new("/d/app.tar"), dir, "op-1");
        assert_eq!(short, Path::new("/d/.app.tar.opmark-op-1"));
        // 200 bytes of name and a 100-character op id: 311 bytes the long way.
        let local = dir.join("n".repeat(200));
        let op = "o".repeat(100);
        let long = partial_path(&local, dir, &op);
        let name = long.file_name().unwrap().to_str().unwrap();
        assert!(name.len() <= 255, "{name}");
        assert!(name.starts_with(".opmark-") && name.ends_with(".part"));
        assert_eq!(long, partial_path(&local, dir, &op), "a rerun finds it");
        assert_ne!(long, partial_path(&local, dir, &"p".repeat(100)));
        assert_ne!(long, partial_path(&dir.join("m".repeat(200)), dir, &op));
    }

    #[test]
    fn the_intent_quotes_the_path() {
        assert_eq!(intent("/var/log/a b"), "opmark-get -- '/var/log/a b'");
    }

    #[test]
    fn the_listing_runs_find_in_the_directory_quoted() {
        assert_eq!(listing(""), "find . -type f -print0");
        assert_eq!(
            listing("/srv/it's"),
            r"cd '/srv/it'\''s' && find . -type f -print0"
        );
        assert_eq!(listing("-x"), "cd './-x' && find . -type f -print0");
    }

    #[test]
    fn a_listing_never_chooses_a_local_path_outside_the_directory() {
        let names = listed_names(b"./b\0./a/c d\0./b\0", "h:d").unwrap();
        assert_eq!(names, ["a/c d", "b"]);
        assert_eq!(listed_names(b"", "h:d").unwrap(), Vec::<String>::new());
        for bad in [
            &b"./../etc/passwd\0"[..],
            b"./a/../../x\0",
            b"/etc/passwd\0",
            b"./a//b\0",
            b"./\xff\0",
        ] {
            let e = listed_names(bad, "h:d").unwrap_err();
            assert!(
                e.message.contains("nothing was read but the listing"),
                "{e:?}"
            );
        }
    }
}
