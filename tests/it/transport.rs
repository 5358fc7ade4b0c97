//! transport integration tests.
