//! policy: not built yet.
