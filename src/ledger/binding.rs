//! The ledger's installation key: where it lives, how a ledger is bound to it and how the
//! binding is checked on every open (docs/ledger.md#backends).
//!
//! The key belongs to the ledger, not to a user's config directory: a ledger reached from
//! another `XDG_CONFIG_HOME` (sudo, a container that keeps only the state directory) must
//! find the same key or refuse, because a new key would turn the same intent into a
//! different fingerprint, i.e. a `conflict` whose "use a new op id" means a second
//! execution. So:
//!
//! - a fresh ledger gets its key beside it (`ledger.db` → `ledger.key`, 0600) unless
//!   `--ledger-key` names one, which must then exist (`opmark ledger keygen PATH`);
//! - the ledger stores a check value (an HMAC of a fixed text) in its `meta` table, and
//!   the switch point from which its chain is keyed, MACed;
//! - a ledger of the old layout (events, no check value, schema before version 2) adopts
//!   the old `${XDG_CONFIG_HOME:-~/.config}/opmark/installation.key` by copying it beside
//!   itself, and says so on stderr once;
//! - anything else (key missing, key different, check value gone from a ledger that had
//!   one) is an error naming the ledger, the key path and the fix. A key is never made for
//!   a ledger that already holds events.

use std::path::{Path, PathBuf};

use super::fingerprint::InstallationKey;

/// The default key file of the ledger at `db`: same name, extension `key`.
pub fn key_path_beside(db: &Path) -> PathBuf {
    let beside = db.with_extension("key");
    if beside == db {
        // A ledger itself named `*.key`: never let its key be the database file.
        let mut name = db.as_os_str().to_owned();
        name.push(".key");
        PathBuf::from(name)
    } else {
        beside
    }
}

/// A key binding as checked at open time.
pub(crate) struct Bound {
    /// The ledger's key.
    pub key: InstallationKey,
    /// A message for stderr after commit (the adoption of an old key), if any.
    pub notice: Option<String>,
}
