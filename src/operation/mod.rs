//! operation: not built yet.
