//! Operation ids: validated once, carried as a checked type afterwards.

use std::fmt;

/// A valid operation id: `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`. Safe to use as a single
/// path component on the host (no `/`, cannot start with `.`), and the shim checks again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(String);

impl OpId {
    /// Checks `text` against the pattern of docs/guarantees.md#operation-ids.
    pub fn parse(text: &str) -> Result<OpId, InvalidOpId> {
        let bytes = text.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= 128
            && bytes[0].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if ok {
            Ok(OpId(text.to_owned()))
        } else {
            // Redacted before escaping: escapes would hide a secret's shape.
            let redacted = crate::redact::Redactor::default().redact_owned(text);
            Err(InvalidOpId {
                shown: redacted.escape_debug().take(160).collect(),
            })
        }
    }

    /// Mints a fresh id for a `run` without `--op`: `op-<utc time>-<random>`.
    pub fn mint() -> OpId {
        let now = time::OffsetDateTime::now_utc();
        let stamp = format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second()
        );
        let random: u64 = rand::random();
        OpId(format!("op-{stamp}-{random:016x}"))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The error for an id that does not match the pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid operation id \"{shown}\": an op id is 1-128 characters of letters, digits, '.', '_', ':' or '-', starting with a letter or digit (no '/', spaces or leading '.'); nothing was sent")]
pub struct InvalidOpId {
    shown: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_spec_pattern() {
        for ok in ["a", "deploy-2026.11.30:web_1", &"x".repeat(128)] {
            assert!(OpId::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_paths_spaces_newlines_leading_dot_and_long_ids() {
        for bad in [
            "",
            "a/b",
            "..",
            ".hidden",
            "a b",
            "a\nb",
            "-x",
            &"x".repeat(129),
            "é",
        ] {
            let err = OpId::parse(bad).unwrap_err().to_string();
            assert!(err.contains("invalid operation id"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_parsed_id_reads_back_as_exactly_the_text_it_was_parsed_from() {
        // The id names the marker directory on the host and the ledger row: reading it
        // back must give the caller's text, not some other valid id.
        let text = "deploy-2026.11.30:web_1";
        let id = OpId::parse(text).unwrap();
        assert_eq!(id.as_str(), text);
        assert_eq!(id.to_string(), text);
    }

    #[test]
    fn minted_ids_are_valid_and_distinct() {
        let a = OpId::mint();
        let b = OpId::mint();
        assert_ne!(a, b);
        assert!(OpId::parse(a.as_str()).is_ok());
    }
}
