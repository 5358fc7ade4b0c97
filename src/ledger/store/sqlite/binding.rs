//! How a SQLite ledger is bound to its installation key (see [`crate::ledger::binding`]):
//! the check value and the keyed chain's start in its `meta` table, checked on every open.

use std::path::Path;

use rusqlite::{params, OptionalExtension, Transaction};

use crate::ledger::binding::{key_path_beside, Bound};
use crate::ledger::chain;
use crate::ledger::error::LedgerError;
use crate::ledger::fingerprint::{legacy_key_path, InstallationKey};

use super::operations;

/// The schema version that introduced the key binding; a ledger found below it with
/// events is of the old layout.
const BOUND_SINCE_VERSION: i64 = 2;

fn meta(tx: &Transaction<'_>, name: &str) -> Result<Option<String>, LedgerError> {
    Ok(tx
        .query_row(
            "SELECT value FROM meta WHERE name = ?1",
            params![name],
            |r| r.get(0),
        )
        .optional()?)
}

fn set_meta(tx: &Transaction<'_>, name: &str, value: &str) -> Result<(), LedgerError> {
    tx.execute(
        "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        params![name, value],
    )?;
    Ok(())
}

/// The recorded switch point, when present and parseable (0 when not: the verifier then
/// reports it).
pub(crate) fn keyed_from(tx: &Transaction<'_>) -> Result<(u64, Option<String>), LedgerError> {
    let mut read = |name: &str| meta(tx, name);
    Ok((
        crate::ledger::meta::keyed_from(&mut read)?,
        crate::ledger::meta::keyed_from_mac(&mut read)?,
    ))
}

