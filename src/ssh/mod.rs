//! ssh: not built yet.
