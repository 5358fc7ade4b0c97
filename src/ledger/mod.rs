//! ledger: not built yet.
