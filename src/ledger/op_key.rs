//! The key of an operation in the ledger (op id + host), and the check every append
//! makes of it before anything is written.

use serde::Serialize;

use super::error::LedgerError;

/// The ledger key of an operation: op id + host (the same id on two hosts is two
/// operations).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct OpKey {
    /// Operation id.
    pub op_id: String,
    /// Host as the user named it (alias or `[user@]host`).
    pub host: String,
}

impl OpKey {
    /// Builds a key.
    pub fn new(op_id: impl Into<String>, host: impl Into<String>) -> Self {
        OpKey {
            op_id: op_id.into(),
            host: host.into(),
        }
    }

    /// Refuses a key no event may be recorded under (an invalid op id, an empty host or
    /// one with spaces or control characters).
    pub(super) fn check(&self) -> Result<(), LedgerError> {
        if crate::op_id::OpId::parse(&self.op_id).is_err() {
            return Err(LedgerError::Invalid {
                message: "refusing to record an event under an invalid operation id (1-128 letters, digits, '.', '_', ':' or '-')".into(),
            });
        }
        if self.host.is_empty()
            || self.host.len() > 1024
            || self
                .host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(LedgerError::Invalid {
                message: "refusing to record an event under an empty host or one containing spaces or control characters".into(),
            });
        }
        Ok(())
    }
}
