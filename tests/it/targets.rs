//! targets integration tests.
