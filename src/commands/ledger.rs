//! `opmark ledger keygen PATH`: a new installation key for a ledger named with
//! `--ledger-key`; `opmark ledger migrate --to URL`: a SQLite ledger copied into
//! PostgreSQL, chain re-verified there (docs/ledger.md#backends); `opmark ledger backup
//! FILE`: a SQLite ledger's consistent copy; `opmark ledger archive`: old operations moved
//! out.

use crate::cli::{GlobalArgs, LedgerAction, LedgerArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::fingerprint::InstallationKey;
use crate::ledger::{is_postgres_url, Ledger, LedgerError};

/// Writes the key; refuses (exit 245) when PATH already exists.
pub fn run(global: &GlobalArgs, args: &LedgerArgs) -> Result<u8> {
    match &args.action {
        LedgerAction::Keygen { path } => keygen(global, path),
        LedgerAction::Migrate { to } => migrate(global, to),
        LedgerAction::Archive { before, file } => archive(global, *before, file),
        LedgerAction::Backup { file } => backup(global, file),
    }
}

fn backup(global: &GlobalArgs, file: &std::path::Path) -> Result<u8> {
    let (ledger, path) =
        Ledger::open_existing_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())?;
    let Some(ledger) = ledger else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no ledger at {}; give --ledger PATH of the ledger to copy. Nothing was written",
                path.display()
            ),
        ));
    };
    ledger.backup_to(file).map_err(|e| match e {
        LedgerError::Invalid { message } => Error::new(ErrorKind::InvalidInput, message),
        e => e.into(),
    })?;
    let key = ledger.key().path().to_path_buf();
    if global.json {
        super::common::print_json(&serde_json::json!({
            "schema": crate::ops::document::SCHEMA,
            "from": path,
            "backup": file,
            "key": key,
        }))?;
    } else {
        crate::outln!(
            "copied the ledger {} to {} (mode 0600). It opens with this ledger's key: --ledger {} --ledger-key {}",
            path.display(),
            file.display(),
            file.display(),
            key.display()
        );
    }
    Ok(exit_code::OK)
}

fn archive(global: &GlobalArgs, before: std::time::Duration, file: &std::path::Path) -> Result<u8> {
    let cutoff = crate::ledger::stamp_before(before).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "--before reaches back before any possible date; use a shorter duration such as 90d",
        )
    })?;
    let path = match global.ledger.as_deref() {
        Some(p) => p.to_path_buf(),
        None => Ledger::default_path()?,
    };
    // Archiving moves events out: the ledger is opened for writing (a read-only user
    // hears so with the path and the fix), never created.
    let exists = crate::ledger::is_postgres_url(&path) || path.exists();
    let ledger = match exists {
        true => Some(Ledger::open_with_key(&path, global.ledger_key.as_deref())?),
        false => None,
    };
    let Some(mut ledger) = ledger else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no ledger at {}; give --ledger PATH of the ledger to archive. Nothing was archived",
                path.display()
            ),
        ));
    };
    let report = ledger.archive_before(&cutoff, file).map_err(|e| match e {
        LedgerError::Invalid { message } => Error::new(ErrorKind::InvalidInput, message),
        e => e.into(),
    })?;
    if global.json {
        super::common::print_json(&serde_json::json!({
            "schema": crate::ops::document::SCHEMA,
            "archive": file,
            "cut": report.cut,
            "events": report.events,
            "operations": report.operations,
        }))?;
    } else {
        crate::outln!(
            "moved {} events of {} settled operations (through event #{}) to {}; the ledger keeps the cut. `opmark audit verify --archive {}` checks both as one chain",
            report.events,
            report.operations,
            report.cut,
            file.display(),
            file.display()
        );
    }
    Ok(exit_code::OK)
}

fn migrate(global: &GlobalArgs, to: &str) -> Result<u8> {
    if global.ledger.as_deref().is_some_and(is_postgres_url) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "`ledger migrate` copies a SQLite ledger; --ledger names a PostgreSQL one. Give --ledger PATH of the SQLite file (or leave it out for the default); nothing was copied",
        ));
    }
    let (source, path) =
        Ledger::open_existing_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())?;
    let Some(source) = source else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no ledger at {}; give --ledger PATH of the SQLite ledger to copy. Nothing was copied",
                path.display()
            ),
        ));
    };
    let report = source.migrate_to(to)?;
    let target = crate::ledger::postgres::without_password(to);
    let key = source.key().path().to_path_buf();
    if let Some(b) = &report.first_break {
        return Err(Error::new(
            ErrorKind::LocalIo,
            format!(
                "copied, but the chain does not verify on {target} (event #{}: {}); do not use the copy",
                b.seq, b.problem
            ),
        ));
    }
    if let Some(m) = &report.first_mismatch {
        return Err(Error::new(
            ErrorKind::LocalIo,
            format!(
                "copied, but the projection on {target} differs from its events ({}: {}); do not use the copy",
                m.op_id, m.problem
            ),
        ));
    }
    if global.json {
        super::common::print_json(&serde_json::json!({
            "schema": crate::ops::document::SCHEMA,
            "from": path,
            "to": target,
            "events": report.events,
            "chain_intact": true,
            "key": key,
        }))?;
    } else {
        crate::outln!(
            "copied {} events from {} to {target}; chain intact there. From now on use --ledger {target} --ledger-key {} (give every machine a copy of that key file)",
            report.events,
            path.display(),
            key.display()
        );
    }
    Ok(exit_code::OK)
}

fn keygen(global: &GlobalArgs, path: &std::path::Path) -> Result<u8> {
    match InstallationKey::generate(path) {
        Ok(key) => {
            if global.json {
                let doc = serde_json::json!({
                    "schema": crate::ops::document::SCHEMA,
                    "key": key.path(),
                });
                super::common::print_json(&doc)?;
            } else {
                crate::outln!("wrote a new installation key to {}", key.path().display());
            }
            Ok(exit_code::OK)
        }
        Err(LedgerError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} already exists; refusing to overwrite it (it may be the only key that opens a ledger). Choose another path, or move that file aside yourself",
                    path.display()
                ),
            ))
        }
        Err(e) => Err(e.into()),
    }
}
