//! `opmark ledger keygen PATH`: a new installation key for a ledger named with
//! `--ledger-key` (SPEC section 14).

use crate::cli::{GlobalArgs, LedgerAction, LedgerArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::fingerprint::InstallationKey;
use crate::ledger::LedgerError;

/// Writes the key; refuses (exit 245) when PATH already exists.
pub fn run(global: &GlobalArgs, args: &LedgerArgs) -> Result<u8> {
    match &args.action {
        LedgerAction::Keygen { path } => keygen(global, path),
    }
}

fn keygen(global: &GlobalArgs, path: &std::path::Path) -> Result<u8> {
    match InstallationKey::generate(path) {
        Ok(key) => {
            if global.json {
                let doc = serde_json::json!({
                    "schema": "opmark/1",
                    "key": key.path(),
                });
                super::common::print_json(&doc)?;
            } else {
                println!("wrote a new installation key to {}", key.path().display());
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
