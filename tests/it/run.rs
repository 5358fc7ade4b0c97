//! run integration tests.
