//! What the ledger keeps in its `meta` table beside the events and both backends read
//! back: where the keyed chain starts, and the archive's cut and counts, each with its
//! MAC. Each store reads one `meta` value its own way ([`MetaRead`], inside the
//! transaction it holds); what the names mean is read here, once.

use super::cut::{parse_cut, Cut};
use super::error::LedgerError;

/// A store's read of one `meta` value by name (`None` when unset).
pub(crate) type MetaRead<'a> = &'a mut dyn FnMut(&str) -> Result<Option<String>, LedgerError>;

/// Where the keyed chain starts (0 when unset or unreadable: the verifier then reports
/// it).
pub(crate) fn keyed_from(meta: MetaRead<'_>) -> Result<u64, LedgerError> {
    Ok(meta("chain_keyed_from")?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// The MAC of where the keyed chain starts, as stored.
pub(crate) fn keyed_from_mac(meta: MetaRead<'_>) -> Result<Option<String>, LedgerError> {
    meta("chain_keyed_from_mac")
}

/// The recorded archive cut and its MAC, as stored (`None` when the ledger was never
/// archived).
pub(crate) fn archive_cut(
    meta: MetaRead<'_>,
) -> Result<Option<(Cut, Option<String>)>, LedgerError> {
    let Some(value) = meta("archive_cut")? else {
        return Ok(None);
    };
    Ok(Some((parse_cut(&value), meta("archive_cut_mac")?)))
}

/// The archived events' counts (as JSON) and their MAC, as stored.
pub(crate) fn archive_counts(
    meta: MetaRead<'_>,
) -> Result<Option<(String, Option<String>)>, LedgerError> {
    match meta("archive_counts")? {
        Some(json) => Ok(Some((json, meta("archive_counts_mac")?))),
        None => Ok(None),
    }
}
