//! Where `ledger archive` cut the chain ([`Cut`]) and what the ledger keeps of the
//! archived events' counts, each under a MAC of the installation key. Its own leaf: the
//! archive writes them, `audit verify` and `ledger migrate` read them, and neither of
//! those needs the other to know a cut.

use std::collections::BTreeMap;

use super::fingerprint::InstallationKey;

/// Where a ledger was cut: the last archived event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cut {
    pub seq: u64,
    pub hash: String,
}

/// The MAC of a cut.
pub(crate) fn cut_mac(key: &InstallationKey, cut: &Cut) -> String {
    key.mac(
        "opmark-archive-cut",
        &[cut.seq.to_string().as_bytes(), cut.hash.as_bytes()],
    )
}

/// The MAC of the archived events' counts (as JSON).
pub(crate) fn counts_mac(key: &InstallationKey, json: &str) -> String {
    key.mac("opmark-archive-counts", &[json.as_bytes()])
}

/// A cut as the `archive_cut` meta row stores it (`SEQ HASH`); an unreadable one is seq 0,
/// which no MAC matches.
pub(crate) fn parse_cut(value: &str) -> Cut {
    value
        .split_once(' ')
        .and_then(|(s, h)| {
            Some(Cut {
                seq: s.parse().ok()?,
                hash: h.to_owned(),
            })
        })
        .unwrap_or(Cut {
            seq: 0,
            hash: String::new(),
        })
}

/// The archived counts, when their MAC holds.
pub(crate) fn archived_counts(
    key: &InstallationKey,
    stored: Option<(String, Option<String>)>,
) -> Option<BTreeMap<String, i64>> {
    let (json, mac) = stored?;
    (mac.as_deref() == Some(counts_mac(key, &json).as_str()))
        .then(|| serde_json::from_str(&json).ok())
        .flatten()
}