fn is_not_found(e: &LedgerError) -> bool {
    matches!(e, LedgerError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// Checks (or, for a fresh or old-layout ledger, makes) the binding between the ledger
/// at `db` and its key. Runs inside the migrating transaction; `found_version` is the
/// schema version before migrating.
pub(crate) fn bind(
    tx: &Transaction<'_>,
    db: &Path,
    named_key: Option<&Path>,
    found_version: i64,
) -> Result<Bound, LedgerError> {
    if let Some(bound) = check(tx, db, named_key)? {
        return Ok(bound);
    }
    let key_path = named_key.map_or_else(|| key_path_beside(db), Path::to_path_buf);

    let head: Option<(u64, String)> = tx
        .query_row("SELECT seq, hash FROM chain_head WHERE id = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let events: u64 = tx.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
    let has_history = events > 0 || head.is_some();
    let (key, keyed_from, notice) = if !has_history {
        let key = match named_key {
            // An operator-named key (a shared ledger's) is supplied, never made here.
            Some(path) => InstallationKey::load(path).map_err(|e| {
                if is_not_found(&e) {
                    LedgerError::Invalid {
                        message: format!(
                            "no installation key at {} (named by --ledger-key / OPMARK_LEDGER_KEY) for the new ledger {}. Create one with `opmark ledger keygen {}`, or leave --ledger-key out to keep the key beside the ledger",
                            path.display(),
                            db.display(),
                            path.display()
                        ),
                    }
                } else {
                    e
                }
            })?,
            None => InstallationKey::load_or_generate(&key_path)?,
        };
        (key, 1, None)
    } else if found_version < BOUND_SINCE_VERSION {
        adopt_old_key(db, &key_path, named_key.is_some())?
            .map(|(key, notice)| (key, head.as_ref().map_or(0, |h| h.0) + 1, notice))
            .ok_or_else(|| LedgerError::Invalid {
                message: format!(
                    "the ledger {} holds events but has no installation key: none at {} and none at the old location {}. Restore the key file to {} (or name it with --ledger-key PATH), or start a new ledger with --ledger NEW_PATH; nothing was done",
                    db.display(),
                    key_path.display(),
                    legacy_key_path().map_or_else(
                        || "(none: no home directory)".to_owned(),
                        |p| p.display().to_string()
                    ),
                    key_path.display()
                ),
            })?
    } else {
        return Err(LedgerError::Invalid {
            message: format!(
                "the ledger {} holds events but its key check record is gone: it was edited outside opmark, and binding a key now would hide that. Restore the ledger from a backup, or keep it as evidence and start a new one with --ledger NEW_PATH",
                db.display()
            ),
        });
    };
    set_meta(tx, "key_check", &key.check_value())?;
    set_meta(tx, "chain_keyed_from", &keyed_from.to_string())?;
    set_meta(
        tx,
        "chain_keyed_from_mac",
        &chain::keyed_from_mac(&key, keyed_from),
    )?;
    if let Some((seq, hash)) = head {
        tx.execute(
            "UPDATE chain_head SET mac = ?1 WHERE id = 1",
            params![chain::head_mac(&key, seq, &hash)],
        )?;
    }
    let mut notice = notice;
    if has_history && operations::rebuild(tx)? {
        // The old layout's rows were folded by older rules (and never checked): from now
        // on `audit verify` compares them with the events, so start from the events.
        if let Some(n) = &mut notice {
            n.push_str("; its operations table was rebuilt from its events");
        }
    }
    Ok(Bound { key, notice })
}

/// For a ledger of the old layout: the key beside it, else the old config-dir key copied
/// beside it, with the notice to print. `None` when neither exists.
fn adopt_old_key(
    db: &Path,
    key_path: &Path,
    named: bool,
) -> Result<Option<(InstallationKey, Option<String>)>, LedgerError> {
    match InstallationKey::load(key_path) {
        Ok(key) => return Ok(Some((key, None))),
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(e),
    }
    if named {
        // The operator named a key file that does not exist: adopt nothing silently.
        return Ok(None);
    }
    let Some(legacy) = legacy_key_path() else {
        return Ok(None);
    };
    // Read once to be copied (0600) beside the ledger, where every later open checks
    // its mode; the old file is never read again.
    let old = match InstallationKey::load_for_adoption(&legacy) {
        Ok(key) => key,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let key = match old.copy_to(key_path) {
        Ok(key) => key,
        // Another opmark adopted it at the same moment.
        Err(LedgerError::Io { ref source, .. })
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            InstallationKey::load(key_path)?
        }
        Err(e) => return Err(e),
    };
    let notice = format!(
        "opmark: the ledger {} now keeps its installation key beside it: copied {} to {} (the ledger checks it from now on; keep the copy with the ledger, the old file is no longer read)",
        db.display(),
        legacy.display(),
        key_path.display()
    );
    Ok(Some((key, Some(notice))))
}

/// The ledger's binding when it has one: the key (named, else beside the ledger) checked
/// against the ledger's check value. Reads only, so a read-only ledger is checked too;
/// `None` for a ledger not bound yet (binding it writes).
pub(crate) fn check(
    tx: &Transaction<'_>,
    db: &Path,
    named_key: Option<&Path>,
) -> Result<Option<Bound>, LedgerError> {
    let key_path = named_key.map_or_else(|| key_path_beside(db), Path::to_path_buf);
    let Some(check) = meta(tx, "key_check")? else {
        return Ok(None);
    };

    let key = match InstallationKey::load(&key_path) {
            Ok(key) => key,
            Err(e) if is_not_found(&e) => {
                return Err(LedgerError::Invalid {
                    message: format!(
                        "the ledger {} needs its installation key, and there is none at {}. Restore that file (from a backup, or from the machine or directory the ledger came from), or name the key with --ledger-key PATH (OPMARK_LEDGER_KEY). A new key cannot open this ledger: its fingerprints and its chain are keyed with the old one",
                        db.display(),
                        key_path.display()
                    ),
                })
            }
            Err(e) => return Err(e),
        };
    if key.check_value() != check {
        return Err(LedgerError::Invalid {
                message: format!(
                    "the installation key {} is not the key of the ledger {} (the ledger's check value differs). Name the ledger's own key with --ledger-key PATH (OPMARK_LEDGER_KEY), or restore it to {}; nothing was done",
                    key_path.display(),
                    db.display(),
                    key_path_beside(db).display()
                ),
            });
    }
    Ok(Some(Bound { key, notice: None }))
}
