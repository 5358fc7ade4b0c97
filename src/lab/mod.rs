//! lab: not built yet.
