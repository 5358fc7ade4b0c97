//! ledger integration tests.
