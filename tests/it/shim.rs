//! shim integration tests.
