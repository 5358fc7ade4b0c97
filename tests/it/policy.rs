//! policy integration tests.
