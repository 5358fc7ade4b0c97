//! The host shim: not built yet.
